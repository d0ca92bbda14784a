//! `bench-lifecycle`: N simulated machines at zero simulated latency through
//! enroll → ready → deploy → deployed → release → ready against the real
//! services, Postgres and NATS JetStream, through the public HTTP API.
//! Prints one JSON line of figures. The services run in this process, or
//! with `--processes` as compose runs them: a `bcm` process per service and
//! the simulated site in one of its own, each one's CPU and peak RSS given.
//!
//! `eval "$(deploy/dev/stack.sh env)"; cargo run --release -p bcm-allinone --bin bench-lifecycle -- --nodes 1000`
//!
//! With `--release-by-bulk` the release is one `metal.bulk` undeploy of
//! every node, signed by 2 of 3 approvers (the site's anchor needs 2): the
//! figures add the time to admit the request, to approve it, and to finish
//! it, with the bulk's waves of `--bulk-concurrency`.

/// mimalloc: many small short-lived allocations (rows, JSON, HTTP) are
/// cheaper than with glibc's allocator (measured by bench-lifecycle).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "bench_lifecycle/processes.rs"]
mod processes;

use anyhow::Context as _;
use bcm_allinone::figures::percentile;
use clap::Parser;
use futures::StreamExt as _;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Args {
    /// Simulated machines.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Concurrent API callers.
    #[arg(long, default_value_t = 32)]
    callers: usize,
    /// Workflow engine workers (default: the engine's).
    #[arg(long)]
    engine_workers: Option<usize>,
    /// Workflows an engine worker advances per transaction (default: the
    /// engine's).
    #[arg(long)]
    engine_batch: Option<usize>,
    /// Reconciler workers in this process.
    #[arg(long, default_value_t = 1)]
    reconcilers: usize,
    /// Give up after this many seconds per phase (per wave, with waves).
    #[arg(long, default_value_t = 1800)]
    phase_timeout_secs: u64,
    /// Keep the run's database and streams afterwards (a run that fails
    /// always keeps them, for a look).
    #[arg(long)]
    keep: bool,
    /// Serve the API as plain HTTP (to measure what HTTPS costs).
    #[arg(long)]
    plain_http: bool,
    /// Release every node with one bulk undeploy signed by 2 of 3
    /// approvers instead of one verb per node.
    #[arg(long)]
    release_by_bulk: bool,
    /// The pool's `bulkConcurrency` for `--release-by-bulk`.
    #[arg(long, default_value_t = 1000)]
    bulk_concurrency: u32,
    /// Enroll and deploy in waves of this many nodes, each wave waited
    /// for before the next (0: all at once). For runs that measure the
    /// release: 10,000 nodes enrolled at once overload two cores, and the
    /// agents' requests then wait so long that their steps call them silent.
    #[arg(long, default_value_t = 0)]
    setup_wave: usize,
    /// Release in waves of this many nodes, each wave waited for before
    /// the next (0: every node at once, as earlier runs did). For
    /// N = 100,000: every deployed machine's ramdisk agent would
    /// otherwise be polling at once. Ignored with `--release-by-bulk`,
    /// whose waves are the pool's `bulkConcurrency`.
    #[arg(long, default_value_t = 0)]
    release_wave: usize,
    /// The API's pool for the agent endpoints (the service's default
    /// when absent).
    #[arg(long)]
    agent_connections: Option<u32>,
    /// The API's `agents.max_idle_heartbeats_per_sec`: the idle installed
    /// OSes' heartbeats a second it sizes their cadence to (the service's
    /// default when absent; 0: a fixed cadence, as before it existed).
    #[arg(long)]
    max_idle_heartbeats_per_sec: Option<u32>,
    /// Measure only the admission of one bulk request naming every node:
    /// the nodes are written `ready` straight into the record (no
    /// workflows run), then `metal.bulk inspect` of all of them is timed
    /// three times.
    #[arg(long)]
    admit_only: bool,
    /// Requests per second from a separate client process (`bench-verbs`,
    /// beside this binary) for the whole lifecycle: node reads, pages and
    /// `metal.power` verbs of `--verb-load-nodes` machines of its own (0:
    /// none).
    #[arg(long, default_value_t = 0)]
    verb_load: u32,
    /// The verb load's own machines, which its `metal.power` verbs share.
    #[arg(long, default_value_t = 64)]
    verb_load_nodes: usize,
    /// Run the control plane as compose does, a `bcm` process per service
    /// (the API with its relay, the workflow engine, each reconciler,
    /// attestation) and the simulated site in one of its own, instead of
    /// every service in this process; the figures then give each
    /// process's CPU and peak RSS. Needs `bcm` built beside this binary.
    #[arg(long)]
    processes: bool,
}

/// The sum and count of a histogram over all its label sets, from the
/// process's metrics text.
fn histogram_totals(metrics: &str, name: &str) -> (f64, f64) {
    let (mut sum, mut count) = (0.0, 0.0);
    for line in metrics.lines() {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let bare = key.split('{').next().unwrap_or(key);
        if bare == format!("{name}_sum") {
            sum += value;
        } else if bare == format!("{name}_count") {
            count += value;
        }
    }
    (sum, count)
}

/// The agent requests (count and mean seconds per endpoint and status),
/// the pools' waits (count and mean) and the agent requests' gathered
/// touches (statements, and touches per statement), from the process's
/// metrics text.
fn load_line(metrics: &str) -> String {
    let mut sums: std::collections::BTreeMap<String, (f64, f64)> = Default::default();
    for line in metrics.lines() {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        for (metric, short) in [
            ("bcm_api_agent_request_seconds", "agent"),
            ("bcm_db_pool_wait_seconds", "pool-wait"),
            ("bcm_api_agent_touches_per_statement", "touches"),
            ("bcm_outbox_relay_round_seconds", "relay"),
            ("bcm_workflow_txn_seconds", "engine-txn"),
            ("bcm_api_request_seconds", "request"),
        ] {
            let (is_count, labels) = if let Some(l) = name.strip_prefix(&format!("{metric}_count"))
            {
                (true, l)
            } else if let Some(l) = name.strip_prefix(&format!("{metric}_sum")) {
                (false, l)
            } else {
                continue;
            };
            let key = format!("{short}{labels}");
            let e = sums.entry(key).or_default();
            if is_count {
                e.0 += value;
            } else {
                e.1 += value;
            }
        }
    }
    // The idle fleet the API counted and the cadence it asks of it; the
    // agents turned away, and the whole seconds agent requests waited in
    // line for the agent pool.
    let gauges = metrics.lines().filter_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        let short = match name {
            "bcm_api_agent_idle_fleet" => "idle-fleet",
            "bcm_api_agent_idle_cadence_seconds" => "idle-cadence-s",
            "bcm_api_agent_turned_away_total" => "turned-away",
            "bcm_api_agent_waiting_seconds_total" => "waited-in-line-s",
            _ => return None,
        };
        let value = value.parse::<f64>().ok()?;
        Some(format!("{short}={value:.0}"))
    });
    sums.iter()
        .map(|(k, (count, sum))| {
            let mean = if *count > 0.0 { sum / count } else { 0.0 };
            // Agent requests' touches: the statements, and the touches each served.
            if k.starts_with("touches") {
                format!("{k}={count:.0}/{mean:.1}each")
            } else {
                format!("{k}={count:.0}/{:.0}ms", mean * 1000.0)
            }
        })
        .chain(gauges)
        .collect::<Vec<_>>()
        .join(" ")
}

fn rss_kib(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .or_else(|| status.lines().find(|l| l.starts_with("VmRSS:")))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Peak RSS of processes whose command line contains `needle`, summed, in MiB.
fn rss_of(needle: &str) -> f64 {
    let mut total = 0u64;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let pid = e.file_name().to_string_lossy().to_string();
            if !pid.chars().all(|c| c.is_ascii_digit()) {
                continue;
            }
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains(needle) {
                total += rss_kib(&pid).unwrap_or(0);
            }
        }
    }
    total as f64 / 1024.0
}

/// Where the services run: in this process, or as compose runs them.
enum Plane {
    ThisProcess(tokio::task::JoinHandle<Result<(), bcm_allinone::RunError>>),
    Processes(processes::Processes),
}

/// This process's name in the per-process figures.
const BENCH: &str = "bench";

/// Where the services' metrics are read.
#[derive(Clone)]
enum Metrics {
    ThisProcess,
    Children(processes::Scrape),
}

impl Metrics {
    async fn text(&self) -> String {
        match self {
            Metrics::ThisProcess => bcm_telemetry::render_metrics(),
            Metrics::Children(s) => s.text().await,
        }
    }
}

impl Plane {
    fn metrics(&self) -> Metrics {
        match self {
            Plane::ThisProcess(_) => Metrics::ThisProcess,
            Plane::Processes(p) => Metrics::Children(p.scrape()),
        }
    }

    /// CPU seconds so far of each process the run uses, by name; this
    /// process (with every service, where they run in it) is [`BENCH`].
    fn cpu_secs(&self) -> Vec<(String, f64)> {
        let mut all = match self {
            Plane::ThisProcess(_) => vec![],
            Plane::Processes(p) => p.cpu_secs(),
        };
        all.push((BENCH.into(), processes::cpu_secs_of("self")));
        all
    }

    /// Peak RSS in MiB of each process the run uses, by name.
    fn peak_rss_mib(&self) -> Vec<(String, f64)> {
        let mut all = match self {
            Plane::ThisProcess(_) => vec![],
            Plane::Processes(p) => p.peak_rss_mib(),
        };
        all.push((BENCH.into(), rss_kib("self").unwrap_or(0) as f64 / 1024.0));
        all
    }

    async fn stop(self, shutdown: &tokio_util::sync::CancellationToken) {
        shutdown.cancel();
        match self {
            Plane::ThisProcess(server) => {
                let _ = server.await;
            }
            Plane::Processes(p) => p.stop().await,
        }
    }
}

struct Run {
    http: reqwest::Client,
    base: String,
    token: String,
    latencies: Mutex<Vec<f64>>,
}

impl Run {
    async fn verb(&self, verb: &str, body: Value) -> anyhow::Result<Value> {
        let t = Instant::now();
        let res = self
            .http
            .post(format!("{}/api/compute/metal/{verb}", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await?;
        let status = res.status();
        let v: Value = res.json().await?;
        self.latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(status.is_success(), "{verb}: {status} {v}");
        Ok(v)
    }
}

/// Waits until `n` nodes are in `state`; fails early when a node failed.
/// The nodes of one wave: `wave`, or all `n` at once when it is 0.
fn wave_size(wave: usize, n: usize) -> usize {
    if wave == 0 {
        n
    } else {
        wave
    }
}

async fn wait_all(
    db: &bcm_db::Db,
    state: bcm_core::ProvisionState,
    n: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let asked = Instant::now();
        let counts = bcm_db::nodes::node_count_by_state(db).await?;
        let took = asked.elapsed();
        let have = counts
            .iter()
            .find(|(s, _)| *s == state)
            .map(|(_, c)| *c as usize)
            .unwrap_or(0);
        let failed = counts
            .iter()
            .find(|(s, _)| *s == bcm_core::ProvisionState::Failed)
            .map(|(_, c)| *c)
            .unwrap_or(0);
        anyhow::ensure!(failed == 0, "{failed} nodes failed");
        if have >= n {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "only {have}/{n} reached {state}: {counts:?}"
        );
        tokio::time::sleep(count_pause(took)).await;
    }
}

/// The pause between two counts of a wait: 100 ms, or twenty times what
/// the last count took when that is longer (at most a second), so the
/// harness's own counting (a scan of every node: 8 ms at N = 10,000 on a
/// busy fleet, more at N = 100,000) takes at most a twentieth of one
/// Postgres core while a count takes under 50 ms (a thirteenth at 80 ms),
/// not the run it measures.
fn count_pause(took: Duration) -> Duration {
    (took * 20).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

impl Run {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        self.call_as(&self.token, method, path, body).await
    }

    async fn call_as(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await?;
        let status = res.status();
        let text = res.text().await?;
        // 204 No Content (an admin write) has no body.
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        anyhow::ensure!(status.is_success(), "{path}: {status} {text}");
        Ok(v)
    }
}

/// Writes `n` nodes `ready` into the record (as enrollment would leave
/// them, without running it) and times `metal.bulk inspect` of all of
/// them: validation, per-node admission, the Merkle tree and the batch's
/// rows, three times.
async fn admit_only(run: &Run, db: &bcm_db::Db, n: usize) -> anyhow::Result<Value> {
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut tx = db.begin().await?;
        for i in chunk {
            let id = bcm_core::NodeId::generate();
            let address = format!("sim://admit-{i}");
            let node = bcm_db::nodes::Node {
                macs: vec![bcm_sim::site::mac_of(&address)],
                ..bcm_db::nodes::Node::first(
                    id,
                    "root".parse()?,
                    "default".parse()?,
                    "local".parse()?,
                    bcm_core::ProvisionState::Ready,
                    bcm_core::BmcDriver::Sim,
                    address,
                    "sim".into(),
                )
            };
            bcm_db::nodes::node_insert_in_txn(&mut tx, &node).await?;
            ids.push(id.to_string());
        }
        tx.commit().await?;
    }
    let mut seconds = vec![];
    for round in 0..3 {
        let t = Instant::now();
        let v = run
            .call(
                reqwest::Method::POST,
                "/api/compute/metal/bulk",
                Some(
                    json!({"tenantId": "root", "poolId": "default", "verb": "inspect",
                    "nodeIds": ids, "reason": format!("bench: admission {round}")}),
                ),
            )
            .await?;
        seconds.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(
            v["batch"]["header"]["leafCount"].as_u64() == Some(n as u64),
            "not every node was admitted: {}",
            v["refused"]
        );
    }
    Ok(json!({"nodes": n, "admitSeconds": seconds}))
}

/// Releases every node with one bulk undeploy: registers three approvers,
/// sets the pool's quorum (2) and waves, submits, has two approvers sign,
/// and waits for the bulk to finish. Returns its figures.
async fn bulk_release(
    run: &Run,
    approvers: &[ed25519_dalek::SigningKey],
    ids: &[String],
    concurrency: u32,
) -> anyhow::Result<Value> {
    use reqwest::Method;
    run.call(
        Method::PUT,
        "/api/compute/admin/pools/default",
        Some(json!({"tenantId": "root", "siteId": "local", "hardwareProfile": "sim",
            "quorum": {"required": 2, "requesterMayApprove": true, "bulkConcurrency": concurrency}})),
    )
    .await?;
    let mut tokens = vec![];
    for (i, k) in approvers.iter().enumerate() {
        // Each approver is a person of its own, with a token of its own.
        let principal = format!("approver-{}", i + 1);
        run.call(
            Method::PUT,
            &format!("/api/compute/admin/approvers/{principal}"),
            Some(json!({"tenantId": "root", "principal": principal, "publicKey": bcm_quorum::public_key_b64(k)})),
        )
        .await?;
        let t = run
            .call(
                Method::POST,
                "/api/compute/admin/tokens",
                Some(json!({"principal": principal, "grants": [
                    {"action": "compute:nodes:read", "scope": {"kind": "tenant", "id": "root"}}]})),
            )
            .await?;
        tokens.push(t["token"].as_str().unwrap_or_default().to_owned());
    }
    let t = Instant::now();
    let bulk = run
        .call(
            Method::POST,
            "/api/compute/metal/bulk",
            Some(
                json!({"tenantId": "root", "poolId": "default", "verb": "undeploy", "wipe": "quick",
                "nodeIds": ids, "reason": "bench: release every node"}),
            ),
        )
        .await?;
    let admit = t.elapsed();
    let batch = &bulk["batch"];
    let id = batch["header"]["batchId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let header: bcm_contracts::batch::BatchHeader =
        serde_json::from_value(batch["header"].clone())?;
    let t = Instant::now();
    for n in [1usize, 3] {
        run.call_as(
            &tokens[n - 1],
            Method::POST,
            &format!("/api/compute/metal/batches/{id}/approve"),
            Some(json!({"approverId": format!("approver-{n}"),
                "signature": bcm_quorum::sign(&approvers[n - 1], &header)})),
        )
        .await?;
    }
    let approve = t.elapsed();
    let t = Instant::now();
    let done = loop {
        let b = run
            .call(
                Method::GET,
                &format!("/api/compute/metal/batches/{id}"),
                None,
            )
            .await?;
        if b["state"] != "approved" && b["state"] != "running" {
            break b;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let finish = t.elapsed();
    anyhow::ensure!(
        done["state"] == "finished",
        "the bulk ended {}",
        done["state"]
    );
    Ok(json!({
        "admitSeconds": admit.as_secs_f64(),
        "approveSeconds": approve.as_secs_f64(),
        "approvedToFinishedSeconds": finish.as_secs_f64(),
        "nodesPerSecond": ids.len() as f64 / finish.as_secs_f64(),
        "bulkConcurrency": concurrency,
        "counts": done["counts"],
    }))
}

/// `bench-verbs` running beside the lifecycle, as a process of its own.
struct VerbLoad {
    child: tokio::process::Child,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    own_nodes: usize,
}

impl VerbLoad {
    /// Starts `bench-verbs` (found beside this binary) at `rate` requests
    /// a second against `run`'s API, and waits until its own machines are
    /// ready and its load has started.
    async fn start(
        run: &Run,
        ca_file: Option<&str>,
        rate: u32,
        own_nodes: usize,
    ) -> anyhow::Result<Self> {
        use tokio::io::AsyncBufReadExt as _;
        let exe = std::env::current_exe()?.with_file_name("bench-verbs");
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("--base")
            .arg(&run.base)
            .arg("--rate")
            .arg(rate.to_string())
            .arg("--own-nodes")
            .arg(own_nodes.to_string())
            .env("BCM_BENCH_TOKEN", &run.token)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(ca) = ca_file {
            cmd.arg("--ca-file").arg(ca);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("{}: build it with the same profile", exe.display()))?;
        let mut stdout =
            tokio::io::BufReader::new(child.stdout.take().context("bench-verbs has no stdout")?)
                .lines();
        let line = stdout
            .next_line()
            .await?
            .context("bench-verbs ended before its load started")?;
        let started: Value = serde_json::from_str(&line)?;
        anyhow::ensure!(started["loadStarted"] == true, "bench-verbs said {line}");
        Ok(Self {
            child,
            stdout,
            own_nodes: started["ownNodes"]
                .as_u64()
                .with_context(|| format!("bench-verbs did not say its machines: {line}"))?
                as usize,
        })
    }

    /// Ends the load (closes its standard input) and returns its figures.
    async fn finish(mut self) -> anyhow::Result<Value> {
        drop(self.child.stdin.take());
        // Its requests time out after 30 s (bench-verbs' client), so the
        // figures follow within that.
        let line = tokio::time::timeout(Duration::from_secs(60), self.stdout.next_line())
            .await
            .context("bench-verbs did not print its figures within 60 s")??
            .context("bench-verbs ended without its figures")?;
        let status = self.child.wait().await?;
        anyhow::ensure!(status.success(), "bench-verbs: {status}");
        Ok(serde_json::from_str(&line)?)
    }
}

async fn each(
    run: &Arc<Run>,
    callers: usize,
    items: Vec<Value>,
    verb: &'static str,
) -> anyhow::Result<Vec<Value>> {
    futures::stream::iter(items)
        .map(|body| {
            let run = run.clone();
            async move { run.verb(verb, body).await }
        })
        .buffer_unordered(callers.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let database = std::env::var("DATABASE_URL")
        .context("DATABASE_URL: run `eval \"$(deploy/dev/stack.sh env)\"` first")?;
    let nats = std::env::var("NATS_URL")
        .context("NATS_URL: run `eval \"$(deploy/dev/stack.sh env)\"` first")?;
    let suffix = format!("{}", std::process::id());
    let db_name = format!("bcm_bench_{suffix}");
    let db_url = bcm_db::admin::database_create(&database, &db_name).await?;
    let token = format!("bench-admin-{suffix}-token");
    // HTTPS as deployed (a local CA the simulated agents pin), unless
    // `--plain-http` measures without it.
    let tls_dir = std::env::temp_dir().join(format!("bcm-bench-tls-{suffix}"));
    let files = bcm_pki::tls::LocalTls::write_missing(&tls_dir, &["127.0.0.1".to_owned()])?;
    let (tls, api_ca_file) = if args.plain_http {
        (json!({"plain_http": true}), Value::Null)
    } else {
        (
            json!({"cert_file": files.cert, "key_file": files.key}),
            json!(files.ca),
        )
    };
    let mut config = json!({
        "api": {
            "tls": tls,
            "database_url": db_url, "database_max_connections": 32, "admin_token": token,
            "bus": {"url": nats, "namespace": format!("bench{suffix}")},
            "sealing_keys": [{"id": "bench", "key": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="}],
            "telemetry": {"log_filter": "warn"},
            "seed": {"tenants": [{"id": "root", "name": "Root"}], "sites": [{"id": "local", "name": "bench"}],
                     "pools": [{"id": "default", "tenant": "root", "site": "local", "hardware_profile": "sim"}],
                     "deploy_profiles": [{"tenant": "root", "profile": {"id": "ubuntu-24.04", "version": 1, "image": {
                         "url": "http://images.invalid/ubuntu.raw", "format": "raw", "sha256": "5d".repeat(32), "sizeBytes": 1u64 << 30}}}]}
        },
        "reconciler": {"metal_poll_ms": 30000},
        "sim": {"site": "local", "concurrency": 256, "api_ca_file": api_ca_file}
    });
    if let Some(n) = args.agent_connections {
        config["api"]["database_agent_connections"] = json!(n);
    }
    if let Some(n) = args.max_idle_heartbeats_per_sec {
        config["api"]["agents"]["max_idle_heartbeats_per_sec"] = json!(n);
    }
    // As separate processes, the API's child binds the address itself
    // after this listener is dropped: a port no other child's port-0
    // listener can take meanwhile.
    let listener = if args.processes {
        tokio::net::TcpListener::bind(("127.0.0.1", processes::free_port()?)).await?
    } else {
        tokio::net::TcpListener::bind("127.0.0.1:0").await?
    };
    let scheme = if args.plain_http { "http" } else { "https" };
    let api_listen = listener.local_addr()?.to_string();
    let base = format!("{scheme}://{api_listen}");
    // The quorum: the API's policy key approves single verbs; three
    // approvers, two of whom the site's anchor needs for a bulk. On disk,
    // as separate processes read them.
    let keys = bcm_quorum::files::write_missing(&tls_dir.join("quorum"), 3, 2)?;
    let read_key = |p: &std::path::Path| -> anyhow::Result<ed25519_dalek::SigningKey> {
        Ok(bcm_quorum::signing_key(&std::fs::read_to_string(p)?)?)
    };
    let policy = read_key(&keys.policy_key)?;
    let approvers = keys
        .approver_keys
        .iter()
        .map(|p| read_key(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut engine = bcm_workflow::EngineConfig::new(base.clone());
    if let Some(w) = args.engine_workers {
        engine.workers = w;
    }
    if let Some(b) = args.engine_batch {
        engine.batch = b;
    }
    let (engine_workers, engine_batch) = (engine.workers, engine.batch);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut cfg: bcm_allinone::Config = serde_json::from_value(config.clone())?;
    bcm_telemetry::init("bench", &cfg.api.telemetry)?;
    let http = if args.plain_http {
        reqwest::Client::new()
    } else {
        bcm_pki::tls::client_pinned_to_file(&files.ca)?
    };
    let plane = if args.processes {
        drop(listener);
        bcm_pki::join_key::write_keys(&tls_dir, &["local"])?;
        config["api"]["join_key"] = json!({"file": tls_dir.join("join.key")});
        config["api"]["quorum"] = json!({"policy_key_file": keys.policy_key});
        config["sim"]["quorum_anchor_file"] = json!(keys.anchor);
        config["engine"] =
            json!({"control_plane_url": base, "workers": engine_workers, "batch": engine_batch});
        Plane::Processes(
            processes::Processes::start(
                &config,
                &tls_dir,
                &api_listen,
                &base,
                http.clone(),
                args.reconcilers,
            )
            .await?,
        )
    } else {
        cfg.api.quorum.policy_key = Some(policy.clone());
        cfg.sim.quorum_anchor = Some(bcm_quorum::Anchor::of(&approvers, 2, Some(&policy)));
        cfg.engine = Some(engine);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let services = bcm_allinone::Service::ALL.to_vec();
        let server_cfg = cfg.clone();
        let stop = shutdown.clone();
        let server = tokio::spawn(async move {
            bcm_allinone::run(server_cfg, &services, listener, tx, stop).await
        });
        let _ = rx.await?;
        Plane::ThisProcess(server)
    };
    let metrics = plane.metrics();
    let db = bcm_db::Db::connect(&db_url, 4).await?;
    let bus = bcm_bus::Bus::connect(&cfg.api.bus).await?;
    if matches!(plane, Plane::ThisProcess(_)) {
        for _ in 1..args.reconcilers {
            tokio::spawn(bcm_reconciler::run(
                db.clone(),
                bus.clone(),
                cfg.reconciler.clone(),
                shutdown.clone(),
            ));
        }
    }

    // Commit-to-delivery of every event, from a durable consumer.
    let delivery: Arc<Mutex<Vec<f64>>> = Arc::default();
    // And by event type, to tell which step of the lifecycle waits.
    let delivery_by_type: Arc<Mutex<std::collections::BTreeMap<String, Vec<f64>>>> = Arc::default();
    let transitions = Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let stream = bus
            .jetstream()
            .get_stream(bus.subjects().stream(bcm_bus::subjects::StreamKind::Events))
            .await?;
        let consumer = stream
            .get_or_create_consumer(
                "bench",
                async_nats::jetstream::consumer::pull::Config {
                    durable_name: Some("bench".into()),
                    filter_subject: bus.subjects().events_all(),
                    ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
                    ..Default::default()
                },
            )
            .await?;
        let (delivery, by_type, transitions) = (
            delivery.clone(),
            delivery_by_type.clone(),
            transitions.clone(),
        );
        tokio::spawn(async move {
            let Ok(mut messages) = consumer.messages().await else {
                return;
            };
            while let Some(Ok(m)) = messages.next().await {
                if let Ok(ev) =
                    serde_json::from_slice::<bcm_contracts::CloudEvent<Value>>(&m.payload)
                {
                    let ms = (chrono::Utc::now() - ev.time)
                        .num_microseconds()
                        .unwrap_or(0) as f64
                        / 1000.0;
                    delivery.lock().unwrap_or_else(|p| p.into_inner()).push(ms);
                    by_type
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(ev.ty.clone())
                        .or_default()
                        .push(ms);
                    if ev.ty.starts_with("node.provision.") && ev.ty != "node.provision.workflow" {
                        transitions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
        });
    }

    // Once a minute on stderr: what the agents asked of the API and how it
    // answered, and how long work waited for each pool.
    {
        // And each process's peak RSS so far, so that a run that fails
        // still shows how memory grew.
        let (stop, metrics) = (shutdown.clone(), metrics.clone());
        let (db, delivery) = (db.clone(), delivery.clone());
        let pids: Vec<(String, String)> = match &plane {
            Plane::ThisProcess(_) => vec![(BENCH.into(), "self".into())],
            Plane::Processes(p) => p.pids(),
        };
        tokio::spawn(async move {
            let started = Instant::now();
            let mut seen = 0;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                }
                let rss: Vec<String> = pids
                    .iter()
                    .map(|(name, pid)| format!("{name}={}MiB", rss_kib(pid).unwrap_or(0) / 1024))
                    .collect();
                // The events delivered since the last line, and those
                // still waiting in the outbox.
                let mut recent = {
                    let all = delivery.lock().unwrap_or_else(|p| p.into_inner());
                    let recent = all.get(seen..).unwrap_or_default().to_vec();
                    seen = all.len();
                    recent
                };
                recent.sort_by(f64::total_cmp);
                let backlog = bcm_db::outbox::outbox_backlog(&db).await.unwrap_or(-1);
                eprintln!(
                    "[{:>5}s] {} events={}/p50={:.0}ms/p99={:.0}ms/max={:.0}ms outbox-backlog={backlog} peak-rss {}",
                    started.elapsed().as_secs(),
                    load_line(&metrics.text().await),
                    recent.len(),
                    percentile(&recent, 0.5),
                    percentile(&recent, 0.99),
                    recent.last().copied().unwrap_or(0.0),
                    rss.join(" ")
                );
            }
        });
    }

    let run = Arc::new(Run {
        http,
        base,
        token,
        latencies: Mutex::default(),
    });
    let n = args.nodes;
    if args.admit_only {
        let out = admit_only(&run, &db, n).await?;
        println!("{out}");
        plane.stop(&shutdown).await;
        bcm_bus::streams::delete_all(&bus, &["local".parse()?]).await?;
        drop(db);
        bcm_db::admin::database_drop(&database, &db_name).await?;
        return Ok(());
    }
    let timeout = Duration::from_secs(args.phase_timeout_secs);
    // The verb load's own machines are `ready` throughout: the phases that
    // wait for `ready` count them too.
    let mut verb_load = if args.verb_load > 0 {
        Some(
            VerbLoad::start(
                &run,
                api_ca_file.as_str(),
                args.verb_load,
                args.verb_load_nodes,
            )
            .await?,
        )
    } else {
        None
    };
    let extra_ready = verb_load.as_ref().map_or(0, |l| l.own_nodes);
    let commits_before = bcm_db::admin::commit_count(&db).await?;
    let xid_before = bcm_db::admin::next_transaction_id(&db).await?;
    let cpu_before = plane.cpu_secs();
    let metrics_before = metrics.text().await;
    let passes_before = histogram_totals(&metrics_before, "bcm_reconciler_pass_cpu_seconds");
    let pass_wall_before = histogram_totals(&metrics_before, "bcm_reconciler_pass_seconds");
    let t0 = Instant::now();
    let wave = wave_size(args.setup_wave, n);
    let mut enrolled = Vec::with_capacity(n);
    for start in (0..n).step_by(wave.max(1)) {
        let end = (start + wave).min(n);
        enrolled.extend(
            each(
                &run,
                args.callers,
                (start..end)
                    .map(|i| json!({"tenantId": "root", "poolId": "default",
                        "bmc": {"driver": "sim", "address": format!("sim://bench-{i}"), "username": "u", "password": "p"}}))
                    .collect(),
                "enroll",
            )
            .await?,
        );
        wait_all(
            &db,
            bcm_core::ProvisionState::Ready,
            end + extra_ready,
            timeout,
        )
        .await?;
    }
    let t_ready = t0.elapsed();
    let ids: Vec<String> = enrolled
        .iter()
        .filter_map(|v| v["nodeId"].as_str().map(str::to_owned))
        .collect();
    let t1 = Instant::now();
    for (i, chunk) in ids.chunks(wave.max(1)).enumerate() {
        each(
            &run,
            args.callers,
            chunk.iter().map(|id| json!({"tenantId": "root", "nodeId": id, "profileId": "ubuntu-24.04", "profileVersion": 1})).collect(),
            "deploy",
        )
        .await?;
        let done = (i * wave + chunk.len()).min(n);
        wait_all(&db, bcm_core::ProvisionState::Deployed, done, timeout).await?;
    }
    let t_deployed = t1.elapsed();
    let t2 = Instant::now();
    let mut bulk_figures = Value::Null;
    if args.release_by_bulk {
        bulk_figures = bulk_release(&run, &approvers, &ids, args.bulk_concurrency).await?;
    } else {
        let release_wave = wave_size(args.release_wave, n);
        for (i, chunk) in ids.chunks(release_wave.max(1)).enumerate() {
            each(
                &run,
                args.callers,
                chunk
                    .iter()
                    .map(|id| json!({"tenantId": "root", "nodeId": id, "wipe": "quick"}))
                    .collect(),
                "undeploy",
            )
            .await?;
            let done = i * release_wave + chunk.len();
            wait_all(
                &db,
                bcm_core::ProvisionState::Ready,
                done + extra_ready,
                timeout,
            )
            .await?;
        }
    }
    wait_all(
        &db,
        bcm_core::ProvisionState::Ready,
        n + extra_ready,
        timeout,
    )
    .await?;
    let t_released = t2.elapsed();
    let total = t0.elapsed();
    // After the run's clock stops: the load's last answers are not its.
    let verb_load_figures = match verb_load.take() {
        Some(l) => l.finish().await?,
        None => Value::Null,
    };
    tokio::time::sleep(Duration::from_millis(1500)).await; // let the last events and statistics land
    bcm_db::admin::stats_refresh(&db).await?;
    let commits = bcm_db::admin::commit_count(&db).await? - commits_before;
    // Every transaction that wrote was given an id; reads are not.
    let writes = bcm_db::admin::next_transaction_id(&db).await? - xid_before;
    // CPU seconds of each process over the run; the control plane's are
    // every process's but the simulated site's and this one's (where they
    // are separate).
    let cpu_by_process: Vec<(String, f64)> = plane
        .cpu_secs()
        .into_iter()
        .map(|(name, after)| {
            let before = cpu_before
                .iter()
                .find(|(b, _)| *b == name)
                .map_or(0.0, |(_, v)| *v);
            (name, (after - before).max(0.0))
        })
        .collect();
    let cpu: f64 = match &plane {
        Plane::ThisProcess(_) => cpu_by_process.iter().map(|(_, v)| v).sum(),
        Plane::Processes(_) => cpu_by_process
            .iter()
            .filter(|(name, _)| name != "sim" && name != BENCH)
            .map(|(_, v)| v)
            .sum(),
    };
    let mut peak_rss: serde_json::Map<String, Value> = plane
        .peak_rss_mib()
        .into_iter()
        .map(|(name, mib)| (name, json!(mib)))
        .collect();
    peak_rss.insert("postgres".into(), json!(rss_of("postgres")));
    peak_rss.insert("nats-server".into(), json!(rss_of("nats-server")));
    let metrics_text = metrics.text().await;
    let pass_cpu = histogram_totals(&metrics_text, "bcm_reconciler_pass_cpu_seconds");
    let pass_wall = histogram_totals(&metrics_text, "bcm_reconciler_pass_seconds");
    let passes = pass_cpu.1 - passes_before.1;
    let pass_cpu_secs = pass_cpu.0 - passes_before.0;
    let pass_wall_secs = pass_wall.0 - pass_wall_before.0;

    let mut lat = run
        .latencies
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    lat.sort_by(f64::total_cmp);
    let mut del = delivery.lock().unwrap_or_else(|p| p.into_inner()).clone();
    del.sort_by(f64::total_cmp);
    let secs = |d: Duration| d.as_secs_f64();
    let out = json!({
        "nodes": n,
        "seconds": { "enrollToReady": secs(t_ready), "deploy": secs(t_deployed), "release": secs(t_released), "total": secs(total) },
        "nodesPerSecond": {
            "enrollToReady": n as f64 / secs(t_ready), "deploy": n as f64 / secs(t_deployed),
            "release": n as f64 / secs(t_released), "wholeLifecycle": n as f64 / secs(total)
        },
        "transitionsPerSecond": transitions.load(std::sync::atomic::Ordering::Relaxed) as f64 / secs(total),
        "verbLatencyMs": { "p50": percentile(&lat, 0.5), "p99": percentile(&lat, 0.99), "count": lat.len() },
        "eventCommitToDeliveryMs": { "p50": percentile(&del, 0.5), "p99": percentile(&del, 0.99), "count": del.len() },
        "eventCommitToDeliveryMsByType": delivery_by_type
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter_mut()
            .map(|(ty, v)| {
                v.sort_by(f64::total_cmp);
                (ty.clone(), json!({ "p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "count": v.len() }))
            })
            .collect::<serde_json::Map<_, _>>(),
        "postgresCommitsPerNodeLifecycle": commits as f64 / n as f64,
        "postgresWritingTransactionsPerNodeLifecycle": writes as f64 / n as f64,
        "controlPlaneCpuMsPerNode": cpu * 1000.0 / n as f64,
        "cpuMsPerNodeByProcess": cpu_by_process.iter()
            .map(|(name, v)| (name.clone(), json!(v * 1000.0 / n as f64)))
            .collect::<serde_json::Map<_, _>>(),
        "processes": args.processes,
        // What the reconcilers' passes cost this process (not Postgres):
        // per pass, per node, and as a share of the process's CPU.
        "reconcilerPasses": {
            "count": passes,
            "perNode": passes / n as f64,
            "cpuMsPerPass": if passes > 0.0 { pass_cpu_secs * 1000.0 / passes } else { 0.0 },
            "wallMsPerPass": if passes > 0.0 { pass_wall_secs * 1000.0 / passes } else { 0.0 },
            "cpuShareOfControlPlane": if cpu > 0.0 { pass_cpu_secs / cpu } else { 0.0 },
        },
        "peakRssMiB": peak_rss,
        "engineWorkers": engine_workers,
        "engineBatch": engine_batch,
        "reconcilers": args.reconcilers,
        "setupWave": args.setup_wave,
        "releaseWave": args.release_wave,
        "bulkRelease": bulk_figures,
        "verbLoad": verb_load_figures,
    });
    println!("{out}");
    plane.stop(&shutdown).await;
    if args.keep {
        eprintln!("kept database {db_name} and the streams of namespace bench{suffix}");
    } else {
        // A run leaves gigabytes behind at N = 10,000.
        bcm_bus::streams::delete_all(&bus, &["local".parse()?]).await?;
        drop(db);
        bcm_db::admin::database_drop(&database, &db_name).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{count_pause, load_line};
    use std::time::Duration;

    #[test]
    fn a_wait_counts_less_often_as_its_count_grows_slower() {
        assert_eq!(
            count_pause(Duration::from_millis(1)),
            Duration::from_millis(100)
        );
        assert_eq!(
            count_pause(Duration::from_millis(8)),
            Duration::from_millis(160)
        );
        assert_eq!(
            count_pause(Duration::from_millis(80)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn the_load_line_sums_counts_and_means_per_label_set() {
        let text = "\
# TYPE bcm_api_agent_request_seconds histogram
bcm_api_agent_request_seconds_bucket{endpoint=\"heartbeat\",status=\"200\",le=\"0.1\"} 3
bcm_api_agent_request_seconds_sum{endpoint=\"heartbeat\",status=\"200\"} 2
bcm_api_agent_request_seconds_count{endpoint=\"heartbeat\",status=\"200\"} 4
bcm_db_pool_wait_seconds_sum{pool=\"agent\"} 0.3
bcm_db_pool_wait_seconds_count{pool=\"agent\"} 3
bcm_db_pool_wait_seconds_count{pool=\"main\"} 0
bcm_db_pool_wait_seconds_sum{pool=\"main\"} 0
garbage line
bcm_api_agent_request_seconds_count{endpoint=\"join\",status=\"503\"} NaN-ish
bcm_api_agent_idle_fleet 12000
bcm_api_agent_idle_cadence_seconds 120
bcm_api_agent_idle_budget_exceeded 0
bcm_api_agent_idle_fleet many
";
        assert_eq!(
            load_line(text),
            "agent{endpoint=\"heartbeat\",status=\"200\"}=4/500ms \
             pool-wait{pool=\"agent\"}=3/100ms pool-wait{pool=\"main\"}=0/0ms \
             idle-fleet=12000 idle-cadence-s=120"
        );
        assert_eq!(load_line(""), "");
    }
}
