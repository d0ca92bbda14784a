//! `bench-verbs`: a separate client that puts a steady verb load on a
//! running control plane, open loop (each request leaves at its time,
//! whether or not the earlier ones have answered, so a slow answer cannot
//! hide the ones queued behind it), and prints one JSON line of latencies
//! when its standard input closes.
//!
//! `bench-lifecycle --verb-load 200` runs it beside the lifecycle, as a
//! process of its own (issue 24, target 3). Alone:
//! `bench-verbs --base https://127.0.0.1:8443 --ca-file ca.crt --token T --rate 200 < /dev/tty`
//!
//! The load, per four requests: two `GET /nodes/{id}` of nodes it has
//! listed, one `GET /nodes?limit=100` (a page at a random point of the
//! fleet), and one `metal.power` verb (on, then off, by turns) of a node
//! of its own: before the load starts it enrolls `--own-nodes` machines
//! and waits for them to be `ready`, so its writes go through the whole
//! verb path (authorization, the guarded update, a one-leaf batch, the
//! outbox, the BMC command) without touching the nodes of the run it sits
//! beside. It prints `{"loadStarted": true, ...}` when the load starts.

use anyhow::Context as _;
use bcm_allinone::figures::percentile;
use clap::Parser;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt as _;

#[derive(Parser)]
struct Args {
    /// The API's base URL.
    #[arg(long)]
    base: String,
    /// The CA to pin for an HTTPS API (absent: plain HTTP).
    #[arg(long)]
    ca_file: Option<std::path::PathBuf>,
    /// A bearer token that may read nodes, enroll into the pool and power.
    #[arg(long, env = "BCM_BENCH_TOKEN")]
    token: String,
    /// Requests per second.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    #[arg(long, default_value = "root")]
    tenant: String,
    #[arg(long, default_value = "default")]
    pool: String,
    /// Machines of its own for the power verbs (at 200 requests a second,
    /// 64 of them take a power verb about every 1.3 s each).
    #[arg(long, default_value_t = 64)]
    own_nodes: usize,
    /// Give up waiting for its own machines after this many seconds.
    #[arg(long, default_value_t = 300)]
    ready_timeout_secs: u64,
    /// Requests in flight at most (a request due beyond it is counted as
    /// dropped, not sent late).
    #[arg(long, default_value_t = 512)]
    max_in_flight: usize,
}

/// What the load asks, in turn.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Kind {
    Get,
    List,
    Power,
}

impl Kind {
    const CYCLE: [Kind; 4] = [Kind::Get, Kind::List, Kind::Get, Kind::Power];

    fn name(self) -> &'static str {
        match self {
            Kind::Get => "getNode",
            Kind::List => "listNodes",
            Kind::Power => "power",
        }
    }
}

/// One answer: its kind, HTTP status (0: no answer) and milliseconds.
type Sample = (Kind, u16, f64);

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await?;
        let status = res.status().as_u16();
        let text = res.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }
}

/// Latency percentiles and status counts of `samples`, over all and per
/// kind.
fn figures(samples: &[Sample], seconds: f64, dropped: u64) -> Value {
    let summary = |of: &mut dyn Iterator<Item = &Sample>| {
        let mut ms = vec![];
        let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
        for (_, status, t) in of {
            ms.push(*t);
            *statuses.entry(status.to_string()).or_default() += 1;
        }
        ms.sort_by(f64::total_cmp);
        json!({"count": ms.len(), "p50Ms": percentile(&ms, 0.5), "p99Ms": percentile(&ms, 0.99),
               "maxMs": ms.last().copied().unwrap_or(0.0), "statuses": statuses})
    };
    let mut kinds = serde_json::Map::new();
    for kind in [Kind::Get, Kind::List, Kind::Power] {
        kinds.insert(
            kind.name().into(),
            summary(&mut samples.iter().filter(|s| s.0 == kind)),
        );
    }
    json!({
        "seconds": seconds,
        "requestsPerSecond": if seconds > 0.0 { samples.len() as f64 / seconds } else { 0.0 },
        "dropped": dropped,
        "all": summary(&mut samples.iter()),
        "byKind": kinds,
    })
}

/// Enrolls `n` machines of its own and waits until all are `ready`.
async fn own_nodes(client: &Client, args: &Args) -> anyhow::Result<Vec<String>> {
    let mut ids = vec![];
    let run = std::process::id();
    for i in 0..args.own_nodes {
        let (status, v) = client
            .send(
                reqwest::Method::POST,
                "/api/compute/metal/enroll",
                Some(json!({"tenantId": args.tenant, "poolId": args.pool,
                    "bmc": {"driver": "sim", "address": format!("sim://verbs-{run}-{i}"), "username": "u", "password": "p"}})),
            )
            .await?;
        anyhow::ensure!(status == 200, "enroll: {status} {v}");
        ids.push(
            v["nodeId"]
                .as_str()
                .context("enroll answered without a nodeId")?
                .to_owned(),
        );
    }
    let started = Instant::now();
    for id in &ids {
        loop {
            let (_, v) = client
                .send(
                    reqwest::Method::GET,
                    &format!("/api/compute/metal/nodes/{id}"),
                    None,
                )
                .await?;
            match v["provisionState"].as_str() {
                Some("ready") => break,
                Some("failed") => anyhow::bail!("own node {id} failed: {v}"),
                _ => {}
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(args.ready_timeout_secs),
                "own node {id} not ready in time: {v}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(ids)
}

/// One request of `kind`; `seen` is the ids of the last page listed.
async fn one(
    client: &Client,
    kind: Kind,
    tick: u64,
    tenant: &str,
    own: &[String],
    seen: &Mutex<Vec<String>>,
) -> u16 {
    // The n-th of `ids`, round and round.
    let pick = |ids: &[String], n: u64| -> Option<String> {
        (!ids.is_empty()).then(|| ids[n as usize % ids.len()].clone())
    };
    let answer = match kind {
        Kind::Get => {
            // The two reads of a cycle (ticks 4k and 4k+2) read two nodes.
            let id = pick(&seen.lock().unwrap_or_else(|p| p.into_inner()), tick / 2)
                .or_else(|| pick(own, tick / 2));
            let Some(id) = id else { return 0 };
            client
                .send(
                    reqwest::Method::GET,
                    &format!("/api/compute/metal/nodes/{id}"),
                    None,
                )
                .await
        }
        Kind::List => {
            // A page somewhere in the fleet: after one of the ids seen (or
            // from the start), so the pages wander.
            let after = pick(&seen.lock().unwrap_or_else(|p| p.into_inner()), tick / 4)
                .filter(|_| tick % 8 != 1)
                .map(|id| format!("&pageToken={id}"))
                .unwrap_or_default();
            let got = client
                .send(
                    reqwest::Method::GET,
                    &format!("/api/compute/metal/nodes?tenantId={tenant}&limit=100{after}"),
                    None,
                )
                .await;
            if let Ok((200, v)) = &got {
                let ids: Vec<String> = v["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|n| n["nodeId"].as_str().map(str::to_owned))
                    .collect();
                if !ids.is_empty() {
                    *seen.lock().unwrap_or_else(|p| p.into_inner()) = ids;
                }
            }
            got
        }
        Kind::Power => {
            let Some(id) = pick(own, tick / 4) else {
                return 0;
            };
            // Each own node is powered on, then off, by turns.
            let action = if (tick / 4 / own.len().max(1) as u64).is_multiple_of(2) {
                "on"
            } else {
                "off"
            };
            client
                .send(
                    reqwest::Method::POST,
                    "/api/compute/metal/power",
                    Some(json!({"tenantId": tenant, "nodeId": id, "action": action})),
                )
                .await
        }
    };
    match answer {
        Ok((status, _)) => status,
        Err(e) => {
            tracing::debug!(error = %e, "no answer");
            0
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.rate > 0, "--rate must be at least 1");
    anyhow::ensure!(
        args.own_nodes > 0,
        "--own-nodes must be at least 1 (the power verbs' machines)"
    );
    // A request unanswered for 30 s is counted as no answer (status 0).
    let http = match &args.ca_file {
        Some(ca) => bcm_pki::tls::pinned_client(
            &std::fs::read_to_string(ca).with_context(|| ca.display().to_string())?,
        )?,
        None => reqwest::Client::builder(),
    }
    .timeout(Duration::from_secs(30))
    .build()?;
    let client = Arc::new(Client {
        http,
        base: args.base.trim_end_matches('/').to_owned(),
        token: args.token.clone(),
    });
    let own = Arc::new(own_nodes(&client, &args).await?);
    println!(
        "{}",
        json!({"loadStarted": true, "ownNodes": own.len(), "rate": args.rate})
    );

    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(args.max_in_flight.max(1)));
    let mut dropped = 0u64;
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(args.rate)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut stdin_closed = Box::pin(async {
        let mut sink = [0u8; 64];
        let mut stdin = tokio::io::stdin();
        while matches!(stdin.read(&mut sink).await, Ok(n) if n > 0) {}
    });
    let started = Instant::now();
    let mut tick = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stdin_closed => break,
            _ = ticks.tick() => {}
        }
        let kind = Kind::CYCLE[(tick % 4) as usize];
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            dropped += 1;
            tick += 1;
            continue;
        };
        let (client, own, seen, samples) =
            (client.clone(), own.clone(), seen.clone(), samples.clone());
        let tenant = args.tenant.clone();
        tasks.spawn(async move {
            let t = Instant::now();
            let status = one(&client, kind, tick, &tenant, &own, &seen).await;
            samples.lock().unwrap_or_else(|p| p.into_inner()).push((
                kind,
                status,
                t.elapsed().as_secs_f64() * 1000.0,
            ));
            drop(permit);
        });
        // Reap what has finished, so the set does not grow with the run.
        while tasks.try_join_next().is_some() {}
        tick += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    while tasks.join_next().await.is_some() {}
    let samples = samples.lock().unwrap_or_else(|p| p.into_inner()).clone();
    println!("{}", figures(&samples, seconds, dropped));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{figures, Kind};

    #[test]
    fn figures_give_percentiles_and_statuses_per_kind() {
        let samples: Vec<_> = (1..=100)
            .map(|i| (Kind::Get, 200, f64::from(i)))
            .chain([(Kind::Power, 409, 7.0), (Kind::Power, 0, 9.0)])
            .collect();
        let v = figures(&samples, 2.0, 3);
        assert_eq!(v["all"]["count"], 102);
        assert_eq!(v["requestsPerSecond"], 51.0);
        assert_eq!(v["dropped"], 3);
        assert_eq!(v["byKind"]["getNode"]["p50Ms"], 51.0);
        assert_eq!(v["byKind"]["getNode"]["p99Ms"], 99.0);
        assert_eq!(v["byKind"]["power"]["statuses"]["409"], 1);
        assert_eq!(v["byKind"]["power"]["statuses"]["0"], 1);
        assert_eq!(v["byKind"]["listNodes"]["count"], 0);
        assert_eq!(figures(&[], 0.0, 0)["requestsPerSecond"], 0.0);
    }
}
