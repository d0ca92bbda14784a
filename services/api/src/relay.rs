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
    1024
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

/// Runs the relay ([`run`]) on a thread of its own, with a runtime, a NATS
/// connection and a Postgres pool of its own, so that its rounds never
/// queue behind the work of the process it shares. On the API's runtime,
/// at the height of a release, a round of 600 messages waited 840 ms for
/// its acknowledgements behind ten thousand agents' requests, and events
/// waited seconds in the outbox (`bench-lifecycle --nodes 10000
/// --processes`, docs/performance.md). The task returned ends when the
/// relay has stopped.
pub fn run_on_own_thread(
    database_url: String,
    bus: bcm_bus::BusConfig,
    cfg: RelayConfig,
    shutdown: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let (stopped, on_stop) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("bcm-relay".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "the outbox relay cannot start its runtime");
                    shutdown.cancel();
                    return;
                }
            };
            runtime.block_on(async move {
                let db = match Db::connect(&database_url, 3).await {
                    Ok(db) => db.named("relay"),
                    Err(e) => {
                        tracing::error!(error = %e, "the outbox relay cannot reach Postgres");
                        shutdown.cancel();
                        return;
                    }
                };
                let bus = match Bus::attach(&bus).await {
                    Ok(bus) => bus,
                    Err(e) => {
                        tracing::error!(error = %e, "the outbox relay cannot reach NATS");
                        shutdown.cancel();
                        return;
                    }
                };
                run(db.clone(), bus, cfg, RelayFaults::default(), shutdown).await;
                db.close().await;
            });
            drop(stopped);
        })?;
    Ok(tokio::spawn(async move {
        let _ = on_stop.await;
    }))
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

/// A batch published whose acknowledgements are still awaited.
struct InFlight {
    seqs: Vec<i64>,
    created_at: Vec<chrono::DateTime<chrono::Utc>>,
    acks: Vec<Ack>,
    started: std::time::Instant,
}

type Ack =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), bcm_bus::BusError>> + Send>>;

impl InFlight {
    /// Waits for every acknowledgement; the batch's sequence numbers, to
    /// be marked published.
    async fn acknowledged(self) -> Result<Vec<i64>, RoundError> {
        for ack in self.acks {
            ack.await?;
        }
        metrics::histogram!("bcm_outbox_relay_round_seconds", "phase" => "publish")
            .record(self.started.elapsed().as_secs_f64());
        // From each row's commit (about: its insert) to the server's ack.
        let now = chrono::Utc::now();
        for created_at in &self.created_at {
            let lag = (now - *created_at).num_microseconds().unwrap_or(0).max(0);
            metrics::histogram!("bcm_outbox_lag_seconds").record(lag as f64 / 1e6);
        }
        metrics::counter!("bcm_outbox_published_total").increment(self.seqs.len() as u64);
        Ok(self.seqs)
    }
}

/// Publishes `rows` in order without waiting for their acknowledgements.
async fn publish(
    bus: &Bus,
    rows: Vec<bcm_db::outbox::OutboxMessage>,
) -> Result<InFlight, RoundError> {
    let started = std::time::Instant::now();
    let mut batch = InFlight {
        seqs: Vec::with_capacity(rows.len()),
        created_at: Vec::with_capacity(rows.len()),
        acks: Vec::with_capacity(rows.len()),
        started,
    };
    for row in rows {
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
        let ack = bus
            .publish_pipelined(&row.subject, &row.id, &headers, payload.into())
            .await?;
        batch.acks.push(Box::pin(ack));
        batch.seqs.push(row.seq);
        batch.created_at.push(row.created_at);
    }
    Ok(batch)
}

/// Publishes while it holds the lease. Rounds overlap: while a batch's
/// acknowledgements are awaited, one statement marks the batch before it
/// (acknowledged) and reads the next (leaving out both). A batch is
/// published only once the one before it is acknowledged, so messages go
/// out in sequence order and a failed publish stops the relay before
/// anything after it; a batch is marked only once acknowledged.
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
    let mut pruning: Option<tokio::task::JoinHandle<()>> = None;
    // Published and acknowledged, not yet marked: marked by the next read.
    let mut acked: Vec<i64> = vec![];
    // Published, acknowledgements awaited during the next read.
    let mut in_flight: Option<InFlight> = None;
    // The last read found less than a batch: the next waits for commits.
    let mut caught_up = false;
    loop {
        if tokio::time::Instant::now() >= next_prune
            && pruning.as_ref().is_none_or(|p| p.is_finished())
        {
            // Published rows are kept a week for audits, then pruned, off
            // the relay's way (a prune reads the whole table).
            let db = db.clone();
            pruning = Some(tokio::spawn(async move {
                match bcm_db::outbox::outbox_prune(&db, PUBLISHED_RETENTION).await {
                    Ok(n) if n > 0 => tracing::info!(rows = n, "pruned published outbox rows"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "outbox prune failed"),
                }
            }));
            next_prune += Duration::from_secs(600);
        }
        if caught_up {
            // Nothing else was waiting: the next read waits, as the batch
            // just published is acknowledged, for a notification and the
            // linger (so the commits of that moment go out together, and a
            // relay that keeps up does not read a few rows at a time), or
            // for the poll interval.
            let acknowledged = async {
                match in_flight.take() {
                    Some(batch) => batch.acknowledged().await.map(Some),
                    None => Ok(None),
                }
            };
            let woken = async {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = listener.notified() => {
                        if linger > Duration::ZERO {
                            tokio::time::sleep(linger).await;
                        }
                        // What arrived meanwhile is in the read that follows.
                        listener.drain();
                    }
                    _ = tokio::time::sleep(poll) => {}
                }
            };
            let (acknowledged, ()) = tokio::join!(acknowledged, woken);
            if let Some(seqs) = acknowledged? {
                acked.extend(seqs);
            }
        }
        if shutdown.is_cancelled() {
            if let Some(batch) = in_flight.take() {
                acked.extend(batch.acknowledged().await?);
            }
            if !acked.is_empty() {
                lease.mark_published(&acked).await?;
            }
            return Ok(());
        }
        let read_started = std::time::Instant::now();
        let leave_out: Vec<i64> = in_flight
            .as_ref()
            .map(|b| b.seqs.clone())
            .unwrap_or_default();
        let batch_size = cfg.batch.max(1);
        let (rows, acknowledged) = tokio::join!(
            lease.mark_and_fetch(&acked, &leave_out, batch_size),
            async {
                match in_flight.take() {
                    Some(batch) => batch.acknowledged().await.map(Some),
                    None => Ok(None),
                }
            }
        );
        let rows = rows?;
        acked.clear();
        if let Some(seqs) = acknowledged? {
            acked = seqs;
        }
        caught_up = (rows.len() as i64) < batch_size;
        if rows.is_empty() {
            continue;
        }
        metrics::histogram!("bcm_outbox_relay_round_seconds", "phase" => "read")
            .record(read_started.elapsed().as_secs_f64());
        let batch = publish(bus, rows).await?;
        *published_batches += 1;
        if faults
            .halt_after_publishing_batches
            .is_some_and(|n| *published_batches >= n)
        {
            // As if killed once this batch is out: the batch before it
            // is marked (its statement would have run meanwhile), this
            // one is not.
            batch.acknowledged().await?;
            if !acked.is_empty() {
                lease.mark_published(&acked).await?;
            }
            return Err(RoundError::Halted);
        }
        in_flight = Some(batch);
    }
}
