//! The bulk runner: one reconciler at a time (a lease) rolls approved bulk
//! batches out in waves. Each round it settles the started nodes (the
//! chain ended well in the operation's settled state, or the node failed,
//! or another verb took the node over), expires batches past their expiry,
//! and starts queued nodes up to the pool's `bulk_concurrency` and the
//! site's `bulk_site_concurrency`, applying the verb to each node on its
//! own (the state table decides; a node whose state now refuses the verb
//! is refused with its code) under the batch. It publishes `bulk.progress`
//! when counts move and `bulk.finished` when nothing is left.

use bcm_bus::Bus;
use bcm_contracts::events::{types, BulkCounts, BulkFinished, BulkProgress};
use bcm_core::batch::{BatchState, BulkNodeState};
use bcm_core::{NodeId, ProvisionState};
use bcm_db::batches::Batch;
use bcm_db::{Db, DbError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::ReconcilerConfig;

/// The lease kind of the runner.
pub const KIND: &str = "bulk-runner";
/// Nodes started per transaction within a wave.
const START_CHUNK: usize = 100;

/// Leads the runner whenever this worker holds the lease, until `shutdown`.
pub async fn run(
    db: Db,
    bus: Bus,
    cfg: ReconcilerConfig,
    holder: String,
    shutdown: CancellationToken,
) {
    let tick = Duration::from_millis(cfg.bulk_tick_ms.max(50));
    let ttl = Duration::from_millis(cfg.lease_ttl_ms.max(300));
    let (db, bus, cfg) = (&db, &bus, &cfg);
    crate::leader::lead(
        db,
        KIND,
        &holder,
        ttl.max(tick * 3),
        tick,
        &shutdown,
        || async move {
            if let Err(e) = round(db, bus, cfg).await {
                tracing::warn!(error = %e, "bulk round failed");
            }
        },
    )
    .await;
}

fn tenant(b: &Batch) -> Result<bcm_core::TenantId, DbError> {
    b.header
        .tenant_id
        .parse()
        .map_err(|_| DbError::Corrupt(format!("batch {} tenant", b.header.batch_id)))
}

async fn counts(db: &Db, batch: &str) -> Result<BulkCounts, DbError> {
    Ok(bcm_db::batches::batch_counts(db, batch).await?.0)
}

/// One round over every open bulk. Returns how many nodes it started.
pub async fn round(db: &Db, bus: &Bus, cfg: &ReconcilerConfig) -> Result<usize, DbError> {
    expire(db, bus).await?;
    let mut started = 0;
    for b in bcm_db::batches::bulk_runnable(db).await? {
        let moved = settle(db, &b).await?;
        let n = start_wave(db, bus, cfg, &b).await?;
        started += n;
        let c = counts(db, &b.header.batch_id).await?;
        let mut tx = db.begin().await?;
        let t = tenant(&b)?;
        let mut rows = vec![];
        if c.queued == 0 && c.started == 0 {
            // Only the round that finishes it says so (a cancel or a
            // rejection meanwhile published its own end).
            let moved = bcm_db::batches::batch_set_state_in_txn(
                &mut tx,
                &b.header.batch_id,
                &[BatchState::Approved, BatchState::Running],
                BatchState::Finished,
                None,
            )
            .await?;
            if !moved {
                continue;
            }
            rows.push(bcm_bus::outgoing::batch_event(
                bus.subjects(),
                &t,
                &b.header.batch_id,
                types::BULK_FINISHED,
                BulkFinished {
                    batch_id: b.header.batch_id.clone(),
                    tenant_id: t.clone(),
                    state: BatchState::Finished,
                    counts: c,
                    reason: None,
                },
            ));
            tracing::info!(batch = %b.header.batch_id, "bulk finished");
        } else if moved + n > 0 {
            rows.push(bcm_bus::outgoing::batch_event(
                bus.subjects(),
                &t,
                &b.header.batch_id,
                types::BULK_PROGRESS,
                BulkProgress {
                    batch_id: b.header.batch_id.clone(),
                    tenant_id: t.clone(),
                    counts: c,
                },
            ));
        }
        let rows: Vec<_> = rows.into_iter().map(bcm_metal::outbox::row).collect();
        bcm_metal::outbox::write_in_txn(&mut tx, rows).await?;
        tx.commit().await.map_err(DbError::from)?;
    }
    // Started nodes of batches cancelled or rejected while they ran finish
    // their chains; they are settled too.
    for b in bcm_db::batches::bulk_ended_with_started(db).await? {
        settle(db, &b).await?;
    }
    Ok(started)
}

/// Expires batches past their expiry: queued nodes are cancelled (code
/// `EXPIRED`); started ones cannot send another destructive command.
async fn expire(db: &Db, bus: &Bus) -> Result<(), DbError> {
    for b in bcm_db::batches::batches_expired(db).await? {
        let mut tx = db.begin().await?;
        let moved = bcm_db::batches::batch_set_state_in_txn(
            &mut tx,
            &b.header.batch_id,
            &[
                BatchState::AwaitingApproval,
                BatchState::Approved,
                BatchState::Running,
            ],
            BatchState::Expired,
            Some("expired before it finished"),
        )
        .await?;
        bcm_db::batches::bulk_cancel_queued_in_txn(&mut tx, &b.header.batch_id).await?;
        // A held one-leaf command goes out refused (a rotation rolls back).
        let refused =
            bcm_metal::batches::release_held_refused_in_txn(&mut tx, &b.header.batch_id).await?;
        let mut rows: Vec<_> = refused.into_iter().collect();
        // The bulk's end is recorded in the transaction that ends it: a
        // stop or a kill after the commit cannot lose it (an expired batch
        // is never looked at again).
        let finished = moved && b.scope == "bulk";
        if finished {
            let c = bcm_db::batches::batch_counts_in_txn(&mut tx, &b.header.batch_id)
                .await?
                .0;
            let t = tenant(&b)?;
            let ev = bcm_bus::outgoing::batch_event(
                bus.subjects(),
                &t,
                &b.header.batch_id,
                types::BULK_FINISHED,
                BulkFinished {
                    batch_id: b.header.batch_id.clone(),
                    tenant_id: t.clone(),
                    state: BatchState::Expired,
                    counts: c,
                    reason: Some("expired before it finished".into()),
                },
            );
            rows.push(bcm_metal::outbox::row(ev));
        }
        bcm_metal::outbox::write_in_txn(&mut tx, rows).await?;
        tx.commit().await.map_err(DbError::from)?;
        if finished {
            tracing::info!(batch = %b.header.batch_id, "bulk expired");
        }
    }
    Ok(())
}

/// Settles started nodes whose chain ended. Returns how many.
async fn settle(db: &Db, b: &Batch) -> Result<usize, DbError> {
    let op = b.header.operation;
    let mut updates = vec![];
    for s in bcm_db::batches::bulk_started(db, &b.header.batch_id).await? {
        let state = ProvisionState::parse(&s.provision_state);
        let update = if s.batch_id.as_deref() != Some(b.header.batch_id.as_str()) {
            Some((
                BulkNodeState::Failed,
                Some("CONFLICT".to_owned()),
                Some(format!(
                    "another verb took the node over (batch {})",
                    s.batch_id.unwrap_or_default()
                )),
            ))
        } else if state == Some(ProvisionState::Failed) {
            Some((
                BulkNodeState::Failed,
                Some("FAILED".to_owned()),
                s.last_error,
            ))
        } else if state.is_some_and(|st| op.settles_in().contains(&st)) && s.workflow_done {
            Some((BulkNodeState::Succeeded, None, None))
        } else {
            None
        };
        if let Some((st, code, msg)) = update {
            updates.push((s.node_id, st, code, msg));
        }
    }
    if updates.is_empty() {
        return Ok(0);
    }
    let mut tx = db.begin().await?;
    bcm_db::batches::batch_nodes_set_in_txn(&mut tx, &b.header.batch_id, &updates).await?;
    tx.commit().await.map_err(DbError::from)?;
    Ok(updates.len())
}

/// Starts the next wave of an approved bulk. Returns how many nodes moved.
async fn start_wave(
    db: &Db,
    bus: &Bus,
    cfg: &ReconcilerConfig,
    b: &Batch,
) -> Result<usize, DbError> {
    let Some(verb) = b.header.operation.verb() else {
        return Ok(0);
    };
    let mut moved = 0;
    loop {
        let mut tx = db.begin_with_lock_timeout(cfg.lock_timeout_ms).await?;
        // The batch as it is now, locked: a cancel, rejection or expiry
        // that committed since this round began stops the waves.
        let now =
            bcm_db::batches::batch_fetch_for_update_in_txn(&mut tx, &b.header.batch_id).await?;
        if !now.state.authorizes() || chrono::Utc::now().timestamp() >= now.header.expires_at {
            return Ok(moved);
        }
        let policy = bcm_db::batches::pool_policy_in_txn(&mut tx, &b.header.pool_id).await?;
        let in_flight = bcm_db::batches::pool_in_flight_in_txn(&mut tx, &b.header.pool_id).await?;
        let site = bcm_db::batches::site_in_flight_in_txn(&mut tx, &b.site_id).await?;
        let room = (i64::from(policy.bulk_concurrency) - in_flight)
            .min(i64::from(cfg.bulk_site_concurrency) - site)
            .min(START_CHUNK as i64);
        if room <= 0 {
            return Ok(moved);
        }
        let next =
            bcm_db::batches::bulk_queued_take_in_txn(&mut tx, &b.header.batch_id, room).await?;
        if next.is_empty() {
            return Ok(moved);
        }
        let mut updates = vec![];
        for id in &next {
            let outcome = start_one(&mut tx, bus, b, verb, id).await;
            updates.push(match outcome {
                Ok(()) => (id.clone(), BulkNodeState::Started, None, None),
                Err(Refused { code, message }) => (
                    id.clone(),
                    BulkNodeState::Refused,
                    Some(code),
                    Some(message),
                ),
            });
        }
        bcm_db::batches::batch_nodes_set_in_txn(&mut tx, &b.header.batch_id, &updates).await?;
        bcm_db::batches::batch_set_state_in_txn(
            &mut tx,
            &b.header.batch_id,
            &[BatchState::Approved],
            BatchState::Running,
            None,
        )
        .await?;
        tx.commit().await.map_err(DbError::from)?;
        moved += next.len();
        tracing::info!(batch = %b.header.batch_id, nodes = next.len(), "bulk wave started");
    }
}

/// Why a node of a bulk was not started.
struct Refused {
    code: String,
    message: String,
}

/// Applies the bulk's verb to one node, under a savepoint: a node whose
/// state refuses the verb (or that cannot be locked) is refused with its
/// code and the rest of the wave goes on.
async fn start_one(
    tx: &mut bcm_db::Tx<'_>,
    bus: &Bus,
    b: &Batch,
    verb: bcm_core::Verb,
    id: &str,
) -> Result<(), Refused> {
    let refused = |code: &str, message: String| Refused {
        code: code.to_owned(),
        message,
    };
    let node_id: NodeId = id
        .parse()
        .map_err(|_| refused("INVALID_ARGUMENT", format!("{id} is not a node id")))?;
    let mut sp = bcm_db::savepoint(tx)
        .await
        .map_err(|e| refused("UNAVAILABLE", e.to_string()))?;
    let r: Result<Result<(), Refused>, DbError> = async {
        let node = bcm_db::nodes::node_fetch_for_update_in_txn(&mut sp, &node_id).await?;
        let facts = bcm_metal::moves::facts_in_txn(&mut sp, &node).await?;
        let t = match bcm_core::apply(facts, bcm_core::Move::Verb(verb)) {
            Ok(t) => t,
            Err(e) => {
                let code = e.code();
                return Ok(Err(refused(code.as_str(), e.to_string())));
            }
        };
        let mut next = bcm_metal::moves::next_node(&node, &t);
        if verb == bcm_core::Verb::Release {
            next.release_wipe = b.header.wipe;
        }
        next.batch_id = Some(b.header.batch_id.clone());
        bcm_metal::moves::commit_in_txn(
            &mut sp,
            bus.subjects(),
            next,
            &t,
            verb.as_str(),
            bcm_metal::moves::FollowUp::Reconcile,
            Some(&b.requested_by),
        )
        .await?;
        Ok(Ok(()))
    }
    .await;
    match r {
        Ok(Ok(())) => {
            sp.commit()
                .await
                .map_err(|e| refused("UNAVAILABLE", e.to_string()))?;
            Ok(())
        }
        Ok(Err(refusal)) => {
            let _ = sp.rollback().await;
            Err(refusal)
        }
        Err(e) => {
            let _ = sp.rollback().await;
            Err(refused(
                if matches!(e, DbError::Stale) {
                    "CONFLICT"
                } else {
                    "UNAVAILABLE"
                },
                e.to_string(),
            ))
        }
    }
}
