//! The simulated site services: BMCs and boot, answering the real site
//! commands.

use bcm_bus::consumer::{ConsumerSpec, Disposition, Handler, Incoming};
use bcm_bus::subjects::StreamKind;
use bcm_bus::Bus;
use bcm_contracts::commands::{BootDevice, BootDeviceParams, Command, Family};
use bcm_contracts::outputs::{
    BootEntryCleared, BootEntryStored, BootOverride, OobInventory, PowerChanged, PowerRead,
    Verified,
};
use bcm_contracts::{CloudEvent, CommandEnvelope, CommandKind, CommandResult, Output};
use bcm_core::PowerAction;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::agent::{self, parse_cmdline};
use crate::{Fault, Faults, SimConfig, SimError};

/// FNV-1a of a string, for stable simulated serials and MACs.
pub fn fnv(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The simulated PXE MAC of the machine at `address`.
pub fn mac_of(address: &str) -> String {
    let h = fnv(address).to_be_bytes();
    format!("52:54:00:{:02x}:{:02x}:{:02x}", h[1], h[2], h[3])
}

/// What is installed on a simulated disk.
#[derive(Debug, Clone)]
pub struct Disk {
    pub join_token: String,
    pub api: String,
    pub session: Option<String>,
}

#[derive(Debug, Default)]
struct Machine {
    power_on: bool,
    pxe: bool,
    pxe_persistent: bool,
    disk: Option<Disk>,
    running: Option<CancellationToken>,
}

/// Every simulated machine, by BMC address, and the simulated boot
/// service's entries, by MAC (as a real boot service keys them).
#[derive(Clone, Default)]
pub struct Machines {
    inner: Arc<Mutex<HashMap<String, Machine>>>,
    by_node: Arc<Mutex<HashMap<String, String>>>,
    boot_entries: Arc<Mutex<HashMap<String, String>>>,
}

impl Machines {
    fn with<T>(&self, address: &str, f: impl FnOnce(&mut Machine) -> T) -> T {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(map.entry(address.to_owned()).or_default())
    }

    /// Records the image a deploy wrote.
    pub fn install(&self, address: &str, join_token: String, api: String) {
        self.with(address, |m| {
            m.disk = Some(Disk {
                join_token,
                api,
                session: None,
            })
        });
    }

    /// The installed disk, if any.
    pub fn disk(&self, address: &str) -> Option<Disk> {
        self.with(address, |m| m.disk.clone())
    }

    /// Keeps the installed OS's session across reboots.
    pub fn set_session(&self, address: &str, session: String) {
        self.with(address, |m| {
            if let Some(d) = m.disk.as_mut() {
                d.session = Some(session);
            }
        });
    }

    /// Whether the machine is powered on.
    pub fn powered(&self, address: &str) -> bool {
        self.with(address, |m| m.power_on)
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

    /// The kernel command line the boot entry of `mac` boots, if any.
    fn boot_entry(&self, mac: &str) -> Option<String> {
        self.boot_entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&mac.to_ascii_lowercase())
            .cloned()
    }

    fn set_boot_entries(&self, macs: &[String], cmdline: Option<&str>) {
        let mut entries = self.boot_entries.lock().unwrap_or_else(|p| p.into_inner());
        for mac in macs {
            match cmdline {
                Some(c) => entries.insert(mac.to_ascii_lowercase(), c.to_owned()),
                None => entries.remove(&mac.to_ascii_lowercase()),
            };
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
    }
}

struct Site {
    cfg: Arc<SimConfig>,
    faults: Faults,
    machines: Machines,
    http: reqwest::Client,
    results: Mutex<HashMap<String, CommandResult>>,
    /// Commands seen per (address, kind), for `BmcFlaky`.
    flaky: Mutex<HashMap<(String, CommandKind), u32>>,
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
            out.push(self.one(&m.message.data).await);
        }
        out
    }
}

impl SiteHandler {
    /// Executes a command once (a redelivery gets the recorded result
    /// again) and publishes its result.
    async fn one(&self, cmd: &CommandEnvelope) -> Disposition {
        let site = &self.site;
        let known = site
            .results
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&cmd.command_id)
            .cloned();
        let result = match known {
            Some(r) => r,
            None => {
                if site.cfg.latency_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(site.cfg.latency_ms)).await;
                }
                let r = execute(site, cmd, &self.shutdown);
                site.results
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(cmd.command_id.clone(), r.clone());
                r
            }
        };
        match self.bus.publish_result(cmd, result).await {
            Ok(()) => Disposition::Done,
            Err(e) => Disposition::Retry(format!("publishing the result: {e}")),
        }
    }
}

/// Runs the simulated site until `shutdown`.
pub async fn run(
    bus: Bus,
    cfg: SimConfig,
    machines: Machines,
    faults: Faults,
    shutdown: CancellationToken,
) -> Result<(), SimError> {
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
    let (name, filters) = if families.len() == 2 {
        (
            format!("site-{site_id}"),
            vec![subjects.commands_of_site(&site_id)],
        )
    } else {
        (
            // The names these modes always had (they once also took the
            // `metal` family): a durable consumer in the stream keeps its
            // name, and a second one with an overlapping filter is refused.
            if families == ["site"] {
                format!("site-{site_id}-no-bmc")
            } else {
                format!("site-{site_id}-{}-metal", families.join("-"))
            },
            families
                .iter()
                .map(|f| subjects.commands_of_site_family(&site_id, f))
                .collect(),
        )
    };
    let mut spec = ConsumerSpec::new(StreamKind::Commands, name, filters);
    spec.max_deliver = 20;
    spec.concurrency = cfg.concurrency.max(1);
    let handler = Arc::new(SiteHandler {
        site: Arc::new(Site {
            cfg: Arc::new(cfg),
            faults,
            machines,
            http: reqwest::Client::new(),
            results: Mutex::new(HashMap::new()),
            flaky: Mutex::new(HashMap::new()),
        }),
        bus: bus.clone(),
        shutdown: shutdown.clone(),
    });
    bcm_bus::consumer::run(bus, spec, handler, shutdown).await;
    Ok(())
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
        }
        .to_owned(),
        enabled_requested: enabled.to_owned(),
        enabled_read_back: Some(enabled.to_owned()),
        mode_read_back: None,
        sim: true,
    }
}

fn execute(site: &Arc<Site>, cmd: &CommandEnvelope, shutdown: &CancellationToken) -> CommandResult {
    // The boot service keys its entries by MAC: it needs no machine.
    match &cmd.command {
        Command::BootEntrySet(p) => {
            site.machines
                .set_boot_entries(&p.boot_entry.macs, Some(&p.boot_entry.cmdline));
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
            site.machines.set_boot_entries(&p.macs, None);
            return CommandResult::succeeded(
                cmd,
                Output::BootEntryClear(BootEntryCleared {
                    cleared: p.macs.clone(),
                    sim: true,
                }),
            );
        }
        _ => {}
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
                macs: vec![mac_of(&address)],
                sim: true,
                ..Default::default()
            })
        }
        Command::BmcBootDevice(p) => {
            let pxe = p.device == BootDevice::Pxe;
            m.with(&address, |mm| {
                mm.pxe = pxe;
                mm.pxe_persistent = pxe && p.persistent;
            });
            Output::BmcBootDevice(boot_override(p))
        }
        Command::BmcPower(p) => {
            match p.action {
                PowerAction::Off => power_off(site, &address),
                PowerAction::On | PowerAction::Cycle | PowerAction::Reset => {
                    power_on(site, &address, shutdown)
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
        m.power_on = false;
        if let Some(t) = m.running.take() {
            t.cancel();
        }
    });
}

/// Powers a machine on (or resets it) and boots what its boot device says.
fn power_on(site: &Arc<Site>, address: &str, shutdown: &CancellationToken) {
    let stop = shutdown.child_token();
    let boot = site.machines.with(address, |m| {
        if let Some(t) = m.running.take() {
            t.cancel();
        }
        m.power_on = true;
        m.running = Some(stop.clone());
        let pxe = m.pxe;
        if pxe && !m.pxe_persistent {
            m.pxe = false; // a one-time PXE boot falls back to disk next time
        }
        if !pxe {
            return m.disk.is_some().then_some(Boot::Os);
        }
        // With a real boot service every PXE boot asks it, as a real
        // machine's firmware does.
        let cmdline = if site.cfg.boot_service {
            None
        } else {
            site.machines.boot_entry(&mac_of(address))
        };
        match cmdline.as_deref().and_then(parse_cmdline) {
            Some(params) => Some(Boot::Ramdisk(params)),
            None => site.cfg.boot_url.clone().map(Boot::AskBootService),
        }
    });
    let (http, cfg, faults, machines, address) = (
        site.http.clone(),
        site.cfg.clone(),
        site.faults.clone(),
        site.machines.clone(),
        address.to_owned(),
    );
    match boot {
        Some(Boot::Ramdisk(params)) => {
            tokio::spawn(agent::ramdisk(
                http, cfg, faults, machines, address, params, stop,
            ));
        }
        Some(Boot::AskBootService(base)) => {
            tokio::spawn(async move {
                // As iPXE would: the script of our MAC, then its kernel line.
                let url = format!("{}/ipxe/{}", base.trim_end_matches('/'), mac_of(&address));
                let script = match http.get(&url).send().await {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(e) => {
                        tracing::warn!(%url, error = %e, "sim machine: the boot service did not answer; nothing boots");
                        return;
                    }
                };
                let params = script
                    .lines()
                    .find(|l| l.starts_with("kernel "))
                    .and_then(parse_cmdline);
                match params {
                    Some(params) => {
                        agent::ramdisk(http, cfg, faults, machines, address, params, stop).await
                    }
                    None => {
                        tracing::info!(%url, "sim machine: the boot service has no entry for it; nothing boots")
                    }
                }
            });
        }
        Some(Boot::Os) => {
            tokio::spawn(agent::os(http, faults, machines, address, stop));
        }
        None => {}
    }
}

/// What a powered-on simulated machine boots.
enum Boot {
    Ramdisk(agent::BootParams),
    /// PXE through the real boot service at this base URL.
    AskBootService(String),
    Os,
}
