//! The periodic power sync: every node with a BMC gets a `bmc.powerStatus`
//! command every `power_sync_secs`; the result (recorded by the engine's
//! results consumer) updates the node's `power` and emits
//! `node.power.changed` when it drifted. One reconciler at a time leads the
//! sync (a lease), and at most `power_sync_max_outstanding` reads are in
//! flight, so 10,000 nodes do not stampede their BMCs. The leader also
//! prunes finished one-leaf commands after a week.

use bcm_bus::Bus;
use bcm_contracts::commands::{BmcParams, Command};
use bcm_contracts::CommandKind;
use bcm_db::Db;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::ReconcilerConfig;

/// The lease kind of the sync's leader.
pub const KIND: &str = "power-sync";
const KIND_COMMAND: CommandKind = CommandKind::BmcPowerStatus;
/// Finished commands outside workflows (power reads, `metal.power`) are
/// kept this long, then pruned by the sync's leader: at 10,000 nodes and a
/// read every 5 minutes they would otherwise add ~2.9 million rows a day.
const LEAF_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// Leads the sync whenever this worker holds the lease, until `shutdown`.
pub async fn run(
    db: Db,
    bus: Bus,
    cfg: ReconcilerConfig,
    holder: String,
    shutdown: CancellationToken,
) {
    let every = Duration::from_secs(cfg.power_sync_secs.max(1));
    let ttl = Duration::from_millis(cfg.lease_ttl_ms.max(300));
    let tick = (every / 4).clamp(Duration::from_millis(200), Duration::from_secs(15));
    let next_prune = std::sync::Mutex::new(tokio::time::Instant::now());
    let (db, bus, cfg, next_prune) = (&db, &bus, &cfg, &next_prune);
    crate::leader::lead(
        db,
        KIND,
        &holder,
        ttl.max(tick * 3),
        tick,
        &shutdown,
        || async move {
            if let Err(e) = round(db, bus, cfg, every).await {
                tracing::warn!(error = %e, "power sync round failed");
            }
            let due = {
                let mut next = next_prune.lock().unwrap_or_else(|p| p.into_inner());
                let due = tokio::time::Instant::now() >= *next;
                if due {
                    *next = tokio::time::Instant::now() + PRUNE_EVERY;
                }
                due
            };
            if due {
                prune(db).await;
            }
        },
    )
    .await;
}

/// Prunes finished one-leaf commands past their retention.
async fn prune(db: &Db) {
    match bcm_db::commands::commands_prune_leaves(db, LEAF_RETENTION).await {
        Ok(n) if n > 0 => tracing::info!(rows = n, "pruned finished one-leaf commands"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "pruning one-leaf commands failed"),
    }
}

/// Sends power reads to the nodes due, within the outstanding bound.
/// Returns how many it sent.
pub async fn round(
    db: &Db,
    bus: &Bus,
    cfg: &ReconcilerConfig,
    every: Duration,
) -> Result<usize, bcm_db::DbError> {
    let outstanding = bcm_db::commands::commands_outstanding(db, KIND_COMMAND.as_str()).await?;
    let room = cfg.power_sync_max_outstanding as i64 - outstanding;
    if room <= 0 {
        return Ok(0);
    }
    let due = bcm_db::nodes::nodes_due_for_power_read(db, every, room).await?;
    let mut sent = 0;
    for id in due {
        let Ok(node_id) = id.parse::<bcm_core::NodeId>() else {
            continue;
        };
        let mut tx = db.begin().await?;
        let node = bcm_db::nodes::node_fetch_in_txn(&mut tx, &node_id).await?;
        let (_, row) = bcm_metal::bmc::leaf_command_in_txn(
            &mut tx,
            bus.subjects(),
            &node,
            bcm_core::hardware::Concern::Power,
            "power-sync",
            None,
            // A read: not destructive, so no batch.
            None,
            |bmc| Command::BmcPowerStatus(BmcParams { bmc }),
        )
        .await?;
        bcm_metal::outbox::write_in_txn(&mut tx, vec![row]).await?;
        bcm_db::nodes::power_read_requested_in_txn(&mut tx, &id).await?;
        tx.commit().await?;
        sent += 1;
    }
    if sent > 0 {
        metrics::counter!("bcm_power_sync_reads_total").increment(sent as u64);
        tracing::debug!(sent, "power sync sent reads");
    }
    Ok(sent)
}
