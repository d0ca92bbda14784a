//! `chaos`: the project's own chaos test. The control plane runs as
//! separate processes (api, relay, workflow, attestation, two reconcilers,
//! the simulated site — `bcm --services …`, as compose runs them) on a
//! Postgres and a NATS of the run's own. N simulated machines are taken
//! enroll → ready → deployed → ready through the HTTP API while one
//! process is SIGKILLed every few seconds and restarted a second later,
//! nats-server is crashed once (during deploy) and Postgres once (during
//! the release), each restarted on its data.
//!
//! The verdicts come from a durable event recorder (a JetStream consumer
//! that existed before the first event), the database's outbox (every
//! event committed) and the simulated site's execution notes: events lost,
//! events stored twice, destructive commands executed more than once,
//! nodes not at their target (and why). One JSON line of figures; the exit
//! status says whether every verdict held.
//!
//! `cargo build --release -p bcm-allinone -p bcm-chaos && target/release/chaos --nodes 1000`
//! (`--quiet` runs the same without faults, for comparison).

mod drive;
mod procs;
mod recorder;
mod stack;

use anyhow::Context as _;
use bcm_core::ProvisionState;
use clap::Parser;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    /// Simulated machines.
    #[arg(long, default_value_t = 20)]
    nodes: usize,
    /// SIGKILL a random process this often.
    #[arg(long, default_value_t = 5000)]
    kill_every_ms: u64,
    /// How long a killed process stays down.
    #[arg(long, default_value_t = 1000)]
    down_ms: u64,
    /// How long Postgres stays down in its crash.
    #[arg(long, default_value_t = 5000)]
    postgres_down_ms: u64,
    /// No kills, no crashes: the same run, quiet, for comparison.
    #[arg(long)]
    quiet: bool,
    /// The `bcm` binary (default: beside this one).
    #[arg(long)]
    bcm: Option<PathBuf>,
    /// Where the run keeps its stack, config and logs (default: a new
    /// directory under /tmp, removed when every verdict held).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Postgres's port (default: one free now; a fixed one in the
    /// ephemeral range can be taken by any outgoing connection).
    #[arg(long)]
    pg_port: Option<u16>,
    /// NATS's port (default: one free now).
    #[arg(long)]
    nats_port: Option<u16>,
    /// Give up on a phase after this long.
    #[arg(long, default_value_t = 1800)]
    phase_timeout_secs: u64,
}

const ADMIN_TOKEN: &str = "chaos-admin-token-0123456789";

fn config(
    db: &str,
    nats: &str,
    ns: &str,
    api: &str,
    pki: &std::path::Path,
    identities: &std::path::Path,
) -> String {
    let pki = pki.display();
    let ids = identities.display();
    format!(
        r#"
[attestation]
ca_cert_file = "{pki}/ca.pem"
ca_key_file = "{pki}/ca.key"
generate_ca = true
[api]
listen = "{api}"
database_url = "{db}"
admin_token = "{ADMIN_TOKEN}"
database_max_connections = 16
[api.bus]
url = "{nats}"
namespace = "{ns}"
nkey_file = "{ids}/control.nk"
[api.join_key]
file = "{ids}/join.key"
[api.quorum]
policy_key_file = "{pki}/quorum/policy.key"
anchor_file = "{pki}/quorum/anchor.json"
[api.tls]
cert_file = "{pki}/tls/api.crt"
key_file = "{pki}/tls/api.key"
[[api.sealing_keys]]
id = "chaos"
key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
[[api.seed.tenants]]
id = "root"
name = "Root"
[[api.seed.sites]]
id = "local"
name = "Local site (simulated)"
[[api.seed.pools]]
id = "default"
tenant = "root"
site = "local"
hardware_profile = "sim"
[[api.seed.deploy_profiles]]
tenant = "root"
profile = {{ id = "ubuntu-24.04", version = 1, role = "host", image = {{ url = "http://127.0.0.1:1/images/ubuntu-24.04.raw", format = "raw", sha256 = "5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d", sizeBytes = 2361393152 }} }}
[engine]
control_plane_url = "https://{api}"
[reconciler]
metal_poll_ms = 5000
lease_ttl_ms = 3000
[sim]
site = "local"
latency_ms = 20
nkey_file = "{ids}/sim-local.nk"
api_ca_file = "{pki}/tls/ca.crt"
quorum_anchor_file = "{pki}/quorum/anchor.json"
"#
    )
}

/// The lines of the processes' logs that `keep` keeps.
fn log_lines(logs: &std::path::Path, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(logs) else {
        return vec![];
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .flat_map(|text| {
            text.lines()
                .filter(|l| keep(l))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The lines of the processes' logs where the server refused a request
/// under the bus permissions.
fn bus_refusals(logs: &std::path::Path) -> Vec<String> {
    log_lines(logs, |l| l.contains("Permissions Violation"))
}

/// The lines of the processes' logs that hold a join or session token
/// (`bcmj_`/`bcms_` and 64 hex digits): none may.
fn tokens_in_logs(logs: &std::path::Path) -> Vec<String> {
    let holds_token = |line: &str| {
        ["bcmj_", "bcms_"].iter().any(|prefix| {
            line.match_indices(prefix).any(|(at, _)| {
                line[at + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_hexdigit())
                    .count()
                    >= 64
            })
        })
    };
    log_lines(logs, holds_token)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bcm = match &args.bcm {
        Some(b) => b.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("exe dir")?
            .join("bcm"),
    };
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("bcm-chaos.{}", ulid::Ulid::new())),
    };
    std::fs::create_dir_all(&dir)?;
    eprintln!("chaos: N={} in {}", args.nodes, dir.display());
    // Every process connects with an nkey of its own and only its
    // permissions, under the run's namespace.
    let ns = format!("chaos{}", ulid::Ulid::new().to_string().to_lowercase());
    let identities = bcm_bus::auth::generate(
        &dir.join("nats"),
        &bcm_bus::Subjects::new(Some(ns.clone()), 16),
        &["local".parse()?],
    )?;
    bcm_pki::join_key::write_keys(&dir.join("nats"), &["local"])?;
    let stack = stack::Stack::up(
        &repo,
        &dir.join("stack"),
        args.pg_port.map_or_else(free_port, Ok)?,
        args.nats_port.map_or_else(free_port, Ok)?,
        &identities.users,
    )?;
    let outcome = run(&args, &bcm, &dir, &stack, &ns).await;
    stack.down();
    match outcome {
        Ok(true) => {
            let _ = std::fs::remove_dir_all(&dir);
            Ok(())
        }
        Ok(false) => {
            eprintln!(
                "chaos: verdicts failed; the run is kept in {}",
                dir.display()
            );
            std::process::exit(1)
        }
        Err(e) => {
            eprintln!("chaos: {e:#}; the run is kept in {}", dir.display());
            std::process::exit(2)
        }
    }
}

async fn run(
    args: &Args,
    bcm: &std::path::Path,
    dir: &std::path::Path,
    stack: &stack::Stack,
    ns: &str,
) -> anyhow::Result<bool> {
    let db_url = bcm_db::admin::database_create(
        &stack.database_server(),
        &format!("chaos_{}", ulid::Ulid::new().to_string().to_lowercase()),
    )
    .await?;
    let api_addr = format!("127.0.0.1:{}", free_port()?);
    let config_path = dir.join("bcm.toml");
    // One CA for every attestation process of the run, as in production.
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki)?;
    // HTTPS as compose serves it: a local CA the agents and the driver pin.
    let tls = bcm_pki::tls::LocalTls::write_missing(&pki.join("tls"), &["127.0.0.1".to_owned()])?;
    // The quorum: the API's policy key, the simulated site's anchor.
    bcm_quorum::files::write_missing(&pki.join("quorum"), 3, 2)?;
    std::fs::write(
        &config_path,
        config(
            &db_url,
            &stack.nats_addr(),
            ns,
            &api_addr,
            &pki,
            &dir.join("nats"),
        ),
    )?;

    // The recorder's consumer exists before anything is published.
    let bus_cfg = bcm_bus::BusConfig {
        url: stack.nats_admin_url()?,
        namespace: Some(ns.to_owned()),
        shards: 16,
        nkey_file: None,
    };
    let bus = bcm_bus::Bus::connect(&bus_cfg).await?;
    recorder::create(&bus).await?;
    let recorded = recorder::Recorded::default();
    let stop = CancellationToken::new();
    let rec_task = tokio::spawn(recorder::run(bus.clone(), recorded.clone(), stop.clone()));

    let procs = procs::Procs::start(bcm, &config_path, &dir.join("logs"), &dir.join("nats"))?;
    let api = drive::Api::new(&format!("https://{api_addr}"), ADMIN_TOKEN, &tls.ca)?;
    api.get("/readyz", Duration::from_secs(120)).await.ok();
    let started = Instant::now();
    let killer = (!args.quiet).then(|| {
        let (p, s) = (procs.clone(), stop.clone());
        let (every, down) = (
            Duration::from_millis(args.kill_every_ms),
            Duration::from_millis(args.down_ms),
        );
        tokio::spawn(async move { p.killer(every, down, s).await })
    });
    let within = Duration::from_secs(args.phase_timeout_secs);
    let phases = drive_fleet(args, &api, stack, within).await;
    stop.cancel();
    let (kills, crashed) = match killer {
        Some(k) => k.await.unwrap_or_default(),
        None => (vec![], vec![]),
    };
    let total = started.elapsed();
    // Let the last events reach the recorder.
    let bus = bcm_bus::Bus::connect(&bus_cfg).await?;
    let settle = CancellationToken::new();
    let _ = rec_task.await;
    let rec_task = tokio::spawn(recorder::run(bus.clone(), recorded.clone(), settle.clone()));
    let db = bcm_db::Db::connect(&db_url, 4).await?;
    let drained = Instant::now();
    while drained.elapsed() < Duration::from_secs(60) {
        let backlog = bcm_db::outbox::outbox_backlog(&db).await.unwrap_or(1);
        if backlog == 0 && recorded.quiet_for() > Duration::from_secs(3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let exited = procs.exited();
    let slowest_stop = procs.stop_all();
    settle.cancel();
    let _ = rec_task.await;

    let v = verdicts(&db, &bus, &recorded).await?;
    let phases = match phases {
        Ok(p) => p,
        Err(e) => {
            eprintln!("chaos: the fleet did not get through: {e:#}");
            vec![]
        }
    };
    // Every process ran under its own bus identity: a request its
    // permissions refused is a bug (it waits out a timeout and fails).
    let refused = bus_refusals(&dir.join("logs"));
    // No process logs a join or session token.
    let leaked = tokens_in_logs(&dir.join("logs"));
    let held = v.held()
        && exited.is_empty()
        && crashed.is_empty()
        && phases.len() == 3
        && refused.is_empty()
        && leaked.is_empty();
    let figures = json!({
        "nodes": args.nodes,
        "quiet": args.quiet,
        "seconds": total.as_secs_f64(),
        "phases": phases.iter().map(|(name, d)| json!({"phase": name, "seconds": d.as_secs_f64()})).collect::<Vec<_>>(),
        "kills": kills.len(),
        "restarts": procs.restarts().into_iter().map(|(n, r)| json!({"process": n, "restarts": r})).collect::<Vec<_>>(),
        "natsRestarts": u32::from(!args.quiet),
        "postgresRestarts": u32::from(!args.quiet),
        "eventsCommitted": v.committed,
        "eventsDelivered": recorded.deliveries(),
        "eventsLost": v.lost.len(),
        "eventsStoredTwice": v.stored_twice.len(),
        "commandsExecuted": v.executions,
        "destructiveRunTwice": v.run_twice.len(),
        "nodesNotAtTarget": v.not_ready.len(),
        "exitedByThemselves": exited,
        "crashedDuringRun": crashed,
        "busPermissionRefusals": refused.len(),
        "logLinesWithTokens": leaked.len(),
        "slowestSigtermStopMs": slowest_stop.as_millis(),
        "held": held,
    });
    println!("{figures}");
    for line in refused.iter().take(10) {
        eprintln!("chaos: refused by the bus: {line}");
    }
    for line in leaked.iter().take(10) {
        eprintln!("chaos: a log line holds a token: {line}");
    }
    for id in v.lost.iter().take(10) {
        eprintln!("chaos: lost event {id}");
    }
    for (id, n) in v.run_twice.iter().take(10) {
        eprintln!("chaos: command {id} executed {n} times");
    }
    for (id, why) in v.not_ready.iter().take(20) {
        eprintln!("chaos: node {id} not ready: {why}");
    }
    Ok(held)
}

/// The three phases; NATS crashes during deploy, Postgres during release.
async fn drive_fleet(
    args: &Args,
    api: &drive::Api,
    stack: &stack::Stack,
    within: Duration,
) -> anyhow::Result<Vec<(&'static str, Duration)>> {
    let n = args.nodes;
    let mut phases = vec![];
    let t = Instant::now();
    for_each(n, 16, |i| {
        let api = api.clone();
        async move { api.enroll(&format!("sim://chaos-{i}")).await }
    })
    .await?;
    drive::wait_all(api, n, ProvisionState::Ready, within).await?;
    phases.push(("enroll→ready", t.elapsed()));

    let ids = node_ids(api).await?;
    let t = Instant::now();
    let nats = (!args.quiet).then(|| {
        let s = stack.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            eprintln!("chaos: crashing nats-server");
            s.crash_nats(Duration::from_secs(1)).await
        })
    });
    for_each(ids.len(), 16, |i| {
        let (api, id) = (api.clone(), ids[i].clone());
        async move {
            api.verb(
                "deploy",
                &id,
                json!({"profileId": "ubuntu-24.04", "profileVersion": 1}),
                &[ProvisionState::Deploying, ProvisionState::Deployed],
            )
            .await
        }
    })
    .await?;
    drive::wait_all(api, n, ProvisionState::Deployed, within).await?;
    if let Some(h) = nats {
        h.await??;
    }
    phases.push(("deploy→deployed", t.elapsed()));

    let t = Instant::now();
    let pg = (!args.quiet).then(|| {
        let s = stack.clone();
        let down = Duration::from_millis(args.postgres_down_ms);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            eprintln!("chaos: crashing postgres for {down:?}");
            s.crash_postgres(down).await
        })
    });
    for_each(ids.len(), 16, |i| {
        let (api, id) = (api.clone(), ids[i].clone());
        async move {
            api.verb(
                "undeploy",
                &id,
                json!({}),
                &[ProvisionState::Releasing, ProvisionState::Ready],
            )
            .await
        }
    })
    .await?;
    drive::wait_all(api, n, ProvisionState::Ready, within).await?;
    if let Some(h) = pg {
        h.await??;
    }
    phases.push(("undeploy→ready", t.elapsed()));
    Ok(phases)
}

async fn node_ids(api: &drive::Api) -> anyhow::Result<Vec<String>> {
    let mut ids: Vec<String> = api
        .nodes()
        .await?
        .values()
        .filter_map(|v| v["nodeId"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    Ok(ids)
}

/// Runs `f(0..n)` with at most `width` at once; the first error stops it.
async fn for_each<F, Fut>(n: usize, width: usize, f: F) -> anyhow::Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    use futures::StreamExt as _;
    let mut s = futures::stream::iter(0..n).map(f).buffer_unordered(width);
    while let Some(r) = s.next().await {
        r?;
    }
    Ok(())
}

/// What the run came to.
struct Verdicts {
    committed: usize,
    lost: Vec<String>,
    stored_twice: Vec<String>,
    executions: usize,
    run_twice: Vec<(String, usize)>,
    not_ready: Vec<(String, String)>,
}

impl Verdicts {
    fn held(&self) -> bool {
        self.lost.is_empty()
            && self.stored_twice.is_empty()
            && self.run_twice.is_empty()
            && self.not_ready.is_empty()
    }
}

async fn verdicts(
    db: &bcm_db::Db,
    bus: &bcm_bus::Bus,
    recorded: &recorder::Recorded,
) -> anyhow::Result<Verdicts> {
    let prefix = bus.subjects().events_all();
    let prefix = prefix.trim_end_matches('>');
    let committed = bcm_db::outbox::outbox_ids_with_prefix(db, prefix).await?;
    let seen = recorded.ids();
    let lost: Vec<String> = committed
        .iter()
        .filter(|(id, _)| !seen.contains(id))
        .map(|(id, published)| {
            if *published {
                id.clone()
            } else {
                format!("{id} (never published)")
            }
        })
        .collect();
    let site = bcm_sim::store::SiteStore::open(bus, &"local".parse()?).await?;
    let run_twice = site.repeated_executions().await?;
    let executions = site.executions_noted().await?;
    let mut not_ready = vec![];
    let mut after = None;
    loop {
        let page = bcm_db::nodes::node_list(
            db,
            &bcm_db::nodes::NodeFilter {
                tenant: None,
                pool: None,
                state: None,
                after,
                visible: None,
                limit: 1000,
            },
        )
        .await?;
        let Some(last) = page.last().map(|n| n.id) else {
            break;
        };
        for n in &page {
            if n.provision_state != ProvisionState::Ready {
                not_ready.push((
                    n.id.to_string(),
                    format!(
                        "{} ({})",
                        n.provision_state,
                        n.last_error.as_deref().unwrap_or("no error recorded")
                    ),
                ));
            }
        }
        after = Some(last);
    }
    Ok(Verdicts {
        committed: committed.len(),
        lost,
        stored_twice: recorded.stored_twice(),
        executions,
        run_twice,
        not_ready,
    })
}
