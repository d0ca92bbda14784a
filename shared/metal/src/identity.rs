//! A node's agent identity as the engine, the reconciler and the API change
//! it in their own transactions: one-time join tokens minted with the
//! command or answer that carries them (only the hash is stored), and the
//! revocation a transition makes of the identities it ends
//! (`bcm_core::state::identities_ended`). Issuing certificates is the
//! attestation service's alone (it holds the CA key).

use bcm_db::agents::TokenScope;
use bcm_db::{DbError, Tx};
use chrono::{DateTime, Utc};

/// Mints a token of `purpose` for `scope`, live until `expires_at`;
/// returns the token (its hash is what is stored).
pub async fn mint_join_token_in_txn(
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

/// Mints a token of `purpose` for `scope`, live until `expires_at`, as a
/// join reference: the token is derived under `site_key` (the node's
/// site's join key) from the reference's id, only its hash is stored, and
/// what is returned (`bcmjref_<id>`) holds no secret. Whoever delivers it
/// to the machine reveals it ([`bcm_pki::JoinKey::reveal`]).
pub async fn mint_join_ref_in_txn(
    tx: &mut Tx<'_>,
    site_key: &bcm_pki::JoinKey,
    purpose: &str,
    scope: &TokenScope,
    expires_at: DateTime<Utc>,
) -> Result<String, DbError> {
    let ulid = ulid::Ulid::new().to_string().to_lowercase();
    let (_token, hash) = site_key.token(&ulid);
    let id = format!("jt_{ulid}");
    bcm_db::agents::join_token_insert_in_txn(tx, &id, &hash, purpose, scope, expires_at).await?;
    Ok(bcm_pki::join_key::reference(&ulid))
}

/// Ends every identity of a node in a new epoch: every certificate and
/// session revoked, unused join tokens expired (retire's last steps);
/// returns how many certificates were revoked.
pub async fn revoke_in_txn(tx: &mut Tx<'_>, node_id: &str) -> Result<u64, DbError> {
    bcm_db::agents::certs_revoke_in_txn(tx, node_id).await
}

/// Ends what a transition of the node ends (in the transition's
/// transaction); returns how many certificates were revoked.
pub async fn end_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
    ended: bcm_core::state::IdentitiesEnded,
) -> Result<u64, DbError> {
    use bcm_core::state::IdentitiesEnded;
    match ended {
        IdentitiesEnded::Nothing => Ok(0),
        IdentitiesEnded::Ramdisk => {
            let ramdisk = bcm_contracts::agent::AgentPurpose::Discovery.as_str();
            bcm_db::agents::certs_revoke_purposes_in_txn(tx, node_id, &[ramdisk]).await
        }
        IdentitiesEnded::All => bcm_db::agents::certs_revoke_in_txn(tx, node_id).await,
    }
}
