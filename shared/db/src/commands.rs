//! Commands: every command is a row before it is sent, with an idempotency
//! key, so nothing is sent twice and executors dedupe by command id.

use crate::{DbError, Tx};

/// A command to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewCommand {
    pub id: String,
    pub idempotency_key: String,
    pub workflow_id: Option<String>,
    pub step_idx: Option<i32>,
    pub attempt: i32,
    pub node_id: Option<String>,
    pub site_id: Option<String>,
    pub kind: String,
    pub params: serde_json::Value,
}

/// Records a command as pending. A repeated idempotency key is
/// [`DbError::Duplicate`].
pub async fn command_insert_in_txn(tx: &mut Tx<'_>, c: &NewCommand) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO commands (id, idempotency_key, workflow_id, step_idx, attempt, node_id, site_id, kind, params, status) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending')",
    )
    .bind(&c.id)
    .bind(&c.idempotency_key)
    .bind(&c.workflow_id)
    .bind(c.step_idx)
    .bind(c.attempt)
    .bind(&c.node_id)
    .bind(&c.site_id)
    .bind(&c.kind)
    .bind(&c.params)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
