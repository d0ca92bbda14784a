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

/// Fault injection for crash tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct RelayFaults {
    /// The relay stops (as if killed) after publishing this many batches,
    /// before it marks the last one published.
    pub halt_after_publishing_batches: Option<u32>,
    /// NATS refuses the publish of this batch (counted from 1), after the
    /// batch before it was acknowledged and before it was marked; the relay
    /// gives up on NATS as it would then, and stops.
    pub refuse_publishing_batch: Option<u32>,
}

impl RelayFaults {
    /// Whether NATS refuses the next batch, with `published` batches out.
    fn refuses_next(&self, published: u32) -> bool {
        self.refuse_publishing_batch
            .is_some_and(|n| published + 1 >= n)
    }
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
    let mut pruning = Pruning::default();
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
            &mut pruning,
            lease,
            &shutdown,
        )
        .await
        {
            Err(RoundError::Halted) => {
                tracing::warn!("outbox relay halted by fault injection");
                break;
            }
            Err(RoundError::Bus(e)) if faults.refuses_next(published_batches) => {
                tracing::warn!(error = %e, "outbox relay halted by fault injection");
                break;
            }
            Err(e) => {
                tracing::warn!(error = %e, "outbox relay lost its footing; retrying");
                wait(&shutdown, Duration::from_millis(500)).await;
            }
            Ok(()) => {}
        }
    }
    pruning.stop();
}

/// Runs the relay ([`run`]) on a thread of its own, with a runtime, a NATS
/// connection and a Postgres pool of its own, so that its rounds never
/// queue behind the work of the process it shares. On the API's runtime,
/// at the height of a release, a round of 600 messages waited 840 ms for
/// its acknowledgements behind ten thousand agents' requests, and events
/// waited seconds in the outbox (`bench-lifecycle --nodes 10000
/// --processes`, docs/performance.md). Postgres or NATS away at the start
/// is waited for, as the lease is. The task returned ends when the relay
/// has stopped (its pool is closed after, a second at most); a panic on
/// the thread stops the process, which would otherwise serve on with no
/// relay.
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
            let _stop_on_panic = StopOnPanic(shutdown.clone());
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
                let Some(db) = until_stopped(&shutdown, "Postgres", || async {
                    Db::connect_waiting(&database_url, 3, Duration::from_secs(5)).await
                })
                .await
                else {
                    return;
                };
                let db = db.named("relay");
                if let Some(bus) = until_stopped(&shutdown, "NATS", || Bus::attach(&bus)).await {
                    run(db.clone(), bus, cfg, RelayFaults::default(), shutdown).await;
                }
                let _ = stopped.send(());
                let _ = tokio::time::timeout(Duration::from_secs(1), db.close()).await;
            });
        })?;
    Ok(tokio::spawn(async move {
        let _ = on_stop.await;
    }))
}

/// Cancels the process's stop token if the thread it lives on panics.
struct StopOnPanic(CancellationToken);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("the outbox relay's thread panicked; stopping");
            self.0.cancel();
        }
    }
}

/// `connect` again, each second, until it succeeds or `shutdown`.
async fn until_stopped<T, E, F, Fut>(
    shutdown: &CancellationToken,
    what: &str,
    connect: F,
) -> Option<T>
where
    E: std::fmt::Display,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    while !shutdown.is_cancelled() {
        match connect().await {
            Ok(v) => return Some(v),
            Err(e) => {
                tracing::warn!(error = %e, "the outbox relay cannot reach {what} yet; trying again");
                wait(shutdown, Duration::from_secs(1)).await;
            }
        }
    }
    None
}

/// The week's prune of published rows: at most one at a time, across the
/// relay's leases, beside the relay rather than in its way (a prune reads
/// the whole table).
#[derive(Default)]
struct Pruning {
    next: Option<tokio::time::Instant>,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl Pruning {
    fn when_due(&mut self, db: &Db) {
        let now = tokio::time::Instant::now();
        if self.next.is_some_and(|next| now < next)
            || self.running.as_ref().is_some_and(|p| !p.is_finished())
        {
            return;
        }
        self.next = Some(now + Duration::from_secs(600));
        let db = db.clone();
        self.running = Some(tokio::spawn(async move {
            match bcm_db::outbox::outbox_prune(&db, PUBLISHED_RETENTION).await {
                Ok(n) if n > 0 => tracing::info!(rows = n, "pruned published outbox rows"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "outbox prune failed"),
            }
        }));
    }

    fn stop(&mut self) {
        if let Some(p) = self.running.take() {
            p.abort();
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

/// The batch's sequence numbers once acknowledged, if one is in flight.
async fn acknowledged_if(in_flight: Option<InFlight>) -> Result<Option<Vec<i64>>, RoundError> {
    match in_flight {
        Some(batch) => batch.acknowledged().await.map(Some),
        None => Ok(None),
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
/// anything after it; a batch is marked only once acknowledged, and what
/// was acknowledged is marked before the relay gives up on NATS (a batch
/// published again after an outage longer than JetStream's duplicate
/// window would reach consumers twice).
#[allow(clippy::too_many_arguments)]
async fn lead(
    db: &Db,
    bus: &Bus,
    cfg: &RelayConfig,
    faults: RelayFaults,
    published_batches: &mut u32,
    pruning: &mut Pruning,
    lease: bcm_db::outbox::RelayLease,
    shutdown: &CancellationToken,
) -> Result<(), RoundError> {
    let mut rounds = Rounds {
        lease,
        listener: bcm_db::outbox::outbox_listener(db).await,
        acked: vec![],
        in_flight: None,
    };
    let outcome = rounds
        .run(db, bus, cfg, faults, published_batches, pruning, shutdown)
        .await;
    if let Err(RoundError::Bus(_)) = &outcome {
        if !rounds.acked.is_empty() {
            if let Err(e) = rounds.lease.mark_published(&rounds.acked).await {
                tracing::warn!(error = %e, "cannot mark the acknowledged batch published; it will be published again");
            }
        }
    }
    outcome
}

/// The relay's state while it holds the lease.
struct Rounds {
    lease: bcm_db::outbox::RelayLease,
    listener: bcm_db::outbox::OutboxListener,
    /// Published and acknowledged, not yet marked: marked by the next read.
    acked: Vec<i64>,
    /// Published, acknowledgements awaited during the next read.
    in_flight: Option<InFlight>,
}

impl Rounds {
    #[allow(clippy::too_many_arguments)]
    async fn run(
        &mut self,
        db: &Db,
        bus: &Bus,
        cfg: &RelayConfig,
        faults: RelayFaults,
        published_batches: &mut u32,
        pruning: &mut Pruning,
        shutdown: &CancellationToken,
    ) -> Result<(), RoundError> {
        let poll = Duration::from_millis(cfg.poll_ms.max(10));
        let linger = Duration::from_millis(cfg.linger_ms.min(100));
        let batch_size = cfg.batch.max(1);
        // The last read found less than a batch: the next waits for commits.
        let mut caught_up = false;
        loop {
            pruning.when_due(db);
            if caught_up {
                // Nothing else was waiting: the next read waits, as the
                // batch just published is acknowledged, for a notification
                // and the linger (so the commits of that moment go out
                // together, not a few rows a round), or the poll interval.
                let in_flight = self.in_flight.take();
                let listener = &mut self.listener;
                let acknowledged = acknowledged_if(in_flight);
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
                    self.acked.extend(seqs);
                }
            }
            if shutdown.is_cancelled() {
                // What is acknowledged first, then what is still on its way.
                if !self.acked.is_empty() {
                    self.lease.mark_published(&self.acked).await?;
                    self.acked.clear();
                }
                if let Some(batch) = self.in_flight.take() {
                    self.acked = batch.acknowledged().await?;
                    self.lease.mark_published(&self.acked).await?;
                }
                return Ok(());
            }
            let leave_out: Vec<i64> = self
                .in_flight
                .as_ref()
                .map(|b| b.seqs.clone())
                .unwrap_or_default();
            let in_flight = self.in_flight.take();
            let (lease, acked) = (&mut self.lease, &self.acked);
            let (read, acknowledged) = tokio::join!(
                async {
                    let started = std::time::Instant::now();
                    let rows = lease.mark_and_fetch(acked, &leave_out, batch_size).await;
                    metrics::histogram!("bcm_outbox_relay_round_seconds", "phase" => "read")
                        .record(started.elapsed().as_secs_f64());
                    rows
                },
                acknowledged_if(in_flight)
            );
            let rows = read?;
            // Marked by that statement.
            self.acked.clear();
            if let Some(seqs) = acknowledged? {
                self.acked = seqs;
            }
            caught_up = (rows.len() as i64) < batch_size;
            if rows.is_empty() {
                continue;
            }
            if faults.refuses_next(*published_batches) {
                return Err(bcm_bus::BusError::Publish {
                    subject: rows[0].subject.clone(),
                    why: "refused by fault injection".into(),
                }
                .into());
            }
            let batch = publish(bus, rows).await?;
            *published_batches += 1;
            if faults
                .halt_after_publishing_batches
                .is_some_and(|n| *published_batches >= n)
            {
                // As if killed once this batch is out: neither it nor the
                // acknowledged batch before it is marked.
                batch.acknowledged().await?;
                return Err(RoundError::Halted);
            }
            self.in_flight = Some(batch);
        }
    }
}
