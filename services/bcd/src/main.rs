//! `bcd`: the on-machine agent's command line.

use bcm_contracts::agent::AgentRole;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bcm_bcd::agent::{self, AgentConfig};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(version, about = "The Better Compute Metal on-machine agent")]
struct Args {
    /// The control plane's CA (PEM), pinned in this build: an https API is
    /// trusted through it alone.
    #[arg(long, global = true, default_value = "/etc/bcd/trust/ca.crt")]
    ca_file: PathBuf,
    /// The image-signing keys this build trusts, one base64 ed25519 key a
    /// line; a key the control plane names is never added.
    #[arg(long, global = true, default_value = "/etc/bcd/trust/image-keys")]
    image_keys_file: PathBuf,
    /// The quorum trust anchor this build pins (JSON): destructive commands
    /// run only under an approved batch verified against it. Absent: the
    /// `bcm.quorum=` the site's boot service puts on the kernel command
    /// line; neither: every destructive command is refused.
    #[arg(
        long,
        global = true,
        default_value = "/etc/bcd/trust/quorum-anchor.json"
    )]
    quorum_anchor_file: PathBuf,
    #[command(subcommand)]
    mode: Mode,
}

/// What the build pins: the CA, if its file is there, and the image keys
/// of the keys file (if there) and of `--image-key`.
fn pinned(
    args_ca: &Path,
    keys_file: &Path,
    extra: &[String],
) -> anyhow::Result<(Option<String>, Vec<ed25519_dalek::VerifyingKey>)> {
    let ca = match std::fs::read_to_string(args_ca) {
        Ok(pem) => Some(pem),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => anyhow::bail!("{}: {e}", args_ca.display()),
    };
    let mut lines: Vec<String> = match std::fs::read_to_string(keys_file) {
        Ok(text) => text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
        Err(e) => anyhow::bail!("{}: {e}", keys_file.display()),
    };
    lines.extend(extra.iter().cloned());
    let mut keys = vec![];
    for k in &lines {
        keys.push(
            bcm_pki::image::parse_public_key(k)
                .ok_or_else(|| anyhow::anyhow!("image key {k:?} is not a base64 ed25519 key"))?,
        );
    }
    Ok((ca, keys))
}

#[derive(Subcommand)]
enum Mode {
    /// The inspection/provisioning ramdisk's agent.
    Ramdisk {
        /// The kernel command line (default: read /proc/cmdline).
        #[arg(long)]
        cmdline: Option<String>,
        /// Only these disks (block devices or plain files), for tests.
        #[arg(long = "disk")]
        disks: Vec<PathBuf>,
        /// An image-signing key trusted besides the keys file's (base64
        /// ed25519; tests).
        #[arg(long = "image-key")]
        image_keys: Vec<String>,
        /// Random stripes read back after a device erase.
        #[arg(long, default_value_t = 16)]
        wipe_stripes: usize,
        /// Where the key, session and command records outlive a restart of
        /// bcd (tmpfs in the ramdisk: gone with the boot), one directory per
        /// boot (join token).
        #[arg(long, default_value = "/run/bcd")]
        state_dir: PathBuf,
    },
    /// The installed OS's or an adopted machine's agent.
    Node {
        /// The control plane (default: BCD_API from --env-file).
        #[arg(long)]
        api: Option<String>,
        /// A one-time join token (default: BCD_JOIN_TOKEN from --env-file).
        #[arg(long)]
        token: Option<String>,
        /// The file the rendered user data writes.
        #[arg(long, default_value = "/etc/bcd/join.env")]
        env_file: PathBuf,
        /// What this machine calls itself (adopt).
        #[arg(long)]
        hostname: Option<String>,
        /// Where the identity is kept across boots (created 0700, its file
        /// 0600: root only). With an identity in force here, no token is
        /// needed: bcd rejoins with it.
        #[arg(long, default_value = "/var/lib/bcd")]
        state_dir: PathBuf,
        /// Only these disks (block devices or plain files) for inventory and
        /// `node.wipe`, for tests; default: every disk of the machine.
        #[arg(long = "disk")]
        disks: Vec<PathBuf>,
        /// What `node.powerOff` does once answered: power the machine off,
        /// or only stop bcd (tests, on a host that must stay up).
        #[arg(long, value_enum, default_value = "machine")]
        power_off: agent::PowerOff,
    },
}

fn env_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        l.trim()
            .strip_prefix(key)
            .and_then(|v| v.strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').to_owned())
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    // Ctrl-C, or SIGTERM when the ramdisk or the OS shuts down.
    let stop = bcm_telemetry::signals::shutdown_token();
    let args = Args::parse();
    let (ca_file, image_keys_file) = (args.ca_file.clone(), args.image_keys_file.clone());
    let ran = match args.mode {
        Mode::Ramdisk {
            cmdline,
            disks,
            image_keys,
            wipe_stripes,
            state_dir,
        } => {
            let line = match cmdline {
                Some(c) => c,
                None => std::fs::read_to_string("/proc/cmdline")?,
            };
            let Some(boot) = bcm_bcd::cmdline::parse(&line) else {
                anyhow::bail!("the kernel command line has no bcm.node, bcm.api and bcm.join");
            };
            let (ca_pem, keys) = pinned(&ca_file, &image_keys_file, &image_keys)?;
            let quorum_anchor = if args.quorum_anchor_file.exists() {
                // The build's own: a broken one is a broken build.
                Some(bcm_quorum::anchor_from_file(&args.quorum_anchor_file)?)
            } else {
                // The site's, from the command line: unreadable, the agent
                // still joins and reports, and refuses what is destructive.
                match bcm_quorum::anchor_from_cmdline(&line).transpose() {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "bcm.quorum= is unreadable: no anchor");
                        None
                    }
                }
            };
            if quorum_anchor.is_none() {
                tracing::warn!("no quorum trust anchor (pinned or bcm.quorum=): every destructive command will be refused");
            }
            agent::run_ramdisk(
                AgentConfig {
                    api: boot.api,
                    node: Some(boot.node),
                    join_token: boot.join,
                    role: AgentRole::Ramdisk,
                    hostname: None,
                    disks,
                    image_keys: keys,
                    ca_pem,
                    proxy: boot.proxy,
                    cache: boot.cache,
                    heartbeat: Duration::from_secs(10),
                    wipe_stripes,
                    state_dir: Some(state_dir),
                    quorum_anchor,
                    power_off: agent::PowerOff::Machine,
                },
                stop,
            )
            .await
        }
        Mode::Node {
            api,
            token,
            env_file,
            hostname,
            state_dir,
            disks,
            power_off,
        } => {
            let file = std::fs::read_to_string(&env_file).unwrap_or_default();
            let api = api.or_else(|| env_value(&file, "BCD_API")).ok_or_else(|| {
                anyhow::anyhow!("no --api and no BCD_API in {}", env_file.display())
            })?;
            // Without a token only a kept identity can rejoin (checked when
            // it is refused).
            let token = token
                .or_else(|| env_value(&file, "BCD_JOIN_TOKEN"))
                .unwrap_or_default();
            let (ca_pem, _) = pinned(&ca_file, &image_keys_file, &[])?;
            // What the machine's operator pinned (the OS has no kernel
            // command line from the site): without it, the wipe an
            // adopted machine's retire sends is refused.
            // An OS that never runs one (a deployed machine's) must not
            // stop over a broken file: it is named and left out.
            let quorum_anchor = match bcm_quorum::anchor_from_file(&args.quorum_anchor_file) {
                Ok(a) => Some(a),
                Err(e) => {
                    tracing::warn!(error = %e, "no quorum trust anchor: a node.wipe will be refused");
                    None
                }
            };
            agent::run_node(
                AgentConfig {
                    api,
                    node: None,
                    join_token: token,
                    role: AgentRole::Node,
                    hostname,
                    disks,
                    image_keys: vec![],
                    ca_pem,
                    proxy: None,
                    cache: None,
                    heartbeat: Duration::from_secs(10),
                    wipe_stripes: 0,
                    state_dir: Some(state_dir),
                    quorum_anchor,
                    power_off,
                },
                stop,
            )
            .await
        }
    };
    ran.map_err(|e| anyhow::anyhow!("bcd: {e}"))
}
