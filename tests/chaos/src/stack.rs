//! The chaos run's own Postgres and NATS (deploy/dev/stack.sh under the
//! run's directory, on ports of their own), so it can crash and restart
//! them without touching anything else on the machine.

use anyhow::{bail, Context as _};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The run's Postgres and NATS.
#[derive(Clone)]
pub struct Stack {
    script: PathBuf,
    dir: PathBuf,
    pub pg_port: u16,
    pub nats_port: u16,
    /// The nkey users the server admits besides its admin (`bcm
    /// nats-auth`'s `users.conf`).
    nats_users: PathBuf,
}

impl Stack {
    /// Starts both under `dir`.
    pub fn up(
        repo: &Path,
        dir: &Path,
        pg_port: u16,
        nats_port: u16,
        nats_users: &Path,
    ) -> anyhow::Result<Self> {
        let s = Self {
            script: repo.join("deploy/dev/stack.sh"),
            dir: dir.to_owned(),
            pg_port,
            nats_port,
            nats_users: nats_users.to_owned(),
        };
        s.run("up")?;
        Ok(s)
    }

    fn run(&self, what: &str) -> anyhow::Result<()> {
        let status = Command::new(&self.script)
            .arg(what)
            .env("BCM_STACK_DIR", &self.dir)
            .env("BCM_STACK_PG_PORT", self.pg_port.to_string())
            .env("BCM_STACK_NATS_PORT", self.nats_port.to_string())
            .env("BCM_STACK_NATS_USERS", &self.nats_users)
            // Crashed on purpose: every answered commit must survive.
            .env("BCM_STACK_PG_DURABLE", "1")
            .env_remove("DATABASE_URL")
            .env_remove("NATS_URL")
            .status()
            .with_context(|| format!("running {}", self.script.display()))?;
        if !status.success() {
            bail!("stack.sh {what}: {status}");
        }
        Ok(())
    }

    pub fn database_server(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.pg_port)
    }

    /// The server's address, with no credentials (the services bring
    /// their nkeys).
    pub fn nats_addr(&self) -> String {
        format!("nats://127.0.0.1:{}", self.nats_port)
    }

    /// The server as its admin (the run's recorder reads every event).
    pub fn nats_admin_url(&self) -> anyhow::Result<String> {
        let path = self.dir.join("nats/admin.password");
        let password = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(format!(
            "nats://admin:{}@127.0.0.1:{}",
            password.trim(),
            self.nats_port
        ))
    }

    /// Postgres stops as in a crash (immediate: no checkpoint, every
    /// connection cut), stays down `down`, and comes back on its data.
    pub async fn crash_postgres(&self, down: std::time::Duration) -> anyhow::Result<()> {
        self.run("crash-pg")?;
        tokio::time::sleep(down).await;
        self.run("up")
    }

    /// nats-server is SIGKILLed, stays down `down`, and comes back on the
    /// same store.
    pub async fn crash_nats(&self, down: std::time::Duration) -> anyhow::Result<()> {
        self.run("crash-nats")?;
        tokio::time::sleep(down).await;
        self.run("up")
    }

    /// Stops both.
    pub fn down(&self) {
        let _ = self.run("down");
    }
}
