//! API tokens: a hash of the bearer secret, a principal and its grants.

use chrono::{DateTime, Utc};

use crate::{Db, DbError};

/// A stored API token.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ApiTokenRow {
    pub id: String,
    pub token_hash: Vec<u8>,
    pub principal: String,
    /// `[{ "action": …, "scope": {…} }]`, decoded by the caller.
    pub grants: serde_json::Value,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// Stores a token (its hash only).
pub async fn api_token_insert(db: &Db, t: &ApiTokenRow) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO api_tokens (id, token_hash, principal, grants, expires_at) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&t.id)
    .bind(&t.token_hash)
    .bind(&t.principal)
    .bind(&t.grants)
    .bind(t.expires_at)
    .execute(db.pool())
    .await?;
    Ok(())
}

/// Finds a live (unrevoked, unexpired) token by the hash of its secret.
pub async fn api_token_fetch_live_by_hash(db: &Db, hash: &[u8]) -> Result<ApiTokenRow, DbError> {
    Ok(sqlx::query_as(
        "SELECT id, token_hash, principal, grants, expires_at, revoked_at FROM api_tokens \
         WHERE token_hash = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())",
    )
    .bind(hash)
    .fetch_one(db.pool())
    .await?)
}

/// A token as an administrator sees it: never its hash.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ApiTokenInfo {
    pub id: String,
    pub principal: String,
    pub grants: serde_json::Value,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

const INFO: &str = "id, principal, grants, expires_at, revoked_at, created_at";

/// Every token, newest first.
pub async fn api_tokens_list(db: &Db) -> Result<Vec<ApiTokenInfo>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {INFO} FROM api_tokens ORDER BY created_at DESC, id"
    ))
    .fetch_all(db.pool())
    .await?)
}

/// Revokes a token from now on (the next request with it is refused);
/// revoking a revoked token keeps its first revocation time. `NotFound`
/// when there is no such token.
pub async fn api_token_revoke(db: &Db, id: &str) -> Result<ApiTokenInfo, DbError> {
    Ok(sqlx::query_as(&format!(
        "UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, now()) WHERE id = $1 RETURNING {INFO}"
    ))
    .bind(id)
    .fetch_one(db.pool())
    .await?)
}
