//! The stall watch: a node whose workflow has a step the engine should
//! have looked at more than `stall_grace_secs` ago — no engine running, one
//! wedged, a wake-up lost — is stranded until someone acts, and nothing
//! else says so. One reconciler at a time (a lease) looks every
//! `stall_check_secs`, sets `bcm_reconciler_stalled_workflows` to how many
//! it found, and publishes `node.workflow.stalled` once per workflow (in
//! the transaction that marks it reported), so a stranded node is visible
//! before anyone asks.

use bcm_bus::Bus;
use bcm_contracts::events::WorkflowStalled;
use bcm_core::workflow::StepStatus;
use bcm_db::workflows::OverdueWorkflow;
use bcm_db::Db;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::ReconcilerConfig;

/// The lease kind of the watch's leader.
pub const KIND: &str = "stall-watch";

/// Watches while this worker holds the lease, until `shutdown`.
pub async fn run(
    db: Db,
    bus: Bus,
    cfg: ReconcilerConfig,
    holder: String,
    shutdown: CancellationToken,
) {
    let every = Duration::from_secs(cfg.stall_check_secs.max(1));
    let ttl = Duration::from_millis(cfg.lease_ttl_ms.max(300)).max(every * 3);
    crate::leader::lead(&db, KIND, &holder, ttl, every, &shutdown, || async {
        if let Err(e) = round(&db, &bus, &cfg).await {
            tracing::warn!(error = %e, "stall watch round failed");
        }
    })
    .await;
}

/// One look: returns how many workflows were newly reported.
pub async fn round(db: &Db, bus: &Bus, cfg: &ReconcilerConfig) -> Result<usize, bcm_db::DbError> {
    // The fleet at a glance, from the one worker that leads the watch.
    // (A count that fails is logged; the watch goes on.)
    match bcm_db::nodes::node_count_by_state(db).await {
        Ok(counts) => {
            for state in bcm_core::ProvisionState::ALL {
                let n = counts
                    .iter()
                    .find(|(s, _)| *s == state)
                    .map_or(0, |(_, n)| *n);
                metrics::gauge!("bcm_nodes", "state" => state.as_str()).set(n as f64);
            }
        }
        Err(e) => tracing::warn!(error = %e, "counting nodes per state failed"),
    }
    let overdue = bcm_db::workflows::workflows_overdue(db, cfg.stall_grace_secs, 1000).await?;
    metrics::gauge!("bcm_reconciler_stalled_workflows").set(overdue.len() as f64);
    let mut reported = 0;
    for w in overdue.iter().filter(|w| !w.reported) {
        if report(db, bus, w).await? {
            reported += 1;
        }
    }
    Ok(reported)
}

async fn report(db: &Db, bus: &Bus, w: &OverdueWorkflow) -> Result<bool, bcm_db::DbError> {
    let (Ok(node_id), Some(step_status)) = (
        w.node_id.parse::<bcm_core::NodeId>(),
        StepStatus::parse(&w.step_status),
    ) else {
        tracing::warn!(workflow = %w.workflow_id, "a stalled workflow this reconciler cannot read");
        return Ok(false);
    };
    let mut tx = db.begin().await?;
    if !bcm_db::workflows::workflow_mark_stalled_in_txn(&mut tx, &w.workflow_id).await? {
        return Ok(false);
    }
    let node = bcm_db::nodes::node_fetch_in_txn(&mut tx, &node_id).await?;
    let row = bcm_metal::outbox::event(
        bus.subjects(),
        &node,
        WorkflowStalled {
            workflow_id: w.workflow_id.clone(),
            node_id,
            tenant_id: node.tenant_id.clone(),
            profile_id: w.profile_id.clone(),
            step: w.step.clone(),
            step_status,
            overdue_secs: w.overdue_secs,
        },
    );
    bcm_metal::outbox::write_in_txn(&mut tx, vec![row]).await?;
    tx.commit().await?;
    metrics::counter!("bcm_reconciler_stalls_reported_total").increment(1);
    tracing::warn!(workflow = %w.workflow_id, node = %w.node_id, step = %w.step, overdue_secs = w.overdue_secs, "a workflow has stalled: its step is overdue and the engine has not looked at it");
    Ok(true)
}
