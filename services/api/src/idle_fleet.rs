//! The idle heartbeat cadence sized to the fleet. Every idle installed OS
//! (a node `deployed` or `adopted` with bcd, no workflow running) beats at
//! `agents.idle_heartbeat_secs`, or slower, so that the whole idle fleet
//! sends at most `agents.max_idle_heartbeats_per_sec` a second, up to one
//! beat an hour (Nomad sizes its clients' heartbeat TTL the same way). At a
//! fixed cadence the heartbeats a second, and the API's connections held
//! for them, grew with the deployed fleet until the agent pool fell behind
//! (docs/performance.md, N = 100,000). Nothing waits on an idle OS's beat:
//! a release power-cycles through the BMC. A rescue's ask of the OS to
//! power off reaches it at its next beat (then it beats busy), is skipped
//! if the OS was not heard lately, and its BMC powers it off either way.
//!
//! This module owns the formula (a pure function), the fleet count each
//! replica keeps (from the database, as replicas are many and stateless),
//! and the task that refreshes it. It never uses the agent pool.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bcm_contracts::agent::HeartbeatAck;
use bcm_db::Db;

/// The base idle cadence (seconds) for `fleet` idle installed OSes: the
/// configured `floor`, or `fleet / per_sec` rounded up when that is longer,
/// at most [`HeartbeatAck::MAX_SECS`]. `per_sec` 0 keeps the floor (a fixed
/// cadence). Above `per_sec · MAX_SECS` machines the cap lets the fleet's
/// rate exceed `per_sec` ([`budget_exceeded`] says so).
pub fn idle_cadence_secs(floor: u32, per_sec: u32, fleet: u64) -> u32 {
    if per_sec == 0 {
        return floor;
    }
    let sized = fleet.div_ceil(u64::from(per_sec));
    let capped = sized.min(u64::from(HeartbeatAck::MAX_SECS));
    floor.max(u32::try_from(capped).unwrap_or(HeartbeatAck::MAX_SECS))
}

/// Whether even the longest cadence leaves `fleet` beating faster than
/// `per_sec` a second.
pub fn budget_exceeded(per_sec: u32, fleet: u64) -> bool {
    per_sec != 0 && fleet.div_ceil(u64::from(per_sec)) > u64::from(HeartbeatAck::MAX_SECS)
}

/// The idle installed OSes this replica last counted. A count that fails
/// keeps the last one: a database hiccup does not send the fleet back to
/// the floor cadence all at once.
#[derive(Debug, Default)]
pub struct IdleFleet {
    count: AtomicU64,
}

impl IdleFleet {
    /// The last count (0 before the first).
    pub fn get(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Records a new count.
    pub fn set(&self, n: u64) {
        self.count.store(n, Ordering::Relaxed);
    }
}

/// Counts the fleet once into `fleet`, on the main pool, and sets the
/// gauges; a failure keeps the last count, logs and is counted.
pub async fn count_once(db: &Db, fleet: &IdleFleet, cfg: &crate::AgentProtocolConfig) {
    match bcm_db::nodes::installed_os_count(db).await {
        Ok(n) => fleet.set(n),
        Err(e) => {
            metrics::counter!("bcm_api_agent_idle_fleet_count_failed_total").increment(1);
            tracing::warn!(error = %e, kept = fleet.get(), "counting the idle fleet failed; its cadence stays as it was");
        }
    }
    let n = fleet.get();
    let per_sec = cfg.max_idle_heartbeats_per_sec;
    metrics::gauge!("bcm_api_agent_idle_fleet").set(n as f64);
    metrics::gauge!("bcm_api_agent_idle_cadence_seconds").set(f64::from(idle_cadence_secs(
        cfg.idle_heartbeat_secs,
        per_sec,
        n,
    )));
    metrics::gauge!("bcm_api_agent_idle_budget_exceeded").set(if budget_exceeded(per_sec, n) {
        1.0
    } else {
        0.0
    });
}

/// Counts the fleet every `idle_fleet_refresh_secs` until the pool is
/// closed (the service stopping). A fixed cadence (`per_sec` 0) needs no
/// count, and the task ends at once.
pub async fn refresh(db: Db, fleet: Arc<IdleFleet>, cfg: crate::AgentProtocolConfig) {
    if cfg.max_idle_heartbeats_per_sec == 0 {
        return;
    }
    let every = Duration::from_secs(u64::from(cfg.idle_fleet_refresh_secs.max(1)));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first is at once, and start-up counted then
    while !db.is_closed() {
        tick.tick().await;
        if db.is_closed() {
            break;
        }
        count_once(&db, &fleet, &cfg).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{budget_exceeded, idle_cadence_secs};
    use bcm_contracts::agent::HeartbeatAck;

    #[test]
    fn a_small_fleet_keeps_the_floor_and_a_large_one_is_sized_to_the_budget() {
        assert_eq!(idle_cadence_secs(60, 0, 1_000_000), 60, "0: fixed");
        assert_eq!(idle_cadence_secs(60, 100, 0), 60);
        assert_eq!(idle_cadence_secs(60, 100, 6_000), 60);
        assert_eq!(idle_cadence_secs(60, 100, 6_001), 61, "rounded up");
        assert_eq!(idle_cadence_secs(60, 100, 100_000), 1_000);
        assert_eq!(idle_cadence_secs(60, 50, 100_000), 2_000);
        assert_eq!(idle_cadence_secs(60, 1, 1), 60);
        assert_eq!(idle_cadence_secs(60, 100, 1_000_000_000), 3_600);
        assert_eq!(idle_cadence_secs(60, 1, u64::MAX), HeartbeatAck::MAX_SECS);
        assert_eq!(idle_cadence_secs(2, 1, 20), 20);
    }

    #[test]
    fn the_fleets_rate_stays_within_the_budget_unless_at_the_floor_or_the_cap() {
        for per_sec in [1u32, 7, 50, 100, 1_000] {
            for fleet in (0u64..2_000_000).step_by(9_973) {
                let base = idle_cadence_secs(60, per_sec, fleet);
                let within = fleet as f64 / f64::from(base) <= f64::from(per_sec);
                assert!(
                    within || base == 60 || base == HeartbeatAck::MAX_SECS,
                    "{fleet} at {per_sec}/s beats every {base} s"
                );
                assert_eq!(
                    budget_exceeded(per_sec, fleet),
                    !within,
                    "{fleet} at {per_sec}/s"
                );
            }
        }
        assert!(
            !budget_exceeded(0, u64::MAX),
            "a fixed cadence has no budget"
        );
    }
}
