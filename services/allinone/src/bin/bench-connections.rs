//! `bench-connections`: what K client connections cost the API, and that
//! `api.http` bounds it. Starts the API as compose runs it (a `bcm
//! --services api` child, HTTPS from a local CA, its own database), opens
//! K connections at once from this process (one request each, every
//! connection then kept idle in the client's pool, as a fleet of agents
//! between requests keeps them), and samples the child's open descriptors
//! and RSS from `/proc` every 100 ms. Prints one JSON line: the figures
//! before, at the peak, once every request was answered, and after the
//! idle timeout.
//!
//! The client is a process of its own so that the descriptors counted are
//! the server's alone (in one process each connection would be counted at
//! both ends).
//!
//! `eval "$(deploy/dev/stack.sh env)"; cargo build --release -p bcm-allinone --bin bcm --bin bench-connections;
//!  target/release/bench-connections --connections 5000 --max-connections 1000`

use anyhow::Context as _;
use clap::Parser;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Args {
    /// Connections opened at once, one request each.
    #[arg(long, default_value_t = 2000)]
    connections: usize,
    /// The API's `http.max_connections` (0: from its open-file limit).
    #[arg(long, default_value_t = 0)]
    max_connections: u32,
    /// The API's `http.idle_timeout_secs`.
    #[arg(long, default_value_t = 5)]
    idle_timeout_secs: u32,
    /// Serve plain HTTP (to tell what TLS adds).
    #[arg(long)]
    plain_http: bool,
}

/// Open descriptors and resident KiB of process `pid`.
fn sample(pid: u32) -> (u64, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0);
    (fds, rss)
}

/// A client pinned to the API's CA that keeps every connection it opens.
fn keeping_client(ca: &std::path::Path) -> anyhow::Result<reqwest::Client> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca)?)?;
    Ok(reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .pool_max_idle_per_host(usize::MAX)
        .pool_idle_timeout(None)
        .build()?)
}

fn figures((fds, rss_kib): (u64, u64)) -> serde_json::Value {
    json!({"fds": fds, "rssMiB": (rss_kib as f64 / 1024.0 * 10.0).round() / 10.0})
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let database = std::env::var("DATABASE_URL")
        .context("DATABASE_URL: run `eval \"$(deploy/dev/stack.sh env)\"` first")?;
    let nats = std::env::var("NATS_URL")
        .context("NATS_URL: run `eval \"$(deploy/dev/stack.sh env)\"` first")?;
    let suffix = std::process::id().to_string();
    let db_name = format!("bcm_bench_conn_{suffix}");
    let db_url = bcm_db::admin::database_create(&database, &db_name).await?;
    let dir = std::env::temp_dir().join(format!("bcm-bench-conn-{suffix}"));
    let files = bcm_pki::tls::LocalTls::write_missing(&dir, &["127.0.0.1".to_owned()])?;
    let listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let base = format!(
        "{}://{listen}",
        if args.plain_http { "http" } else { "https" }
    );
    let tls = if args.plain_http {
        json!({"plain_http": true})
    } else {
        json!({"cert_file": files.cert, "key_file": files.key})
    };
    let config = json!({
        "api": {
            "tls": tls,
            "database_url": db_url, "admin_token": format!("bench-admin-{suffix}-token"),
            "bus": {"url": nats, "namespace": format!("benchconn{suffix}")},
            "sealing_keys": [{"id": "bench", "key": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="}],
            "telemetry": {"log_filter": "warn"},
            "http": {"max_connections": args.max_connections, "idle_timeout_secs": args.idle_timeout_secs},
            "seed": {"tenants": [{"id": "root", "name": "Root"}], "sites": [{"id": "local", "name": "bench"}]}
        },
        "sim": {"site": "local"}
    });
    let file = dir.join("bcm.toml");
    std::fs::write(&file, toml::to_string(&config)?)?;
    let exe = std::env::current_exe()?.with_file_name("bcm");
    let mut child = tokio::process::Command::new(&exe)
        .args(["--sim-machines", "0", "--services", "api", "--config"])
        .arg(&file)
        .env("BCM_ALL_API__LISTEN", listen.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("api.log"))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("{}: build it with the same profile", exe.display()))?;
    let pid = child.id().context("a child without a pid")?;

    let client = keeping_client(&files.ca)?;
    let started = Instant::now();
    loop {
        let ready = client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "the API did not answer /readyz within 120 s; see {}",
            dir.join("api.log").display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The readiness probe's connection is closed, not pooled with the rest.
    drop(client);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = sample(pid);

    // The peak, sampled beside the load.
    let peak_fds = Arc::new(AtomicU64::new(before.0));
    let peak_rss = Arc::new(AtomicU64::new(before.1));
    let sampler = {
        let (peak_fds, peak_rss) = (peak_fds.clone(), peak_rss.clone());
        tokio::spawn(async move {
            loop {
                let (fds, rss) = sample(pid);
                peak_fds.fetch_max(fds, Relaxed);
                peak_rss.fetch_max(rss, Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let client = keeping_client(&files.ca)?;
    let load = Instant::now();
    let answers = futures::future::join_all((0..args.connections).map(|_| {
        let client = client.clone();
        let url = format!("{base}/healthz");
        async move {
            let t = Instant::now();
            let ok = client
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            (ok, t.elapsed().as_secs_f64())
        }
    }))
    .await;
    let all_answered_secs = load.elapsed().as_secs_f64();
    let answered = answers.iter().filter(|(ok, _)| *ok).count();
    let mut waits: Vec<f64> = answers.iter().map(|(_, s)| *s).collect();
    waits.sort_by(f64::total_cmp);
    let held = sample(pid);
    // Every connection now sits idle in the client's pool: the server
    // closes them after its idle timeout. Watched for three timeouts.
    let idle_from = Instant::now();
    let timeout = Duration::from_secs(u64::from(args.idle_timeout_secs));
    let mut after_idle = sample(pid);
    let mut released: Vec<(f64, u64)> = vec![];
    while idle_from.elapsed() < timeout * 3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        after_idle = sample(pid);
        released.push((idle_from.elapsed().as_secs_f64(), after_idle.0));
        if after_idle.0 <= before.0 + 2 {
            break;
        }
    }
    sampler.abort();

    let out = json!({
        "connections": args.connections,
        "maxConnections": args.max_connections,
        "idleTimeoutSecs": args.idle_timeout_secs,
        "answered": answered,
        "allAnsweredSecs": all_answered_secs,
        "requestSecsP50": bcm_allinone::figures::percentile(&waits, 0.5),
        "requestSecsMax": waits.last().copied().unwrap_or(0.0),
        "before": figures(before),
        "peak": figures((peak_fds.load(Relaxed), peak_rss.load(Relaxed))),
        "allAnswered": figures(held),
        "afterIdleTimeout": figures(after_idle),
        "secondsAfterLastAnswerToFds": released,
        "kibPerConnectionAtPeak": if peak_fds.load(Relaxed) > before.0 {
            (peak_rss.load(Relaxed).saturating_sub(before.1)) as f64
                / (peak_fds.load(Relaxed) - before.0) as f64
        } else { 0.0 },
    });
    println!("{out}");
    drop(client);
    let _ = child.start_kill();
    let _ = child.wait().await;
    bcm_db::admin::database_drop(&database, &db_name).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
