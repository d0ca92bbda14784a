//! Shard ownership and the work sources of owned shards: a durable
//! JetStream consumer per shard for wake-ups, and a periodic look at every
//! owned node in a workflow-driven state.

use bcm_bus::consumer::{ConsumerSpec, Disposition, Handler, Incoming};
use bcm_bus::subjects::{shard_of, StreamKind};
use bcm_bus::Bus;
use bcm_contracts::work::ReconcileRequest;
use bcm_contracts::CloudEvent;
use bcm_core::{NodeId, ProvisionState};
use bcm_db::Db;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::{reconcile, ReconcilerConfig};

/// The kind of work the reconciler's shard leases are for.
pub const KIND: &str = "reconcile";

/// How long a round under way at a stop may take to finish.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(3);

/// How long a stopping worker tries to release its leases.
pub(crate) const LEAVE_WITHIN: Duration = Duration::from_secs(2);

/// Runs the lease loop, the per-shard consumers and the poll loop.
pub async fn run(
    db: Db,
    bus: Bus,
    cfg: ReconcilerConfig,
    holder: String,
    shutdown: CancellationToken,
) {
    let shards = bus.subjects().shards();
    let ttl = Duration::from_millis(cfg.lease_ttl_ms.max(300));
    let mut owned: HashMap<u32, CancellationToken> = HashMap::new();
    let mut next_poll = tokio::time::Instant::now();
    let mut polling: Option<tokio::task::JoinHandle<()>> = None;
    let offset = holder
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        % shards;
    tracing::info!(%holder, shards, "reconciler worker started");
    loop {
        let round = rebalance(
            &db, &bus, &cfg, &holder, shards, offset, ttl, &mut owned, &shutdown,
        );
        // A round under way at a stop gets a short grace, not the wait of
        // a database gone away; a lease a round cut short took is
        // released below, or expires.
        let Some(round) =
            bcm_telemetry::signals::drained("reconcile leases", &shutdown, STOP_GRACE, round).await
        else {
            break;
        };
        if let Err(e) = round {
            tracing::warn!(error = %e, "lease round failed");
        }
        metrics::gauge!("bcm_reconciler_owned_shards", "holder" => holder.clone())
            .set(owned.len() as f64);
        // One periodic look at a time: a slow round is not stacked upon.
        let idle = polling.as_ref().is_none_or(|p| p.is_finished());
        if idle && tokio::time::Instant::now() >= next_poll {
            next_poll =
                tokio::time::Instant::now() + Duration::from_millis(cfg.metal_poll_ms.max(10));
            let shard_set: Vec<u32> = owned.keys().copied().collect();
            let (db2, bus2, lock) = (db.clone(), bus.clone(), cfg.lock_timeout_ms);
            polling = Some(tokio::spawn(async move {
                look_at_owned(&db2, &bus2, &shard_set, shards, lock).await;
            }));
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep((ttl / 3).min(Duration::from_millis(cfg.metal_poll_ms.max(10)))) => {}
        }
    }
    for (_, stop) in owned.drain() {
        stop.cancel();
    }
    // Releasing the leases is a courtesy to the other workers (they take
    // the shards at once instead of at the leases' expiry): brief.
    match tokio::time::timeout(
        LEAVE_WITHIN,
        bcm_db::leases::worker_leave(&db, KIND, &holder),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not release leases on shutdown; they expire")
        }
        Err(_) => tracing::warn!("releasing leases on shutdown took too long; they expire"),
    }
}

#[allow(clippy::too_many_arguments)]
async fn rebalance(
    db: &Db,
    bus: &Bus,
    cfg: &ReconcilerConfig,
    holder: &str,
    shards: u32,
    offset: u32,
    ttl: Duration,
    owned: &mut HashMap<u32, CancellationToken>,
    shutdown: &CancellationToken,
) -> Result<(), bcm_db::DbError> {
    bcm_db::leases::worker_heartbeat(db, KIND, holder).await?;
    let alive = bcm_db::leases::workers_alive(db, KIND, ttl).await?.max(1) as u32;
    let fair = shards.div_ceil(alive);
    // Renew what we hold; drop what expired under us.
    let mut keep = vec![];
    for shard in owned.keys().copied().collect::<Vec<_>>() {
        if keep.len() as u32 >= fair {
            bcm_db::leases::lease_release(db, KIND, shard as i32, holder).await?;
            if let Some(stop) = owned.remove(&shard) {
                stop.cancel();
            }
            tracing::info!(shard, "released a shard for a fair share");
            continue;
        }
        if bcm_db::leases::lease_acquire(db, KIND, shard as i32, holder, ttl).await? {
            keep.push(shard);
        } else if let Some(stop) = owned.remove(&shard) {
            stop.cancel();
            tracing::warn!(shard, "lost a shard lease");
        }
    }
    // Take free or expired shards up to the fair share.
    let mut taken = vec![];
    let mut failed = None;
    for i in 0..shards {
        if owned.len() as u32 >= fair {
            break;
        }
        let shard = (offset + i) % shards;
        if owned.contains_key(&shard) {
            continue;
        }
        match bcm_db::leases::lease_acquire(db, KIND, shard as i32, holder, ttl).await {
            Ok(true) => {
                let stop = shutdown.child_token();
                owned.insert(shard, stop.clone());
                tokio::spawn(consume_shard(
                    db.clone(),
                    bus.clone(),
                    shard,
                    cfg.lock_timeout_ms,
                    stop,
                ));
                taken.push(shard);
            }
            Ok(false) => {}
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    // A new owner looks at its new shards' nodes at once: one look for all
    // the shards this round took (a worker starting takes every shard).
    if !taken.is_empty() {
        let (db2, bus2, lock) = (db.clone(), bus.clone(), cfg.lock_timeout_ms);
        tokio::spawn(async move {
            look_at_owned(&db2, &bus2, &taken, shards, lock).await;
        });
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Nodes a periodic look reads per statement.
pub const LOOK_PAGE: u32 = 1_000;

/// What a periodic look did: how many owned nodes it read, and how many
/// of them it passed over (the rest were settled at a glance).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LookReport {
    pub looked_at: usize,
    pub passed: usize,
}

/// The periodic look at every owned node in a workflow-driven state, for
/// what no wake-up asked for (a request lost, a pass that failed). Nodes
/// are read [`LOOK_PAGE`] at a time without a lock, with their workflows
/// (every node in such a state, each worker: the shard is a hash of the
/// id, filtered here); a node whose decision is to idle or wait at a
/// glance ([`bcm_core::reconcile::settled_at_a_glance`], most of them:
/// their workflows run) is not locked at all, and the others get a locked
/// pass, which decides again. A node whose row the look cannot read gets
/// the locked pass too, which fails for it alone.
pub async fn look_at_owned(
    db: &Db,
    bus: &Bus,
    owned: &[u32],
    shards: u32,
    lock_timeout_ms: u32,
) -> LookReport {
    look_at_owned_in_pages(db, bus, owned, shards, lock_timeout_ms, LOOK_PAGE).await
}

/// [`look_at_owned`], `page` nodes a statement.
pub async fn look_at_owned_in_pages(
    db: &Db,
    bus: &Bus,
    owned: &[u32],
    shards: u32,
    lock_timeout_ms: u32,
    page: u32,
) -> LookReport {
    let mut report = LookReport::default();
    if owned.is_empty() {
        return report;
    }
    let page = page.max(1);
    let states: Vec<ProvisionState> = ProvisionState::ALL
        .into_iter()
        .filter(|s| s.is_workflow_driven())
        .collect();
    let mut after: Option<NodeId> = None;
    loop {
        let rows =
            match bcm_db::nodes::node_glances_in_states(db, &states, after.as_ref(), page).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(error = %e, "poll: cannot list nodes");
                    break;
                }
            };
        let Some((last, _)) = rows.last() else { break };
        after = Some(*last);
        let full = rows.len() as u32 == page;
        for (id, glance) in rows
            .iter()
            .filter(|(id, _)| owned.contains(&shard_of(id, shards)))
        {
            report.looked_at += 1;
            let settled = match glance {
                Ok(g) => bcm_core::reconcile::settled_at_a_glance(g.facts, g.workflow.as_ref()),
                Err(e) => {
                    tracing::warn!(node = %id, error = %e, "poll: a node this reconciler cannot read at a glance; a locked pass looks");
                    false
                }
            };
            if settled {
                continue;
            }
            report.passed += 1;
            if let Err(e) = reconcile::node(db, bus, id, lock_timeout_ms).await {
                tracing::debug!(node = %id, error = %e, "poll: reconcile failed; next round retries");
            }
        }
        if !full {
            break;
        }
    }
    metrics::counter!("bcm_reconciler_look_nodes_total", "outcome" => "settled")
        .increment(report.looked_at.saturating_sub(report.passed) as u64);
    metrics::counter!("bcm_reconciler_look_nodes_total", "outcome" => "passed")
        .increment(report.passed as u64);
    report
}

/// The durable consumer of one shard's reconcile requests.
fn shard_spec(bus: &Bus, shard: u32) -> ConsumerSpec {
    let mut spec = ConsumerSpec::new(
        StreamKind::Work,
        format!("reconcile-{shard}"),
        vec![bus.subjects().reconcile_shard(shard)],
    );
    // One node's passes in order; the next request waits for the commit.
    spec.concurrency = 1;
    spec.ack_wait = Duration::from_secs(10);
    spec.backoff_initial = Duration::from_millis(200);
    spec.backoff_max = Duration::from_secs(5);
    spec
}

/// Runs a reconcile pass for each request of the shard.
struct ShardHandler {
    db: Db,
    bus: Bus,
    lock_timeout_ms: u32,
}

impl Handler<CloudEvent<ReconcileRequest>> for ShardHandler {
    async fn handle(&self, batch: &[Incoming<CloudEvent<ReconcileRequest>>]) -> Vec<Disposition> {
        let mut out = Vec::with_capacity(batch.len());
        for m in batch {
            let node = m.message.data.node_id;
            let pass = reconcile::node(&self.db, &self.bus, &node, self.lock_timeout_ms);
            // A pass continues the trace its message carries; without one
            // it starts none (a workflow it starts then continues the
            // trace of the verb that moved the node, kept with the node).
            let pass = match m.traceparent() {
                Some(tp) => {
                    let span = tracing::info_span!("reconcile", node_id = %node);
                    bcm_telemetry::set_remote_parent(&span, Some(&tp));
                    pass.instrument(span).await
                }
                None => pass.await,
            };
            out.push(match pass {
                // A request for a node that does not exist changes nothing.
                Ok(_) | Err(bcm_db::DbError::NotFound) => Disposition::Done,
                Err(e) => {
                    tracing::debug!(node = %node, error = %e, "reconcile failed; redelivering");
                    Disposition::Retry(e.to_string())
                }
            });
        }
        out
    }
}

async fn consume_shard(
    db: Db,
    bus: Bus,
    shard: u32,
    lock_timeout_ms: u32,
    stop: CancellationToken,
) {
    let spec = shard_spec(&bus, shard);
    let handler = Arc::new(ShardHandler {
        db,
        bus: bus.clone(),
        lock_timeout_ms,
    });
    bcm_bus::consumer::run(bus, spec, handler, stop).await
}
