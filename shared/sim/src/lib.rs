//! The simulated site. Nothing here touches hardware: it is named `sim` and
//! says so in every answer (`"sim": true`). It consumes the real site
//! commands (`cmd.<siteId>.*`) from JetStream and answers on
//! `result.<siteId>.<commandId>` exactly as the `bmc` and `boot` services
//! will, deduping by command id; a machine it "boots" into the ramdisk runs
//! a simulated agent that joins through the real agent endpoints with the
//! one-time token from its kernel command line, long-polls for commands and
//! posts results signed with a per-node ed25519 key, so attestation is
//! exercised, not skipped.
//!
//! Faults per BMC address make failure paths testable: a BMC that refuses,
//! a ramdisk that never joins, a wipe that fails read-back, an unsigned
//! wipe result, an OS that never comes back.

pub mod agent;
pub mod pxe;
pub mod site;
pub mod store;

use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

/// Why the simulated site cannot run or an agent of it gave up.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("sim configuration: {0}")]
    Config(String),
    #[error("join refused: {0}")]
    JoinRefused(String),
    #[error("the control plane did not answer: {0}")]
    Unreachable(String),
}

/// A fault a simulated machine shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// The BMC refuses every command (bad credentials).
    BmcRejects,
    /// The ramdisk boots but its agent never joins.
    RamdiskNeverJoins,
    /// A disk fails read-back verification after a wipe.
    WipeFailsReadBack,
    /// The disk was swapped since the inventory was taken: the wipe reports
    /// (and verifies) a disk of the same name with another serial, and the
    /// recorded disk does not report at all.
    DiskSwapped,
    /// The agent posts wipe results without a signature.
    UnsignedWipe,
    /// The installed OS never joins.
    OsNeverJoins,
    /// The installed OS heartbeats but takes no command (a `bcd` that
    /// predates them): booted with this fault, it never polls.
    OsTakesNoCommands,
    /// The BMC answers every other command of each kind with a retryable
    /// 503 (the first try fails, its retry succeeds).
    BmcFlaky,
    /// The BMC pads the strings of its inventory with NUL characters, as
    /// some firmware does.
    BmcPadsWithNul,
    /// The ramdisk agent joins, takes the commands of its first poll and
    /// then hangs: no poll, no heartbeat, no result, ever.
    RamdiskFallsSilent,
    /// The ramdisk agent joins and stays alive (it polls on and on) but
    /// never answers a command it is given, like a tool that hangs: only
    /// the step's time-out ends the wait.
    RamdiskIgnoresCommands,
    /// The BMC carries out the machine's first power action that boots it,
    /// but the answer is lost (a retryable failure): the machine booted,
    /// and the retry must not assume it did not.
    PowerAnswerLost,
    /// The BMC offers no drive erase (no `#Drive.SecureErase`): an
    /// agentless machine's release cannot be attested.
    BmcNoErase,
    /// The system firmware reports another version than the one recorded
    /// at commissioning (a tenant flashed it): a dedicated teardown fails.
    FirmwareChanged,
}

/// Settings of the simulated site.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// The site the simulated services serve.
    pub site: String,
    /// Added to every BMC and agent answer, in milliseconds.
    #[serde(default)]
    pub latency_ms: u64,
    /// Faults by BMC address (e.g. `sim://node-3`).
    #[serde(default)]
    pub faults: HashMap<String, Vec<Fault>>,
    /// Commands handled at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// A real `bmc` service serves the site's `bmc.*` commands: the sim
    /// then emulates boot and ramdisks only.
    #[serde(default)]
    pub bmc_service: bool,
    /// A real `boot` service serves the site's `site.*` commands (boot
    /// entries): the sim then leaves them alone.
    #[serde(default)]
    pub boot_service: bool,
    /// The real boot service's proxy DHCP (PXE) address, `host:4011` (with
    /// `boot_service`): simulated machines PXE-boot as iPXE does, asking
    /// there over DHCP for their script's one-time link, fetching the
    /// script and booting the kernel command line it names.
    #[serde(default)]
    pub boot_dhcp: Option<std::net::SocketAddr>,
    /// Boot a real agent as the ramdisk: the program and arguments, to
    /// which `--cmdline "<kernel command line>"` is appended (e.g. `bcd
    /// ramdisk --disk /dev/loop3`). The process lives while the simulated
    /// machine stays powered on in that boot. Without it the simulated
    /// ramdisk agent runs in-process.
    #[serde(default)]
    pub ramdisk_command: Option<Vec<String>>,
    /// The site's join key (`join-<site>.key` from `bcm nats-auth`): when
    /// the sim plays the boot service, it reveals the boot entries' join
    /// references as a boot service does, at boot.
    #[serde(default)]
    pub join_key: bcm_pki::JoinKeyConfig,
    /// The simulated site's own bus identity (an nkey seed file from `bcm
    /// nats-auth`): it then connects as the site would, with the site's
    /// permissions, not the control plane's.
    #[serde(default)]
    pub nkey_file: Option<std::path::PathBuf>,
    /// The CA the simulated agents pin when the control plane's URL is
    /// HTTPS (a real ramdisk carries it in its build): they trust it alone.
    #[serde(default)]
    pub api_ca_file: Option<std::path::PathBuf>,
    /// The site's quorum trust anchor (as `bmc.quorum_anchor_file`): the
    /// simulated BMCs and ramdisk agents run a destructive command only
    /// with an approved batch's authority they verify themselves, as the
    /// real services and `bcd` do. Without one they refuse every
    /// destructive command.
    #[serde(default)]
    pub quorum_anchor_file: Option<std::path::PathBuf>,
    /// An anchor handed over in process (tests).
    #[serde(skip)]
    pub quorum_anchor: Option<bcm_quorum::Anchor>,
}

fn default_concurrency() -> usize {
    64
}

impl SimConfig {
    /// A site with no latency and no faults.
    pub fn new(site: &str) -> Self {
        Self {
            site: site.to_owned(),
            latency_ms: 0,
            faults: HashMap::new(),
            concurrency: default_concurrency(),
            bmc_service: false,
            boot_service: false,
            ramdisk_command: None,
            boot_dhcp: None,
            nkey_file: None,
            join_key: Default::default(),
            api_ca_file: None,
            quorum_anchor_file: None,
            quorum_anchor: None,
        }
    }
}

/// The faults machines show now; tests change them while the site runs.
#[derive(Clone, Default, Debug)]
pub struct Faults {
    inner: Arc<RwLock<HashMap<String, HashSet<Fault>>>>,
}

impl Faults {
    /// The faults of a configuration.
    pub fn from_config(cfg: &SimConfig) -> Self {
        let f = Faults::default();
        for (address, faults) in &cfg.faults {
            for fault in faults {
                f.set(address, *fault);
            }
        }
        f
    }

    /// Makes the machine at `address` show `fault`.
    pub fn set(&self, address: &str, fault: Fault) {
        self.inner
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(address.to_owned())
            .or_default()
            .insert(fault);
    }

    /// Heals the machine at `address` of `fault`.
    pub fn clear(&self, address: &str, fault: Fault) {
        if let Some(f) = self
            .inner
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(address)
        {
            f.remove(&fault);
        }
    }

    /// Whether the machine at `address` shows `fault`.
    pub fn has(&self, address: &str, fault: Fault) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(address)
            .is_some_and(|f| f.contains(&fault))
    }
}
