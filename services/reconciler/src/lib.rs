//! The metal reconciler. Level-triggered: for a node it re-reads the row and
//! its workflow, asks `bcm_core::reconcile::decide` what to do, does it, and
//! repeats up to eight transitions, so `enrolling → inspecting →
//! commissioning → ready` chains without a caller.
//!
//! Work is sharded by node (`work.reconcile.<shard>.<nodeId>`). Each shard
//! is owned by one worker at a time through a lease in Postgres; workers
//! heartbeat and take a fair share, and a dead worker's shards move when
//! its leases expire. The node row's version guard is the backstop, and the
//! unique index on (node, state, version) of workflows means no node state
//! entry ever gets two workflows. While workflows run, every owned node is
//! looked at again every `metal_poll_ms` (`metalPollMs`) in case a wake-up was
//! missed.

pub mod bulk;
pub mod leader;
pub mod power_sync;
pub mod reconcile;
pub mod shards;
pub mod stalls;

use bcm_bus::Bus;
use bcm_db::Db;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// Settings of the reconciler.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct ReconcilerConfig {
    /// The spec's `metalPollMs`: how often owned nodes in workflow states
    /// are looked at again without a wake-up. `poll_ms`, its earlier name,
    /// is still read.
    #[serde(default = "default_poll_ms", alias = "poll_ms")]
    pub metal_poll_ms: u64,
    /// Lease lifetime; leases renew every third of it.
    #[serde(default = "default_lease_ttl_ms")]
    pub lease_ttl_ms: u64,
    /// This worker's name; random when absent.
    #[serde(default)]
    pub holder: Option<String>,
    /// Row lock wait before a reconcile pass gives up and retries.
    #[serde(default = "default_lock_timeout_ms")]
    pub lock_timeout_ms: u32,
    /// How often each node's BMC is asked for its power state.
    #[serde(default = "default_power_sync_secs")]
    pub power_sync_secs: u64,
    /// At most this many power reads in flight across the control plane.
    #[serde(default = "default_power_sync_max_outstanding")]
    pub power_sync_max_outstanding: u32,
    /// How often the stall watch looks for overdue workflow steps.
    #[serde(default = "default_stall_check_secs")]
    pub stall_check_secs: u64,
    /// A step due (or past its deadline) this long ago that the engine has
    /// not looked at is a stalled workflow.
    #[serde(default = "default_stall_grace_secs")]
    pub stall_grace_secs: u64,
    /// How often the bulk runner settles nodes and starts waves.
    #[serde(default = "default_bulk_tick_ms")]
    pub bulk_tick_ms: u64,
    /// At most this many nodes of a site's bulks run at once (each pool's
    /// `bulkConcurrency` bounds its own bulks below that).
    #[serde(default = "default_bulk_site_concurrency")]
    pub bulk_site_concurrency: u32,
}

fn default_bulk_tick_ms() -> u64 {
    1_000
}
fn default_bulk_site_concurrency() -> u32 {
    500
}

fn default_stall_check_secs() -> u64 {
    30
}
fn default_stall_grace_secs() -> u64 {
    // An engine looks at a due step within its poll (250 ms) or batch; a
    // restarted one within seconds.
    120
}

fn default_power_sync_secs() -> u64 {
    300
}
fn default_power_sync_max_outstanding() -> u32 {
    256
}

fn default_poll_ms() -> u64 {
    30_000
}
fn default_lease_ttl_ms() -> u64 {
    9_000
}
fn default_lock_timeout_ms() -> u32 {
    2_000
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self {
            metal_poll_ms: default_poll_ms(),
            lease_ttl_ms: default_lease_ttl_ms(),
            holder: None,
            lock_timeout_ms: default_lock_timeout_ms(),
            power_sync_secs: default_power_sync_secs(),
            power_sync_max_outstanding: default_power_sync_max_outstanding(),
            stall_check_secs: default_stall_check_secs(),
            stall_grace_secs: default_stall_grace_secs(),
            bulk_tick_ms: default_bulk_tick_ms(),
            bulk_site_concurrency: default_bulk_site_concurrency(),
        }
    }
}

/// Runs a reconciler worker until `shutdown`.
pub async fn run(db: Db, bus: Bus, cfg: ReconcilerConfig, shutdown: CancellationToken) {
    let holder = cfg.holder.clone().unwrap_or_else(|| {
        format!(
            "reconciler-{}",
            ulid::Ulid::new().to_string().to_lowercase()
        )
    });
    let sync = tokio::spawn(power_sync::run(
        db.clone(),
        bus.clone(),
        cfg.clone(),
        holder.clone(),
        shutdown.clone(),
    ));
    let stalls = tokio::spawn(stalls::run(
        db.clone(),
        bus.clone(),
        cfg.clone(),
        holder.clone(),
        shutdown.clone(),
    ));
    let bulk = tokio::spawn(bulk::run(
        db.clone(),
        bus.clone(),
        cfg.clone(),
        holder.clone(),
        shutdown.clone(),
    ));
    shards::run(db, bus, cfg, holder, shutdown).await;
    let _ = bulk.await;
    let _ = sync.await;
    let _ = stalls.await;
}

#[cfg(test)]
mod tests {
    use super::ReconcilerConfig;

    #[test]
    fn the_poll_is_the_specs_metal_poll_ms_and_its_old_name_still_reads() {
        let named: ReconcilerConfig =
            serde_json::from_value(serde_json::json!({"metal_poll_ms": 1234})).expect("new");
        assert_eq!(named.metal_poll_ms, 1234);
        let old: ReconcilerConfig =
            serde_json::from_value(serde_json::json!({"poll_ms": 4321})).expect("old");
        assert_eq!(old.metal_poll_ms, 4321);
        assert!(
            serde_json::from_value::<ReconcilerConfig>(serde_json::json!({"metal_pol_ms": 1}))
                .is_err()
        );
    }
}
