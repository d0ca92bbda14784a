//! Harness of the security tests: a nats-server of their own, configured
//! with the identities and permissions `bcm nats-auth` generates (the
//! same `bcm_bus::auth::generate`), and clients that connect as one of
//! those identities and record what the server refused.
//!
//! The server is `$BCM_NATS_SERVER` (the test command's stack exports it)
//! or `nats-server` on the PATH; it must be 2.10 or later.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bcm_core::SiteId;

/// A nats-server with JetStream and the generated identities of sites
/// `a` and `b`, on a free loopback port; killed on drop.
pub struct AuthServer {
    child: Child,
    bin: String,
    conf: PathBuf,
    port: u16,
    pub url: String,
    /// Where the seeds are (`<identity>.nk`).
    pub dir: PathBuf,
    pub subjects: bcm_bus::Subjects,
}

impl AuthServer {
    /// Starts one with identities for `sites`.
    pub async fn start(sites: &[&str]) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("bcm-security-{}", ulid::Ulid::new()));
        let subjects = bcm_bus::Subjects::new(None, 16);
        let sites: Vec<SiteId> = sites.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
        let made = bcm_bus::auth::generate(&dir, &subjects, &sites)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let conf = dir.join("server.conf");
        std::fs::write(
            &conf,
            format!(
                "listen: \"127.0.0.1:{port}\"\njetstream {{ store_dir: \"{}\" }}\ninclude \"{}\"\n",
                dir.join("js").display(),
                made.authorization
                    .file_name()
                    .and_then(|n| n.to_str())
                    .context("auth.conf")?,
            ),
        )?;
        let bin = std::env::var("BCM_NATS_SERVER").unwrap_or_else(|_| "nats-server".to_owned());
        let child = spawn_server(&bin, &conf, &dir)?;
        let server = Self {
            child,
            bin,
            conf,
            port,
            url: format!("nats://127.0.0.1:{port}"),
            dir,
            subjects,
        };
        server.listening().await?;
        Ok(server)
    }

    /// SIGKILLs the server (its store stays); [`AuthServer::restart`]
    /// brings it back on the same port and store.
    pub fn crash(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again after a [`AuthServer::crash`].
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.child = spawn_server(&self.bin, &self.conf, &self.dir)?;
        self.listening().await
    }

    async fn listening(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                bail!(
                    "{} did not listen; see {}",
                    self.bin,
                    self.dir.join("server.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// The bus configuration of `identity` (e.g. `bmc-a`).
    pub fn bus_config(&self, identity: &str) -> bcm_bus::BusConfig {
        bcm_bus::BusConfig {
            nkey_file: Some(self.dir.join(format!("{identity}.nk"))),
            ..bcm_bus::BusConfig::new(self.url.clone())
        }
    }

    /// A raw client connected as `identity`, recording the server's errors.
    pub async fn client(&self, identity: &str) -> anyhow::Result<Peer> {
        let key = bcm_bus::auth::load_seed(&self.dir.join(format!("{identity}.nk")))?;
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = errors.clone();
        let client = async_nats::ConnectOptions::new()
            .nkey(key.seed()?)
            .custom_inbox_prefix(bcm_bus::auth::inbox_prefix(&key.public_key()))
            // A refused request is never answered: do not wait long for it.
            .request_timeout(Some(std::time::Duration::from_secs(2)))
            .event_callback(move |ev| {
                let seen = seen.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = ev {
                        seen.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(e.to_string());
                    }
                }
            })
            .connect(&self.url)
            .await?;
        Ok(Peer { client, errors })
    }
}

fn spawn_server(bin: &str, conf: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))?;
    Command::new(bin)
        .arg("-c")
        .arg(conf)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {bin} (set BCM_NATS_SERVER to a nats-server >= 2.10)"))
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A client and the errors the server sent it.
pub struct Peer {
    pub client: async_nats::Client,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Peer {
    /// Waits (up to 5 s) for the server to report a permissions violation
    /// naming `subject`; the error's text.
    pub async fn violation(&self, subject: &str) -> anyhow::Result<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let found = self
                .errors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .find(|e| e.contains("Permissions Violation") && e.contains(subject))
                .cloned();
            if let Some(e) = found {
                return Ok(e);
            }
            if Instant::now() > deadline {
                bail!(
                    "no permissions violation for {subject}; the server said {:?}",
                    self.errors.lock().unwrap_or_else(|p| p.into_inner())
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every error the server sent so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
