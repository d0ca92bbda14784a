//! Agents' identity: one-time join tokens (hashed), node certificates (the
//! public key a node signs results with), agent sessions, and what agents
//! reported (node facts).

use chrono::{DateTime, Utc};

use crate::{Db, DbError, Tx};

/// What a join token is for: one node, or (adopt) any machine of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenScope {
    Node(String),
    Pool(String),
}

/// Stores a join token's hash.
pub async fn join_token_insert_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
    hash: &[u8],
    purpose: &str,
    scope: &TokenScope,
    expires_at: DateTime<Utc>,
) -> Result<(), DbError> {
    let (node, pool) = match scope {
        TokenScope::Node(n) => (Some(n.as_str()), None),
        TokenScope::Pool(p) => (None, Some(p.as_str())),
    };
    sqlx::query("INSERT INTO join_tokens (id, token_hash, purpose, node_id, pool_id, expires_at) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(id)
        .bind(hash)
        .bind(purpose)
        .bind(node)
        .bind(pool)
        .bind(expires_at)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Uses a join token once: `(purpose, scope)` if it was live and unused.
pub async fn join_token_consume_in_txn(
    tx: &mut Tx<'_>,
    hash: &[u8],
) -> Result<Option<(String, TokenScope)>, DbError> {
    let row: Option<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "UPDATE join_tokens SET used_at = now() WHERE token_hash = $1 AND used_at IS NULL AND expires_at > now() \
         RETURNING purpose, node_id, pool_id",
    )
    .bind(hash)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row.and_then(|(purpose, node, pool)| match (node, pool) {
        (Some(n), _) => Some((purpose, TokenScope::Node(n))),
        (None, Some(p)) => Some((purpose, TokenScope::Pool(p))),
        (None, None) => None,
    }))
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
    pub purpose: String,
}

const CERT_COLUMNS: &str =
    "serial, node_id, public_key, cert_pem, not_before, not_after, revoked_at, purpose";

/// Records a certificate.
pub async fn cert_insert_in_txn(tx: &mut Tx<'_>, c: &CertRow) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO node_certs (serial, node_id, public_key, cert_pem, not_before, not_after, purpose) VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&c.serial)
    .bind(&c.node_id)
    .bind(&c.public_key)
    .bind(&c.cert_pem)
    .bind(c.not_before)
    .bind(c.not_after)
    .bind(&c.purpose)
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

/// Revokes one certificate (its sessions end with it).
pub async fn cert_revoke_in_txn(tx: &mut Tx<'_>, serial: &str) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE node_certs SET revoked_at = now() WHERE serial = $1 AND revoked_at IS NULL",
    )
    .bind(serial)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(n == 1)
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

/// How many live certificates a node has, in a transaction.
pub async fn certs_live_count_in_txn(tx: &mut Tx<'_>, node_id: &str) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL AND not_after > now()",
    )
    .bind(node_id)
    .fetch_one(&mut **tx)
    .await?)
}

/// Reads what an agent reported, in a transaction.
pub async fn node_fact_fetch_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
    kind: &str,
) -> Result<Option<serde_json::Value>, DbError> {
    Ok(
        sqlx::query_scalar("SELECT data FROM node_facts WHERE node_id = $1 AND kind = $2")
            .bind(node_id)
            .bind(kind)
            .fetch_optional(&mut **tx)
            .await?,
    )
}

/// Every live (unrevoked, unexpired) certificate of a node.
pub async fn certs_live_of_node_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
) -> Result<Vec<CertRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {CERT_COLUMNS} FROM node_certs \
         WHERE node_id = $1 AND revoked_at IS NULL AND not_after > now() ORDER BY not_before DESC"
    ))
    .bind(node_id)
    .fetch_all(&mut **tx)
    .await?)
}

/// Every certificate of a node, newest first.
pub async fn certs_of_node(db: &Db, node_id: &str) -> Result<Vec<CertRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {CERT_COLUMNS} FROM node_certs WHERE node_id = $1 ORDER BY not_before DESC"
    ))
    .bind(node_id)
    .fetch_all(db.pool())
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

/// Merges keys into what an agent reported of `kind` (a heartbeat keeps
/// what the join recorded).
pub async fn node_fact_merge_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
    kind: &str,
    data: &serde_json::Value,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO node_facts (node_id, kind, data) VALUES ($1, $2, $3) \
         ON CONFLICT (node_id, kind) DO UPDATE SET data = node_facts.data || $3, updated_at = now()",
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
