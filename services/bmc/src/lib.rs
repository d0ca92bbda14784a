//! The `bmc` service for one site: executes `bmc.*` commands against real
//! BMCs (Redfish natively; IPMI through the `bcx-ipmi` plugin, which runs
//! `ipmitool`) and replies with results.
//! It is the only place where BMC credentials are opened: they arrive
//! sealed in each command, are opened for that command only, and never
//! appear in a result, a log line or an error.

pub mod driver;
pub mod error;
pub mod ipmi;
pub mod plugin;
pub mod redfish;
pub mod redfish_model;
pub mod redfish_vendor;
pub mod rotation;
pub mod service;
pub mod tls;

use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Configuration of the service.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct BmcConfig {
    /// The site whose `bmc.*` commands this service executes.
    pub site: String,
    pub bus: bcm_bus::BusConfig,
    /// The keys that open the credentials (the API's sealing keys).
    pub sealing_keys: Vec<bcm_seal::KeyConfig>,
    /// Commands executed at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// How long a power change may take to show in the BMC's power state.
    #[serde(default = "default_power_timeout")]
    pub power_timeout_secs: u64,
    /// How long a graceful shutdown (Redfish `GracefulShutdown`, IPMI's
    /// ACPI soft-off) may take before a forced off.
    #[serde(default = "default_graceful_timeout")]
    pub graceful_timeout_secs: u64,
    /// Redfish TLS: a CA bundle (PEM) to verify BMCs against instead of the
    /// system roots.
    #[serde(default)]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Redfish TLS: accept any certificate. Only for labs; off by default.
    #[serde(default)]
    pub tls_insecure: bool,
    /// The ipmitool binary the IPMI plugin runs.
    #[serde(default = "default_ipmitool")]
    pub ipmitool: String,
    /// Drivers hosted as plugins: name to executable (the plugin protocol
    /// of `bcm_contracts::plugin`). `ipmi` hosts the IPMI driver; any other
    /// name `<n>` hosts the driver `plugin:<n>`, which hardware profiles
    /// bind like a built-in one. Without an `ipmi` entry, the
    /// `bcx-ipmi` beside this service's executable hosts IPMI when it is
    /// there; a driver with no plugin answers `unsupported-driver`.
    #[serde(default)]
    pub plugins: std::collections::BTreeMap<String, std::path::PathBuf>,
    /// The site's quorum trust anchor (JSON: the approvers' keys, the
    /// quorum, the control plane's policy key where one-node batches may be
    /// approved by policy). Without one, every destructive command is
    /// refused.
    #[serde(default)]
    pub quorum_anchor_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub telemetry: bcm_telemetry::TelemetryConfig,
}

fn default_concurrency() -> usize {
    64
}
fn default_power_timeout() -> u64 {
    120
}
fn default_graceful_timeout() -> u64 {
    60
}
fn default_ipmitool() -> String {
    "ipmitool".into()
}

impl BmcConfig {
    /// Loads a TOML file, then `BCM_BMC_*` environment variables.
    pub fn load(path: Option<&std::path::Path>) -> Result<Self, Box<figment::Error>> {
        bcm_config::load(path, "BCM_BMC_")
    }

    /// The drivers' settings.
    pub fn drivers(&self) -> Result<driver::DriverSettings, StartError> {
        let ca_pem = match &self.tls_ca_file {
            Some(p) => Some(
                std::fs::read(p)
                    .map_err(|e| StartError::Config(format!("tls_ca_file {}: {e}", p.display())))?,
            ),
            None => None,
        };
        Ok(driver::DriverSettings {
            redfish: redfish::RedfishSettings {
                power_timeout: Duration::from_secs(self.power_timeout_secs),
                graceful_timeout: Duration::from_secs(self.graceful_timeout_secs),
                insecure_tls: self.tls_insecure,
                ca_pem,
                ..Default::default()
            },
            plugins: self.plugins()?,
        })
    }
}

impl BmcConfig {
    /// The plugins this service hosts, each checked to exist.
    fn plugins(
        &self,
    ) -> Result<std::collections::BTreeMap<bcm_core::BmcDriver, plugin::PluginSettings>, StartError>
    {
        let mut named = self.plugins.clone();
        if !named.contains_key("ipmi") {
            if let Some(beside) = std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|d| d.join("bcx-ipmi")))
                .filter(|p| p.is_file())
            {
                named.insert("ipmi".into(), beside);
            }
        }
        let mut out = std::collections::BTreeMap::new();
        for (name, exe) in named {
            let driver = bcm_core::BmcDriver::hosted_as(&name)
                .map_err(|e| StartError::Config(format!("plugins.{name}: {e}")))?;
            if !exe.is_file() {
                return Err(StartError::Config(format!(
                    "plugins.{name}: {} is not a file",
                    exe.display()
                )));
            }
            out.insert(
                driver,
                plugin::PluginSettings {
                    executable: exe,
                    // The plugin's own waits (a soft-off, then a forced
                    // one), and time to answer.
                    timeout: Duration::from_secs(
                        self.graceful_timeout_secs + self.power_timeout_secs + 60,
                    ),
                    env: vec![
                        ("BCX_IPMITOOL".into(), self.ipmitool.clone()),
                        (
                            "BCX_POWER_TIMEOUT_SECS".into(),
                            self.power_timeout_secs.to_string(),
                        ),
                        (
                            "BCX_GRACEFUL_TIMEOUT_SECS".into(),
                            self.graceful_timeout_secs.to_string(),
                        ),
                    ],
                },
            );
        }
        if !out.contains_key(&bcm_core::BmcDriver::Ipmi) {
            tracing::warn!("no ipmi plugin (plugins.ipmi, or bcx-ipmi beside this executable): IPMI nodes will be answered unsupported-driver");
        }
        Ok(out)
    }
}

/// Why the service cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Bus(#[from] bcm_bus::BusError),
    #[error(transparent)]
    Seal(#[from] bcm_seal::SealError),
}

/// Runs the service until `shutdown`. Returns its context (with the count
/// of operations executed) and the loop's task.
pub async fn start(
    cfg: &BmcConfig,
    drivers: driver::DriverSettings,
    shutdown: CancellationToken,
) -> Result<(Arc<service::Ctx>, tokio::task::JoinHandle<()>), StartError> {
    // A site service's identity may not create streams: the control
    // plane does, and the consumer waits for them.
    let bus = bcm_bus::Bus::attach(&cfg.bus).await?;
    let sealer = bcm_seal::Sealer::new(&cfg.sealing_keys)?;
    let site: bcm_core::SiteId = cfg
        .site
        .parse()
        .map_err(|e| StartError::Config(format!("site {:?}: {e}", cfg.site)))?;
    let anchor = match &cfg.quorum_anchor_file {
        Some(path) => Some(
            bcm_quorum::anchor_from_file(path).map_err(|e| StartError::Config(e.to_string()))?,
        ),
        None => {
            tracing::warn!("no quorum trust anchor (bmc.quorum_anchor_file): every destructive command will be refused");
            None
        }
    };
    let ctx = Arc::new(
        service::Ctx::new(bus, site, sealer, drivers, cfg.concurrency).with_anchor(anchor),
    );
    let task = tokio::spawn(service::run(ctx.clone(), shutdown));
    Ok((ctx, task))
}
