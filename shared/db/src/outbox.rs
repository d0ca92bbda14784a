//! The transactional outbox: messages inserted in the transaction of the
//! change that caused them, published by one relay at a time (an advisory
//! lock), in sequence order, and marked published afterwards.

use sqlx::Connection as _;
use std::future::Future as _;

use crate::{Db, DbError, Tx};

/// The channel a commit with new outbox rows notifies.
pub const NOTIFY_CHANNEL: &str = "bcm_outbox";

/// A message to publish once the transaction commits.
#[derive(Debug, Clone, PartialEq)]
pub struct NewOutboxMessage {
    /// The message id: the CloudEvents id and the `Nats-Msg-Id`.
    pub id: String,
    pub subject: String,
    pub payload: serde_json::Value,
    /// NATS headers to publish with (e.g. `traceparent`).
    pub headers: serde_json::Map<String, serde_json::Value>,
    pub node_id: Option<String>,
}

/// A stored, unpublished message.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxMessage {
    pub seq: i64,
    pub id: String,
    pub subject: String,
    pub payload: serde_json::Value,
    pub headers: serde_json::Value,
    /// When its transaction wrote it (the relay's lag is counted from here).
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Inserts messages and notifies the relay on commit.
pub async fn outbox_insert_in_txn(
    tx: &mut Tx<'_>,
    msgs: &[NewOutboxMessage],
) -> Result<(), DbError> {
    if msgs.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = msgs.iter().map(|m| m.id.as_str()).collect();
    let subjects: Vec<&str> = msgs.iter().map(|m| m.subject.as_str()).collect();
    let payloads: Vec<serde_json::Value> = msgs.iter().map(|m| m.payload.clone()).collect();
    let headers: Vec<serde_json::Value> = msgs
        .iter()
        .map(|m| serde_json::Value::Object(m.headers.clone()))
        .collect();
    let nodes: Vec<Option<&str>> = msgs.iter().map(|m| m.node_id.as_deref()).collect();
    // One round trip: the rows, and the notification that wakes the relay
    // when they commit.
    sqlx::query(
        "WITH rows AS (INSERT INTO outbox (id, subject, payload, headers, node_id) \
         SELECT id, subject, payload, headers, node_id FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::jsonb[], $5::text[]) \
         WITH ORDINALITY AS t(id, subject, payload, headers, node_id, ord) ORDER BY ord RETURNING 1) \
         SELECT pg_notify($6, '') FROM (SELECT count(*) FROM rows) AS c",
    )
    .bind(&ids)
    .bind(&subjects)
    .bind(&payloads)
    .bind(&headers)
    .bind(&nodes)
    .bind(NOTIFY_CHANNEL)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// How many messages wait to be published.
pub async fn outbox_backlog(db: &Db) -> Result<i64, DbError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .fetch_one(db.pool())
            .await?,
    )
}

/// Every outbox message whose subject starts with `prefix`: `(id,
/// published)` (the chaos test's ledger of what was committed).
pub async fn outbox_ids_with_prefix(db: &Db, prefix: &str) -> Result<Vec<(String, bool)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT id, published_at IS NOT NULL FROM outbox WHERE starts_with(subject, $1) ORDER BY seq",
    )
    .bind(prefix)
    .fetch_all(db.pool())
    .await?)
}

/// Deletes published messages older than `keep`, returning how many.
pub async fn outbox_prune(db: &Db, keep: std::time::Duration) -> Result<u64, DbError> {
    let secs = keep.as_secs_f64();
    Ok(sqlx::query(
        "DELETE FROM outbox WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1)",
    )
    .bind(secs)
    .execute(db.pool())
    .await?
    .rows_affected())
}

const RELAY_LOCK_KEY: i64 = 0x6263_6d5f_6f75_7462; // "bcm_outb"

/// Held by the one relay that publishes. The lock lives on a connection of
/// its own, detached from the pool, so it is released when the lease drops
/// or the process dies.
pub struct RelayLease {
    conn: sqlx::PgConnection,
}

impl std::fmt::Debug for RelayLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelayLease")
    }
}

impl RelayLease {
    /// Tries to become the relay; `None` when another relay holds the lease.
    pub async fn try_acquire(db: &Db) -> Result<Option<Self>, DbError> {
        let mut conn = db.pool().acquire().await?.detach();
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(RELAY_LOCK_KEY)
            .fetch_one(&mut conn)
            .await?;
        if got {
            // The outbox grows from empty by thousands of rows a second
            // between two autoanalyze runs. A generic plan cached while it
            // was small (a sequential scan filtering `seq = ANY($1)`) stays
            // cached while it grows, and each mark then reads the whole
            // table: 80–180 ms a batch at 5,000–8,000 rows (auto_explain,
            // bench-lifecycle N=1,000), the "relay stall". Planned for each
            // call, the marks and fetches use the indexes the table has now.
            sqlx::query("SET plan_cache_mode = force_custom_plan")
                .execute(&mut conn)
                .await?;
            Ok(Some(Self { conn }))
        } else {
            let _ = conn.close().await;
            Ok(None)
        }
    }

    /// The oldest unpublished messages, in sequence order, read on the
    /// lease's own connection (the relay never waits for the pool).
    pub async fn fetch_unpublished(&mut self, limit: i64) -> Result<Vec<OutboxMessage>, DbError> {
        Ok(sqlx::query_as(
            "SELECT seq, id, subject, payload, headers, created_at FROM outbox WHERE published_at IS NULL ORDER BY seq LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&mut self.conn)
        .await?)
    }

    /// Marks `published` published and reads the oldest unpublished
    /// messages other than those and `leave_out` (published, not yet
    /// acknowledged), in one statement on the lease's own connection: the
    /// relay's mark of one batch and its read of the next cost one round
    /// trip and one commit. (The statement's read sees the table as it was
    /// before the mark, hence the exclusion.) A relay that dies between
    /// publishing a batch and marking it publishes it again; JetStream
    /// drops the repeat by its message id.
    pub async fn mark_and_fetch(
        &mut self,
        published: &[i64],
        leave_out: &[i64],
        limit: i64,
    ) -> Result<Vec<OutboxMessage>, DbError> {
        if published.is_empty() && leave_out.is_empty() {
            return self.fetch_unpublished(limit).await;
        }
        Ok(sqlx::query_as(
            "WITH marked AS (UPDATE outbox SET published_at = now() WHERE seq = ANY($1)) \
             SELECT seq, id, subject, payload, headers, created_at FROM outbox \
             WHERE published_at IS NULL AND seq <> ALL($1) AND seq <> ALL($2) ORDER BY seq LIMIT $3",
        )
        .bind(published)
        .bind(leave_out)
        .bind(limit)
        .fetch_all(&mut self.conn)
        .await?)
    }

    /// Marks messages published, on the lease's own connection.
    pub async fn mark_published(&mut self, seqs: &[i64]) -> Result<(), DbError> {
        sqlx::query("UPDATE outbox SET published_at = now() WHERE seq = ANY($1)")
            .bind(seqs)
            .execute(&mut self.conn)
            .await?;
        Ok(())
    }

    /// Checks the lease's connection is alive (the lock with it).
    pub async fn check(&mut self) -> Result<(), DbError> {
        self.conn.ping().await?;
        Ok(())
    }
}

/// Wakes the relay when a commit added outbox rows.
///
/// Its channel is read as notifications arrive, whether the relay is
/// waiting or busy publishing ([`crate::listen`] says why that matters).
/// The wake-ups coalesce: one waits for the relay however many commits
/// came meanwhile.
pub struct OutboxListener {
    wake: std::sync::Arc<tokio::sync::Notify>,
    _reader: crate::listen::ChannelReader,
}

impl OutboxListener {
    /// Waits for a notification since the last wait or [`Self::drain`].
    /// A lost `LISTEN` connection wakes it too once listening again
    /// (commits meanwhile announced nothing).
    pub async fn notified(&mut self) {
        self.wake.notified().await;
    }

    /// Forgets a notification already received, without waiting: the
    /// commits it announced are covered by the read that follows, so it
    /// must not wake another.
    pub fn drain(&mut self) {
        let pending = self.wake.notified();
        tokio::pin!(pending);
        // A stored wake-up completes the first poll, which consumes it.
        let waker = std::task::Waker::noop();
        let _ = pending
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker));
    }
}

/// Listens for commits that added outbox rows.
pub async fn outbox_listener(db: &Db) -> OutboxListener {
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let woken = wake.clone();
    let reader = crate::listen::read_channel(db, NOTIFY_CHANNEL, move |_| woken.notify_one()).await;
    OutboxListener {
        wake,
        _reader: reader,
    }
}

/// How many outbox rows a node has, published or not.
pub async fn outbox_count_for_node(db: &Db, node_id: &str) -> Result<i64, DbError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE node_id = $1")
            .bind(node_id)
            .fetch_one(db.pool())
            .await?,
    )
}
