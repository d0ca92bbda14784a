//! The simulated site services: BMCs and boot, answering the real site
//! commands.

use bcm_bus::consumer::{ConsumerSpec, Disposition, Handler, Incoming};
use bcm_bus::subjects::StreamKind;
use bcm_bus::Bus;
use bcm_contracts::commands::{BootDevice, BootDeviceParams, Command, Family, MediaAction};
use bcm_contracts::outputs::{
    BootEntryCleared, BootEntryStored, BootOverride, DiskEraseReport, DriveErase, MediaReport,
    OobDrive, OobInventory, PowerChanged, PowerRead, RotationReport, RotationStep, Verified,
};
use bcm_contracts::{CloudEvent, CommandEnvelope, CommandKind, CommandResult, Output};
use bcm_core::PowerAction;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::agent::{self, parse_cmdline};
pub use crate::store::Disk;
use crate::store::{Booted, CommandRun, MachineRecord, RamdiskAgent, SiteStore};
use crate::{Fault, Faults, SimConfig, SimError};

/// FNV-1a of a string, for stable simulated serials and MACs.
pub fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The simulated PXE MAC of the machine at `address`: 40 bits of a 64-bit
/// FNV-1a under a locally administered prefix (`0a:`), so a simulated fleet
/// of ten thousand shares no MAC (a MAC is unique within a site; 24 bits
/// gave one pair in thirty a shared MAC at a thousand machines).
pub fn mac_of(address: &str) -> String {
    let h = address
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
        .to_be_bytes();
    format!(
        "0a:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        h[3], h[4], h[5], h[6], h[7]
    )
}

#[derive(Debug, Default)]
struct Machine {
    rec: MachineRecord,
    /// The boot it runs now (cancelled at power-off).
    running: Option<CancellationToken>,
}

/// Every simulated machine, by BMC address, and the simulated boot
/// service's entries, by MAC (as a real boot service keys them); kept in
/// the site's store (when it has one) at every change, so they outlive the
/// site process.
#[derive(Clone, Default)]
pub struct Machines {
    inner: Arc<Mutex<HashMap<String, Machine>>>,
    by_node: Arc<Mutex<HashMap<String, String>>>,
    boot_entries: Arc<Mutex<HashMap<String, String>>>,
    store: SiteStore,
    /// Saves in flight: each holds it shared; closing takes it whole, so
    /// it returns once every save in flight has landed.
    saving: Arc<tokio::sync::RwLock<()>>,
    /// One save at a time per machine (or boot entry), each of the state
    /// as it is then: a slower save never overwrites a newer one. Saves of
    /// different machines run at once.
    saving_key: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// Set when the site process these machines belong to stops: a task
    /// of it still finishing (a join in flight) must not overwrite what the
    /// next site process keeps.
    closed: Arc<std::sync::atomic::AtomicBool>,
}

impl Machines {
    /// Machines kept in the site's buckets on `bus`, as they were left.
    pub async fn durable(bus: &Bus, site: &str) -> Result<Self, SimError> {
        let site: bcm_core::SiteId = site
            .parse()
            .map_err(|e| SimError::Config(format!("site {site:?}: {e}")))?;
        let store = SiteStore::open(bus, &site)
            .await
            .map_err(|e| SimError::Config(format!("the site's store: {e}")))?;
        let (machines, entries) = store
            .load()
            .await
            .map_err(|e| SimError::Config(format!("the site's store: {e}")))?;
        let this = Machines {
            store,
            ..Default::default()
        };
        {
            let mut inner = this.inner.lock().unwrap_or_else(|p| p.into_inner());
            let mut by_node = this.by_node.lock().unwrap_or_else(|p| p.into_inner());
            for (address, rec) in machines {
                if let Some(n) = &rec.node {
                    by_node.insert(n.clone(), address.clone());
                }
                inner.insert(address, Machine { rec, running: None });
            }
        }
        this.boot_entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(entries);
        Ok(this)
    }

    /// Stops keeping anything (the site process stops); returns once a
    /// save in flight has landed.
    pub async fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let _wait = self.saving.write().await;
    }

    /// The lock that orders the saves of `key` (a machine's address, or
    /// `mac:<mac>` for a boot entry).
    fn key_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.saving_key
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_owned())
            .or_default()
            .clone()
    }

    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The site's store.
    pub fn store(&self) -> &SiteStore {
        &self.store
    }

    fn with<T>(&self, address: &str, f: impl FnOnce(&mut Machine) -> T) -> T {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(map.entry(address.to_owned()).or_default())
    }

    /// Keeps the machine at `address` as it is now. A failure is logged:
    /// the machine runs on, and the next change saves it again.
    pub async fn save(&self, address: &str) {
        if !self.store.is_durable() || self.is_closed() {
            return;
        }
        let _open = self.saving.read().await;
        let key = self.key_lock(address);
        let _one = key.lock().await;
        if self.is_closed() {
            return;
        }
        let rec = self.with(address, |m| m.rec.clone());
        let store = self.store.clone();
        let kept = keep_trying(|| store.save_machine(address, &rec)).await;
        if let Err(e) = kept {
            tracing::warn!(%address, error = %e, "sim: the machine's state was not kept");
        }
    }

    /// Records the image a deploy wrote.
    pub fn install(&self, address: &str, join_token: String, api: String) {
        self.with(address, |m| {
            m.rec.disk = Some(Disk {
                join_token,
                api,
                key: None,
                session: None,
                node: None,
            })
        });
    }

    /// The installed disk, if any.
    pub fn disk(&self, address: &str) -> Option<Disk> {
        self.with(address, |m| m.rec.disk.clone())
    }

    /// Keeps the installed OS agent's key (before it joins).
    pub fn set_os_key(&self, address: &str, key: String) {
        self.with(address, |m| {
            if let Some(d) = m.rec.disk.as_mut() {
                d.key = Some(key);
            }
        });
    }

    /// The machine's own OS powered it off (a `node.powerOff`): what the
    /// BMC reads next is off, and what it ran stops.
    pub fn os_powered_off(&self, address: &str) {
        self.with(address, |m| {
            m.rec.power_on = false;
            m.rec.booted = None;
            if let Some(t) = m.running.take() {
                t.cancel();
            }
        });
    }

    /// Keeps the installed OS's session across reboots.
    pub fn set_session(&self, address: &str, session: String, node: String) {
        self.with(address, |m| {
            if let Some(d) = m.rec.disk.as_mut() {
                d.session = Some(session);
                d.node = Some(node);
            }
        });
    }

    /// The ramdisk agent the machine runs now, if it booted one.
    pub fn ramdisk_agent(&self, address: &str) -> Option<RamdiskAgent> {
        self.with(address, |m| match &m.rec.booted {
            Some(Booted::Ramdisk { agent, .. }) => agent.clone(),
            _ => None,
        })
    }

    /// Records the ramdisk agent the machine runs now.
    pub fn set_ramdisk_agent(&self, address: &str, agent: RamdiskAgent) {
        self.with(address, |m| {
            if let Some(Booted::Ramdisk { agent: a, .. }) = m.rec.booted.as_mut() {
                *a = Some(agent);
            }
        });
    }

    /// Whether the machine is powered on.
    pub fn powered(&self, address: &str) -> bool {
        self.with(address, |m| m.rec.power_on)
    }

    /// The machine's power as the real `bmc` service reports it (`power`
    /// of a `bmc.power` or `bmc.powerStatus` result).
    pub fn power(&self, address: &str) -> bcm_core::PowerState {
        if self.powered(address) {
            bcm_core::PowerState::On
        } else {
            bcm_core::PowerState::Off
        }
    }

    /// The machines powered on, with what they booted.
    fn running_boots(&self) -> Vec<(String, Booted)> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, m)| m.rec.power_on)
            .filter_map(|(a, m)| m.rec.booted.clone().map(|b| (a.clone(), b)))
            .collect()
    }

    /// The kernel command line the boot entry of `mac` boots, if any.
    fn boot_entry(&self, mac: &str) -> Option<String> {
        self.boot_entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&mac.to_ascii_lowercase())
            .cloned()
    }

    async fn set_boot_entries(&self, macs: &[String], cmdline: Option<&str>) {
        {
            let mut entries = self.boot_entries.lock().unwrap_or_else(|p| p.into_inner());
            for mac in macs {
                match cmdline {
                    Some(c) => entries.insert(mac.to_ascii_lowercase(), c.to_owned()),
                    None => entries.remove(&mac.to_ascii_lowercase()),
                };
            }
        }
        if self.store.is_durable() && !self.is_closed() {
            let _open = self.saving.read().await;
            for mac in macs {
                let key = self.key_lock(&format!("mac:{}", mac.to_ascii_lowercase()));
                let _one = key.lock().await;
                if self.is_closed() {
                    return;
                }
                // The entry as it is now: a later change saved first is
                // not overwritten by this one.
                let now = self.boot_entry(mac);
                let store = self.store.clone();
                if let Err(e) = keep_trying(|| store.save_entry(mac, now.as_deref())).await {
                    tracing::warn!(%mac, error = %e, "sim: the boot entry was not kept");
                }
            }
        }
    }

    fn address_of(&self, node: &str) -> Option<String> {
        self.by_node
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .cloned()
    }

    fn remember(&self, node: &str, address: &str) {
        self.by_node
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node.to_owned(), address.to_owned());
        self.with(address, |m| m.rec.node = Some(node.to_owned()));
    }
}

/// Retries a write to the site's store for up to ~2 minutes (a NATS
/// restart): the state is kept before the command that changed it is
/// answered.
async fn keep_trying<F, Fut>(mut write: F) -> Result<(), bcm_bus::BusError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), bcm_bus::BusError>>,
{
    let mut attempt = 0;
    loop {
        match write().await {
            Ok(()) => return Ok(()),
            Err(e) if attempt >= 10 => return Err(e),
            Err(_) => {
                attempt += 1;
                tokio::time::sleep(bcm_contracts::agent::retry_backoff(attempt, rand::random()))
                    .await;
            }
        }
    }
}

/// Every execution of a site command id by any simulated site in this
/// process, for tests and the chaos verdicts: a count above one is a
/// command run twice.
/// [`Executions::not_kept`] counts nothing (a site whose executions no
/// one reads, which would otherwise hold an entry per command run).
#[derive(Clone, Debug)]
pub struct Executions {
    inner: Option<Arc<Mutex<HashMap<String, u32>>>>,
}

impl Default for Executions {
    fn default() -> Self {
        Self {
            inner: Some(Arc::default()),
        }
    }
}

impl Executions {
    /// Counts nothing: every count reads 0.
    pub fn not_kept() -> Self {
        Self { inner: None }
    }

    fn record(&self, command_id: &str) {
        if let Some(inner) = &self.inner {
            *inner
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(command_id.to_owned())
                .or_default() += 1;
        }
    }

    /// How often `command_id` was executed.
    pub fn count(&self, command_id: &str) -> u32 {
        self.inner.as_ref().map_or(0, |inner| {
            inner
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(command_id)
                .copied()
                .unwrap_or(0)
        })
    }

    /// The command ids executed more than once.
    pub fn repeated(&self) -> Vec<String> {
        self.inner.as_ref().map_or_else(Vec::new, |inner| {
            inner
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(_, n)| **n > 1)
                .map(|(id, _)| id.clone())
                .collect()
        })
    }
}

struct Site {
    cfg: Arc<SimConfig>,
    faults: Faults,
    machines: Machines,
    executions: Executions,
    http: reqwest::Client,
    /// Results by command id, for a site whose store keeps nothing (a
    /// durable store's run records answer a redelivery instead, and this
    /// would grow with every command run).
    results: Mutex<HashMap<String, CommandResult>>,
    /// Commands seen per (address, kind), for `BmcFlaky`.
    flaky: Mutex<HashMap<(String, CommandKind), u32>>,
    /// Booting power actions carried out per address, for `PowerAnswerLost`.
    boots: Mutex<HashMap<String, u32>>,
    /// The site's join key, when the sim plays the boot service.
    join_key: Option<bcm_pki::JoinKey>,
}

/// The sim's consumer of the command families no real service serves.
struct SiteHandler {
    site: Arc<Site>,
    bus: Bus,
    shutdown: CancellationToken,
}

impl Handler<CloudEvent<CommandEnvelope>> for SiteHandler {
    async fn handle(&self, batch: &[Incoming<CloudEvent<CommandEnvelope>>]) -> Vec<Disposition> {
        let mut out = Vec::with_capacity(batch.len());
        for m in batch {
            let span = bcm_bus::command_span("sim", m);
            let started = std::time::Instant::now();
            let d = self.one(&m.message.data).instrument(span).await;
            bcm_bus::command_handled("sim", m, started.elapsed(), &d);
            out.push(d);
        }
        out
    }
}

impl SiteHandler {
    /// Executes a command at most once — also across a restart of the site:
    /// the run is recorded before it begins — and publishes its result (a
    /// redelivery gets the recorded result again).
    async fn one(&self, cmd: &CommandEnvelope) -> Disposition {
        let site = &self.site;
        // A durable site answers a redelivery from its store; only a site
        // that keeps nothing remembers results here.
        let remember = !site.machines.store().is_durable();
        let known = remember
            .then(|| {
                site.results
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&cmd.command_id)
                    .cloned()
            })
            .flatten();
        let result = match known {
            Some(r) => r,
            None => match self.run_once(cmd).await {
                Ok(r) => {
                    if remember {
                        site.results
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(cmd.command_id.clone(), r.clone());
                    }
                    r
                }
                Err(why) => return Disposition::Retry(why),
            },
        };
        match self.bus.publish_result(cmd, result).await {
            Ok(()) => Disposition::Done,
            Err(e) => Disposition::Retry(format!("publishing the result: {e}")),
        }
    }

    /// The command's result: from the record of an earlier run, or by
    /// running it now (recorded as begun first, and its result after).
    async fn run_once(&self, cmd: &CommandEnvelope) -> Result<CommandResult, String> {
        let site = &self.site;
        let store = site.machines.store();
        let interrupted = || {
            CommandResult::failed(
                cmd,
                true,
                "sim: the site restarted while this command ran; it is not run again",
            )
        };
        match store.run_of(&cmd.command_id).await {
            Ok(Some(CommandRun::Done { result })) => return Ok(*result),
            Ok(Some(CommandRun::Started)) => return Ok(interrupted()),
            Ok(None) => {}
            Err(e) => return Err(format!("reading the run record: {e}")),
        }
        if cmd.expired(chrono::Utc::now()) {
            // The control plane stopped waiting for it: not run.
            tracing::warn!(command = %cmd.command_id, kind = %cmd.kind(), "sim: refused a command past its deadline; not run");
            return Ok(CommandResult::expired(cmd));
        }
        if let Err(e) = bcm_quorum::check_command(
            self.site.cfg.quorum_anchor.as_ref(),
            cmd.kind(),
            Some(&cmd.command),
            cmd.node_id.map(|n| n.to_string()).as_deref(),
            cmd.authority.as_ref(),
            chrono::Utc::now().timestamp(),
        ) {
            tracing::warn!(command = %cmd.command_id, kind = %cmd.kind(), error = %e, "sim: refused a destructive command without a valid batch authority; not run");
            return Ok(CommandResult::failed(cmd, false, e.refusal()));
        }
        match store.begin_run(&cmd.command_id).await {
            Ok(true) => {}
            Ok(false) => return Ok(interrupted()),
            Err(e) => return Err(format!("recording the run: {e}")),
        }
        if site.cfg.latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(site.cfg.latency_ms)).await;
        }
        if let Err(e) = store.note_execution(&cmd.command_id).await {
            return Err(format!("noting the execution: {e}"));
        }
        site.executions.record(&cmd.command_id);
        let r = execute(site, cmd, &self.shutdown).await;
        if let Err(e) = store.finish_run(&cmd.command_id, &r).await {
            // A redelivery finds the run begun and does not run it again.
            return Err(format!("recording the result: {e}"));
        }
        Ok(r)
    }
}

/// Runs the simulated site until `shutdown`.
pub async fn run(
    bus: Bus,
    cfg: SimConfig,
    machines: Machines,
    faults: Faults,
    executions: Executions,
    shutdown: CancellationToken,
) -> Result<(), SimError> {
    let mut cfg = cfg;
    if cfg.quorum_anchor.is_none() {
        if let Some(path) = &cfg.quorum_anchor_file {
            cfg.quorum_anchor = Some(
                bcm_quorum::anchor_from_file(path).map_err(|e| SimError::Config(e.to_string()))?,
            );
        }
    }
    if cfg.quorum_anchor.is_none() {
        tracing::warn!("sim: no quorum trust anchor (sim.quorum_anchor_file): every destructive command will be refused");
    }
    let site_id: bcm_core::SiteId = cfg
        .site
        .parse()
        .map_err(|e| SimError::Config(format!("site {:?}: {e}", cfg.site)))?;
    // The sim consumes every family a real service does not.
    let families: Vec<&str> = [
        (!cfg.bmc_service).then_some("bmc"),
        (!cfg.boot_service).then_some("site"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if families.is_empty() {
        // Real bmc and boot services take every command: the sim only
        // plays the machines.
        shutdown.cancelled().await;
        return Ok(());
    }
    let subjects = bus.subjects();
    // The consumer's name and filter are those the site's bus identity
    // may use (`bcm_bus::auth`): one filter, named in the create subject.
    let (name, filter) = bcm_bus::auth::sim_consumer(subjects, &site_id, &families);
    let filters = vec![filter];
    let mut spec = ConsumerSpec::new(StreamKind::Commands, name, filters);
    spec.max_deliver = 20;
    spec.concurrency = cfg.concurrency.max(1);
    let kept = machines.clone();
    let join_key = cfg
        .join_key
        .resolve()
        .map_err(|e| SimError::Config(e.to_string()))?;
    let http = match &cfg.api_ca_file {
        None => reqwest::Client::new(),
        Some(path) => bcm_pki::tls::client_pinned_to_file(path)
            .map_err(|e| SimError::Config(format!("api_ca_file: {e}")))?,
    };
    let site = Arc::new(Site {
        join_key,
        cfg: Arc::new(cfg),
        faults,
        machines,
        executions,
        http,
        results: Mutex::new(HashMap::new()),
        flaky: Mutex::new(HashMap::new()),
        boots: Mutex::new(HashMap::new()),
    });
    resume_boots(&site, &shutdown);
    let handler = Arc::new(SiteHandler {
        site,
        bus: bus.clone(),
        shutdown: shutdown.clone(),
    });
    bcm_bus::consumer::run(bus, spec, handler, shutdown).await;
    kept.close().await;
    Ok(())
}

/// After a restart of the site process, the machines that were powered on
/// are still running what they booted: their agents carry on (with the key
/// and session they had).
fn resume_boots(site: &Arc<Site>, shutdown: &CancellationToken) {
    let boots = site.machines.running_boots();
    if !boots.is_empty() {
        tracing::info!(
            machines = boots.len(),
            "sim: machines still running from before the restart carry on"
        );
    }
    for (address, booted) in boots {
        let stop = shutdown.child_token();
        site.machines
            .with(&address, |m| m.running = Some(stop.clone()));
        start_boot(site, &address, booted, stop);
    }
}

fn err(cmd: &CommandEnvelope, retryable: bool, e: &str) -> CommandResult {
    CommandResult::failed(cmd, retryable, e)
}

/// What the BMC's boot override reads back as, Redfish-style.
fn boot_override(p: &BootDeviceParams) -> BootOverride {
    let enabled = if p.persistent { "Continuous" } else { "Once" };
    BootOverride {
        device: p.device,
        persistent: p.persistent,
        target: match p.device {
            BootDevice::Pxe => "Pxe",
            BootDevice::Disk => "Hdd",
            BootDevice::UefiHttp => "UefiHttp",
            BootDevice::Cd => "Cd",
        }
        .to_owned(),
        enabled_requested: enabled.to_owned(),
        enabled_read_back: Some(enabled.to_owned()),
        mode_read_back: None,
        sim: true,
    }
}

/// Executes a command and keeps the state it changed.
async fn execute(
    site: &Arc<Site>,
    cmd: &CommandEnvelope,
    shutdown: &CancellationToken,
) -> CommandResult {
    // The boot service keys its entries by MAC: it needs no machine.
    match &cmd.command {
        Command::BootEntrySet(p)
            if site.join_key.is_none()
                && bcm_pki::join_key::has_reference(&p.boot_entry.cmdline) =>
        {
            return CommandResult::failed(
                cmd,
                false,
                "INVALID_CONFIG: the boot entry carries a join reference and the simulated site holds no join key (sim.join_key.file)",
            );
        }
        Command::BootEntrySet(p) => {
            site.machines
                .set_boot_entries(&p.boot_entry.macs, Some(&p.boot_entry.cmdline))
                .await;
            return CommandResult::succeeded(
                cmd,
                Output::BootEntrySet(BootEntryStored {
                    macs: p.boot_entry.macs.clone(),
                    expires_at: now_secs() + p.boot_entry.expires_in_secs,
                    sim: true,
                }),
            );
        }
        Command::BootEntryClear(p) => {
            site.machines.set_boot_entries(&p.macs, None).await;
            return CommandResult::succeeded(
                cmd,
                Output::BootEntryClear(BootEntryCleared {
                    cleared: p.macs.clone(),
                    sim: true,
                }),
            );
        }
        Command::SiteHttpProxy(_) => {
            return err(
                cmd,
                false,
                "unsupported: the simulated site keeps no image cache (bcm-boot runs site.httpProxy)",
            );
        }
        _ => {}
    }
    // The simulated site hosts the simulated BMC driver only: a node whose
    // hardware profile binds another here cannot be served.
    if let Some(bmc) = cmd.command.bmc() {
        if bmc.driver != bcm_core::BmcDriver::Sim {
            return err(
                cmd,
                false,
                &format!(
                    "unsupported-driver: {} (this simulated site hosts the sim BMC driver only)",
                    bmc.driver
                ),
            );
        }
    }
    let node = cmd.node_id.map(|n| n.to_string()).unwrap_or_default();
    let address = cmd
        .command
        .bmc()
        .map(|b| b.address.clone())
        .or_else(|| site.machines.address_of(&node));
    let Some(address) = address else {
        return err(cmd, false, "sim: no machine is known for this node");
    };
    site.machines.remember(&node, &address);
    let result = execute_on_machine(site, cmd, &address, shutdown);
    site.machines.save(&address).await;
    result
}

/// Executes a BMC command on the machine at `address`.
fn execute_on_machine(
    site: &Arc<Site>,
    cmd: &CommandEnvelope,
    address: &str,
    shutdown: &CancellationToken,
) -> CommandResult {
    let address = address.to_owned();
    let uses_bmc = cmd.kind().family() == Family::Bmc;
    if uses_bmc && site.faults.has(&address, Fault::BmcRejects) {
        return err(
            cmd,
            false,
            "sim BMC: 401 Unauthorized (Base.1.0.InsufficientPrivilege)",
        );
    }
    if uses_bmc && site.faults.has(&address, Fault::BmcFlaky) {
        let mut seen = site.flaky.lock().unwrap_or_else(|p| p.into_inner());
        let n = seen.entry((address.clone(), cmd.kind())).or_default();
        *n += 1;
        if *n % 2 == 1 {
            return err(
                cmd,
                true,
                "sim BMC: 503 Service Unavailable (Base.1.0.ServiceTemporarilyUnavailable)",
            );
        }
    }
    let m = &site.machines;
    let output = match &cmd.command {
        Command::BmcPowerStatus(_) => Output::BmcPowerStatus(PowerRead {
            power: m.power(&address),
            sim: true,
        }),
        Command::BmcVerify(_) => Output::BmcVerify(Verified {
            protocol_version: Some("1.17.0".to_owned()),
            system_id: "sim".to_owned(),
            power: m.power(&address),
            sim: true,
        }),
        Command::BmcInspect(_) => {
            let pad = if site.faults.has(&address, Fault::BmcPadsWithNul) {
                "\0\0\0"
            } else {
                ""
            };
            Output::BmcInspect(OobInventory {
                manufacturer: Some(format!("Better Compute Sim{pad}")),
                model: Some("sim-1".to_owned()),
                serial: Some(format!("SIM{:08X}{pad}", fnv(&address))),
                cpus: Some(16),
                memory_gib: Some(64.0),
                macs: vec![mac_of(&address)],
                drives: vec![sim_drive(&address)],
                bios_version: Some(
                    if site.faults.has(&address, Fault::FirmwareChanged) {
                        "SIM-BIOS-1.1"
                    } else {
                        "SIM-BIOS-1.0"
                    }
                    .to_owned(),
                ),
                bmc_firmware: Some("sim-bmc-2.0".to_owned()),
                sim: true,
                ..Default::default()
            })
        }
        Command::BmcBootDevice(p) => {
            let pxe = p.device == BootDevice::Pxe;
            let cd = p.device == BootDevice::Cd;
            m.with(&address, |mm| {
                mm.rec.pxe = pxe;
                mm.rec.pxe_persistent = pxe && p.persistent;
                mm.rec.cd = cd;
                mm.rec.cd_persistent = cd && p.persistent;
            });
            Output::BmcBootDevice(boot_override(p))
        }
        Command::BmcVirtualMedia(p) => {
            let image = match p.action {
                MediaAction::Insert => match &p.image {
                    Some(url) => Some(url.clone()),
                    None => return err(cmd, false, "sim BMC: an insert names no image"),
                },
                MediaAction::Eject => None,
            };
            m.with(&address, |mm| mm.rec.media = image.clone());
            Output::BmcVirtualMedia(MediaReport {
                slot: "sim/VirtualMedia/Cd".to_owned(),
                inserted: image.is_some(),
                image,
                sim: true,
            })
        }
        Command::BmcRotateCredentials(p) => {
            // The simulated BMC has no accounts and takes any password: the
            // pending credentials (sealed for the node; the sim cannot open
            // them) come back as the new ones, as a real bmc service's
            // committed rotation returns them.
            Output::BmcRotateCredentials(RotationReport {
                outcome: RotationStep::Committed,
                recovered: false,
                sealed_credentials: Some(p.pending_credentials.clone()),
            })
        }
        Command::BmcDiskErase(_) => {
            if site.faults.has(&address, Fault::BmcNoErase) {
                Output::BmcDiskErase(DiskEraseReport {
                    offered: false,
                    drives: vec![],
                    reason: Some("sim BMC: no drive offers #Drive.SecureErase (fault)".into()),
                    sim: true,
                })
            } else {
                m.with(&address, |mm| {
                    mm.rec.disk = None;
                    mm.rec.installed = None;
                });
                let drive = sim_drive(&address);
                Output::BmcDiskErase(DiskEraseReport {
                    offered: true,
                    drives: vec![DriveErase {
                        id: drive.id,
                        serial: drive.serial,
                        erased: true,
                        reason: None,
                    }],
                    reason: None,
                    sim: true,
                })
            }
        }
        Command::BmcPower(p) => {
            match p.action {
                PowerAction::Off => power_off(site, &address),
                PowerAction::On | PowerAction::Cycle | PowerAction::Reset => {
                    power_on(site, &address, shutdown);
                    if site.faults.has(&address, Fault::PowerAnswerLost) {
                        let mut boots = site.boots.lock().unwrap_or_else(|p| p.into_inner());
                        let n = boots.entry(address.clone()).or_default();
                        *n += 1;
                        if *n == 1 {
                            return err(
                                cmd,
                                true,
                                "sim BMC: the power action was carried out, but its answer was lost (fault)",
                            );
                        }
                    }
                }
            }
            Output::BmcPower(PowerChanged {
                action: p.action,
                power: m.power(&address),
                sim: true,
            })
        }
        other => {
            return err(
                cmd,
                false,
                &format!("sim: unsupported command kind {}", other.kind()),
            )
        }
    };
    CommandResult::succeeded(cmd, output)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn power_off(site: &Arc<Site>, address: &str) {
    site.machines.with(address, |m| {
        m.rec.power_on = false;
        m.rec.booted = None;
        if let Some(t) = m.running.take() {
            t.cancel();
        }
    });
}

/// How long a simulated agentless installer runs before it powers off.
const INSTALLER_MILLIS: u64 = 300;

/// The one drive a simulated machine's BMC reports.
fn sim_drive(address: &str) -> OobDrive {
    OobDrive {
        id: "Disk.Bay.0".to_owned(),
        capacity_bytes: Some(480_000_000_000),
        media_type: Some("SSD".to_owned()),
        protocol: Some("NVMe".to_owned()),
        serial: Some(format!("SIMD{:08X}", fnv(address))),
    }
}

/// Powers a machine on (or resets it) and boots what its boot device says.
fn power_on(site: &Arc<Site>, address: &str, shutdown: &CancellationToken) {
    let stop = shutdown.child_token();
    let boot = site.machines.with(address, |m| {
        if let Some(t) = m.running.take() {
            t.cancel();
        }
        m.rec.power_on = true;
        m.running = Some(stop.clone());
        let pxe = m.rec.pxe;
        if pxe && !m.rec.pxe_persistent {
            m.rec.pxe = false; // a one-time PXE boot falls back to disk next time
        }
        let cd = m.rec.cd && m.rec.media.is_some();
        if m.rec.cd && !m.rec.cd_persistent {
            m.rec.cd = false;
        }
        let boot = if cd {
            m.rec.media.clone().map(|image| Booted::Installer { image })
        } else if !pxe {
            if m.rec.disk.is_some() {
                Some(Booted::Os)
            } else {
                m.rec.installed.is_some().then_some(Booted::AgentlessOs)
            }
        } else {
            // With a real boot service every PXE boot asks it, as a real
            // machine's firmware does.
            let cmdline = if site.cfg.boot_service {
                None
            } else {
                // Revealed at boot, as a boot service's script does.
                site.machines
                    .boot_entry(&mac_of(address))
                    .map(|c| match &site.join_key {
                        Some(k) => k.reveal(&c),
                        None => c,
                    })
            };
            match cmdline.as_deref().and_then(parse_cmdline) {
                Some(params) => Some(Booted::Ramdisk {
                    params,
                    agent: None,
                }),
                None => site
                    .cfg
                    .boot_dhcp
                    .map(|dhcp| Booted::AskBootService { dhcp }),
            }
        };
        m.rec.booted = boot.clone();
        boot
    });
    if let Some(boot) = boot {
        start_boot(site, address, boot, stop);
    }
}

/// Runs what a machine booted until `stop` (its power-off).
fn start_boot(site: &Arc<Site>, address: &str, boot: Booted, stop: CancellationToken) {
    let (http, cfg, faults, machines, address) = (
        site.http.clone(),
        site.cfg.clone(),
        site.faults.clone(),
        site.machines.clone(),
        address.to_owned(),
    );
    match boot {
        Booted::Ramdisk { params, .. } => {
            tokio::spawn(agent::ramdisk(
                http, cfg, faults, machines, address, params, stop,
            ));
        }
        Booted::AskBootService { dhcp } => {
            tokio::spawn(async move {
                // As iPXE does: DHCP for our script's link, then the script.
                let mac = mac_of(&address);
                let url = match crate::pxe::script_link(dhcp, &mac).await {
                    Ok(url) => url,
                    Err(e) => {
                        tracing::warn!(%dhcp, %mac, error = %e, "sim machine: no proxy DHCP answer; nothing boots");
                        return;
                    }
                };
                let script = match http.get(&url).send().await {
                    Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
                    Ok(r) => {
                        tracing::warn!(status = %r.status(), "sim machine: the boot service refused its script link; nothing boots");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "sim machine: the boot service did not answer; nothing boots");
                        return;
                    }
                };
                let params = script
                    .lines()
                    .find(|l| l.starts_with("kernel "))
                    .and_then(parse_cmdline);
                match params {
                    Some(params) => {
                        machines.with(&address, |m| {
                            m.rec.booted = Some(Booted::Ramdisk {
                                params: params.clone(),
                                agent: None,
                            })
                        });
                        machines.save(&address).await;
                        agent::ramdisk(http, cfg, faults, machines, address, params, stop).await
                    }
                    None => {
                        tracing::info!(%mac, "sim machine: the boot service's script boots no kernel; nothing boots")
                    }
                }
            });
        }
        Booted::Os => {
            tokio::spawn(agent::os(http, cfg, faults, machines, address, stop));
        }
        Booted::Installer { image } => {
            // The installer writes its image and powers the machine off:
            // its hand-off, which the deploy's `wait-installer` sees.
            tokio::spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_millis(INSTALLER_MILLIS + cfg.latency_ms)) => {}
                }
                machines.with(&address, |m| {
                    m.rec.installed = Some(image.clone());
                    m.rec.power_on = false;
                    m.rec.booted = None;
                    m.running = None;
                });
                machines.save(&address).await;
                tracing::info!(%address, %image, "sim machine: the installer wrote its image and powered off");
            });
        }
        Booted::AgentlessOs => {
            tracing::info!(%address, "sim machine: booted what an agentless installer wrote (no agent runs)");
        }
    }
}
