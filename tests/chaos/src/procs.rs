//! The control plane as separate `bcm --services …` processes, the way
//! compose runs it, and the killer: SIGKILL of a random one every few
//! seconds, restarted a moment later.

use anyhow::Context as _;
use rand::seq::SliceRandom as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// One service process.
struct Proc {
    name: String,
    services: String,
    child: Option<Child>,
    restarts: u32,
}

/// Every process of the run.
#[derive(Clone)]
pub struct Procs {
    bcm: PathBuf,
    config: PathBuf,
    logs: PathBuf,
    /// The directory of the bus identities' seeds.
    identities: PathBuf,
    inner: Arc<Mutex<Vec<Proc>>>,
}

/// Each process: (name, `--services`).
pub const LAYOUT: &[(&str, &str)] = &[
    ("api", "api"),
    ("relay", "relay"),
    ("workflow", "workflow"),
    ("attestation", "attestation"),
    ("reconciler-1", "reconciler"),
    ("reconciler-2", "reconciler"),
    ("sim", "sim"),
];

impl Procs {
    /// Starts every process of [`LAYOUT`].
    pub fn start(
        bcm: &Path,
        config: &Path,
        logs: &Path,
        identities: &Path,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(logs)?;
        let this = Self {
            identities: identities.to_owned(),
            bcm: bcm.to_owned(),
            config: config.to_owned(),
            logs: logs.to_owned(),
            inner: Arc::new(Mutex::new(
                LAYOUT
                    .iter()
                    .map(|(n, s)| Proc {
                        name: (*n).to_owned(),
                        services: (*s).to_owned(),
                        child: None,
                        restarts: 0,
                    })
                    .collect(),
            )),
        };
        let names: Vec<String> = LAYOUT.iter().map(|(n, _)| (*n).to_owned()).collect();
        for n in names {
            this.spawn(&n)?;
        }
        Ok(this)
    }

    fn spawn(&self, name: &str) -> anyhow::Result<()> {
        let mut procs = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let p = procs
            .iter_mut()
            .find(|p| p.name == name)
            .context("no such process")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{name}.log")))?;
        let mut cmd = Command::new(&self.bcm);
        cmd.args(["--sim-machines", "0", "--services", &p.services, "--config"])
            .arg(&self.config);
        if p.services != "api" {
            // Only the API serves on the configured address.
            cmd.env("BCM_ALL_API__LISTEN", "127.0.0.1:0");
        }
        // Each control-plane service with its own bus identity (the relay
        // is the API's; the sim process's site connects as `sim-local`).
        let identity = match p.services.as_str() {
            "relay" => "api",
            "sim" => "control",
            s => s,
        };
        cmd.env(
            "BCM_ALL_API__BUS__NKEY_FILE",
            self.identities.join(format!("{identity}.nk")),
        );
        let child = cmd
            .env("BCM_ALL_API__TELEMETRY__LOG_FORMAT", "json")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawning {}", self.bcm.display()))?;
        p.child = Some(child);
        Ok(())
    }

    /// SIGKILLs `name`; returns false if it had already exited by itself
    /// (a crash the run reports).
    fn kill(&self, name: &str) -> bool {
        let mut procs = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(p) = procs.iter_mut().find(|p| p.name == name) else {
            return true;
        };
        let Some(mut child) = p.child.take() else {
            return true;
        };
        let alive = matches!(child.try_wait(), Ok(None));
        let _ = child.kill();
        let _ = child.wait();
        p.restarts += 1;
        alive
    }

    /// Processes that exited by themselves (not killed by us).
    pub fn exited(&self) -> Vec<String> {
        let mut procs = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        procs
            .iter_mut()
            .filter_map(|p| match p.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(status))) => Some(format!("{} ({status})", p.name)),
                _ => None,
            })
            .collect()
    }

    /// Kills `name` and starts it again after `down`.
    pub async fn restart(&self, name: &str, down: Duration) -> anyhow::Result<bool> {
        let was_alive = self.kill(name);
        tokio::time::sleep(down).await;
        self.spawn(name)?;
        Ok(was_alive)
    }

    /// Kills a random process every `every`, restarting it `down` later,
    /// until `stop`. Returns the kills made, and the processes found to
    /// have exited by themselves when their turn came (a crash).
    pub async fn killer(
        &self,
        every: Duration,
        down: Duration,
        stop: CancellationToken,
    ) -> (Vec<String>, Vec<String>) {
        let mut kills = vec![];
        let mut crashed = vec![];
        // Every process in turn, in a new random order each round: a short
        // run still kills each of them.
        let mut queue: Vec<&str> = vec![];
        loop {
            tokio::select! {
                _ = stop.cancelled() => return (kills, crashed),
                _ = tokio::time::sleep(every) => {}
            }
            if queue.is_empty() {
                queue = LAYOUT.iter().map(|(n, _)| *n).collect();
                queue.shuffle(&mut rand::thread_rng());
            }
            let Some(name) = queue.pop() else {
                return (kills, crashed);
            };
            match self.restart(name, down).await {
                Ok(true) => {}
                Ok(false) => {
                    eprintln!("chaos: {name} had exited by itself before its kill");
                    crashed.push(name.to_owned());
                }
                Err(e) => eprintln!("chaos: restarting {name}: {e:#}"),
            }
            kills.push(name.to_owned());
        }
    }

    /// SIGTERMs every process and waits for each; returns the slowest stop.
    pub fn stop_all(&self) -> Duration {
        let mut procs = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut slowest = Duration::ZERO;
        for p in procs.iter_mut() {
            if let Some(mut child) = p.child.take() {
                let started = Instant::now();
                let _ = Command::new("kill")
                    .args(["-TERM", &child.id().to_string()])
                    .status();
                let deadline = started + Duration::from_secs(10);
                loop {
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    if Instant::now() > deadline {
                        eprintln!("chaos: {} did not stop on SIGTERM in 10 s", p.name);
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                slowest = slowest.max(started.elapsed());
            }
        }
        slowest
    }

    /// Restarts per process.
    pub fn restarts(&self) -> Vec<(String, u32)> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|p| (p.name.clone(), p.restarts))
            .collect()
    }
}
