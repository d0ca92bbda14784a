//! Agents' identity: one-time join tokens (hashed), node certificates (the
//! public key a node signs results with), agent sessions, and what agents
//! reported (node facts).

use chrono::{DateTime, Utc};

use crate::{Db, DbError, Tx};

/// Stores a join token's hash.
pub async fn join_token_insert_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
    hash: &[u8],
    purpose: &str,
    node_id: &str,
    expires_at: DateTime<Utc>,
) -> Result<(), DbError> {
    sqlx::query("INSERT INTO join_tokens (id, token_hash, purpose, node_id, expires_at) VALUES ($1, $2, $3, $4, $5)")
        .bind(id)
        .bind(hash)
        .bind(purpose)
        .bind(node_id)
        .bind(expires_at)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Uses a join token once: `(purpose, node id)` if it was live and unused.
pub async fn join_token_consume_in_txn(
    tx: &mut Tx<'_>,
    hash: &[u8],
) -> Result<Option<(String, String)>, DbError> {
    Ok(sqlx::query_as(
        "UPDATE join_tokens SET used_at = now() WHERE token_hash = $1 AND used_at IS NULL AND expires_at > now() \
         AND node_id IS NOT NULL RETURNING purpose, node_id",
    )
    .bind(hash)
    .fetch_optional(&mut **tx)
    .await?)
}

/// A node certificate as stored.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CertRow {
    pub serial: String,
    pub node_id: String,
    pub public_key: Vec<u8>,
    pub cert_pem: String,
    pub not_before: DateTime<Utc>,
    pub not_after: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// Records a certificate.
pub async fn cert_insert_in_txn(tx: &mut Tx<'_>, c: &CertRow) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO node_certs (serial, node_id, public_key, cert_pem, not_before, not_after) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(&c.serial)
    .bind(&c.node_id)
    .bind(&c.public_key)
    .bind(&c.cert_pem)
    .bind(c.not_before)
    .bind(c.not_after)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Revokes every certificate and session of a node; returns how many certs.
pub async fn certs_revoke_in_txn(tx: &mut Tx<'_>, node_id: &str) -> Result<u64, DbError> {
    let n = sqlx::query(
        "UPDATE node_certs SET revoked_at = now() WHERE node_id = $1 AND revoked_at IS NULL",
    )
    .bind(node_id)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    sqlx::query("DELETE FROM agent_sessions WHERE node_id = $1")
        .bind(node_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query("UPDATE join_tokens SET expires_at = now() WHERE node_id = $1 AND used_at IS NULL")
        .bind(node_id)
        .execute(&mut **tx)
        .await?;
    Ok(n)
}

/// How many live (unrevoked, unexpired) certificates a node has.
pub async fn certs_live_count(db: &Db, node_id: &str) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL AND not_after > now()",
    )
    .bind(node_id)
    .fetch_one(db.pool())
    .await?)
}

/// A live certificate by serial.
pub async fn cert_fetch_live_in_txn(
    tx: &mut Tx<'_>,
    serial: &str,
) -> Result<Option<CertRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT serial, node_id, public_key, cert_pem, not_before, not_after, revoked_at FROM node_certs \
         WHERE serial = $1 AND revoked_at IS NULL AND not_after > now()",
    )
    .bind(serial)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Stores an agent session.
pub async fn session_insert_in_txn(
    tx: &mut Tx<'_>,
    hash: &[u8],
    node_id: &str,
    cert_serial: &str,
    purpose: &str,
    expires_at: DateTime<Utc>,
) -> Result<(), DbError> {
    sqlx::query("INSERT INTO agent_sessions (token_hash, node_id, cert_serial, purpose, expires_at) VALUES ($1, $2, $3, $4, $5)")
        .bind(hash)
        .bind(node_id)
        .bind(cert_serial)
        .bind(purpose)
        .bind(expires_at)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A live session: `(node id, cert serial, purpose)`.
pub async fn session_fetch_live(
    db: &Db,
    hash: &[u8],
) -> Result<Option<(String, String, String)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT node_id, cert_serial, purpose FROM agent_sessions WHERE token_hash = $1 AND expires_at > now()",
    )
    .bind(hash)
    .fetch_optional(db.pool())
    .await?)
}

/// Whether an agent of `purpose` joined for the node at or after `since`.
pub async fn joined_since_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
    purpose: &str,
    since: DateTime<Utc>,
) -> Result<bool, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM agent_sessions WHERE node_id = $1 AND purpose = $2 AND created_at >= $3)",
    )
    .bind(node_id)
    .bind(purpose)
    .bind(since)
    .fetch_one(&mut **tx)
    .await?)
}

/// Stores what an agent reported, replacing the previous report of `kind`.
pub async fn node_fact_upsert_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
    kind: &str,
    data: &serde_json::Value,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO node_facts (node_id, kind, data) VALUES ($1, $2, $3) \
         ON CONFLICT (node_id, kind) DO UPDATE SET data = $3, updated_at = now()",
    )
    .bind(node_id)
    .bind(kind)
    .bind(data)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Reads what an agent reported.
pub async fn node_fact_fetch(
    db: &Db,
    node_id: &str,
    kind: &str,
) -> Result<Option<serde_json::Value>, DbError> {
    Ok(
        sqlx::query_scalar("SELECT data FROM node_facts WHERE node_id = $1 AND kind = $2")
            .bind(node_id)
            .bind(kind)
            .fetch_optional(db.pool())
            .await?,
    )
}

/// Whether the node's fact `kind` was written at or after `since`.
pub async fn node_fact_since_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
    kind: &str,
    since: DateTime<Utc>,
) -> Result<Option<serde_json::Value>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT data FROM node_facts WHERE node_id = $1 AND kind = $2 AND updated_at >= $3",
    )
    .bind(node_id)
    .bind(kind)
    .bind(since)
    .fetch_optional(&mut **tx)
    .await?)
}
