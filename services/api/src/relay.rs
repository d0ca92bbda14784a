//! The outbox relay: publishes committed outbox rows to JetStream, in
//! sequence order, with `Nats-Msg-Id` = the row id, then marks them
//! published. One relay publishes at a time (a Postgres advisory lock);
//! a crash between publish and mark re-publishes on restart and JetStream
//! drops the duplicates within its window, so every event arrives once.

use bcm_bus::Bus;
use bcm_db::Db;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Relay settings.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct RelayConfig {
    /// Run the relay in this process.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Rows published per round trip.
    #[serde(default = "default_batch")]
    pub batch: i64,
    /// Poll interval when no notification arrives, in milliseconds.
    #[serde(default = "default_poll_ms")]
    pub poll_ms: u64,
    /// How long the relay lingers after a notification before it reads,
    /// in milliseconds, so the commits of that moment go out as one batch
    /// (one read and one mark) rather than one each.
    #[serde(default = "default_linger_ms")]
    pub linger_ms: u64,
}

/// How long published outbox rows are kept.
const PUBLISHED_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

fn yes() -> bool {
    true
}
fn default_batch() -> i64 {
    256
}
fn default_poll_ms() -> u64 {
    1000
}
fn default_linger_ms() -> u64 {
    5
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            batch: default_batch(),
            poll_ms: default_poll_ms(),
            linger_ms: default_linger_ms(),
        }
    }
}

/// Fault injection for crash tests: the relay stops (as if killed) after
/// publishing this many batches, before it marks the last one published.
#[derive(Debug, Clone, Copy, Default)]
pub struct RelayFaults {
    pub halt_after_publishing_batches: Option<u32>,
}

/// Why a relay round failed.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Db(#[from] bcm_db::DbError),
    #[error(transparent)]
    Bus(#[from] bcm_bus::BusError),
    #[error("halted by fault injection")]
    Halted,
}

/// Runs the relay until `shutdown`. Returns early only when a fault
/// injection halts it.
pub async fn run(
    db: Db,
    bus: Bus,
    cfg: RelayConfig,
    faults: RelayFaults,
    shutdown: CancellationToken,
) {
    let mut published_batches = 0u32;
    while !shutdown.is_cancelled() {
        let lease = match bcm_db::outbox::RelayLease::try_acquire(&db).await {
            Ok(Some(l)) => l,
            Ok(None) => {
                tracing::debug!("another relay holds the outbox lease; standing by");
                wait(&shutdown, Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot take the outbox lease");
                wait(&shutdown, Duration::from_secs(1)).await;
                continue;
            }
        };
        tracing::info!("outbox relay is the active publisher");
        match lead(
            &db,
            &bus,
            &cfg,
            faults,
            &mut published_batches,
            lease,
            &shutdown,
        )
        .await
        {
            Err(RoundError::Halted) => {
                tracing::warn!("outbox relay halted by fault injection");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "outbox relay lost its footing; retrying");
                wait(&shutdown, Duration::from_millis(500)).await;
            }
            Ok(()) => {}
        }
    }
}

async fn wait(shutdown: &CancellationToken, d: Duration) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(d) => {}
    }
}

/// The relay's hop in a message's trace: a span, a child of the trace
/// context the row was written with, whose context the published message
/// carries instead (a row written with none stays without).
fn relay_hop(subject: &str, headers: &mut [(String, String)]) {
    let Some((_, tp)) = headers
        .iter_mut()
        .find(|(k, _)| k == bcm_telemetry::TRACEPARENT)
    else {
        return;
    };
    let span = tracing::info_span!("outbox.publish", subject = %subject);
    bcm_telemetry::set_remote_parent(&span, Some(tp.as_str()));
    if let Some(own) = span.in_scope(bcm_telemetry::current_traceparent) {
        *tp = own;
    }
}

async fn lead(
    db: &Db,
    bus: &Bus,
    cfg: &RelayConfig,
    faults: RelayFaults,
    published_batches: &mut u32,
    mut lease: bcm_db::outbox::RelayLease,
    shutdown: &CancellationToken,
) -> Result<(), RoundError> {
    let mut listener = bcm_db::outbox::outbox_listener(db).await;
    let poll = Duration::from_millis(cfg.poll_ms.max(10));
    let linger = Duration::from_millis(cfg.linger_ms.min(100));
    let mut next_prune = tokio::time::Instant::now();
    // The batch published and not yet marked: marked by the next read.
    let mut unmarked: Vec<i64> = vec![];
    loop {
        if tokio::time::Instant::now() >= next_prune {
            // Published rows are kept a week for audits, then pruned.
            match bcm_db::outbox::outbox_prune(db, PUBLISHED_RETENTION).await {
                Ok(n) if n > 0 => tracing::info!(rows = n, "pruned published outbox rows"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "outbox prune failed"),
            }
            next_prune += Duration::from_secs(600);
        }
        if shutdown.is_cancelled() {
            if !unmarked.is_empty() {
                lease.mark_published(&unmarked).await?;
            }
            return Ok(());
        }
        let rows = lease.mark_and_fetch(&unmarked, cfg.batch.max(1)).await?;
        unmarked.clear();
        if rows.is_empty() {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = listener.notified() => {
                    if linger > Duration::ZERO {
                        tokio::time::sleep(linger).await;
                    }
                    // What arrived meanwhile is in the read that follows.
                    listener.drain();
                }
                _ = tokio::time::sleep(poll) => { lease.check().await?; }
            }
            continue;
        }
        let mut acks = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut headers: Vec<(String, String)> = row
                .headers
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                        .collect()
                })
                .unwrap_or_default();
            relay_hop(&row.subject, &mut headers);
            let payload = serde_json::to_vec(&row.payload).unwrap_or_default();
            acks.push(
                bus.publish_pipelined(&row.subject, &row.id, &headers, payload.into())
                    .await?,
            );
        }
        for ack in acks {
            ack.await?;
        }
        *published_batches += 1;
        if faults
            .halt_after_publishing_batches
            .is_some_and(|n| *published_batches >= n)
        {
            return Err(RoundError::Halted);
        }
        unmarked = rows.iter().map(|r| r.seq).collect();
        // From each row's commit (about: its insert) to the server's ack.
        let now = chrono::Utc::now();
        for row in &rows {
            let lag = (now - row.created_at)
                .num_microseconds()
                .unwrap_or(0)
                .max(0);
            metrics::histogram!("bcm_outbox_lag_seconds").record(lag as f64 / 1e6);
        }
        metrics::counter!("bcm_outbox_published_total").increment(rows.len() as u64);
    }
}
