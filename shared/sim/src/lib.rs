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
pub mod site;

use serde::Deserialize;
use std::collections::HashMap;

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
    /// The agent posts wipe results without a signature.
    UnsignedWipe,
    /// The installed OS never joins.
    OsNeverJoins,
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
        }
    }

    /// Whether the machine at `address` shows `fault`.
    pub fn has(&self, address: &str, fault: Fault) -> bool {
        self.faults.get(address).is_some_and(|f| f.contains(&fault))
    }
}
