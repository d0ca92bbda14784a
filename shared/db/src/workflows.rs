//! Workflows, as far as the API needs them: the status of a node's current
//! workflow. The engine's queries come with the engine.

use crate::{DbError, Tx};

/// Status of a workflow, or `None` when it does not exist.
pub async fn workflow_status_in_txn(tx: &mut Tx<'_>, id: &str) -> Result<Option<String>, DbError> {
    Ok(
        sqlx::query_scalar("SELECT status FROM workflows WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?,
    )
}
