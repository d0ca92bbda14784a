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

/// The join a spent token made, if it was spent less than `window_secs`
/// ago on a certificate still unrevoked: `(purpose, certificate)`. The
/// token row is locked, so two retries of one join are answered in turn.
pub async fn join_token_spent_recently_in_txn(
    tx: &mut Tx<'_>,
    hash: &[u8],
    window_secs: u64,
) -> Result<Option<(String, CertRow)>, DbError> {
    let serial: Option<(String, String)> = sqlx::query_as(
        "SELECT t.purpose, t.used_by_cert FROM join_tokens t \
         WHERE t.token_hash = $1 AND t.used_by_cert IS NOT NULL \
           AND t.used_at > now() - make_interval(secs => $2) FOR UPDATE",
    )
    .bind(hash)
    .bind(window_secs as f64)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((purpose, serial)) = serial else {
        return Ok(None);
    };
    let cert: Option<CertRow> = sqlx::query_as(&format!(
        "SELECT {CERT_COLUMNS} FROM node_certs WHERE serial = $1 AND revoked_at IS NULL AND not_after > now()"
    ))
    .bind(&serial)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(cert.map(|c| (purpose, c)))
}

/// Gives the session of a certificate a new bearer token (a retried join
/// whose first answer was lost: the token it carried was never received).
/// False when the certificate has no live session.
pub async fn session_rekey_in_txn(
    tx: &mut Tx<'_>,
    cert_serial: &str,
    new_hash: &[u8],
) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE agent_sessions SET token_hash = $2, alive_until = greatest(alive_until, now()) \
         WHERE cert_serial = $1 AND expires_at > now()",
    )
    .bind(cert_serial)
    .bind(new_hash)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(n > 0)
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
    /// The node's identity epoch the certificate was issued in.
    pub epoch: i32,
}

const CERT_COLUMNS: &str =
    "serial, node_id, public_key, cert_pem, not_before, not_after, revoked_at, purpose, epoch";

/// What a granted join records, in one round trip: its certificate, the
/// join token spent on it (`used_by_cert`), the agent's session (alive
/// until the certificate's end) and the agent's presence fact.
pub async fn join_record_in_txn(
    tx: &mut Tx<'_>,
    c: &CertRow,
    token_hash: &[u8],
    session_hash: &[u8],
    presence_kind: &str,
    presence: &serde_json::Value,
) -> Result<(), DbError> {
    sqlx::query(
        "WITH cert AS (INSERT INTO node_certs (serial, node_id, public_key, cert_pem, not_before, not_after, purpose, epoch) \
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8)), \
         spent AS (UPDATE join_tokens SET used_by_cert = $1 WHERE token_hash = $9), \
         session AS (INSERT INTO agent_sessions (token_hash, node_id, cert_serial, purpose, expires_at) \
           VALUES ($10, $2, $1, $7, $6)), \
         presence AS (INSERT INTO node_facts (node_id, kind, data) VALUES ($2, $11, $12) \
           ON CONFLICT (node_id, kind) DO UPDATE SET data = $12, updated_at = now()) \
         SELECT 1",
    )
    .bind(&c.serial)
    .bind(&c.node_id)
    .bind(&c.public_key)
    .bind(&c.cert_pem)
    .bind(c.not_before)
    .bind(c.not_after)
    .bind(&c.purpose)
    .bind(c.epoch)
    .bind(token_hash)
    .bind(session_hash)
    .bind(presence_kind)
    .bind(presence)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records a certificate.
pub async fn cert_insert_in_txn(tx: &mut Tx<'_>, c: &CertRow) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO node_certs (serial, node_id, public_key, cert_pem, not_before, not_after, purpose, epoch) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(&c.serial)
    .bind(&c.node_id)
    .bind(&c.public_key)
    .bind(&c.cert_pem)
    .bind(c.not_before)
    .bind(c.not_after)
    .bind(&c.purpose)
    .bind(c.epoch)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The node's identity epoch (0 until its identities were first ended).
pub async fn epoch_in_txn(tx: &mut Tx<'_>, node_id: &str) -> Result<i32, DbError> {
    let e: Option<i32> =
        sqlx::query_scalar("SELECT epoch FROM node_agent_epochs WHERE node_id = $1")
            .bind(node_id)
            .fetch_optional(&mut **tx)
            .await?;
    Ok(e.unwrap_or(0))
}

/// Ends every identity of a node: a new epoch, every certificate revoked,
/// every session ended, every unused join token expired. Returns how many
/// certificates were revoked.
pub async fn certs_revoke_in_txn(tx: &mut Tx<'_>, node_id: &str) -> Result<u64, DbError> {
    sqlx::query(
        "INSERT INTO node_agent_epochs (node_id, epoch) VALUES ($1, 1) \
         ON CONFLICT (node_id) DO UPDATE SET epoch = node_agent_epochs.epoch + 1",
    )
    .bind(node_id)
    .execute(&mut **tx)
    .await?;
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

/// Ends a node's identities of the given purposes (the epoch stays):
/// their certificates revoked, their sessions ended, their unused join
/// tokens expired. Returns how many certificates were revoked.
pub async fn certs_revoke_purposes_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
    purposes: &[&str],
) -> Result<u64, DbError> {
    // Tokens first: a join spending one of them holds its row until it
    // commits, so this waits for it, and the statements after it (each
    // with a fresh snapshot) see the certificate and session it made.
    sqlx::query(
        "UPDATE join_tokens SET expires_at = now() \
         WHERE node_id = $1 AND purpose = ANY($2) AND used_at IS NULL AND expires_at > now()",
    )
    .bind(node_id)
    .bind(purposes)
    .execute(&mut **tx)
    .await?;
    // Certificates and sessions in one statement: its one snapshot is
    // taken after the wait above.
    let n: i64 = sqlx::query_scalar(
        "WITH revoked AS (UPDATE node_certs SET revoked_at = now() \
           WHERE node_id = $1 AND purpose = ANY($2) AND revoked_at IS NULL RETURNING 1), \
         ended AS (DELETE FROM agent_sessions WHERE node_id = $1 AND purpose = ANY($2)) \
         SELECT count(*) FROM revoked",
    )
    .bind(node_id)
    .bind(purposes)
    .fetch_one(&mut **tx)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Revokes one certificate and ends its sessions.
pub async fn cert_revoke_in_txn(tx: &mut Tx<'_>, serial: &str) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE node_certs SET revoked_at = now() WHERE serial = $1 AND revoked_at IS NULL",
    )
    .bind(serial)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    sqlx::query("DELETE FROM agent_sessions WHERE cert_serial = $1")
        .bind(serial)
        .execute(&mut **tx)
        .await?;
    Ok(n == 1)
}

/// A certificate that answers for its node now: unrevoked, in its
/// validity window and of the node's current epoch.
pub async fn cert_in_force_in_txn(
    tx: &mut Tx<'_>,
    serial: &str,
) -> Result<Option<CertRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {CERT_COLUMNS} FROM node_certs c \
         WHERE c.serial = $1 AND c.revoked_at IS NULL AND c.not_after > now() \
           AND c.epoch = coalesce((SELECT epoch FROM node_agent_epochs e WHERE e.node_id = c.node_id), 0)"
    ))
    .bind(serial)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Records that the certificate signed a rejoin at `signed_at`, if that is
/// newer than every rejoin it signed before; false for an older or equal
/// one (a replay).
pub async fn cert_mark_rejoin_in_txn(
    tx: &mut Tx<'_>,
    serial: &str,
    signed_at: DateTime<Utc>,
) -> Result<bool, DbError> {
    let done = sqlx::query(
        "UPDATE node_certs SET last_rejoin_at = $2 \
         WHERE serial = $1 AND (last_rejoin_at IS NULL OR last_rejoin_at < $2)",
    )
    .bind(serial)
    .bind(signed_at)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// The certificate of the live session whose bearer token has this hash.
pub async fn session_cert_of_hash_in_txn(
    tx: &mut Tx<'_>,
    hash: &[u8],
) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT cert_serial FROM agent_sessions WHERE token_hash = $1 AND expires_at > now()",
    )
    .bind(hash)
    .fetch_optional(&mut **tx)
    .await?)
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

/// Every certificate in force of a node: unrevoked, unexpired, of its
/// current epoch.
pub async fn certs_live_of_node_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
) -> Result<Vec<CertRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {CERT_COLUMNS} FROM node_certs c \
         WHERE c.node_id = $1 AND c.revoked_at IS NULL AND c.not_after > now() \
           AND c.epoch = coalesce((SELECT epoch FROM node_agent_epochs e WHERE e.node_id = c.node_id), 0) \
         ORDER BY c.not_before DESC"
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

/// An agent session a request was made under, as its touch found it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct LiveSession {
    pub node_id: String,
    pub cert_serial: String,
    pub purpose: String,
    /// Whether the node had a running workflow at the touch (what a
    /// heartbeat needs to know, read in the same statement).
    pub workflow_running: bool,
    /// How long from now (by the database's clock) the session stays
    /// marked alive, in milliseconds: what a long poll may wait at most.
    pub alive_left_ms: i64,
}

/// Sessions' touches as common table expressions, for a statement that
/// goes on from them. Binds, one element per ask: `$1` the tokens' hashes,
/// `$2` how long each is marked alive from now and `$3` its slack, both in
/// seconds. `asks`: the asks, numbered from 1 (`ask`); `live`: each ask's
/// session, if its certificate is in force, and whether its touch `moves`
/// the mark; `locked`: the sessions to move, locked in the order of their
/// hashes (two statements moving the same sessions never wait for each
/// other in a cycle) — unless `wait_for_locks`, one another transaction
/// holds is passed over; `touched`: the marks moved (a session asked twice
/// moves once, as far as its longer ask); `heard`: every ask of `live`,
/// `busy` where its touch had to move the mark and did not (its row was
/// passed over, or ended or rekeyed while the move waited for it: such a
/// session is not heard), with whether the node runs a workflow and how
/// long the mark holds (`workflow_running`, `alive_left_ms`:
/// [`LiveSession`]'s fields).
pub(crate) fn touch_ctes(wait_for_locks: bool) -> String {
    let lock = if wait_for_locks {
        "FOR NO KEY UPDATE OF s"
    } else {
        "FOR NO KEY UPDATE OF s SKIP LOCKED"
    };
    format!(
        "asks AS ( \
           SELECT * FROM unnest($1::bytea[], $2::float8[], $3::float8[]) \
             WITH ORDINALITY AS a(token_hash, alive_for, slack, ask) \
         ), live AS ( \
           SELECT a.ask, a.alive_for, s.token_hash, s.node_id, s.cert_serial, s.purpose, s.alive_until, s.created_at, \
             s.alive_until < now() + make_interval(secs => a.alive_for) - make_interval(secs => a.slack) AS moves \
           FROM asks a JOIN agent_sessions s ON s.token_hash = a.token_hash \
           JOIN node_certs c ON c.serial = s.cert_serial \
           WHERE s.expires_at > now() AND c.revoked_at IS NULL \
             AND c.epoch = coalesce((SELECT epoch FROM node_agent_epochs e WHERE e.node_id = c.node_id), 0) \
         ), moving AS ( \
           SELECT token_hash, max(alive_for) AS alive_for FROM live WHERE moves GROUP BY token_hash \
         ), locked AS MATERIALIZED ( \
           SELECT s.token_hash, m.alive_for FROM agent_sessions s JOIN moving m ON m.token_hash = s.token_hash \
           ORDER BY s.token_hash {lock} \
         ), touched AS ( \
           UPDATE agent_sessions s SET alive_until = greatest(s.alive_until, now() + make_interval(secs => l.alive_for)) \
           FROM locked l WHERE s.token_hash = l.token_hash \
           RETURNING s.token_hash, s.alive_until \
         ), heard AS ( \
           SELECT live.*, live.moves AND t.token_hash IS NULL AS busy, \
             EXISTS (SELECT 1 FROM workflows w WHERE w.node_id = live.node_id AND w.status = 'running') AS workflow_running, \
             (extract(epoch FROM (coalesce(t.alive_until, live.alive_until) - now())) * 1000)::bigint AS alive_left_ms \
           FROM live LEFT JOIN touched t ON t.token_hash = live.token_hash \
         )"
    )
}

/// What one agent request asks of its session's touch: the token's hash,
/// how long the session is marked alive from now, the slack within which
/// a mark already in place is left as it is, and whether the request (a
/// poll) takes its commands as well
/// ([`crate::commands::sessions_touch_and_take`]).
#[derive(Debug, Clone, Copy)]
pub struct TouchAsk<'a> {
    pub hash: &'a [u8],
    pub alive_for_ms: u64,
    pub slack_ms: u64,
    pub takes_commands: bool,
}

impl TouchAsk<'_> {
    /// The binds of [`touch_ctes`] for `asks`: hashes, and the marks and
    /// slacks in seconds (a slack never more than its mark).
    pub(crate) fn binds(asks: &[TouchAsk<'_>]) -> (Vec<Vec<u8>>, Vec<f64>, Vec<f64>) {
        (
            asks.iter().map(|a| a.hash.to_vec()).collect(),
            asks.iter()
                .map(|a| a.alive_for_ms as f64 / 1000.0)
                .collect(),
            asks.iter()
                .map(|a| a.slack_ms.min(a.alive_for_ms) as f64 / 1000.0)
                .collect(),
        )
    }
}

/// A live session whose certificate is in force (unrevoked, of the
/// node's current epoch), marked alive for at least `alive_for_ms` from now (a
/// request is a sign of life; a long poll keeps it for as long as it waits),
/// less at most `slack_ms`.
///
/// The mark is written only where it moves by more than `slack_ms`: a
/// result or a heartbeat during a long poll's window (no slack), or a poll
/// made within `slack_ms` of the last one that moved it, finds the session
/// without writing it, so its transaction takes no transaction id and no WAL
/// flush. [`LiveSession::alive_left_ms`] says how long the mark holds, so a
/// poll that did not move it waits no longer than that.
///
/// A touch that moves the mark answers only if its update found the
/// session still there: one ended (deleted, rekeyed) while the update
/// waited for its row is refused, as the plain update refused it. A touch
/// that moves nothing reads the session as of its statement's start.
pub async fn session_touch_live(
    db: &Db,
    hash: &[u8],
    alive_for_ms: u64,
    slack_ms: u64,
) -> Result<Option<LiveSession>, DbError> {
    // One touch alone, waiting for its row: the gathered statement's path.
    let ask = TouchAsk {
        hash,
        alive_for_ms,
        slack_ms,
        takes_commands: false,
    };
    let mut found = crate::commands::sessions_touch_and_take(db, &[ask], &[], 0, 0, true).await?;
    Ok(match found.pop() {
        Some(crate::commands::Touched::Heard(session, _)) => Some(session),
        _ => None,
    })
}

/// Records that the API turned an agent's request away unheard now (its
/// agent pool exhausted), or holds one in line for that pool: the mark
/// only moves forward.
pub async fn turnaway_record(db: &Db) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO agent_turnaways (id, at) VALUES (1, now()) \
         ON CONFLICT (id) DO UPDATE SET at = greatest(agent_turnaways.at, excluded.at)",
    )
    .execute(db.pool())
    .await?;
    Ok(())
}

/// When the API last turned an agent's request away unheard, if ever.
pub async fn turnaway_last_in_txn(tx: &mut Tx<'_>) -> Result<Option<DateTime<Utc>>, DbError> {
    Ok(
        sqlx::query_scalar("SELECT at FROM agent_turnaways WHERE id = 1")
            .fetch_optional(&mut **tx)
            .await?,
    )
}

/// The node's newest live session of `purpose` (the one its commands go
/// to): `(cert serial, alive until)`.
pub async fn session_newest_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
    purpose: &str,
) -> Result<Option<(String, DateTime<Utc>)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT cert_serial, alive_until FROM agent_sessions \
         WHERE node_id = $1 AND purpose = $2 AND expires_at > now() ORDER BY created_at DESC LIMIT 1",
    )
    .bind(node_id)
    .bind(purpose)
    .fetch_optional(&mut **tx)
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

/// Forgets the node's fact `kind`; whether there was one.
pub async fn node_fact_delete_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
    kind: &str,
) -> Result<bool, DbError> {
    let done = sqlx::query("DELETE FROM node_facts WHERE node_id = $1 AND kind = $2")
        .bind(node_id)
        .bind(kind)
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected() > 0)
}

/// A heartbeat of the node's installed OS while a workflow runs, in one
/// statement (one round trip on the agents' pool, not a transaction's
/// four): merges `data`'s keys into the node's fact `kind` (a heartbeat
/// keeps what the join recorded), and nudges the node's steps that wait for
/// its agent, as [`crate::workflows::steps_nudge_for_node_in_txn`] (never
/// behind an engine's batch). Both or neither: the statement is atomic,
/// and both are hints the next heartbeat redoes.
pub async fn heartbeat_record(
    db: &Db,
    node_id: &str,
    kind: &str,
    data: &serde_json::Value,
) -> Result<(), DbError> {
    sqlx::query(concat!(
        "WITH fact AS (INSERT INTO node_facts (node_id, kind, data) VALUES ($1, $3, $4) \
         ON CONFLICT (node_id, kind) DO UPDATE SET data = node_facts.data || $4, updated_at = now()), ",
        crate::workflows::steps_nudge_ctes!(),
        " SELECT pg_notify($2, '') WHERE EXISTS (SELECT 1 FROM woken)"
    ))
    .bind(node_id)
    .bind(crate::workflows::NOTIFY_CHANNEL)
    .bind(kind)
    .bind(data)
    .execute(&mut *db.acquire().await?)
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
