//! The `api` service: the metal API group over HTTP (axum), node views,
//! administration of tenants, sites, pools and tokens, and the outbox relay
//! that publishes what the API commits.
//!
//! `main.rs` only parses arguments and loads [`ApiConfig`]; [`run`] does the
//! rest, so tests and the all-in-one binary start the service in-process.

pub mod admin;
pub mod agent;
pub mod auth;
pub mod bulk;
pub mod connections;
pub mod downloads;
pub mod error;
pub mod extract;
pub mod idle_fleet;
pub mod images;
pub mod join_tokens;
pub mod leases;
pub mod limits;
pub use bcm_telemetry::once_per_second;
pub mod openapi;
pub mod profiles;
pub mod reads;
pub mod relay;
pub mod requests;
pub mod touches;
pub mod verbs;
pub mod views;
pub mod wakeups;
pub mod whole_number;

use axum::routing::{get, post, put};
use bcm_bus::{Bus, BusConfig};
use bcm_db::Db;
use bcm_seal::{KeyConfig, Sealer};
use bcm_telemetry::TelemetryConfig;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Configuration of the api service. Every field is documented; unknown
/// fields are refused.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct ApiConfig {
    /// Address the HTTP API listens on.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Postgres URL, e.g. `postgres://postgres@127.0.0.1:5432/bcm`.
    pub database_url: String,
    /// Connection pool size.
    #[serde(default = "default_db_connections")]
    pub database_max_connections: u32,
    /// A second pool, for the agent endpoints alone (join, heartbeat,
    /// command polls, results): a flood of agents waits on it, never on the
    /// pool the verbs and reads use.
    #[serde(default = "default_agent_db_connections")]
    pub database_agent_connections: u32,
    /// A third pool, read-only, for the node reads (`GET` of a node and of
    /// a page of nodes) and the API tokens' lookup: a read waits for other
    /// reads only, never behind verbs that hold the main pool's connections
    /// while they wait for row locks.
    #[serde(default = "default_read_db_connections")]
    pub database_read_connections: u32,
    /// NATS JetStream.
    pub bus: BusConfig,
    /// Sealing keys for BMC credentials; the first seals, all open.
    pub sealing_keys: Vec<KeyConfig>,
    /// The bootstrap admin's bearer token.
    pub admin_token: SecretString,
    /// The control plane's join key (master): the API hands an agent the
    /// tokens its command's join references stand for. `bcm nats-auth`
    /// writes `join.key`.
    #[serde(default)]
    pub join_key: bcm_pki::JoinKeyConfig,
    /// How long a verb waits for a node's row lock before `CONFLICT`.
    #[serde(default = "default_lock_timeout_ms")]
    pub lock_timeout_ms: u32,
    /// The outbox relay.
    #[serde(default)]
    pub relay: relay::RelayConfig,
    /// How the agent endpoints ride out lost answers.
    #[serde(default)]
    pub agents: AgentProtocolConfig,
    /// The API's client connections: how many at once, how long idle.
    #[serde(default)]
    pub http: connections::HttpConfig,
    /// Per-principal request limits.
    #[serde(default)]
    pub rate_limit: limits::RateLimitConfig,
    /// Logs, traces and metrics.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// HTTPS: the server's certificate and key (`bcm local-tls` writes a
    /// local CA and certificate), or `plain_http = true` by name.
    #[serde(default)]
    pub tls: bcm_pki::tls::ServerTlsConfig,
    /// The destructive-batch quorum: the policy key and batch lifetimes.
    #[serde(default)]
    pub quorum: QuorumConfig,
    /// Tenants, sites and pools to create at start-up if missing.
    #[serde(default)]
    pub seed: Seed,
    /// What the API serves to machines (bcd for the installed OS).
    #[serde(default)]
    pub downloads: downloads::DownloadsConfig,
    /// Hardware profiles by name, added to (or replacing) the shipped ones
    /// (`gpu-redfish`, `redfish`, `ipmi`, `sim`): one driver per concern.
    #[serde(default)]
    pub hardware_profiles: std::collections::BTreeMap<String, bcm_core::hardware::HardwareProfile>,
    /// The profile of a node whose enroll and pool name none.
    #[serde(default = "default_hardware_profile")]
    pub default_hardware_profile: String,
}

fn default_hardware_profile() -> String {
    "gpu-redfish".into()
}

/// The hardware profiles: the shipped ones with the configuration's over
/// them; an error names the key.
pub fn hardware_profiles(cfg: &ApiConfig) -> Result<bcm_core::hardware::Profiles, StartError> {
    let mut profiles = bcm_core::hardware::Profiles::builtin();
    for (name, p) in &cfg.hardware_profiles {
        profiles
            .insert(name, p.clone())
            .map_err(|e| StartError::Config(format!("hardware_profiles.{name}: {e}")))?;
    }
    profiles
        .get(&cfg.default_hardware_profile)
        .map_err(|e| StartError::Config(format!("default_hardware_profile: {e}")))?;
    for (i, p) in cfg.seed.pools.iter().enumerate() {
        profiles
            .get(&p.hardware_profile)
            .map_err(|e| StartError::Config(format!("seed.pools[{i}].hardware_profile: {e}")))?;
    }
    Ok(profiles)
}

/// The destructive-batch quorum as the API runs it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuorumConfig {
    /// The control plane's policy key (a 32-byte ed25519 seed in hex or
    /// base64; `bcm quorum-keys` writes one, mode 0600): its signature
    /// approves the one-node batch of an ordinary verb in a pool whose
    /// policy allows it, and the edges' trust anchors name its public key.
    /// Absent: every batch waits for the pool's approvers.
    #[serde(default)]
    pub policy_key_file: Option<std::path::PathBuf>,
    /// A policy key handed over in process (tests, the all-in-one).
    #[serde(skip)]
    pub policy_key: Option<ed25519_dalek::SigningKey>,
    /// The approver id the edges' anchors name the policy key by.
    #[serde(default = "default_policy_approver_id")]
    pub policy_approver_id: String,
    /// The sites' trust anchor (what `bcm quorum-keys` wrote, the file the
    /// BMC service, boot service and agents verify against). Its quorum is
    /// the floor of every batch's `quorumRequired`: a pool that asks fewer
    /// approvers gets batches needing the anchor's count, never batches
    /// this API calls approved and every edge refuses. Absent: the pool's
    /// count stands alone (and a warning says so).
    #[serde(default)]
    pub anchor_file: Option<std::path::PathBuf>,
    /// An anchor handed over in process (tests, the bench).
    #[serde(skip)]
    pub anchor: Option<bcm_quorum::Anchor>,
    /// How long a verb's one-node batch authorizes its chain's commands.
    #[serde(default = "default_node_batch_ttl_secs")]
    pub node_batch_ttl_secs: u64,
    /// The longest expiry a bulk request may ask for.
    #[serde(default = "default_bulk_max_ttl_secs")]
    pub bulk_max_ttl_secs: u64,
}

impl Default for QuorumConfig {
    fn default() -> Self {
        Self {
            policy_key_file: None,
            policy_key: None,
            policy_approver_id: default_policy_approver_id(),
            anchor_file: None,
            anchor: None,
            node_batch_ttl_secs: default_node_batch_ttl_secs(),
            bulk_max_ttl_secs: default_bulk_max_ttl_secs(),
        }
    }
}

fn default_policy_approver_id() -> String {
    bcm_quorum::POLICY_APPROVER_ID.to_owned()
}
fn default_node_batch_ttl_secs() -> u64 {
    // A chain's longest step (a wipe: 24 h) with room to start it; an
    // authority carried on the bus is good for no longer.
    2 * 86_400
}
fn default_bulk_max_ttl_secs() -> u64 {
    7 * 86_400
}

impl QuorumConfig {
    /// The policy signer, from the key given in process or its file.
    pub fn signer(&self) -> Result<Option<bcm_metal::batches::PolicySigner>, String> {
        let key = match (&self.policy_key, &self.policy_key_file) {
            (Some(k), _) => Some(k.clone()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("quorum.policy_key_file {}: {e}", path.display()))?;
                Some(
                    bcm_quorum::signing_key(&text)
                        .map_err(|e| format!("quorum.policy_key_file {}: {e}", path.display()))?,
                )
            }
            (None, None) => None,
        };
        Ok(key.map(|key| bcm_metal::batches::PolicySigner {
            id: self.policy_approver_id.clone(),
            key,
        }))
    }

    /// How many approvers the edges' anchor asks (none when no anchor is
    /// configured), from the anchor given in process or its file.
    pub fn edge_quorum(&self) -> Result<Option<u32>, String> {
        let anchor = match (&self.anchor, &self.anchor_file) {
            (Some(a), _) => Some(a.clone()),
            (None, Some(path)) => Some(
                bcm_quorum::anchor_from_file(path)
                    .map_err(|e| format!("quorum.anchor_file: {e}"))?,
            ),
            (None, None) => None,
        };
        Ok(anchor.map(|a| u32::try_from(a.quorum).unwrap_or(u32::MAX)))
    }
}

/// How the agent endpoints ride out lost answers (see `agent.rs`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentProtocolConfig {
    /// A command handed to an agent is offered again after this long with
    /// no result: the poll's answer may never have arrived. Agents run a
    /// command id at most once and answer a repeat from their record.
    #[serde(default = "default_command_lease_ms")]
    pub command_lease_ms: u64,
    /// How long a join or result keeps being forwarded to the attestation
    /// service while the bus or the service is away, before `UNAVAILABLE`.
    #[serde(default = "default_attest_retry_ms")]
    pub attest_retry_ms: u64,
    /// The heartbeat cadence asked of an agent whose node runs a workflow,
    /// and of every ramdisk agent (a step may be waiting on it, and the
    /// engine counts a ramdisk silent after `agent_silence_ms`).
    #[serde(default = "default_busy_heartbeat_secs")]
    pub busy_heartbeat_secs: u32,
    /// The cadence asked of an idle installed OS (no workflow running), to
    /// which a tenth is added or taken at random so a fleet deployed
    /// together does not beat together.
    #[serde(default = "default_idle_heartbeat_secs")]
    pub idle_heartbeat_secs: u32,
    /// The most heartbeats a second the whole idle fleet is asked for:
    /// with more than `idle_heartbeat_secs` times this many idle installed
    /// OSes, each is asked to beat every `fleet / this` seconds instead
    /// (at most an hour; see `idle_fleet.rs`). 0 keeps the fixed
    /// `idle_heartbeat_secs` however large the fleet.
    #[serde(default = "default_max_idle_heartbeats_per_sec")]
    pub max_idle_heartbeats_per_sec: u32,
    /// How often each replica counts the idle fleet (seconds).
    #[serde(default = "default_idle_fleet_refresh_secs")]
    pub idle_fleet_refresh_secs: u32,
    /// How long an agent request waits in line for one of the agent pool's
    /// connections (`database_agent_connections`) before `UNAVAILABLE`
    /// (with `Retry-After`). Meanwhile the waiting agent counts as heard.
    /// A longer line does not add capacity: at N = 10,000 as separate
    /// processes, 30 s made the release slower than 10 s (docs/
    /// performance.md, "The agent pool's line"). Each statement of a
    /// request waits at most this long (a result has one before it is
    /// forwarded, `attest_retry_ms`; a busy heartbeat two); at most 30 s.
    #[serde(default = "default_pool_wait_ms")]
    pub pool_wait_ms: u64,
}

impl AgentProtocolConfig {
    /// Refuses cadences an agent would not keep (0, or above an hour).
    pub fn check(&self) -> Result<(), String> {
        let max = bcm_contracts::agent::HeartbeatAck::MAX_SECS;
        for (name, v) in [
            ("agents.busy_heartbeat_secs", self.busy_heartbeat_secs),
            ("agents.idle_heartbeat_secs", self.idle_heartbeat_secs),
        ] {
            if !(1..=max).contains(&v) {
                return Err(format!("{name} must be 1-{max}, not {v}"));
            }
        }
        let refresh = self.idle_fleet_refresh_secs;
        if !(1..=3600).contains(&refresh) {
            return Err(format!(
                "agents.idle_fleet_refresh_secs must be 1-3600, not {refresh}"
            ));
        }
        let wait = self.pool_wait_ms;
        if !(100..=POOL_WAIT_MAX_MS).contains(&wait) {
            return Err(format!(
                "agents.pool_wait_ms must be 100-{POOL_WAIT_MAX_MS}, not {wait}"
            ));
        }
        let rate = self.max_idle_heartbeats_per_sec;
        if rate > 1_000_000 {
            return Err(format!(
                "agents.max_idle_heartbeats_per_sec must be 0 (a fixed cadence) to 1000000, not {rate}"
            ));
        }
        Ok(())
    }
}

impl Default for AgentProtocolConfig {
    fn default() -> Self {
        Self {
            command_lease_ms: default_command_lease_ms(),
            attest_retry_ms: default_attest_retry_ms(),
            busy_heartbeat_secs: default_busy_heartbeat_secs(),
            idle_heartbeat_secs: default_idle_heartbeat_secs(),
            max_idle_heartbeats_per_sec: default_max_idle_heartbeats_per_sec(),
            idle_fleet_refresh_secs: default_idle_fleet_refresh_secs(),
            pool_wait_ms: default_pool_wait_ms(),
        }
    }
}

/// The longest `agents.pool_wait_ms`.
const POOL_WAIT_MAX_MS: u64 = 30_000;

fn default_pool_wait_ms() -> u64 {
    10_000
}

fn default_command_lease_ms() -> u64 {
    // Longer than an agent needs to read a poll's answer. A lease may run
    // out under a command still running (a wipe takes hours), but nobody
    // else polls that session meanwhile: agents poll again only once it is
    // answered, and one restarted answers it from its record.
    30_000
}
fn default_busy_heartbeat_secs() -> u32 {
    // Six chances inside the engine's default silence limit (60 s).
    10
}
fn default_idle_heartbeat_secs() -> u32 {
    // 10,000 deployed nodes: about 170 requests a second, not 1,000.
    60
}
fn default_max_idle_heartbeats_per_sec() -> u32 {
    // Up to 6,000 idle machines beat every 60 s; 100,000 every 1,000 s.
    100
}
fn default_idle_fleet_refresh_secs() -> u32 {
    // The cadence follows the fleet within one old cadence anyway.
    30
}
fn default_attest_retry_ms() -> u64 {
    // Long enough for a NATS server to restart and clients to reconnect.
    20_000
}

/// Declarative tenancy created at start-up.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seed {
    #[serde(default)]
    pub tenants: Vec<SeedNamed>,
    #[serde(default)]
    pub sites: Vec<SeedNamed>,
    #[serde(default)]
    pub pools: Vec<SeedPool>,
    /// Tenant deploy profiles (immutable versions).
    #[serde(default)]
    pub deploy_profiles: Vec<SeedDeployProfile>,
}

/// A deploy profile version to store in a tenant's catalog.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedDeployProfile {
    pub tenant: String,
    /// The profile, in its wire form (camelCase keys).
    pub profile: bcm_core::deploy::DeployProfile,
}

/// A tenant or site to create.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedNamed {
    pub id: String,
    pub name: String,
}

/// A pool to create.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedPool {
    pub id: String,
    pub tenant: String,
    pub site: String,
    pub hardware_profile: String,
    /// `bcd` (the default) or `none` (agentless).
    #[serde(default)]
    pub agent_mode: bcm_core::agentless::AgentMode,
    /// An agentless pool's release without an attested erase: `failed`
    /// (the default) or `ready`.
    #[serde(default)]
    pub unattested_release: bcm_core::agentless::UnattestedRelease,
    /// Commissioning accepts `diag.dcgm` answering `unsupported` (a pool
    /// of machines without GPUs).
    #[serde(default)]
    pub accept_unsupported_diag: bool,
    /// The deploy profile ids the pool accepts (absent: every profile of
    /// its tenant).
    #[serde(default)]
    pub deploy_profiles: Option<Vec<String>>,
    /// A release's wipe when the request names none.
    #[serde(default)]
    pub release_wipe: bcm_core::WipeMode,
    /// Commissioning's wipe.
    #[serde(default)]
    pub commission_wipe: bcm_core::WipeMode,
    /// Adoption's acceptance checks.
    #[serde(default)]
    pub adopt_acceptance: Option<bcm_core::reconcile::AdoptAcceptance>,
    /// The erase methods that satisfy secure-erase and crypto-erase
    /// (absent: the default policy).
    #[serde(default)]
    pub erase_methods: Option<bcm_core::erase::ErasePolicy>,
    /// How many dedicated-root leases the pool holds at once (absent: no
    /// limit).
    #[serde(default)]
    pub max_dedicated_leases: Option<u32>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
fn default_db_connections() -> u32 {
    16
}
fn default_agent_db_connections() -> u32 {
    6
}
fn default_read_db_connections() -> u32 {
    16
}
fn default_lock_timeout_ms() -> u32 {
    2000
}

impl ApiConfig {
    /// Loads from an optional TOML file, then `BCM_API_*` environment variables
    /// (`BCM_API_DATABASE_URL`, `BCM_API_BUS__URL`, …).
    pub fn load(path: Option<&std::path::Path>) -> Result<Self, Box<figment::Error>> {
        bcm_config::load(path, "BCM_API_")
    }
}

/// Errors that stop the service from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("database: {0}")]
    Db(#[from] bcm_db::DbError),
    #[error("bus: {0}")]
    Bus(#[from] bcm_bus::BusError),
    #[error("configuration: {0}")]
    Config(String),
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

/// The router type of the API.
pub type Router = axum::Router;

/// How long in-flight requests may take to finish after `stop`: an agent's
/// long-poll (up to 30 s), or a connection to a machine that was powered
/// off and will never read its answer, must not hold the process.
pub const DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves `app` on `listener` until `stop` — HTTPS, or plain HTTP when
/// the configuration asked for it by name — holding at most `http`'s cap
/// of connections and closing idle ones (`connections.rs`), then drains
/// for at most [`DRAIN`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    serving: bcm_pki::tls::Serving,
    http: &connections::HttpConfig,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let open_files = bcm_telemetry::open_files::raise_to_hard_limit();
    if let Some(files) = open_files.filter(|f| f.raised_from.is_some()) {
        tracing::info!(from = ?files.raised_from, to = files.soft, "raised the open-file limit to the hard limit");
    }
    let cap = http.cap(open_files.map(|f| f.soft));
    tracing::info!(
        max_connections = cap,
        idle_timeout_secs = http.idle_timeout_secs,
        "API connections"
    );
    let handle = axum_server::Handle::new();
    let h = handle.clone();
    tokio::spawn(async move {
        stop.cancelled().await;
        h.graceful_shutdown(Some(DRAIN));
        // The accept loop does not watch the stop while it waits for a
        // slot at the cap: after the drain everything ends regardless.
        tokio::time::sleep(DRAIN).await;
        let open = h.connection_count();
        if open > 0 {
            tracing::info!(
                open,
                drain_secs = DRAIN.as_secs(),
                "connections still open after the drain are dropped"
            );
        }
        h.shutdown();
    });
    // A request whose body stalls or drips is in flight, so its connection
    // is not idle: the body's own deadline ends it (INVALID_ARGUMENT) and
    // frees the slot. A body its handler left unread is read before the
    // answer goes, or the answer says the connection closes.
    let within = http.idle_timeout();
    let app = app.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            connections::settle_bodies(within, req, next)
        },
    ));
    let capped = connections::Capped::new(app, cap);
    let idle = connections::IdleAcceptor::new(http.idle_timeout());
    let server = axum_server::from_tcp(listener.into_std()?).handle(handle);
    match serving {
        bcm_pki::tls::Serving::Tls(tls) => {
            // HTTP/1.1 only (`connections.rs`): ALPN offers nothing else.
            let mut tls = (*tls).clone();
            tls.alpn_protocols = vec![b"http/1.1".to_vec()];
            let config = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(tls));
            let tls = axum_server::tls_rustls::RustlsAcceptor::new(config).acceptor(idle);
            let mut server = server.acceptor(tls);
            http.tune(server.http_builder());
            server.serve(capped).await
        }
        bcm_pki::tls::Serving::Plain => {
            let mut server = server.acceptor(idle);
            http.tune(server.http_builder());
            server.serve(capped).await
        }
    }
}

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState {
    pub inner: Arc<Inner>,
}

/// What the handlers share.
pub struct Inner {
    pub db: Db,
    /// The agent endpoints' own pool.
    pub agent_db: Db,
    /// The node reads' and the token lookup's own pool, read-only.
    pub read_db: Db,
    pub bus: Bus,
    pub sealer: Sealer,
    pub admin_token_hash: Vec<u8>,
    pub lock_timeout_ms: u32,
    /// The agents' long polls, woken per node when its commands are written.
    pub agent_wakeups: Arc<wakeups::AgentWakeups>,
    /// When agents were last turned away unheard, recorded for the engine.
    pub turnaways: agent::TurnAways,
    /// Agent requests' session touches (a poll's with its first look),
    /// gathered into shared statements.
    pub touches: touches::Touches,
    pub agents: AgentProtocolConfig,
    /// The idle installed OSes last counted, which size their cadence.
    pub idle_fleet: Arc<idle_fleet::IdleFleet>,
    /// The join key (master), if configured.
    pub join_key: Option<bcm_pki::JoinKey>,
    /// Per-principal request limits.
    pub limits: limits::Limits,
    /// The policy key that approves one-node batches where pools allow it.
    pub policy_signer: Option<bcm_metal::batches::PolicySigner>,
    pub quorum: QuorumConfig,
    /// The floor of every batch's approver count: the edges' anchor's
    /// quorum (1 without an anchor).
    pub edge_quorum: u32,
    /// The files served to machines.
    pub downloads: downloads::Downloads,
    /// The hardware profiles, and the one a node gets when its enroll and
    /// pool name none.
    pub hardware: bcm_core::hardware::Profiles,
    pub default_hardware_profile: String,
}

/// The router of the service, for tests and the all-in-one binary.
pub fn router(state: AppState) -> Router {
    let metal = axum::Router::<AppState>::new()
        .route("/enroll", post(verbs::enroll))
        .route("/joinTokens", post(join_tokens::create))
        .route("/manage", post(verbs::manage))
        .route("/inspect", post(verbs::inspect))
        .route("/provide", post(verbs::provide))
        .route("/deploy", post(verbs::deploy))
        .route("/undeploy", post(verbs::undeploy))
        .route("/rescue", post(verbs::rescue))
        .route("/unrescue", post(verbs::unrescue))
        .route("/abort", post(verbs::abort))
        .route("/recover", post(verbs::recover))
        .route("/retire", post(verbs::retire))
        .route("/power", post(verbs::power))
        .route("/rotateCredentials", post(verbs::rotate_credentials))
        .route("/bulk", post(bulk::create))
        .route("/batches", get(bulk::list))
        .route("/batches/{id}", get(bulk::get))
        .route("/batches/{id}/nodes", get(bulk::nodes))
        .route("/batches/{id}/approve", post(bulk::approve))
        .route("/batches/{id}/reject", post(bulk::reject))
        .route("/batches/{id}/cancel", post(bulk::cancel))
        .route("/nodes", get(reads::list_nodes))
        .route("/nodes/{node_id}", get(reads::get_node))
        .route("/leases", get(leases::list))
        .route_layer(axum::middleware::from_fn(requests::measured));
    let admin = axum::Router::<AppState>::new()
        .route("/tenants/{id}", put(admin::put_tenant))
        .route("/sites/{id}", put(admin::put_site).get(admin::get_site))
        .route("/sites/{id}/httpProxy", put(admin::put_site_http_proxy))
        .route("/pools", get(admin::list_pools))
        .route("/pools/{id}", put(admin::put_pool).get(admin::get_pool))
        .route("/tokens", post(admin::create_token).get(admin::list_tokens))
        .route("/tokens/{id}", axum::routing::delete(admin::revoke_token))
        .route("/approvers", get(bulk::list_approvers))
        .route(
            "/approvers/{id}",
            put(bulk::put_approver).delete(bulk::revoke_approver),
        )
        .route_layer(axum::middleware::from_fn(requests::measured));
    let agent = axum::Router::<AppState>::new()
        .route("/join", post(agent::join))
        .route("/rejoin", post(agent::rejoin))
        .route("/heartbeat", post(agent::heartbeat))
        .route("/commands", get(agent::commands))
        .route("/results", post(agent::results))
        .layer(axum::middleware::from_fn(agent::measured));
    // The catalogs beside the metal API (profiles, images, hardware
    // profiles, downloads), by their full paths.
    let compute = axum::Router::<AppState>::new()
        .route(
            "/api/compute/deployProfiles",
            post(profiles::publish).get(profiles::list),
        )
        .route(
            "/api/compute/deployProfiles/{tenant_id}/{id}/{version}",
            get(profiles::get),
        )
        .route(
            "/api/compute/images",
            post(images::register).get(images::list),
        )
        .route("/api/compute/images/{tenant_id}/{name}", get(images::get))
        .route(
            "/api/compute/images/{tenant_id}/{name}/prewarm",
            post(images::prewarm),
        )
        .route(
            "/api/compute/hardwareProfiles",
            get(admin::list_hardware_profiles),
        )
        .route("/api/compute/downloads", get(downloads::list))
        .route(
            "/api/compute/downloads/{name}/{version}/{platform}",
            get(downloads::get),
        )
        .route_layer(axum::middleware::from_fn(requests::measured));
    axum::Router::new()
        .nest("/api/compute/metal", metal)
        .nest("/api/agent", agent)
        .nest("/api/compute/admin", admin)
        .merge(compute)
        .route("/api/openapi.json", get(|| async { axum::Json(openapi::document()) }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(|| async { bcm_telemetry::render_metrics() }))
        .fallback(|| async { error::ApiError::new(bcm_core::ErrorCode::NotFound, "no such endpoint") })
        .layer(
            tower_http::trace::TraceLayer::new_for_http().make_span_with(|req: &axum::http::Request<_>| {
                let span = tracing::info_span!("http", method = %req.method(), path = %req.uri().path());
                let tp = req.headers().get(bcm_telemetry::TRACEPARENT).and_then(|v| v.to_str().ok());
                bcm_telemetry::set_remote_parent(&span, tp);
                span
            })
            // A 5xx is logged where it is decided, once, with its cause (an
            // internal error at ERROR, an outage's 503 at WARN) and counted
            // (`bcm_api_errors_total`); tower-http's own line for each (at
            // ERROR) only repeated it, a quarter of a million times in the
            // N = 100,000 run.
            .on_failure(
                tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
            ),
        )
        .with_state(state)
}

async fn readyz(
    axum::extract::State(app): axum::extract::State<AppState>,
) -> Result<&'static str, error::ApiError> {
    app.inner.db.ping().await?;
    if app.inner.bus.client().connection_state() != bcm_bus::ConnectionState::Connected {
        return Err(error::ApiError::new(
            bcm_core::ErrorCode::Unavailable,
            "NATS is not connected",
        ));
    }
    Ok("ready")
}

/// Connects, migrates, seeds and builds the handlers' state.
pub async fn prepare(cfg: &ApiConfig) -> Result<AppState, StartError> {
    let sealer = Sealer::new(&cfg.sealing_keys).map_err(|e| StartError::Config(e.to_string()))?;
    let join_key = cfg
        .join_key
        .resolve()
        .map_err(|e| StartError::Config(e.to_string()))?;
    if join_key.is_none() {
        tracing::warn!("no join key is configured (api.join_key.file): agents are handed no join token, so a deployed OS cannot join");
    }
    if cfg.admin_token.expose_secret().len() < 16 {
        return Err(StartError::Config(
            "admin_token must be at least 16 characters".into(),
        ));
    }
    cfg.agents.check().map_err(StartError::Config)?;
    cfg.http.check().map_err(StartError::Config)?;
    let hardware = hardware_profiles(cfg)?;
    let policy_signer = cfg.quorum.signer().map_err(StartError::Config)?;
    let edge_quorum = cfg.quorum.edge_quorum().map_err(StartError::Config)?;
    if edge_quorum.is_none() {
        tracing::warn!("no quorum trust anchor is configured (api.quorum.anchor_file): a pool asking fewer approvers than the sites' anchor gets batches the edges refuse");
    }
    if policy_signer.is_none() {
        tracing::warn!("no quorum policy key is configured (api.quorum.policy_key_file): every batch, even a single verb's, waits for the pool's approvers");
    }
    let Pools {
        db,
        agent_db,
        read_db,
        downloads,
    } = database_waiting(cfg).await?;
    let bus = Bus::connect(&cfg.bus).await?;
    let agent_wakeups = Arc::new(wakeups::AgentWakeups::default());
    tokio::spawn(forward_agent_wakeups(db.clone(), agent_wakeups.clone()));
    // Counted before serving, so a restarted API does not send the whole
    // fleet back to the floor cadence.
    let idle_fleet = Arc::new(idle_fleet::IdleFleet::default());
    if cfg.agents.max_idle_heartbeats_per_sec != 0 {
        idle_fleet::count_once(&db, &idle_fleet, &cfg.agents).await;
    }
    tokio::spawn(idle_fleet::refresh(
        db.clone(),
        idle_fleet.clone(),
        cfg.agents.clone(),
    ));
    let touches = touches::Touches::start(
        agent_db.clone(),
        agent::poll_takes(&cfg.agents),
        std::time::Duration::from_millis(cfg.agents.pool_wait_ms),
    );
    Ok(AppState {
        inner: Arc::new(Inner {
            db,
            agent_db,
            read_db,
            bus,
            sealer,
            admin_token_hash: auth::token_hash(cfg.admin_token.expose_secret()),
            lock_timeout_ms: cfg.lock_timeout_ms,
            agent_wakeups,
            turnaways: agent::TurnAways::default(),
            touches,
            agents: cfg.agents.clone(),
            idle_fleet,
            join_key,
            limits: limits::Limits::new(cfg.rate_limit.clone()),
            policy_signer,
            quorum: cfg.quorum.clone(),
            edge_quorum: edge_quorum.unwrap_or(1),
            downloads,
            hardware,
            default_hardware_profile: cfg.default_hardware_profile.clone(),
        }),
    })
}

/// The process's database, ready for work: its pools connected, the
/// schema migrated, the configured seed and downloads recorded. A
/// database that goes away part way (a restart, a failover) is waited for
/// and the whole of it done again — each step is idempotent — for up to
/// [`bcm_db::CONNECT_WAIT`], so a service started in an outage comes up
/// with the database instead of exiting.
async fn database_waiting(cfg: &ApiConfig) -> Result<Pools, StartError> {
    use backon::Retryable as _;
    (|| database_once(cfg))
        .retry(bcm_db::outage_backoff())
        .when(|e| matches!(e, StartError::Db(e) if e.unreachable()))
        .adjust(bcm_db::until(
            std::time::Instant::now() + bcm_db::CONNECT_WAIT,
        ))
        .notify(|e, pause| tracing::warn!(error = %e, ?pause, "the database is away while the service starts; waiting"))
        .await
}

/// One try of [`database_waiting`]: its connections do not wait on their
/// own, so the whole start-up has the one deadline.
async fn database_once(cfg: &ApiConfig) -> Result<Pools, StartError> {
    let now = std::time::Duration::ZERO;
    let db = Db::connect_waiting(&cfg.database_url, cfg.database_max_connections, now).await?;
    db.migrate().await?;
    // Every write of the agent endpoints is a hint or redone (a session's
    // touch, a heartbeat, a command's lease): their commits do not wait for
    // the WAL flush. Results and joins are recorded by the attestation
    // service, on its own pool.
    let agent_db = Db::connect_for_hints(
        &cfg.database_url,
        cfg.database_agent_connections.max(1),
        std::time::Duration::from_millis(cfg.agents.pool_wait_ms),
        now,
    )
    .await?
    .named("agent");
    let read_db =
        Db::connect_read_only(&cfg.database_url, cfg.database_read_connections.max(1), now).await?;
    seed(&db, &cfg.seed).await?;
    let downloads = downloads::publish(&db, &cfg.downloads).await?;
    Ok(Pools {
        db,
        agent_db,
        read_db,
        downloads,
    })
}

/// The API's pools, connected and migrated, and the downloads it serves.
struct Pools {
    db: Db,
    agent_db: Db,
    read_db: Db,
    downloads: downloads::Downloads,
}

/// Forwards `bcm_agent` notifications to waiting long-polls; listening
/// (again, after a lost connection) wakes them all, as what was written
/// meanwhile woke nobody (long-polls re-check every few seconds while the
/// database is away). Ends when the pool is closed.
async fn forward_agent_wakeups(db: Db, wakeups: Arc<wakeups::AgentWakeups>) {
    use bcm_db::listen::Heard;
    bcm_db::listen::read_channel(
        &db,
        bcm_db::commands::AGENT_CHANNEL,
        move |heard| match heard {
            Heard::Notification(node) => wakeups.wake(node),
            Heard::Resumed => wakeups.wake_all(),
        },
    )
    .await
    .ended()
    .await;
}

async fn seed(db: &Db, seed: &Seed) -> Result<(), StartError> {
    let bad = |e: bcm_core::IdError| StartError::Config(format!("seed: {e}"));
    for t in &seed.tenants {
        bcm_db::tenancy::tenant_upsert(db, &t.id.parse().map_err(bad)?, &t.name).await?;
    }
    for s in &seed.sites {
        bcm_db::tenancy::site_upsert(db, &s.id.parse().map_err(bad)?, &s.name).await?;
    }
    for p in &seed.pools {
        let pool = bcm_db::tenancy::Pool {
            id: p.id.parse().map_err(bad)?,
            tenant_id: p.tenant.parse().map_err(bad)?,
            site_id: p.site.parse().map_err(bad)?,
            name: p.id.clone(),
            hardware_profile: p.hardware_profile.clone(),
            agent_mode: p.agent_mode.as_str().to_owned(),
            accept_unsupported_diag: p.accept_unsupported_diag,
            deploy_profiles: p.deploy_profiles.clone(),
            release_wipe: p.release_wipe.as_str().to_owned(),
            commission_wipe: p.commission_wipe.as_str().to_owned(),
            adopt_acceptance: p.adopt_acceptance.clone(),
            unattested_release: p.unattested_release.as_str().to_owned(),
            erase_methods: p.erase_methods.clone(),
        };
        admin::check_pool_policy(&pool)
            .map_err(|e| StartError::Config(format!("seed: pool {}: {}", p.id, e.message)))?;
        bcm_db::tenancy::pool_upsert(db, &pool).await?;
        bcm_db::tenant_leases::pool_set_max_leases(db, pool.id.as_str(), p.max_dedicated_leases)
            .await?;
    }
    for d in &seed.deploy_profiles {
        let p = &d.profile;
        let what = format!(
            "seed: deploy profile {} v{} of tenant {}",
            p.id, p.version, d.tenant
        );
        p.validate()
            .map_err(|e| StartError::Config(format!("{what}: {e}")))?;
        let definition =
            serde_json::to_value(p).map_err(|e| StartError::Config(format!("{what}: {e}")))?;
        match bcm_db::deploy_profiles::deploy_profile_insert(
            db,
            &d.tenant,
            &p.id,
            p.version as i32,
            &definition,
            "seed",
        )
        .await
        {
            Ok(_) => {}
            Err(bcm_db::DbError::Duplicate { .. }) => {
                return Err(StartError::Config(format!(
                    "{what} is already stored with different content; a version is immutable, add a new version"
                )))
            }
            Err(bcm_db::DbError::MissingReference { .. }) => {
                return Err(StartError::Config(format!("{what}: no such tenant")))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Runs the service on `listener` until `shutdown`: the HTTP API and, when
/// enabled, the outbox relay.
pub async fn run(
    cfg: ApiConfig,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let serving = cfg
        .tls
        .serving()
        .map_err(|e| StartError::Config(format!("api.tls: {e}")))?;
    let state = prepare(&cfg).await?;
    let relay = if cfg.relay.enabled {
        Some(relay::run_on_own_thread(
            cfg.database_url.clone(),
            cfg.bus.clone(),
            cfg.relay.clone(),
            shutdown.clone(),
        )?)
    } else {
        None
    };
    tracing::info!(addr = %listener.local_addr()?, tls = matches!(serving, bcm_pki::tls::Serving::Tls(_)), "metal API listening");
    let app = router(state.clone());
    // The drain's deadline runs from the stop (or from the server's end
    // on an error); the server's own drain is shorter and fits in it.
    let stopped_at = {
        let stop = shutdown.clone();
        tokio::spawn(async move {
            stop.cancelled().await;
            tokio::time::Instant::now()
        })
    };
    let served = serve(listener, app, serving, &cfg.http, shutdown.clone()).await;
    shutdown.cancel();
    // A database or a bus that went down first must not hold the process.
    let stopped_at = stopped_at
        .await
        .unwrap_or_else(|_| tokio::time::Instant::now());
    let deadline = stopped_at + bcm_telemetry::signals::DRAIN;
    let mut tasks = bcm_telemetry::signals::Drain::new();
    if let Some(r) = relay {
        tasks.push("relay", r);
    }
    tasks.until(deadline).await;
    // Closing the pools is a courtesy to the server: a second at most.
    let closing = deadline.min(tokio::time::Instant::now() + std::time::Duration::from_secs(1));
    // (The agent pool stays open: its batched touches may still flush.)
    let pools = async { tokio::join!(state.inner.db.close(), state.inner.read_db.close()) };
    if tokio::time::timeout_at(closing, pools).await.is_err() {
        tracing::warn!(
            "the database pools did not close in time; their connections end with the process"
        );
    }
    Ok(served?)
}
