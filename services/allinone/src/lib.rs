//! `bcm`, the all-in-one: the API with its outbox relay, the workflow
//! engine, the attestation service, a reconciler and a simulated site in one process, on the
//! Postgres and NATS the configuration names. With `--sim-machines N` it
//! enrolls N simulated machines, shows them moving to `ready`, deploys one
//! and releases it, and leaves the API up for `metalctl`.

pub mod demo;
pub mod figures;

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// Configuration of the all-in-one: one section per service.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub api: bcm_api::ApiConfig,
    /// Defaults to the API's own URL as the agents' control plane.
    #[serde(default)]
    pub engine: Option<bcm_workflow::EngineConfig>,
    #[serde(default)]
    pub reconciler: bcm_reconciler::ReconcilerConfig,
    /// The attestation service; an ephemeral CA when absent.
    #[serde(default)]
    pub attestation: Option<bcm_attestation::AttestationConfig>,
    /// The simulated site; its `site` must be a site of the seed.
    pub sim: bcm_sim::SimConfig,
    /// A pool of its own, of this many connections, for the services that
    /// work in the background (the relay, the workflow engine, the
    /// attestation service, the reconciler) when they run in one process
    /// with the API: their batches then never hold the connections the
    /// verbs and reads wait for. 0: they share the API's pool.
    #[serde(default = "default_work_connections")]
    pub work_connections: u32,
}

fn default_work_connections() -> u32 {
    16
}

impl Config {
    /// Loads a TOML file, then `BCM_*` environment variables (`BCM_API__DATABASE_URL`, …).
    pub fn load(path: Option<&std::path::Path>) -> Result<Self, Box<figment::Error>> {
        bcm_config::load(path, "BCM_ALL_")
    }
}

/// Why the all-in-one stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Start(#[from] bcm_api::StartError),
    #[error("the API listener: {0}")]
    Io(#[from] std::io::Error),
    #[error("a service task ended abnormally: {0}")]
    Task(String),
}

/// A service the all-in-one can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Service {
    /// The HTTP API.
    Api,
    /// The outbox relay.
    Relay,
    /// The workflow engine.
    Workflow,
    /// A reconciler worker.
    Reconciler,
    /// The attestation service.
    Attestation,
    /// The simulated site.
    Sim,
}

impl Service {
    /// Every service.
    pub const ALL: [Service; 6] = [
        Service::Api,
        Service::Relay,
        Service::Workflow,
        Service::Reconciler,
        Service::Attestation,
        Service::Sim,
    ];
}

/// Runs `services` until `shutdown`; sends the API's base URL through
/// `ready` once it listens.
pub async fn run(
    cfg: Config,
    services: &[Service],
    listener: tokio::net::TcpListener,
    ready: tokio::sync::oneshot::Sender<String>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    // Only a process that serves the API needs its certificate.
    let serving = if services.contains(&Service::Api) {
        cfg.api
            .tls
            .serving()
            .map_err(|e| bcm_api::StartError::Config(format!("api.tls: {e}")))?
    } else {
        bcm_pki::tls::Serving::Plain
    };
    if matches!(serving, bcm_pki::tls::Serving::Tls(_))
        && services.contains(&Service::Sim)
        && cfg.sim.api_ca_file.is_none()
    {
        // Its agents would trust nothing and never join.
        return Err(bcm_api::StartError::Config(
            "sim.api_ca_file: the CA the simulated agents pin for the API's HTTPS \
             (`bcm local-tls` writes it as ca.crt)"
                .into(),
        )
        .into());
    }
    let scheme = match serving {
        bcm_pki::tls::Serving::Tls(_) => "https",
        bcm_pki::tls::Serving::Plain => "http",
    };
    let base = format!("{scheme}://{}", listener.local_addr()?);
    let mut cfg = cfg;
    with_join_keys(&mut cfg);
    with_quorum(&mut cfg);
    let state = bcm_api::prepare(&cfg.api).await?;
    let bus = state.inner.bus.clone();
    let on = |s: Service| services.contains(&s);
    // The relay has a pool of its own, on its own thread.
    let background = [Service::Workflow, Service::Attestation, Service::Reconciler];
    let db = if on(Service::Api) && background.into_iter().any(on) && cfg.work_connections > 0 {
        bcm_db::Db::connect(&cfg.api.database_url, cfg.work_connections)
            .await
            .map_err(bcm_api::StartError::Db)?
            .named("work")
    } else {
        state.inner.db.clone()
    };
    let mut tasks = bcm_telemetry::signals::Drain::new();
    if cfg.api.relay.enabled && on(Service::Relay) {
        tasks.push(
            "relay",
            bcm_api::relay::run_on_own_thread(
                cfg.api.database_url.clone(),
                cfg.api.bus.clone(),
                cfg.api.relay.clone(),
                shutdown.clone(),
            )
            .map_err(|e| RunError::Task(format!("the outbox relay's thread: {e}")))?,
        );
    }
    if on(Service::Workflow) {
        let engine = cfg.engine.clone().unwrap_or_else(|| {
            // The engine mints what the API reveals: the same key.
            let mut e = bcm_workflow::EngineConfig::new(base.clone());
            e.join_key = cfg.api.join_key.clone();
            e
        });
        tasks.push(
            "workflow",
            tokio::spawn(bcm_workflow::run(
                db.clone(),
                bus.clone(),
                engine,
                shutdown.clone(),
            )),
        );
    }
    if on(Service::Attestation) {
        let attest = cfg
            .attestation
            .clone()
            .unwrap_or_else(bcm_attestation::AttestationConfig::ephemeral);
        let (db, bus, stop) = (db.clone(), bus.clone(), shutdown.clone());
        tasks.push(
            "attestation",
            tokio::spawn(async move {
                if let Err(e) = bcm_attestation::run(db, bus, attest, stop.clone()).await {
                    tracing::error!(error = %e, "attestation service stopped");
                    stop.cancel();
                }
            }),
        );
    }
    if on(Service::Reconciler) {
        tasks.push(
            "reconciler",
            tokio::spawn(bcm_reconciler::run(
                db.clone(),
                bus.clone(),
                cfg.reconciler.clone(),
                shutdown.clone(),
            )),
        );
    }
    if on(Service::Sim) {
        let faults = bcm_sim::Faults::from_config(&cfg.sim);
        // The simulated machines outlive this process, as real ones would.
        let (bus, sim, stop) = (bus.clone(), cfg.sim.clone(), shutdown.clone());
        let site_bus = sim.nkey_file.clone().map(|nkey_file| bcm_bus::BusConfig {
            nkey_file: Some(nkey_file),
            ..cfg.api.bus.clone()
        });
        tasks.push(
            "sim",
            tokio::spawn(async move {
                // With an identity of its own, the site connects as a site.
                let bus = match site_bus {
                    None => bus,
                    Some(site_bus) => match bcm_bus::Bus::attach(&site_bus).await {
                        Ok(b) => b,
                        Err(e) => {
                            tracing::error!(error = %e, "the simulated site cannot connect");
                            stop.cancel();
                            return;
                        }
                    },
                };
                let machines = match bcm_sim::site::Machines::durable(&bus, &sim.site).await {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::error!(error = %e, "the simulated site cannot start");
                        stop.cancel();
                        return;
                    }
                };
                let site = bcm_sim::site::run(
                    bus,
                    sim,
                    machines,
                    faults,
                    // Nothing here reads them; the chaos verdicts count
                    // the store's execution notes.
                    bcm_sim::site::Executions::not_kept(),
                    stop,
                );
                if let Err(e) = site.await {
                    tracing::error!(error = %e, "the simulated site stopped");
                }
            }),
        );
    }
    // The drain's deadline runs from the stop (or from the API server's
    // end on an error): the server's own drain, the services' and the
    // pools' closing all fit in it.
    let mut served = Ok(());
    let deadline;
    if on(Service::Api) {
        let app = bcm_api::router(state.clone());
        let stop = shutdown.clone();
        let mut http = cfg.api.http.clone();
        if on(Service::Sim) {
            // The simulated site's agents hold their ends of the API's
            // connections in this process too.
            http = http.sharing_descriptors_with_clients();
        }
        let mut server =
            tokio::spawn(async move { bcm_api::serve(listener, app, serving, &http, stop).await });
        let _ = ready.send(base);
        let ended = tokio::select! {
            r = &mut server => Some(r),
            _ = shutdown.cancelled() => None,
        };
        shutdown.cancel();
        deadline = tokio::time::Instant::now() + bcm_telemetry::signals::DRAIN;
        let ended = match ended {
            Some(r) => Some(r),
            None => tokio::time::timeout_at(deadline, &mut server).await.ok(),
        };
        served = match ended {
            Some(r) => r
                .map_err(|e| RunError::Task(e.to_string()))
                .and_then(|r| r.map_err(RunError::from)),
            None => {
                server.abort();
                Ok(())
            }
        };
    } else {
        // A process without the API serves its metrics on the listener.
        let _ = ready.send(base);
        if let Err(e) = bcm_telemetry::serve_metrics(listener, shutdown.clone()).await {
            tracing::warn!(error = %e, "the metrics listener stopped");
        }
        shutdown.cancelled().await;
        deadline = tokio::time::Instant::now() + bcm_telemetry::signals::DRAIN;
    }
    shutdown.cancel();
    // A database or a bus that went down first must not hold the process:
    // what is still running at the deadline stops where it stood, as a
    // kill would leave it, and resumes there at the next start. Closing a
    // pool waits for its connections, and those a dead database holds
    // come back only at the pool's acquire timeout: closing is a courtesy
    // to the server, so it gets a second at most.
    tasks.until(deadline).await;
    let closing = deadline.min(tokio::time::Instant::now() + POOL_CLOSE_WITHIN);
    for pool in [&db, &state.inner.db] {
        if tokio::time::timeout_at(closing, pool.close())
            .await
            .is_err()
        {
            tracing::warn!(
                "the database pool did not close in time; its connections end with the process"
            );
        }
    }
    tracing::info!("stopped");
    served
}

/// How long closing the database pools may take at a stop.
const POOL_CLOSE_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// The quorum keys of this process: where the API has no policy key, one
/// is made now (it dies with the process); where the simulated site has no
/// anchor, it trusts that policy key for one-node batches and no approver
/// (so a bulk needs an anchor file naming the approvers: `bcm
/// quorum-keys`).
fn with_quorum(cfg: &mut Config) {
    let q = &mut cfg.api.quorum;
    if q.policy_key.is_none() && q.policy_key_file.is_none() {
        q.policy_key = Some(ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng));
    }
    if cfg.sim.quorum_anchor.is_none() && cfg.sim.quorum_anchor_file.is_none() {
        match cfg.api.quorum.signer() {
            Ok(Some(signer)) => {
                cfg.sim.quorum_anchor = Some(bcm_quorum::Anchor {
                    approvers: vec![],
                    quorum: 1,
                    auto_approver: Some(bcm_quorum::AnchorKey {
                        id: signer.id.clone(),
                        public_key: bcm_quorum::public_key_b64(&signer.key),
                        tenants: vec![],
                    }),
                })
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "the API's policy key cannot be read"),
        }
    }
    // The API's floor of approvers is the simulated site's anchor, where
    // it was given none of its own.
    let q = &mut cfg.api.quorum;
    if q.anchor.is_none() && q.anchor_file.is_none() {
        q.anchor_file = cfg.sim.quorum_anchor_file.clone();
        q.anchor = cfg.sim.quorum_anchor.clone();
    }
}

/// The join keys of the services of this process. Where none is given one,
/// a process-wide key is made now: the API, the engine and the simulated
/// site (its site's key) share it, and it dies with the process (as the
/// tokens it makes are meant to). Where only the API is given one, the
/// engine mints under it too and the simulated site holds its site's key.
/// Separate processes are given `join.key` files (`bcm nats-auth`).
fn with_join_keys(cfg: &mut Config) {
    let engine_set = cfg.engine.as_ref().is_some_and(|e| e.join_key.is_set());
    if !cfg.api.join_key.is_set() && !engine_set && !cfg.sim.join_key.is_set() {
        cfg.api.join_key = bcm_pki::JoinKeyConfig::with_key(bcm_pki::JoinKey::generate());
    }
    if let Some(e) = cfg.engine.as_mut() {
        if !e.join_key.is_set() {
            e.join_key = cfg.api.join_key.clone();
        }
    }
    if !cfg.sim.join_key.is_set() {
        match cfg.api.join_key.resolve() {
            Ok(Some(master)) => {
                cfg.sim.join_key = bcm_pki::JoinKeyConfig::with_key(master.for_site(&cfg.sim.site))
            }
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, "the API's join key cannot be read"),
        }
    }
}
