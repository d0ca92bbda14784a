//! Drives the simulated fleet through the public HTTP API as a platform
//! team would — enroll, wait for `ready`, deploy, wait for `deployed`,
//! undeploy, wait for `ready` — retrying every call whose answer was lost
//! (the API is killed under it) and reading the outcome before repeating a
//! call that may have taken effect.

use anyhow::{bail, Context as _};
use bcm_core::ProvisionState;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The API, as the admin.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    /// The API at `base`, trusting only the CA in `ca_file`.
    pub fn new(base: &str, token: &str, ca_file: &std::path::Path) -> anyhow::Result<Self> {
        let ca = std::fs::read_to_string(ca_file)?;
        Ok(Self {
            http: bcm_pki::tls::pinned_client(&ca)?
                .timeout(Duration::from_secs(30))
                .build()?,
            base: base.to_owned(),
            token: token.to_owned(),
        })
    }

    /// One call: `None` when no answer came (refused connection, reset,
    /// timeout) or the answer was a 5xx.
    async fn once(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Option<(u16, Value)> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req.send().await.ok()?;
        let status = res.status().as_u16();
        let value = res.json().await.unwrap_or(Value::Null);
        (status < 500).then_some((status, value))
    }

    /// A read, retried until answered (within `within`).
    pub async fn get(&self, path: &str, within: Duration) -> anyhow::Result<Value> {
        let deadline = Instant::now() + within;
        loop {
            match self.once(reqwest::Method::GET, path, None).await {
                Some((200, v)) => return Ok(v),
                Some((s, v)) => bail!("GET {path}: {s} {v}"),
                None if Instant::now() > deadline => bail!("GET {path}: no answer"),
                None => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
    }

    /// Every node, by BMC address.
    pub async fn nodes(&self) -> anyhow::Result<HashMap<String, Value>> {
        let mut out = HashMap::new();
        let mut token: Option<String> = None;
        loop {
            let path = match &token {
                Some(t) => format!("/api/compute/metal/nodes?limit=1000&pageToken={t}"),
                None => "/api/compute/metal/nodes?limit=1000".to_owned(),
            };
            let page = self.get(&path, Duration::from_secs(300)).await?;
            for n in page["items"].as_array().cloned().unwrap_or_default() {
                let address = n["bmc"]["address"].as_str().unwrap_or_default().to_owned();
                out.insert(address, n);
            }
            match page["nextPageToken"].as_str() {
                Some(t) => token = Some(t.to_owned()),
                None => return Ok(out),
            }
        }
    }

    /// Enrolls `sim://<name>` unless a node of that address exists (a
    /// retried enroll whose first answer was lost must not make a second).
    pub async fn enroll(&self, address: &str) -> anyhow::Result<()> {
        let body = json!({"tenantId": "root", "poolId": "default",
            "bmc": {"driver": "sim", "address": address, "username": "admin", "password": "pw"}});
        for _ in 0..600 {
            match self
                .once(
                    reqwest::Method::POST,
                    "/api/compute/metal/enroll",
                    Some(&body),
                )
                .await
            {
                Some((200, _)) => return Ok(()),
                Some((s, v)) => bail!("enroll {address}: {s} {v}"),
                None => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    if self.nodes().await?.contains_key(address) {
                        return Ok(());
                    }
                }
            }
        }
        bail!("enroll {address}: no answer")
    }

    /// Runs `verb` on a node, until it took effect: answered 200, or the
    /// node is found in one of `effect` (the answer was lost).
    pub async fn verb(
        &self,
        verb: &str,
        node: &str,
        extra: Value,
        effect: &[ProvisionState],
    ) -> anyhow::Result<()> {
        let mut body = json!({"tenantId": "root", "nodeId": node});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        for _ in 0..600 {
            match self
                .once(
                    reqwest::Method::POST,
                    &format!("/api/compute/metal/{verb}"),
                    Some(&body),
                )
                .await
            {
                Some((200, _)) => return Ok(()),
                // Busy (a lock held by a dying transaction): again.
                Some((409, _)) => {}
                Some((s, v)) => {
                    let now = self.state_of(node).await?;
                    if effect.contains(&now) {
                        return Ok(());
                    }
                    bail!("{verb} {node}: {s} {v} (in {now})")
                }
                None => {}
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            if effect.contains(&self.state_of(node).await?) {
                return Ok(());
            }
        }
        bail!("{verb} {node}: no answer")
    }

    async fn state_of(&self, node: &str) -> anyhow::Result<ProvisionState> {
        let n = self
            .get(
                &format!("/api/compute/metal/nodes/{node}"),
                Duration::from_secs(300),
            )
            .await?;
        n["provisionState"]
            .as_str()
            .context("provisionState")?
            .parse()
            .map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// Waits until every node is in `target` (or `within` passes), printing
/// progress every few seconds; returns the time it took.
pub async fn wait_all(
    api: &Api,
    n: usize,
    target: ProvisionState,
    within: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut last_print = Instant::now();
    loop {
        let nodes = api.nodes().await?;
        let mut by_state: HashMap<String, usize> = HashMap::new();
        for v in nodes.values() {
            *by_state
                .entry(v["provisionState"].as_str().unwrap_or("?").to_owned())
                .or_default() += 1;
        }
        let at = by_state.get(target.as_str()).copied().unwrap_or(0);
        if at >= n {
            eprintln!(
                "chaos: {n}/{n} {target} after {:.1} s",
                started.elapsed().as_secs_f64()
            );
            return Ok(started.elapsed());
        }
        if last_print.elapsed() > Duration::from_secs(5) {
            let mut states: Vec<_> = by_state.into_iter().collect();
            states.sort();
            eprintln!(
                "chaos: {at}/{n} {target} after {:.0} s ({states:?})",
                started.elapsed().as_secs_f64()
            );
            last_print = Instant::now();
        }
        if started.elapsed() > within {
            bail!("only {at}/{n} reached {target} in {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
