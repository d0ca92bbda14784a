//! The `bmc` parameters every BMC command carries: driver, address and the
//! node's credentials still sealed (only the bmc service opens them).

use base64::Engine as _;
use bcm_db::nodes::Node;
use bcm_db::{DbError, Tx};
use serde_json::{json, Value};

/// `{"driver", "address", "sealedCredentials": {keyId, nonce, ciphertext, owner} | null}`.
pub async fn params_in_txn(tx: &mut Tx<'_>, node: &Node) -> Result<Value, DbError> {
    let sealed = match &node.bmc_secret_id {
        Some(id) => {
            let s = bcm_db::secrets::secret_fetch_in_txn(tx, id).await?;
            let b64 = base64::engine::general_purpose::STANDARD;
            json!({ "keyId": s.key_id, "nonce": b64.encode(&s.nonce), "ciphertext": b64.encode(&s.ciphertext), "owner": s.owner })
        }
        None => Value::Null,
    };
    Ok(
        json!({ "driver": node.bmc_driver, "address": node.bmc_address, "sealedCredentials": sealed }),
    )
}
