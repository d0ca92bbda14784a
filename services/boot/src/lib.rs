//! The `boot` service for one site: proxy DHCP (ports 67 and 4011) that
//! never hands out addresses, read-only TFTP for the iPXE builds, iPXE
//! scripts, UEFI HTTP boot and cached images over HTTP, and the boot
//! entries that decide who is answered (from `site.bootEntry.*` commands,
//! shared by the site's boot processes through a JetStream KV bucket).
//! Several processes may run per site: exactly one holds the site boot
//! lease and answers DHCP; the others stand by and take over when its lease
//! expires. TFTP and HTTP answer on every process; an iPXE script is
//! served only behind the per-boot link the DHCP answer named, which lives
//! in the memory of the process that answered ([`nonces`]): a link of a
//! process that lost its lease dies with it, and the machine's next DHCP
//! exchange gets a fresh one.

pub mod commands;
pub mod dhcp;
pub mod dhcp_server;
pub mod entries;
pub mod http;
pub mod images;
pub mod lease;
pub mod nonces;
pub mod proxy;
pub mod tftp;

use serde::Deserialize;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Proxy DHCP settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct DhcpConfig {
    /// The address the DHCP sockets bind (0.0.0.0 to receive broadcasts).
    #[serde(default = "any")]
    pub listen: Ipv4Addr,
    /// Bind the sockets to this interface (SO_BINDTODEVICE): the boot VLAN.
    #[serde(default)]
    pub interface: Option<String>,
    #[serde(default = "default_dhcp_port")]
    pub port: u16,
    #[serde(default = "default_pxe_port")]
    pub pxe_port: u16,
    /// The port clients listen on (68).
    #[serde(default = "default_client_port")]
    pub client_port: u16,
    /// Where replies to clients without an address go: the limited
    /// broadcast. A lab on loopback may name a unicast address.
    #[serde(default = "broadcast")]
    pub broadcast: Ipv4Addr,
}

fn any() -> Ipv4Addr {
    Ipv4Addr::UNSPECIFIED
}
fn broadcast() -> Ipv4Addr {
    Ipv4Addr::BROADCAST
}
fn default_dhcp_port() -> u16 {
    67
}
fn default_pxe_port() -> u16 {
    4011
}
fn default_client_port() -> u16 {
    68
}

impl Default for DhcpConfig {
    fn default() -> Self {
        Self {
            listen: any(),
            interface: None,
            port: default_dhcp_port(),
            pxe_port: default_pxe_port(),
            client_port: default_client_port(),
            broadcast: broadcast(),
        }
    }
}

/// The forward proxy's settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct HttpProxyConfig {
    pub listen: SocketAddr,
    /// `host:port` destinations it may reach (`images.example:443`).
    pub allow: Vec<String>,
}

/// Configuration of the service.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct BootConfig {
    /// The site whose `site.*` commands this service executes.
    pub site: String,
    pub bus: bcm_bus::BusConfig,
    /// This server's address on the boot network: next-server, option 54
    /// and the host of every URL handed out.
    pub server_ip: Ipv4Addr,
    #[serde(default)]
    pub dhcp: DhcpConfig,
    /// TFTP listen address (the boot VLAN address, port 69).
    #[serde(default = "default_tftp_listen")]
    pub tftp_listen: SocketAddr,
    /// The directory of boot files: copies (`cp -L`) of the iPXE builds;
    /// Debian's /usr/lib/ipxe links ipxe.efi to /boot, which is refused.
    #[serde(default = "default_boot_files")]
    pub boot_files: PathBuf,
    #[serde(default = "default_bios_file")]
    pub bios_file: String,
    #[serde(default = "default_uefi_x64_file")]
    pub uefi_x64_file: String,
    #[serde(default = "default_uefi_arm64_file")]
    pub uefi_arm64_file: String,
    /// HTTP listen address (scripts, UEFI HTTP boot, images).
    #[serde(default = "default_http_listen")]
    pub http_listen: SocketAddr,
    /// The port URLs name (the listen port unless behind a forwarder).
    #[serde(default)]
    pub http_port: Option<u16>,
    /// This site's join key (from `bcm nats-auth`: `join-<site>.key`): the
    /// boot entries' kernel command lines carry join references, revealed
    /// only in the script served behind a one-time link.
    #[serde(default)]
    pub join_key: bcm_pki::JoinKeyConfig,
    /// The site's quorum trust anchor (the file the bmc service reads):
    /// every ramdisk this service boots gets it on its kernel command line
    /// (`bcm.quorum=`, in place of any the control plane wrote), so `bcd`
    /// verifies destructive commands against what the site trusts. A
    /// ramdisk built with an anchor of its own (`bcd --quorum-anchor`)
    /// prefers that one.
    #[serde(default)]
    pub quorum_anchor_file: Option<std::path::PathBuf>,
    /// Seconds a DHCP answer's script link (`/ipxe/<nonce>`) stays usable.
    #[serde(default = "default_script_link_ttl")]
    pub script_link_ttl_secs: u64,
    /// Seconds the site boot lease lives without renewal.
    #[serde(default = "default_lease_ttl")]
    pub lease_ttl_secs: u64,
    /// This process's name in the lease (default: host and pid).
    #[serde(default)]
    pub holder: Option<String>,
    /// The image cache: pre-warmed from `images` at start, served over HTTP.
    #[serde(default = "default_image_cache")]
    pub image_cache: PathBuf,
    #[serde(default)]
    pub images: Vec<images::CatalogImage>,
    /// The site's upstream HTTP proxy (`http://host:port`): the image
    /// cache fetches the catalog through it when set (a boot network with
    /// no other way out). A `site.httpProxy` command carrying the site's
    /// proxy from the control plane uses that one instead.
    #[serde(default)]
    pub upstream_proxy: Option<String>,
    /// A forward proxy for the ramdisk's image downloads, to allowlisted
    /// destinations only. Off unless configured.
    #[serde(default)]
    pub http_proxy: Option<HttpProxyConfig>,
    #[serde(default)]
    pub telemetry: bcm_telemetry::TelemetryConfig,
}

fn default_tftp_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 69))
}
fn default_http_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8081))
}
fn default_boot_files() -> PathBuf {
    "/var/lib/bcm-boot/tftp".into()
}
fn default_bios_file() -> String {
    "undionly.kpxe".into()
}
fn default_uefi_x64_file() -> String {
    "ipxe.efi".into()
}
fn default_uefi_arm64_file() -> String {
    "ipxe-arm64.efi".into()
}
fn default_script_link_ttl() -> u64 {
    // iPXE fetches its script within a second of the answer; slow firmware
    // and a loaded boot network get two minutes.
    120
}
fn default_lease_ttl() -> u64 {
    6
}
fn default_image_cache() -> PathBuf {
    "/var/cache/bcm-boot".into()
}

impl BootConfig {
    /// Loads a TOML file, then `BCM_BOOT_*` environment variables.
    pub fn load(path: Option<&std::path::Path>) -> Result<Self, Box<figment::Error>> {
        bcm_config::load(path, "BCM_BOOT_")
    }

    /// The proxy DHCP decisions' settings.
    pub fn proxy(&self, http_port: u16) -> dhcp::ProxyConfig {
        dhcp::ProxyConfig {
            server_ip: self.server_ip,
            http_port: self.http_port.unwrap_or(http_port),
            bios_file: self.bios_file.clone(),
            uefi_x64_file: self.uefi_x64_file.clone(),
            uefi_arm64_file: self.uefi_arm64_file.clone(),
            client_port: self.dhcp.client_port,
        }
    }
}

/// Why the boot service cannot start or serve.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Bus(#[from] bcm_bus::BusError),
    #[error("key-value bucket: {0}")]
    Kv(String),
    #[error("image cache: {0}")]
    Image(String),
    #[error("tftp: {0}")]
    Tftp(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A running boot service: what tests and benchmarks look at.
pub struct Running {
    pub lease: Arc<lease::Lease>,
    pub entries: Arc<entries::Entries>,
    pub nonces: Arc<nonces::Nonces>,
    pub dhcp: SocketAddr,
    pub pxe: SocketAddr,
    pub tftp: SocketAddr,
    pub http: SocketAddr,
    /// The forward proxy, when configured.
    pub proxy: Option<SocketAddr>,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts every part of the service; each runs until `shutdown`.
pub async fn start(cfg: &BootConfig, shutdown: CancellationToken) -> Result<Running, BootError> {
    let site: bcm_core::SiteId = cfg
        .site
        .parse()
        .map_err(|e| BootError::Config(format!("site {:?}: {e}", cfg.site)))?;
    // A site service's identity may not create streams: the control
    // plane does, and the consumer waits for them.
    let bus = bcm_bus::Bus::attach(&cfg.bus).await?;
    let ttl = Duration::from_secs(cfg.lease_ttl_secs.max(2));
    let (entries_kv, lease_kv) = commands::buckets(&bus, &site, ttl).await?;

    images::prewarm(&cfg.image_cache, &cfg.images, cfg.upstream_proxy.as_deref()).await?;
    let join_key = cfg
        .join_key
        .resolve()
        .map_err(|e| BootError::Config(e.to_string()))?;
    if join_key.is_none() {
        tracing::warn!(site = %site, "no join key is configured (join_key.file): boot entries that carry a join token are refused");
    }

    let quorum_anchor = match &cfg.quorum_anchor_file {
        Some(path) => {
            let anchor =
                bcm_quorum::anchor_from_file(path).map_err(|e| BootError::Config(e.to_string()))?;
            Some(bcm_quorum::anchor_cmdline_value(&anchor))
        }
        None => {
            tracing::warn!(site = %site, "no quorum trust anchor (quorum_anchor_file): ramdisks it boots refuse every destructive command unless their build pins one");
            None
        }
    };
    let entries = Arc::new(entries::Entries::default());
    let nonces = Arc::new(nonces::Nonces::new(Duration::from_secs(
        cfg.script_link_ttl_secs.max(1),
    )));
    let holder = cfg.holder.clone().unwrap_or_else(|| {
        format!(
            "{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "boot".into()),
            std::process::id()
        )
    });
    let lease = Arc::new(lease::Lease::new(holder, ttl));
    let mut tasks = vec![];

    // HTTP first: the proxy's URLs name its port.
    let http_listener = tokio::net::TcpListener::bind(cfg.http_listen).await?;
    let http_addr = http_listener.local_addr()?;
    let proxy = cfg.proxy(http_addr.port());
    let app = http::router(http::HttpState {
        entries: entries.clone(),
        nonces: nonces.clone(),
        join_key: join_key.clone(),
        quorum_anchor,
        lease: lease.clone(),
        proxy: proxy.clone(),
        boot_files: tftp::RootHandler::new(&cfg.boot_files)?,
        image_cache: cfg.image_cache.clone(),
    });
    let stop = shutdown.clone();
    tasks.push(tokio::spawn(async move {
        let served = axum::serve(http_listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "boot HTTP server failed");
        }
    }));

    let files = tftp::RootHandler::new(&cfg.boot_files)?;
    for f in [&cfg.bios_file, &cfg.uefi_x64_file, &cfg.uefi_arm64_file] {
        if let Err(e) = files.read(std::path::Path::new(f)) {
            tracing::warn!(file = %f, root = %cfg.boot_files.display(), error = ?e, "a boot file cannot be served (missing, or a symlink out of the root: copy it in)");
        }
    }
    let proxy_addr = match &cfg.http_proxy {
        Some(p) => {
            let listener = tokio::net::TcpListener::bind(p.listen).await?;
            let addr = listener.local_addr()?;
            let app = proxy::router(proxy::ProxyState::new(&p.allow));
            let stop = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { stop.cancelled().await })
                    .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "HTTP proxy failed");
                }
            }));
            Some(addr)
        }
        None => None,
    };

    // TFTP binds an address (the boot VLAN's), not a device: its transfers
    // run on per-client sockets of that address anyway.
    let tftp_socket = dhcp_server::udp_socket(cfg.tftp_listen, None, false)?;
    let tftp =
        tftp::TftpServer::new(tftp_socket, &cfg.boot_files, &tftp::TftpSettings::default()).await?;
    let tftp_addr = tftp.local_addr()?;
    let stop = shutdown.clone();
    tasks.push(tokio::spawn(async move {
        if let Err(e) = tftp.serve(stop).await {
            tracing::error!(error = %e, "TFTP server failed");
        }
    }));

    let dhcp = dhcp_server::DhcpServer::bind(
        &cfg.dhcp,
        proxy,
        entries.clone(),
        nonces.clone(),
        lease.clone(),
    )?;
    let (dhcp_addr, pxe_addr) = dhcp.local_addrs()?;
    tasks.push(tokio::spawn(dhcp.run(shutdown.clone())));

    tasks.push(tokio::spawn(commands::sync_entries(
        entries_kv.clone(),
        entries.clone(),
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(commands::run(
        bus.clone(),
        site.clone(),
        entries_kv,
        commands::Cache {
            dir: cfg.image_cache.clone(),
            upstream_proxy: cfg.upstream_proxy.clone(),
        },
        join_key.is_some(),
        shutdown.clone(),
    )));
    tasks.push(tokio::spawn(lease::run(lease.clone(), lease_kv, shutdown)));
    tracing::info!(site = %site, dhcp = %dhcp_addr, pxe = %pxe_addr, tftp = %tftp_addr, http = %http_addr, holder = lease.holder(), "boot service running");
    Ok(Running {
        lease,
        entries,
        nonces,
        dhcp: dhcp_addr,
        pxe: pxe_addr,
        tftp: tftp_addr,
        http: http_addr,
        proxy: proxy_addr,
        tasks,
    })
}
