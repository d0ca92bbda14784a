//! The demo the README's first command shows: enroll simulated machines,
//! watch them reach `ready`, deploy one and release it — all through the
//! public HTTP API, as a user would.

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Why the demo stopped.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("the API did not answer: {0}")]
    Unreachable(#[from] reqwest::Error),
    #[error("{path}: {status}: {message}")]
    Refused {
        path: String,
        status: reqwest::StatusCode,
        message: String,
    },
    #[error("{0}")]
    Stuck(String),
    #[error("progress bar: {0}")]
    Template(#[from] indicatif::style::TemplateError),
}

/// A tiny client of the metal API.
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    /// A client of the API at `base` with a bearer token, trusting the CA
    /// of `http` (a pinned client for HTTPS).
    pub fn new(http: reqwest::Client, base: &str, token: &str) -> Self {
        Self {
            http,
            base: base.to_owned(),
            token: token.to_owned(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, DemoError> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await?;
        let status = res.status();
        let body: Value = res.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            return Err(DemoError::Refused {
                path: path.to_owned(),
                status,
                message: body["message"].as_str().unwrap_or("no message").to_owned(),
            });
        }
        Ok(body)
    }

    /// `POST /api/compute/metal/<verb>`.
    pub async fn verb(&self, verb: &str, body: &Value) -> Result<Value, DemoError> {
        self.call(
            reqwest::Method::POST,
            &format!("/api/compute/metal/{verb}"),
            Some(body),
        )
        .await
    }

    /// Every node of a tenant.
    pub async fn nodes(&self, tenant: &str) -> Result<Vec<Value>, DemoError> {
        let mut out = vec![];
        let mut page: Option<String> = None;
        loop {
            let q = match &page {
                Some(p) => {
                    format!("/api/compute/metal/nodes?tenantId={tenant}&limit=1000&pageToken={p}")
                }
                None => format!("/api/compute/metal/nodes?tenantId={tenant}&limit=1000"),
            };
            let v = self.call(reqwest::Method::GET, &q, None).await?;
            out.extend(v["items"].as_array().cloned().unwrap_or_default());
            match v["nextPageToken"].as_str() {
                Some(t) => page = Some(t.to_owned()),
                None => return Ok(out),
            }
        }
    }

    /// One node.
    pub async fn node(&self, id: &str) -> Result<Value, DemoError> {
        self.call(
            reqwest::Method::GET,
            &format!("/api/compute/metal/nodes/{id}"),
            None,
        )
        .await
    }
}

fn by_state(nodes: &[Value]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for n in nodes {
        *m.entry(n["provisionState"].as_str().unwrap_or("?").to_owned())
            .or_insert(0) += 1;
    }
    m
}

/// Waits until `id` is in `state`, or fails with where it is.
async fn wait_for(c: &Client, id: &str, state: &str, within: Duration) -> Result<Value, DemoError> {
    let started = Instant::now();
    loop {
        let n = c.node(id).await?;
        if n["provisionState"] == state {
            return Ok(n);
        }
        if n["provisionState"] == "failed" || started.elapsed() > within {
            return Err(DemoError::Stuck(format!(
                "{id} is {} (lastError {})",
                n["provisionState"], n["lastError"]
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Enrolls `machines` simulated machines (those not enrolled yet), shows
/// their progress to `ready`, deploys one and releases it.
pub async fn run(c: &Client, tenant: &str, pool: &str, machines: usize) -> Result<(), DemoError> {
    let existing = c.nodes(tenant).await?;
    let known: Vec<String> = existing
        .iter()
        .filter_map(|n| n["bmc"]["address"].as_str().map(str::to_owned))
        .collect();
    for i in 1..=machines {
        let address = format!("sim://machine-{i}");
        if known.contains(&address) {
            continue;
        }
        c.verb(
            "enroll",
            &json!({"tenantId": tenant, "poolId": pool,
                    "bmc": {"driver": "sim", "address": address, "username": "admin", "password": "sim-password"}}),
        )
        .await?;
    }
    let bar = ProgressBar::new(machines as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>4} [{bar:30}] {pos}/{len} ready  {msg}")?
            .progress_chars("=> "),
    );
    let started = Instant::now();
    let nodes = loop {
        let nodes = c.nodes(tenant).await?;
        let states = by_state(&nodes);
        let ready = states.get("ready").copied().unwrap_or(0)
            + states.get("deployed").copied().unwrap_or(0);
        bar.set_position(ready as u64);
        bar.set_message(
            states
                .iter()
                .map(|(s, n)| format!("{s}:{n}"))
                .collect::<Vec<_>>()
                .join(" "),
        );
        bar.tick();
        if ready >= machines
            || states.contains_key("failed")
            || started.elapsed() > Duration::from_secs(300)
        {
            break nodes;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    bar.finish();
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        // The bar's line stays; what follows starts below it.
        eprintln!();
    }
    let Some(first) = nodes.iter().find(|n| n["provisionState"] == "ready") else {
        return Err(DemoError::Stuck(format!(
            "no machine reached ready: {:?}",
            by_state(&nodes)
        )));
    };
    let id = first["nodeId"].as_str().unwrap_or_default().to_owned();
    println!(
        "{} machines ready in {:.1} s",
        machines,
        started.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    c.verb("deploy", &json!({"tenantId": tenant, "nodeId": id, "profileId": "ubuntu-24.04", "profileVersion": 1})).await?;
    wait_for(c, &id, "deployed", Duration::from_secs(120)).await?;
    println!("deployed {id} in {:.1} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    c.verb(
        "undeploy",
        &json!({"tenantId": tenant, "nodeId": id, "wipe": "quick"}),
    )
    .await?;
    wait_for(c, &id, "ready", Duration::from_secs(120)).await?;
    println!(
        "released {id} (quick wipe, node-signed and verified) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
