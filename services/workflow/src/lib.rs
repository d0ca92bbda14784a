//! The workflow engine. Workflows and steps live in Postgres; engines claim
//! due steps with `FOR UPDATE SKIP LOCKED`, so any number of engines share
//! the work, and every outcome is persisted before the next step is
//! scheduled, so a killed engine's successor resumes from the last persisted
//! step. Site commands are recorded (idempotency key: workflow, step,
//! attempt) in the same transaction as their outbox message: a restart
//! never sends one twice. Results arrive on `result.<site>.<commandId>`
//! (site services) or through the API's agent endpoints (signed, ramdisk).
//!
//! Every decision (which step next, retry or give up, when cleanup runs)
//! is `bcm_core::workflow`'s; this crate does the I/O.

pub mod commands;
pub mod engine;
pub mod results;
pub mod rotation;

use bcm_bus::Bus;
use bcm_db::Db;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// Settings of the engine.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct EngineConfig {
    /// Concurrent step workers in this process.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// At most this many workflows a worker advances in one transaction.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// How often an idle worker looks for due steps without a notification.
    #[serde(default = "default_poll_ms")]
    pub poll_ms: u64,
    /// The control plane URL agents join through (put on the ramdisk's
    /// kernel command line and into user data).
    pub control_plane_url: String,
    /// The control plane's join key (master): join tokens are minted as
    /// references derived under it, so no command, event or stream holds a
    /// token. Required; `bcm nats-auth` writes `join.key`.
    #[serde(default)]
    pub join_key: bcm_pki::JoinKeyConfig,
    /// Lifetime of discovery and provisioned join tokens.
    #[serde(default = "default_token_ttl")]
    pub join_token_ttl_secs: u64,
    /// Poll interval of steps that wait for an agent to join.
    #[serde(default = "default_join_poll_ms")]
    pub join_poll_ms: u64,
    /// A step waiting on an agent's result fails (retryably) once the agent
    /// has given no sign of life — no poll, heartbeat or result — for this
    /// long, instead of waiting out the step's whole deadline.
    #[serde(default = "default_agent_silence_ms")]
    pub agent_silence_ms: u64,
    /// [`Self::agent_silence_ms`] for an installed OS's agent, which an
    /// idle node hears from only at its idle heartbeat (the API's
    /// `idle_heartbeat_secs`, 60 s ±10 % by default, longer in a fleet of
    /// more than `max_idle_heartbeats_per_sec` × that) until a heartbeat
    /// tells it that a workflow runs. An optional ask of an OS not heard
    /// within it is skipped at once (rescue's BMC then shuts it down).
    #[serde(default = "default_installed_os_silence_ms")]
    pub installed_os_silence_ms: u64,
    /// A site's own time-outs for steps, by step name (`collect-inventory`,
    /// `wait-ramdisk-join`, `wipe`, …), in seconds, in place of the
    /// profile's: a site whose machines take longer to POST, or whose
    /// disks take longer to erase, says so here. Zero is refused at start.
    /// A step that outlives its time-out is retried per its policy, then
    /// fails naming itself and the time-out.
    #[serde(default)]
    pub step_timeouts: std::collections::BTreeMap<String, std::num::NonZeroU32>,
}

fn default_workers() -> usize {
    // Workers mostly wait on Postgres; each advances a batch. Measured on
    // 2 cores (bench-lifecycle, N=1000): 2 workers x 64 beat 4, 8 or 16
    // workers, which spend the difference contending for the same rows.
    2
}
fn default_batch() -> usize {
    // Statements and commits per step fall with the batch; at 128 a
    // transaction holds its locks long enough to cost more than it saves.
    64
}
fn default_poll_ms() -> u64 {
    250
}
fn default_token_ttl() -> u64 {
    3600
}
fn default_join_poll_ms() -> u64 {
    // Joins and heartbeats wake the waiting step; this is only the backstop
    // for a missed wake-up. Each waiting step costs a transaction per poll,
    // so a short poll taxes every node that waits (measured at 10,000 nodes).
    10_000
}

fn default_installed_os_silence_ms() -> u64 {
    // Two idle heartbeats of a small fleet (66 s at the most, with
    // jitter) missed. A large fleet's idle OSes beat more slowly: most are
    // then not asked, and rescue's BMC power-off shuts them down.
    135_000
}

fn default_agent_silence_ms() -> u64 {
    // bcd heartbeats every 10 s and long-polls for 25 s at most; the sim's
    // agents poll. Three missed heartbeats and a lost poll.
    60_000
}

impl EngineConfig {
    /// The time-out of a step: the site's, else the profile's.
    pub fn step_timeout_secs(&self, step: &bcm_core::workflow::StepDef) -> u32 {
        self.step_timeouts
            .get(&step.name)
            .map_or(step.timeout_secs, |t| t.get())
    }

    /// Defaults for `control_plane_url`.
    pub fn new(control_plane_url: impl Into<String>) -> Self {
        Self {
            workers: default_workers(),
            batch: default_batch(),
            poll_ms: default_poll_ms(),
            control_plane_url: control_plane_url.into(),
            join_key: Default::default(),
            join_token_ttl_secs: default_token_ttl(),
            join_poll_ms: default_join_poll_ms(),
            agent_silence_ms: default_agent_silence_ms(),
            installed_os_silence_ms: default_installed_os_silence_ms(),
            step_timeouts: Default::default(),
        }
    }
}

/// Runs the engine until `shutdown`: the step workers and the results
/// consumer.
pub async fn run(db: Db, bus: Bus, mut cfg: EngineConfig, shutdown: CancellationToken) {
    // Read the key file once; without a key every step that mints a join
    // token fails for good, saying why.
    match cfg.join_key.resolve() {
        Ok(Some(key)) => cfg.join_key = bcm_pki::JoinKeyConfig::with_key(key),
        Ok(None) => tracing::error!("no join key is configured (engine.join_key.file): steps that boot a ramdisk or deploy will fail"),
        Err(e) => tracing::error!(error = %e, "the join key cannot be read: steps that boot a ramdisk or deploy will fail"),
    }
    let ctx = std::sync::Arc::new(engine::Ctx::new(db.clone(), bus.clone(), cfg.clone()));
    let mut tasks = vec![tokio::spawn(engine::listen(ctx.clone(), shutdown.clone()))];
    for i in 0..cfg.workers.max(1) {
        tasks.push(tokio::spawn(engine::worker(
            ctx.clone(),
            i,
            shutdown.clone(),
        )));
    }
    tasks.push(tokio::spawn(results::consume(ctx, shutdown.clone())));
    for t in tasks {
        let _ = t.await;
    }
}
