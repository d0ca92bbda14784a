//! The `bmc` parameters every BMC command carries: driver, address and the
//! node's credentials still sealed (only the bmc service opens them).

use base64::Engine as _;
use bcm_db::nodes::Node;
use bcm_db::{DbError, Tx};
use serde_json::{json, Value};

/// `{"driver", "address", "tls": BmcTls | null, "sealedCredentials": {keyId, nonce, ciphertext, owner} | null}`.
pub async fn params_in_txn(tx: &mut Tx<'_>, node: &Node) -> Result<Value, DbError> {
    let sealed = match &node.bmc_secret_id {
        Some(id) => sealed_in_txn(tx, id).await?,
        None => Value::Null,
    };
    Ok(json!({
        "driver": node.bmc_driver,
        "address": node.bmc_address,
        "tls": node.bmc_tls,
        "sealedCredentials": sealed,
    }))
}

/// A stored sealed value as command parameters carry it:
/// `{keyId, nonce, ciphertext, owner}` (binary fields in base64).
pub async fn sealed_in_txn(tx: &mut Tx<'_>, secret_id: &str) -> Result<Value, DbError> {
    let s = bcm_db::secrets::secret_fetch_in_txn(tx, secret_id).await?;
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(
        json!({ "keyId": s.key_id, "nonce": b64.encode(&s.nonce), "ciphertext": b64.encode(&s.ciphertext), "owner": s.owner }),
    )
}

/// Records a one-leaf BMC command for `node` (not part of a workflow) and
/// returns it with its outbox message, for the caller's transaction: the
/// row exists before the command is sent, and only if the caller commits.
/// `params` gets the node's `bmc` parameters added.
pub async fn leaf_command_in_txn(
    tx: &mut Tx<'_>,
    subjects: &bcm_bus::Subjects,
    node: &Node,
    kind: &str,
    purpose: &str,
    mut params: serde_json::Map<String, Value>,
) -> Result<
    (
        bcm_bus::messages::CommandEnvelope,
        bcm_db::outbox::NewOutboxMessage,
    ),
    DbError,
> {
    params.insert("bmc".into(), params_in_txn(tx, node).await?);
    let cmd = bcm_bus::messages::CommandEnvelope {
        command_id: bcm_core::CommandId::generate().to_string(),
        kind: kind.to_owned(),
        site_id: node.site_id.clone(),
        node_id: Some(node.id),
        params: Value::Object(params),
        issued_at: chrono::Utc::now(),
    };
    bcm_db::commands::command_insert_in_txn(
        tx,
        &bcm_db::commands::NewCommand {
            id: cmd.command_id.clone(),
            idempotency_key: format!("{purpose}/{}", cmd.command_id),
            workflow_id: None,
            step_idx: None,
            attempt: 1,
            node_id: Some(node.id.to_string()),
            site_id: Some(node.site_id.to_string()),
            kind: cmd.kind.clone(),
            target: "site".to_owned(),
            params: cmd.params.clone(),
        },
    )
    .await?;
    let row = crate::outbox::command(subjects, node, &cmd);
    Ok((cmd, row))
}
