//! The simulated site services: BMCs and boot, answering the real site
//! commands.

use async_nats::jetstream::consumer::{pull, AckPolicy};
use bcm_bus::messages::{CloudEvent, CommandEnvelope, CommandResult};
use bcm_bus::subjects::StreamKind;
use bcm_bus::Bus;
use futures::StreamExt as _;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::agent::{self, parse_cmdline};
use crate::{Fault, Faults, SimConfig};

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
    cmdline: Option<String>,
    disk: Option<Disk>,
    running: Option<CancellationToken>,
}

/// Every simulated machine, by BMC address.
#[derive(Clone, Default)]
pub struct Machines {
    inner: Arc<Mutex<HashMap<String, Machine>>>,
    by_node: Arc<Mutex<HashMap<String, String>>>,
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
    flaky: Mutex<HashMap<(String, String), u32>>,
}

/// Runs the simulated site until `shutdown`.
pub async fn run(
    bus: Bus,
    cfg: SimConfig,
    machines: Machines,
    faults: Faults,
    shutdown: CancellationToken,
) {
    let site = Arc::new(Site {
        cfg: Arc::new(cfg),
        faults,
        machines,
        http: reqwest::Client::new(),
        results: Mutex::new(HashMap::new()),
        flaky: Mutex::new(HashMap::new()),
    });
    while !shutdown.is_cancelled() {
        if let Err(e) = consume(&bus, &site, &shutdown).await {
            tracing::warn!(error = %e, "sim site consumer failed; restarting");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

async fn consume(bus: &Bus, site: &Arc<Site>, shutdown: &CancellationToken) -> anyhow::Result<()> {
    let subjects = bus.subjects();
    let site_id: bcm_core::SiteId = site.cfg.site.parse()?;
    let stream = bus
        .jetstream()
        .get_stream(subjects.stream(StreamKind::Commands))
        .await?;
    // The sim consumes every family a real service does not.
    let families: Vec<&str> = [
        (!site.cfg.bmc_service).then_some("bmc"),
        (!site.cfg.boot_service).then_some("site"),
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
    let (name, filter_subject, filter_subjects) = if families.len() == 2 {
        (
            format!("site-{site_id}"),
            subjects.commands_of_site(&site_id),
            vec![],
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
            String::new(),
            families
                .iter()
                .map(|f| subjects.commands_of_site_family(&site_id, f))
                .collect(),
        )
    };
    let consumer = stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject,
                filter_subjects,
                ack_policy: AckPolicy::Explicit,
                max_deliver: 20,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: 10_000,
                ..Default::default()
            },
        )
        .await?;
    let mut messages = consumer.messages().await?;
    let gate = Arc::new(tokio::sync::Semaphore::new(site.cfg.concurrency.max(1)));
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            m = messages.next() => match m {
                Some(m) => m.map_err(|e| anyhow::anyhow!("{e}"))?,
                None => return Ok(()),
            },
        };
        let permit = gate.clone().acquire_owned().await?;
        let (site, bus, shutdown) = (site.clone(), bus.clone(), shutdown.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let cmd: CloudEvent<CommandEnvelope> = match serde_json::from_slice(&msg.payload) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "sim site: dropping an undecodable command");
                    let _ = msg.ack_with(async_nats::jetstream::AckKind::Term).await;
                    return;
                }
            };
            let cmd = cmd.data;
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
                    let r = execute(&site, &cmd, &shutdown);
                    site.results
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(cmd.command_id.clone(), r.clone());
                    r
                }
            };
            match bus.publish_result(&cmd, result).await {
                Ok(()) => {
                    let _ = msg.ack().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "sim site: publishing a result failed; redelivery retries")
                }
            }
        });
    }
}

fn ok(cmd: &CommandEnvelope, output: Value) -> CommandResult {
    CommandResult {
        command_id: cmd.command_id.clone(),
        ok: true,
        retryable: false,
        output,
        error: None,
    }
}

fn err(cmd: &CommandEnvelope, retryable: bool, e: &str) -> CommandResult {
    CommandResult {
        command_id: cmd.command_id.clone(),
        ok: false,
        retryable,
        output: json!({}),
        error: Some(e.to_owned()),
    }
}

fn execute(site: &Arc<Site>, cmd: &CommandEnvelope, shutdown: &CancellationToken) -> CommandResult {
    let node = cmd.node_id.map(|n| n.to_string()).unwrap_or_default();
    let address = cmd
        .params
        .pointer("/bmc/address")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| site.machines.address_of(&node));
    let Some(address) = address else {
        return err(cmd, false, "sim: no machine is known for this node");
    };
    site.machines.remember(&node, &address);
    let uses_bmc = cmd.kind.starts_with("bmc.");
    if uses_bmc && site.faults.has(&address, Fault::BmcRejects) {
        return err(
            cmd,
            false,
            "sim BMC: 401 Unauthorized (Base.1.0.InsufficientPrivilege)",
        );
    }
    if uses_bmc && site.faults.has(&address, Fault::BmcFlaky) {
        let mut seen = site.flaky.lock().unwrap_or_else(|p| p.into_inner());
        let n = seen.entry((address.clone(), cmd.kind.clone())).or_default();
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
    match cmd.kind.as_str() {
        "bmc.powerStatus" => ok(cmd, json!({ "sim": true, "power": m.power(&address) })),
        "bmc.verify" => ok(cmd, json!({ "sim": true, "redfishVersion": "1.17.0" })),
        "bmc.inspect" => {
            let pad = if site.faults.has(&address, Fault::BmcPadsWithNul) {
                "\0\0\0"
            } else {
                ""
            };
            ok(
                cmd,
                json!({ "sim": true, "manufacturer": format!("Better Compute Sim{pad}"), "model": "sim-1",
                        "serial": format!("SIM{:08X}{pad}", fnv(&address)), "macs": [mac_of(&address)] }),
            )
        }
        "bmc.bootDevice" => {
            let pxe = cmd.params.get("device").and_then(Value::as_str) == Some("pxe");
            let persistent = cmd
                .params
                .get("persistent")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            m.with(&address, |mm| {
                mm.pxe = pxe;
                mm.pxe_persistent = pxe && persistent;
            });
            ok(
                cmd,
                json!({ "sim": true, "device": if pxe { "pxe" } else { "disk" }, "persistent": persistent }),
            )
        }
        "bmc.power" => {
            let action = cmd
                .params
                .get("action")
                .and_then(Value::as_str)
                .unwrap_or("");
            match action {
                "off" => power_off(site, &address),
                "on" | "cycle" | "reset" => power_on(site, &address, shutdown),
                other => {
                    return err(
                        cmd,
                        false,
                        &format!("sim BMC: unsupported power action {other:?}"),
                    )
                }
            }
            ok(
                cmd,
                json!({ "sim": true, "action": action, "power": m.power(&address) }),
            )
        }
        "site.bootEntry.set" => {
            let cmdline = cmd
                .params
                .pointer("/bootEntry/cmdline")
                .and_then(Value::as_str)
                .map(str::to_owned);
            m.with(&address, |mm| mm.cmdline = cmdline);
            ok(cmd, json!({ "sim": true }))
        }
        "site.bootEntry.clear" => {
            m.with(&address, |mm| mm.cmdline = None);
            ok(cmd, json!({ "sim": true }))
        }
        other => err(
            cmd,
            false,
            &format!("sim: unsupported command kind {other}"),
        ),
    }
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
            m.cmdline.clone()
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
