//! The test harness: each test gets a fresh Postgres database and a private
//! JetStream namespace on the servers named by `DATABASE_URL` and
//! `NATS_URL` (`.ci/run` and `deploy/dev/stack.sh` start throwaway ones),
//! and the api service in-process on an ephemeral port.
//!
//! Waiting is on conditions with a deadline, never on fixed sleeps.

use anyhow::{bail, Context as _};
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use bcm_api::relay::{RelayConfig, RelayFaults};
use bcm_api::{ApiConfig, AppState};
use bcm_bus::subjects::StreamKind;
use bcm_bus::BusConfig;
use bcm_contracts::CloudEvent;
use bcm_core::{NodeId, ProvisionState};
use futures::StreamExt as _;
use serde_json::{json, Value};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub use bcm_api::AgentProtocolConfig;
pub use bcm_reconciler::ReconcilerConfig;

/// Options of a test environment.
#[derive(Debug, Clone)]
pub struct Options {
    /// Start the outbox relay with the API.
    pub relay: bool,
    /// Row lock wait before `CONFLICT`.
    pub lock_timeout_ms: u32,
    /// Start the workflow engine, the reconciler and a simulated site `s1`
    /// with these settings.
    pub site: Option<bcm_sim::SimConfig>,
    /// How many reconciler workers to start with the site.
    pub reconcilers: usize,
    /// Start a workflow engine in-process with the site.
    pub engine: bool,
    /// Start the attestation service (an ephemeral CA) with the API.
    pub attestation: bool,
    /// The agent endpoints' leases and retries.
    pub agents: bcm_api::AgentProtocolConfig,
    /// How long the engine lets a ramdisk agent stay silent.
    pub agent_silence_ms: u64,
    /// The engine's site time-outs of steps, by name (`engine.step_timeouts`).
    pub step_timeouts: std::collections::BTreeMap<String, std::num::NonZeroU32>,
    /// The API's per-principal limits.
    pub rate_limit: bcm_api::limits::RateLimitConfig,
    /// The size of the API's pool for agent endpoints.
    pub agent_db_connections: u32,
    /// What the API publishes for machines to download.
    pub downloads: bcm_api::downloads::DownloadsConfig,
    /// Hardware profiles besides the shipped ones.
    pub hardware_profiles: std::collections::BTreeMap<String, bcm_core::hardware::HardwareProfile>,
    /// The lifetime of an installed OS's certificate (default: the
    /// attestation service's).
    pub node_cert_ttl_secs: Option<u64>,
    /// The (empty) database to start on; a fresh one when `None`.
    pub database_url: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            relay: true,
            lock_timeout_ms: 2000,
            site: None,
            reconcilers: 1,
            engine: true,
            attestation: true,
            // A handful of machines, not a fleet: an idle installed OS
            // beats every 2 s, so what it is asked (a rescue's power-off)
            // reaches it at once.
            agents: bcm_api::AgentProtocolConfig {
                idle_heartbeat_secs: 2,
                ..Default::default()
            },
            agent_silence_ms: 60_000,
            step_timeouts: Default::default(),
            rate_limit: Default::default(),
            agent_db_connections: 4,
            downloads: Default::default(),
            hardware_profiles: Default::default(),
            node_cert_ttl_secs: None,
            database_url: None,
        }
    }
}

impl Options {
    /// The whole control plane with a simulated site `s1` without faults.
    pub fn with_site() -> Self {
        Self {
            site: Some(bcm_sim::SimConfig::new("s1")),
            ..Default::default()
        }
    }

    /// The database, the bus and the in-process API only: no relay,
    /// engine, attestation, reconciler or site (a test runs those itself,
    /// e.g. as separate `bcm --services …` processes).
    pub fn api_only() -> Self {
        Self {
            relay: false,
            engine: false,
            attestation: false,
            reconcilers: 0,
            site: None,
            ..Default::default()
        }
    }
}

/// A running api service on a fresh database and namespace.
pub struct TestEnv {
    pub db: bcm_db::Db,
    pub database_url: String,
    pub bus_config: BusConfig,
    pub state: AppState,
    pub base: String,
    pub admin_token: String,
    pub http: reqwest::Client,
    /// The simulated site's faults, changeable while it runs.
    pub faults: bcm_sim::Faults,
    /// The API's sealing keys (a site's bmc service opens with them).
    pub sealing_keys: Vec<bcm_seal::KeyConfig>,
    /// The control plane's join key (a site's boot service holds
    /// `join_key.for_site(site)`).
    pub join_key: bcm_pki::JoinKey,
    agent_silence_ms: u64,
    step_timeouts: std::collections::BTreeMap<String, std::num::NonZeroU32>,
    /// The destructive-batch quorum of this test: the API's policy key,
    /// three approver keys (`approver-1`..`approver-3`) and the site's
    /// anchor (2 of the 3, and the policy key for one-node batches), which
    /// the simulated site verifies against.
    pub quorum: Quorum,
    /// Every site command the simulated sites of this test executed.
    pub executions: bcm_sim::site::Executions,
    #[allow(clippy::type_complexity)]
    site: std::sync::Mutex<Option<(CancellationToken, tokio::task::JoinHandle<()>)>>,
    /// Files this test wrote under the temporary directory, removed with it.
    temp_files: std::sync::Mutex<Vec<std::path::PathBuf>>,
    shutdown: CancellationToken,
}

/// The quorum keys of a test.
#[derive(Clone)]
pub struct Quorum {
    pub policy: ed25519_dalek::SigningKey,
    pub approvers: Vec<ed25519_dalek::SigningKey>,
    pub anchor: bcm_quorum::Anchor,
}

impl Quorum {
    fn generate() -> Self {
        let mut rng = rand::rngs::OsRng;
        let policy = ed25519_dalek::SigningKey::generate(&mut rng);
        let approvers: Vec<_> = (0..3)
            .map(|_| ed25519_dalek::SigningKey::generate(&mut rng))
            .collect();
        let anchor = bcm_quorum::Anchor::of(&approvers, 2, Some(&policy));
        Self {
            policy,
            approvers,
            anchor,
        }
    }
}

fn env_url(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| {
        format!("{name} is not set: run the tests through .ci/run, or `eval \"$(deploy/dev/stack.sh env)\"` first")
    })
}

fn random_suffix() -> String {
    ulid::Ulid::new().to_string().to_lowercase()
}

/// Creates an empty database on the `DATABASE_URL` server and returns its URL.
pub async fn fresh_database() -> anyhow::Result<String> {
    let server = env_url("DATABASE_URL")?;
    Ok(bcm_db::admin::database_create(&server, &format!("bcm_t_{}", random_suffix())).await?)
}

impl TestEnv {
    /// Starts with default options.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(Options::default()).await
    }

    /// Starts the api on a fresh database and namespace, seeded with
    /// tenants `a` and `b`, site `s1`, pools `a-pool` and `b-pool`, the
    /// agentless pool `a-agentless` of tenant `a` (agent mode `none`, an
    /// unattested release returns to `ready`), and the deploy profiles `p`
    /// v1 (both tenants), `ubuntu-24.04` v1, `ubuntu-24.04-gpu-host` v1,
    /// `dedicated-ubuntu` v1 (role `dedicated`), `talos-iso` v1 and
    /// `talos-iso-dedicated` v1 (installer ISOs) of tenant `a`, `b-only` v1
    /// of tenant `b`.
    pub async fn start_with(opts: Options) -> anyhow::Result<Self> {
        let _ = bcm_telemetry::init("bcm-test", &Default::default());
        let database_url = match &opts.database_url {
            Some(url) => url.clone(),
            None => fresh_database().await?,
        };
        let bus_config = BusConfig {
            url: env_url("NATS_URL")?,
            namespace: Some(format!("t{}", random_suffix())),
            shards: 16,
            nkey_file: None,
        };
        let admin_token = format!("admin-{}", random_suffix());
        let sealing_keys = vec![bcm_seal::KeyConfig::generate("test-1")];
        let join_key = bcm_pki::JoinKey::generate();
        let quorum = Quorum::generate();
        let seed: bcm_api::Seed = serde_json::from_value(json!({
            "tenants": [{"id": "a", "name": "Tenant A"}, {"id": "b", "name": "Tenant B"}],
            "sites": [{"id": "s1", "name": "Site 1"}],
            "pools": [
                {"id": "a-pool", "tenant": "a", "site": "s1", "hardware_profile": "gpu-redfish"},
                {"id": "b-pool", "tenant": "b", "site": "s1", "hardware_profile": "gpu-redfish"},
                {"id": "a-agentless", "tenant": "a", "site": "s1", "hardware_profile": "sim",
                 "agent_mode": "none", "unattested_release": "ready"}
            ],
            "deploy_profiles": [
                {"tenant": "a", "profile": sim_profile("p", 1, "host")},
                {"tenant": "a", "profile": sim_profile("ubuntu-24.04", 1, "host")},
                {"tenant": "a", "profile": sim_profile("ubuntu-24.04-gpu-host", 1, "host")},
                {"tenant": "a", "profile": sim_profile("dedicated-ubuntu", 1, "dedicated")},
                {"tenant": "a", "profile": {"id": "talos-iso", "version": 1, "role": "host",
                    "image": {"url": "http://images.invalid/talos-amd64.iso", "format": "iso",
                              "sha256": "7a".repeat(32), "sizeBytes": 100u64 << 20}}},
                {"tenant": "a", "profile": {"id": "talos-iso-dedicated", "version": 1, "role": "dedicated",
                    "image": {"url": "http://images.invalid/talos-amd64.iso", "format": "iso",
                              "sha256": "7a".repeat(32), "sizeBytes": 100u64 << 20}}},
                {"tenant": "b", "profile": sim_profile("p", 1, "host")},
                {"tenant": "b", "profile": sim_profile("b-only", 1, "host")}
            ]
        }))?;
        let cfg = ApiConfig {
            listen: "127.0.0.1:0".parse()?,
            database_url: database_url.clone(),
            database_max_connections: 10,
            database_agent_connections: opts.agent_db_connections,
            database_read_connections: 2,
            bus: bus_config.clone(),
            sealing_keys: sealing_keys.clone(),
            admin_token: admin_token.clone().into(),
            join_key: bcm_pki::JoinKeyConfig::with_key(join_key.clone()),
            lock_timeout_ms: opts.lock_timeout_ms,
            relay: RelayConfig {
                enabled: opts.relay,
                batch: 64,
                poll_ms: 200,
                linger_ms: 5,
            },
            agents: opts.agents.clone(),
            http: Default::default(),
            rate_limit: opts.rate_limit.clone(),
            telemetry: Default::default(),
            // In-process tests talk plain HTTP on loopback, by name;
            // tests/security/tests/tls.rs serves the real HTTPS.
            tls: bcm_pki::tls::ServerTlsConfig {
                plain_http: true,
                ..Default::default()
            },
            quorum: bcm_api::QuorumConfig {
                policy_key: Some(quorum.policy.clone()),
                anchor: Some(quorum.anchor.clone()),
                ..Default::default()
            },
            seed,
            downloads: opts.downloads.clone(),
            hardware_profiles: opts.hardware_profiles.clone(),
            default_hardware_profile: "gpu-redfish".into(),
        };
        let state = bcm_api::prepare(&cfg).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let shutdown = CancellationToken::new();
        let app = bcm_api::router(state.clone());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum_serve(listener, app, stop).await;
        });
        let env = Self {
            db: state.inner.db.clone(),
            database_url,
            bus_config,
            state,
            base,
            admin_token,
            http: reqwest::Client::new(),
            faults: opts
                .site
                .as_ref()
                .map(bcm_sim::Faults::from_config)
                .unwrap_or_default(),
            sealing_keys,
            join_key,
            agent_silence_ms: opts.agent_silence_ms,
            step_timeouts: opts.step_timeouts.clone(),
            quorum,
            executions: Default::default(),
            site: std::sync::Mutex::new(None),
            temp_files: std::sync::Mutex::new(vec![]),
            shutdown,
        };
        if opts.relay {
            env.spawn_relay(RelayFaults::default());
        }
        if opts.attestation {
            let mut cfg = bcm_attestation::AttestationConfig::ephemeral();
            if let Some(ttl) = opts.node_cert_ttl_secs {
                cfg.node_cert_ttl_secs = ttl;
            }
            env.spawn_attestation(cfg).await?;
        }
        if let Some(sim) = opts.site.clone() {
            if opts.engine {
                env.spawn_engine();
            }
            for _ in 0..opts.reconcilers {
                env.spawn_reconciler();
            }
            env.spawn_site(sim).await?;
        }
        Ok(env)
    }

    /// Starts a simulated site with `cfg` on the machines its store kept
    /// (none, the first time); a running one is stopped first, as a restart
    /// of the site process. Returns once the new one was started.
    pub async fn spawn_site(&self, mut cfg: bcm_sim::SimConfig) -> anyhow::Result<()> {
        if !cfg.join_key.is_set() {
            cfg.join_key = bcm_pki::JoinKeyConfig::with_key(self.join_key.for_site(&cfg.site));
        }
        if cfg.quorum_anchor.is_none() && cfg.quorum_anchor_file.is_none() {
            cfg.quorum_anchor = Some(self.quorum.anchor.clone());
        }
        let old = self.site.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((stop, task)) = old {
            stop.cancel();
            let _ = task.await;
        }
        let machines = bcm_sim::site::Machines::durable(&self.state.inner.bus, &cfg.site).await?;
        let stop = self.shutdown.child_token();
        let site = bcm_sim::site::run(
            self.state.inner.bus.clone(),
            cfg,
            machines,
            self.faults.clone(),
            self.executions.clone(),
            stop.clone(),
        );
        let task = tokio::spawn(async move {
            if let Err(e) = site.await {
                tracing::error!(error = %e, "the simulated site stopped");
            }
        });
        *self.site.lock().unwrap_or_else(|p| p.into_inner()) = Some((stop, task));
        Ok(())
    }

    /// A token cancelled when the environment stops.
    pub fn child_token(&self) -> CancellationToken {
        self.shutdown.child_token()
    }

    /// Starts an attestation service (subscribed when this returns);
    /// returns its stop token.
    pub async fn spawn_attestation(
        &self,
        cfg: bcm_attestation::AttestationConfig,
    ) -> anyhow::Result<CancellationToken> {
        let stop = self.shutdown.child_token();
        let (db, bus) = (self.db.clone(), self.state.inner.bus.clone());
        bcm_attestation::start(db, bus, cfg, stop.clone()).await?;
        Ok(stop)
    }

    /// Starts a workflow engine; returns its stop token.
    pub fn spawn_engine(&self) -> CancellationToken {
        let stop = self.shutdown.child_token();
        let mut cfg = bcm_workflow::EngineConfig::new(self.base.clone());
        cfg.poll_ms = 100;
        cfg.join_poll_ms = 50;
        cfg.agent_silence_ms = self.agent_silence_ms;
        cfg.step_timeouts = self.step_timeouts.clone();
        cfg.join_key = bcm_pki::JoinKeyConfig::with_key(self.join_key.clone());
        tokio::spawn(bcm_workflow::run(
            self.db.clone(),
            self.state.inner.bus.clone(),
            cfg,
            stop.clone(),
        ));
        stop
    }

    /// Starts a reconciler worker; returns its stop token.
    pub fn spawn_reconciler(&self) -> CancellationToken {
        self.spawn_reconciler_with(ReconcilerConfig {
            metal_poll_ms: 5000,
            lease_ttl_ms: 3000,
            holder: None,
            lock_timeout_ms: 2000,
            ..Default::default()
        })
    }

    /// Starts a reconciler worker with `cfg` (a test's own poll and power
    /// sync settings).
    pub fn spawn_reconciler_with(&self, cfg: ReconcilerConfig) -> CancellationToken {
        let stop = self.shutdown.child_token();
        tokio::spawn(bcm_reconciler::run(
            self.db.clone(),
            self.state.inner.bus.clone(),
            cfg,
            stop.clone(),
        ));
        stop
    }

    /// Waits until the node is in `state` (and no workflow runs for it when
    /// the state is not workflow-driven).
    pub async fn wait_state(
        &self,
        id: &NodeId,
        state: ProvisionState,
        within: Duration,
    ) -> anyhow::Result<bcm_db::nodes::Node> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let n = self.node(id).await?;
            if n.provision_state == state {
                return Ok(n);
            }
            if tokio::time::Instant::now() >= deadline {
                let steps = match n.workflow_id {
                    Some(w) => bcm_db::workflows::steps_fetch(&self.db, &w.to_string())
                        .await?
                        .iter()
                        .map(|s| {
                            format!(
                                "{}={}#{}{}",
                                s.name,
                                s.status,
                                s.attempt,
                                s.error
                                    .as_deref()
                                    .map(|e| format!("({e})"))
                                    .unwrap_or_default()
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
                    None => "no workflow".to_owned(),
                };
                bail!(
                    "node {id} did not reach {state} within {within:?}; it is {} (lastError {:?}); steps: {steps}",
                    n.provision_state,
                    n.last_error
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts a relay (another one may already run; one leads at a time).
    pub fn spawn_relay(&self, faults: RelayFaults) -> tokio::task::JoinHandle<()> {
        self.spawn_relay_with(
            RelayConfig {
                enabled: true,
                batch: 64,
                poll_ms: 200,
                linger_ms: 5,
            },
            faults,
        )
    }

    /// Starts a relay with its own settings.
    pub fn spawn_relay_with(
        &self,
        cfg: RelayConfig,
        faults: RelayFaults,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(bcm_api::relay::run(
            self.state.inner.db.clone(),
            self.state.inner.bus.clone(),
            cfg,
            faults,
            self.shutdown.child_token(),
        ))
    }

    /// `POST` JSON with a bearer token; returns the status and the body.
    pub async fn post(
        &self,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> anyhow::Result<(u16, Value)> {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        Self::answer(req).await
    }

    /// `POST` a raw body (for malformed JSON).
    pub async fn post_raw(
        &self,
        path: &str,
        token: Option<&str>,
        body: &str,
    ) -> anyhow::Result<(u16, Value)> {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        Self::answer(req).await
    }

    /// `GET` with a bearer token.
    pub async fn get(&self, path: &str, token: Option<&str>) -> anyhow::Result<(u16, Value)> {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        Self::answer(req).await
    }

    /// `PUT` JSON with a bearer token.
    pub async fn put(
        &self,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> anyhow::Result<(u16, Value)> {
        let mut req = self.http.put(format!("{}{path}", self.base)).json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        Self::answer(req).await
    }

    async fn answer(req: reqwest::RequestBuilder) -> anyhow::Result<(u16, Value)> {
        let res = req.send().await?;
        let status = res.status().as_u16();
        let text = res.text().await?;
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok((status, body))
    }

    /// Mints a token with `grants` (`[(action, scope kind, scope id)]`).
    pub async fn token(
        &self,
        principal: &str,
        grants: &[(&str, &str, &str)],
    ) -> anyhow::Result<String> {
        let grants: Vec<Value> = grants
            .iter()
            .map(|(action, kind, id)| {
                if *kind == "global" {
                    json!({"action": action, "scope": {"kind": "global"}})
                } else {
                    json!({"action": action, "scope": {"kind": kind, "id": id}})
                }
            })
            .collect();
        let (status, body) = self
            .post(
                "/api/compute/admin/tokens",
                Some(&self.admin_token),
                &json!({"principal": principal, "grants": grants}),
            )
            .await?;
        if status != 200 {
            bail!("minting a token: {status} {body}");
        }
        Ok(body["token"].as_str().context("token")?.to_owned())
    }

    /// A genuine authority for a one-leaf `power` batch of `node` and
    /// `action`, signed by approvers 1 and 2 (what the site's anchor
    /// needs), as a test that publishes a destructive command itself must
    /// carry.
    pub fn power_authority(
        &self,
        node: &NodeId,
        action: bcm_core::PowerAction,
    ) -> bcm_contracts::batch::BatchAuthority {
        let op = bcm_core::batch::Operation::for_power(action);
        let ids = vec![node.to_string()];
        let built = bcm_quorum::build(&ids, op, None).unwrap_or_else(|| panic!("one leaf"));
        let header = bcm_contracts::batch::BatchHeader {
            batch_id: format!("bat_{}", random_suffix()),
            tenant_id: "a".into(),
            pool_id: "a-pool".into(),
            operation: op,
            wipe: None,
            reason_sha256: bcm_quorum::reason_sha256("a test's own command"),
            expires_at: chrono::Utc::now().timestamp() + 3600,
            root: built.root,
            leaf_count: 1,
        };
        let approvals = self.quorum.approvers[..2]
            .iter()
            .enumerate()
            .map(|(i, k)| bcm_contracts::batch::ApprovalSignature {
                approver_id: format!("approver-{}", i + 1),
                signature: bcm_quorum::sign(k, &header),
            })
            .collect();
        bcm_contracts::batch::BatchAuthority {
            header,
            leaf_index: 0,
            proof: vec![],
            approvals,
        }
    }

    /// Writes the site's quorum anchor to a file (for a bmc or boot
    /// service's `quorum_anchor_file`) and returns its path.
    pub fn anchor_file(&self) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("bcm-anchor-{}.json", random_suffix()));
        let text = serde_json::to_string(&self.quorum.anchor).unwrap_or_default();
        if let Err(e) = std::fs::write(&path, text) {
            panic!("writing {}: {e}", path.display());
        }
        self.temp_files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(path.clone());
        path
    }

    /// Registers `approver-1`..`approver-3` for tenant `a` with their
    /// test keys, as principals `approver-<n>`, and returns each one's API
    /// token (reading tenant `a`'s nodes: an approver needs nothing more to
    /// sign).
    pub async fn register_approvers(&self) -> anyhow::Result<Vec<String>> {
        let mut tokens = vec![];
        for (i, k) in self.quorum.approvers.iter().enumerate() {
            let id = format!("approver-{}", i + 1);
            let (s, b) = self
                .put(
                    &format!("/api/compute/admin/approvers/{id}"),
                    Some(&self.admin_token),
                    &json!({"tenantId": "a", "principal": id, "publicKey": bcm_quorum::public_key_b64(k)}),
                )
                .await?;
            if s != 200 {
                bail!("registering {id}: {s} {b}");
            }
            tokens.push(
                self.token(&id, &[("compute:nodes:read", "tenant", "a")])
                    .await?,
            );
        }
        Ok(tokens)
    }

    /// A one-time `node` join token of `pool` of `tenant` (the adopt path),
    /// minted through the API as the admin.
    pub async fn pool_join_token(&self, tenant: &str, pool: &str) -> anyhow::Result<String> {
        let (status, body) = self
            .post(
                "/api/compute/metal/joinTokens",
                Some(&self.admin_token),
                &json!({"tenantId": tenant, "poolId": pool, "ttlSecs": 600}),
            )
            .await?;
        anyhow::ensure!(status == 200, "joinTokens: {status} {body}");
        body["token"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow::anyhow!("joinTokens answered no token: {body}"))
    }

    /// Enrolls a node in `pool` of `tenant` as the admin, with a unique BMC.
    pub async fn enroll(&self, tenant: &str, pool: &str) -> anyhow::Result<Value> {
        let (status, body) = self
            .post(
                "/api/compute/metal/enroll",
                Some(&self.admin_token),
                &json!({
                    "tenantId": tenant, "poolId": pool,
                    "bmc": {"driver": "redfish", "address": format!("https://bmc-{}.test", random_suffix()),
                            "username": "root", "password": "calvin-secret"}
                }),
            )
            .await?;
        if status != 200 {
            bail!("enroll: {status} {body}");
        }
        Ok(body)
    }

    /// Enrolls the simulated machine `sim://<name>` in tenant `a`, pool `a-pool`.
    pub async fn enroll_sim(&self, name: &str) -> NodeId {
        self.enroll_sim_in(name, "a-pool").await
    }

    /// Enrolls the simulated machine `sim://<name>` in tenant `a`'s pool
    /// `pool`.
    pub async fn enroll_sim_in(&self, name: &str, pool: &str) -> NodeId {
        let (s, b) = self
            .post(
                "/api/compute/metal/enroll",
                Some(&self.admin_token),
                &json!({"tenantId": "a", "poolId": pool,
                    "hardwareProfile": "sim", "bmc": {"driver": "sim", "address": format!("sim://{name}"), "username": "admin", "password": "pw"}}),
            )
            .await
            .unwrap_or_else(|e| panic!("enroll {name}: {e}"));
        assert_eq!(s, 200, "enroll {name}: {b}");
        b["nodeId"]
            .as_str()
            .and_then(|i| i.parse().ok())
            .unwrap_or_else(|| panic!("enroll {name}: {b}"))
    }

    /// Enrolls `sim://<name>` into `a-pool` and deploys it with profile
    /// `p` v1: the node, in `deployed`.
    pub async fn deployed_sim(&self, name: &str) -> NodeId {
        let t = Duration::from_secs(60);
        let id = self.enroll_sim(name).await;
        self.wait_state(&id, ProvisionState::Ready, t)
            .await
            .unwrap_or_else(|e| panic!("{name} ready: {e}"));
        let (s, b) = self
            .verb(
                "deploy",
                &id,
                json!({"profileId": "p", "profileVersion": 1}),
            )
            .await;
        assert_eq!(s, 200, "deploy {name}: {b}");
        self.wait_state(&id, ProvisionState::Deployed, t)
            .await
            .unwrap_or_else(|e| panic!("{name} deployed: {e}"));
        id
    }

    /// Enrolls `n` simulated machines `sim://<prefix>-<i>` into `a-pool`.
    pub async fn enroll_sims(&self, prefix: &str, n: usize) -> Vec<NodeId> {
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            ids.push(self.enroll_sim(&format!("{prefix}-{i}")).await);
        }
        ids
    }

    /// Calls `metal.<verb>` on a node of tenant `a` as the admin, with the
    /// fields of `extra` added to the body.
    pub async fn verb(&self, verb: &str, node: &NodeId, extra: Value) -> (u16, Value) {
        let mut body = json!({"tenantId": "a", "nodeId": node.to_string()});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        self.post(
            &format!("/api/compute/metal/{verb}"),
            Some(&self.admin_token),
            &body,
        )
        .await
        .unwrap_or_else(|e| panic!("{verb}: {e}"))
    }

    /// [`TestEnv::verb`] that must answer 200; returns the node view.
    pub async fn verb_ok(&self, verb: &str, node: &NodeId, extra: Value) -> Value {
        let (s, b) = self.verb(verb, node, extra).await;
        assert_eq!(s, 200, "{verb}: {b}");
        b
    }

    /// Puts a node into `state` as the reconciler would have (test set-up
    /// only), through the db crate's guarded update. Returns the version.
    pub async fn force_state(
        &self,
        node: &NodeId,
        state: ProvisionState,
        failed_from: Option<ProvisionState>,
    ) -> anyhow::Result<i64> {
        let mut tx = self.db.begin().await?;
        let n = bcm_db::nodes::node_fetch_for_update_in_txn(&mut tx, node).await?;
        let mut next = bcm_db::nodes::Node {
            provision_state: state,
            failed_from,
            maintenance: failed_from.is_some() || n.maintenance,
            workflow_id: None,
            unrescue_pending: false,
            ..n
        };
        if state == ProvisionState::Rescue {
            // As after `metal-rescue` succeeded: the rescue ramdisk is up.
            let id = bcm_core::WorkflowId::generate();
            let profile = bcm_core::workflow::metal_rescue();
            bcm_db::workflows::workflow_insert_in_txn(
                &mut tx,
                &bcm_db::workflows::NewWorkflow {
                    id: id.to_string(),
                    node_id: node.to_string(),
                    owner: "metal".into(),
                    profile_id: profile.id.clone(),
                    profile_version: profile.version as i32,
                    for_state: state.as_str().into(),
                    for_version: next.version,
                    definition: serde_json::to_value(&profile)?,
                    actor: None,
                    traceparent: None,
                    steps: vec![],
                },
            )
            .await?;
            let mut wf =
                bcm_db::workflows::workflow_fetch_for_update_in_txn(&mut tx, &id.to_string())
                    .await?;
            wf.status = bcm_core::workflow::WorkflowPhase::Succeeded;
            bcm_db::workflows::workflow_update_in_txn(&mut tx, &wf, true).await?;
            next.workflow_id = Some(id);
        }
        let v = bcm_db::nodes::node_update_guarded_in_txn(&mut tx, &next).await?;
        tx.commit().await?;
        Ok(v)
    }

    /// Reads a node from the record.
    pub async fn node(&self, id: &NodeId) -> anyhow::Result<bcm_db::nodes::Node> {
        Ok(bcm_db::nodes::node_fetch(&self.db, id).await?)
    }

    /// The subjects of this env's namespace.
    pub fn subjects(&self) -> &bcm_bus::Subjects {
        self.state.inner.bus.subjects()
    }

    /// A durable pull consumer over this env's events matching `filter`, a
    /// subject from [`TestEnv::subjects`].
    pub async fn events_consumer(
        &self,
        durable: &str,
        filter: &str,
    ) -> anyhow::Result<EventReader> {
        let subjects = self.state.inner.bus.subjects();
        let stream = self
            .state
            .inner
            .bus
            .jetstream()
            .get_stream(subjects.stream(StreamKind::Events))
            .await?;
        let consumer = stream
            .get_or_create_consumer(
                durable,
                pull::Config {
                    durable_name: Some(durable.to_owned()),
                    filter_subject: filter.to_owned(),
                    deliver_policy: DeliverPolicy::All,
                    ack_policy: AckPolicy::Explicit,
                    ..Default::default()
                },
            )
            .await?;
        Ok(EventReader { consumer })
    }

    /// Publishes `payload` as it is on `subject` (a stream subject of this
    /// env's namespace), as a peer that breaks the contracts would.
    pub async fn publish_raw(&self, subject: &str, payload: &[u8]) -> anyhow::Result<()> {
        let id = format!("raw-{}", random_suffix());
        self.state
            .inner
            .bus
            .publish_durable(subject, &id, &[], payload.to_vec().into())
            .await?;
        Ok(())
    }

    /// Waits until the durable consumer `consumer` has dead-lettered at
    /// least `n` messages, and returns them.
    pub async fn dead_letters(
        &self,
        consumer: &str,
        n: usize,
        within: Duration,
    ) -> anyhow::Result<Vec<bcm_bus::consumer::DeadLetter>> {
        let bus = self.state.inner.bus.clone();
        eventually(within, || {
            let bus = bus.clone();
            async move {
                let got = bcm_bus::consumer::dead_letters(&bus, consumer).await?;
                Ok((got.len() >= n).then_some(got))
            }
        })
        .await
        .with_context(|| format!("{consumer} dead-lettered fewer than {n} messages"))
    }

    /// Stops the api and its relays.
    pub fn stop(&self) {
        self.shutdown.cancel();
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.shutdown.cancel();
        for f in self
            .temp_files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = std::fs::remove_file(f);
        }
    }
}

async fn axum_serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}

/// An event as read from JetStream, with its headers.
#[derive(Debug, Clone)]
pub struct ReadEvent {
    pub subject: String,
    pub event: CloudEvent<Value>,
    pub traceparent: Option<String>,
}

/// Reads events from a durable consumer, acking each.
pub struct EventReader {
    consumer: async_nats::jetstream::consumer::Consumer<pull::Config>,
}

impl EventReader {
    /// Reads until `n` events arrived or `within` passed; returns what came.
    pub async fn read(&self, n: usize, within: Duration) -> anyhow::Result<Vec<ReadEvent>> {
        let deadline = tokio::time::Instant::now() + within;
        let mut out = vec![];
        while out.len() < n && tokio::time::Instant::now() < deadline {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let mut batch = self
                .consumer
                .fetch()
                .max_messages(n - out.len())
                .expires(
                    left.min(Duration::from_secs(2))
                        .max(Duration::from_millis(100)),
                )
                .messages()
                .await?;
            while let Some(msg) = batch.next().await {
                let msg = msg.map_err(|e| anyhow::anyhow!("{e}"))?;
                let event: CloudEvent<Value> = serde_json::from_slice(&msg.payload)?;
                out.push(ReadEvent {
                    subject: msg.subject.to_string(),
                    traceparent: bcm_bus::traceparent_of(msg.headers.as_ref()),
                    event,
                });
                msg.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            }
        }
        Ok(out)
    }

    /// Reads until nothing more arrives for `quiet`.
    pub async fn drain(&self, quiet: Duration) -> anyhow::Result<Vec<ReadEvent>> {
        let mut out = vec![];
        loop {
            let got = self.read(1000, quiet).await?;
            if got.is_empty() {
                return Ok(out);
            }
            out.extend(got);
        }
    }
}

/// Polls `check` until it returns `Some` or `within` passes.
pub async fn eventually<T, F, Fut>(within: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("condition not met within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tenant `a` of the seed.
pub fn tenant_a() -> bcm_core::TenantId {
    "a".parse()
        .unwrap_or_else(|_| unreachable!("a valid tenant id"))
}

/// A deploy profile for the simulated site (whose ramdisk does not download
/// the image), with the shipped user data template.
pub fn sim_profile(id: &str, version: u32, role: &str) -> serde_json::Value {
    json!({
        "id": id, "version": version, "role": role,
        "image": {"url": format!("http://images.invalid/{id}.raw"), "format": "raw",
                  "sha256": "5d".repeat(32), "sizeBytes": 1u64 << 30}
    })
}

/// A whole database as `pg_dump` writes it, for tests that search it.
pub fn dump_database(url: &str) -> String {
    let dump = std::process::Command::new(pg_dump())
        .arg(url)
        .output()
        .expect("pg_dump");
    assert!(
        dump.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    String::from_utf8_lossy(&dump.stdout).into_owned()
}

/// Debian's newest `pg_dump`, for tests that grep a whole database.
pub fn pg_dump() -> std::path::PathBuf {
    let mut found: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path().join("bin/pg_dump")))
                .filter(|p| p.exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().unwrap_or_else(|| "pg_dump".into())
}
