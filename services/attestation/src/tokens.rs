//! Minting one-time join tokens inside the caller's transaction (the step
//! that hands a token to a ramdisk or an installed OS commits it with the
//! command that carries it). Only the hash is stored.

use bcm_db::agents::TokenScope;
use bcm_db::{DbError, Tx};
use chrono::{DateTime, Utc};

/// Mints a token of `purpose` for `scope`, live until `expires_at`.
pub async fn mint_in_txn(
    tx: &mut Tx<'_>,
    purpose: &str,
    scope: &TokenScope,
    expires_at: DateTime<Utc>,
) -> Result<String, DbError> {
    let (token, hash) = bcm_pki::tokens::mint();
    let id = format!("jt_{}", ulid::Ulid::new().to_string().to_lowercase());
    bcm_db::agents::join_token_insert_in_txn(tx, &id, &hash, purpose, scope, expires_at).await?;
    Ok(token)
}
