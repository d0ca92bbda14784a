//! Rescue access: the operator's SSH public key of a rescue, kept as the
//! node's `rescue-access` fact (with who asked) from the verb until the node
//! leaves `rescue`, and read by the engine when it makes the rescue
//! ramdisk's boot entry. The key is checked by `bcm_core::rescue` before it
//! gets here.

use bcm_core::rescue::SshPublicKey;
use bcm_db::{DbError, Tx};
use serde_json::json;

/// The node fact that holds a rescue's access.
pub const RESCUE_ACCESS_FACT: &str = "rescue-access";

/// Records the rescue's access (a key, or none: the serial console only).
pub async fn record_access_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
    key: Option<&SshPublicKey>,
    by: &str,
) -> Result<(), DbError> {
    let data = json!({
        "sshPublicKey": key.map(SshPublicKey::line),
        "fingerprint": key.map(SshPublicKey::fingerprint),
        "by": by,
    });
    bcm_db::agents::node_fact_upsert_in_txn(tx, node_id, RESCUE_ACCESS_FACT, &data).await
}

/// The key the node's rescue ramdisk lets in, if the rescue named one. A
/// stored key that no longer passes the check is ignored (and logged).
pub async fn access_key_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
) -> Result<Option<SshPublicKey>, DbError> {
    let Some(fact) =
        bcm_db::agents::node_fact_fetch_in_txn(tx, node_id, RESCUE_ACCESS_FACT).await?
    else {
        return Ok(None);
    };
    let Some(line) = fact.get("sshPublicKey").and_then(|v| v.as_str()) else {
        return Ok(None);
    };
    match bcm_core::rescue::check_ssh_public_key(line) {
        Ok(k) => Ok(Some(k)),
        Err(e) => {
            tracing::warn!(node = node_id, error = %e, "a stored rescue key no longer passes the check; the rescue ramdisk gets none");
            Ok(None)
        }
    }
}

/// Forgets the rescue's access (the node left `rescue`).
pub async fn forget_access_in_txn(tx: &mut Tx<'_>, node_id: &str) -> Result<bool, DbError> {
    bcm_db::agents::node_fact_delete_in_txn(tx, node_id, RESCUE_ACCESS_FACT).await
}
