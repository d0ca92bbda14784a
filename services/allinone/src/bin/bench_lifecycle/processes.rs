//! `bench-lifecycle --processes`: the control plane as compose runs it, a
//! process per service (the API with its outbox relay, the workflow
//! engine, each reconciler, attestation) and the simulated site in one of
//! its own, every one a `bcm --services …` child sharing one configuration
//! file. Owns starting them, reading each one's CPU time and peak RSS from
//! `/proc`, scraping their metrics, and stopping them.

use anyhow::Context as _;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// One child: what it runs, the process, and where its metrics are served.
struct Child {
    name: String,
    process: tokio::process::Child,
    pid: u32,
    metrics: String,
}

/// The running children.
pub struct Processes {
    children: Vec<Child>,
    http: reqwest::Client,
}

/// The children's metrics endpoints.
#[derive(Clone)]
pub struct Scrape {
    http: reqwest::Client,
    urls: Vec<String>,
}

impl Scrape {
    /// Every child's metrics text, one after the other (a child that does
    /// not answer adds nothing).
    pub async fn text(&self) -> String {
        let mut all = String::new();
        for url in &self.urls {
            if let Ok(r) = self.http.get(url).send().await {
                all.push_str(&r.text().await.unwrap_or_default());
                all.push('\n');
            }
        }
        all
    }
}

/// A port free now, picked below the range the kernel hands out for port 0
/// (`ip_local_port_range`): the children bind their other listeners on
/// port 0, and one of those could take a port picked from that range before
/// the child it was picked for binds it (a run failed so: "Address already
/// in use"). Successive calls pick successive ports.
pub fn free_port() -> anyhow::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let start = 10_000u32
        .min(ephemeral_low.saturating_sub(1_000))
        .max(1_024);
    let span = ephemeral_low.saturating_sub(start).max(1);
    // Runs side by side start at different points.
    let seed = std::process::id().wrapping_mul(7_919);
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let Ok(port) = u16::try_from(start + seed.wrapping_add(n) % span) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The value without its `null`s, which TOML cannot say (an absent key is
/// the same to the configuration).
pub fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// CPU seconds (user and system) of process `pid`, from `/proc/<pid>/stat`
/// (in the kernel's USER_HZ ticks, 100 a second); 0 where it cannot be read.
pub fn cpu_secs_of(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command name, which is in parentheses.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are the 14th and 15th fields; `after` starts at the 3rd.
    (ticks(11) + ticks(12)) / 100.0
}

impl Processes {
    /// Writes `config` (the all-in-one's configuration as JSON) to
    /// `dir/bcm.toml` and starts the children from `bcm` beside this
    /// binary: the API on `api_listen`, `reconcilers` reconciler processes.
    /// Returns once the API answers `/readyz`.
    pub async fn start(
        config: &Value,
        dir: &Path,
        api_listen: &str,
        base: &str,
        http: reqwest::Client,
        reconcilers: usize,
    ) -> anyhow::Result<Self> {
        let text =
            toml::to_string(&without_nulls(config.clone())).context("the configuration as TOML")?;
        let file = dir.join("bcm.toml");
        std::fs::write(&file, text)?;
        let exe = std::env::current_exe()?.with_file_name("bcm");
        let mut sets: Vec<(String, &str)> = vec![("api".into(), "api,relay")];
        sets.push(("workflow".into(), "workflow"));
        for i in 0..reconcilers.max(1) {
            sets.push((format!("reconciler-{i}"), "reconciler"));
        }
        sets.push(("attestation".into(), "attestation"));
        sets.push(("sim".into(), "sim"));
        let mut children = vec![];
        for (name, services) in sets {
            let api = services.starts_with("api");
            let listen = if api {
                api_listen.to_owned()
            } else {
                "127.0.0.1:0".to_owned()
            };
            // The API serves its metrics itself; the others on a port of
            // their own.
            let metrics_port = if api { None } else { Some(free_port()?) };
            let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
            let mut cmd = tokio::process::Command::new(&exe);
            cmd.args(["--sim-machines", "0", "--services", services, "--config"])
                .arg(&file)
                .env("BCM_ALL_API__LISTEN", &listen)
                .stdout(std::process::Stdio::null())
                .stderr(log)
                .kill_on_drop(true);
            if let Some(port) = metrics_port {
                cmd.env(
                    "BCM_ALL_API__TELEMETRY__METRICS_LISTEN",
                    format!("127.0.0.1:{port}"),
                );
            }
            let process = cmd
                .spawn()
                .with_context(|| format!("{}: build it with the same profile", exe.display()))?;
            let pid = process.id().context("a child without a pid")?;
            let metrics = match metrics_port {
                Some(port) => format!("http://127.0.0.1:{port}/metrics"),
                None => format!("{base}/metrics"),
            };
            children.push(Child {
                name,
                process,
                pid,
                metrics,
            });
        }
        let started = Self { children, http };
        let t = Instant::now();
        loop {
            let ready = started
                .http
                .get(format!("{base}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                break;
            }
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(120),
                "the API child did not answer /readyz within 120 s; see {}",
                dir.join("api.log").display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(started)
    }

    /// Each child's CPU seconds so far, by name.
    pub fn cpu_secs(&self) -> Vec<(String, f64)> {
        self.children
            .iter()
            .map(|c| (c.name.clone(), cpu_secs_of(&c.pid.to_string())))
            .collect()
    }

    /// Each child's name and process id.
    pub fn pids(&self) -> Vec<(String, String)> {
        self.children
            .iter()
            .map(|c| (c.name.clone(), c.pid.to_string()))
            .collect()
    }

    /// Each child's peak RSS so far in MiB, by name.
    pub fn peak_rss_mib(&self) -> Vec<(String, f64)> {
        self.children
            .iter()
            .map(|c| {
                let kib = super::rss_kib(&c.pid.to_string()).unwrap_or(0);
                (c.name.clone(), kib as f64 / 1024.0)
            })
            .collect()
    }

    /// Where every child's metrics are read.
    pub fn scrape(&self) -> Scrape {
        Scrape {
            http: self.http.clone(),
            urls: self.children.iter().map(|c| c.metrics.clone()).collect(),
        }
    }

    /// Kills every child and waits for each.
    pub async fn stop(mut self) {
        for c in &mut self.children {
            let _ = c.process.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nulls_are_left_out_at_every_depth_and_the_rest_is_kept() {
        let v =
            json!({"a": null, "b": {"c": null, "d": 1}, "e": [{"f": null, "g": "x"}], "h": [1, 2]});
        assert_eq!(
            without_nulls(v),
            json!({"b": {"d": 1}, "e": [{"g": "x"}], "h": [1, 2]})
        );
    }

    #[test]
    fn cpu_of_a_process_that_does_not_exist_is_zero_and_of_this_one_is_read() {
        assert_eq!(cpu_secs_of("no-such-pid"), 0.0);
        // Burn CPU until this process has a tick (10 ms), for at most 10 s
        // of wall time: a fixed 50 ms of wall time on a loaded machine (the
        // test command's four test processes on two cores) could be less
        // than one tick of CPU (a clean-clone run failed so). A reader that
        // never sees the ticks fails after the 10 s.
        let mut x = 0u64;
        let t = Instant::now();
        while cpu_secs_of("self") == 0.0 && t.elapsed() < Duration::from_secs(10) {
            for _ in 0..100_000 {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
        }
        assert!(x != 1);
        assert!(cpu_secs_of("self") > 0.0);
    }
}
