//! Simulated agents over the real agent endpoints: the ramdisk agent (join
//! with the discovery token from the kernel command line, long-poll,
//! execute, post signed results) and the installed OS's agent (join with the
//! provisioned token from user data, heartbeat with role `node`).

use base64::Engine as _;
use bcm_contracts::agent::{
    retry_wait, AgentCommand, AgentResult, AgentRole, Answer, Heartbeat, HeartbeatAck, JoinRequest,
    JoinResponse,
};
use bcm_contracts::commands::Command;
use bcm_contracts::outputs::{
    CheckedRegion, DcgmReport, DcgmStatus, DeployReport, DiskInfo, DiskWipe, Inventory, NicInfo,
    Region, SeedReport, SystemInfo, Transport, WipeOutcome, WipeReport,
};
use bcm_contracts::{CommandKind, Output};
use ed25519_dalek::SigningKey;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::site::Machines;
use crate::store::RamdiskAgent;
use crate::{Fault, Faults, SimConfig, SimError};

/// The boot parameters a ramdisk reads from `/proc/cmdline`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootParams {
    pub node: String,
    pub api: String,
    pub join: String,
}

/// Parses `bcm.node=… bcm.api=… bcm.join=…` from a kernel command line.
pub fn parse_cmdline(cmdline: &str) -> Option<BootParams> {
    let get = |k: &str| {
        cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .map(str::to_owned)
    };
    Some(BootParams {
        node: get("bcm.node=")?,
        api: get("bcm.api=")?,
        join: get("bcm.join=")?,
    })
}

/// Joins as `bcd` does: retried by the agents' one policy while the
/// control plane is unreachable or answers 5xx (a retry with the same token
/// and key gets the same identity back), final on a refusal.
async fn join(
    http: &reqwest::Client,
    api: &str,
    token: &str,
    key: &SigningKey,
    role: AgentRole,
    stop: &CancellationToken,
) -> Result<JoinResponse, SimError> {
    let req = JoinRequest {
        token: token.to_owned(),
        csr: bcm_pki::csr_pem(key, role.as_str())
            .map_err(|e| SimError::JoinRefused(e.to_string()))?,
        role,
        hostname: None,
        inventory: None,
    };
    let mut attempt = 0;
    loop {
        let mut asked_wait = None;
        let why = match http
            .post(format!("{api}/api/agent/join"))
            .json(&req)
            .send()
            .await
        {
            Ok(res) => match Answer::of_status(res.status().as_u16()) {
                Answer::Done => {
                    return res
                        .json()
                        .await
                        .map_err(|e| SimError::JoinRefused(format!("malformed answer: {e}")))
                }
                Answer::Retry => {
                    asked_wait = retry_after(&res);
                    res.status().to_string()
                }
                Answer::Refused | Answer::SessionEnded => {
                    return Err(SimError::JoinRefused(format!(
                        "{} {}",
                        res.status(),
                        res.text().await.unwrap_or_default()
                    )))
                }
            },
            Err(e) => e.to_string(),
        };
        attempt += 1;
        tracing::debug!(%why, attempt, "sim agent: join retried");
        tokio::select! {
            _ = stop.cancelled() => return Err(SimError::Unreachable(why)),
            _ = tokio::time::sleep(retry_wait(attempt, rand::random(), asked_wait.as_deref())) => {}
        }
    }
}

/// The `Retry-After` an answer carried (a floor under the agents' backoff,
/// `retry_wait`).
fn retry_after(res: &reqwest::Response) -> Option<String> {
    res.headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Posts a result as `bcd` does: retried until answered; a refusal is
/// final. False when the session ended (or `stop`).
async fn post_result(
    http: &reqwest::Client,
    api: &str,
    session: &str,
    result: &AgentResult,
    traceparent: Option<&str>,
    stop: &CancellationToken,
) -> bool {
    let mut attempt = 0;
    loop {
        let mut req = http
            .post(format!("{api}/api/agent/results"))
            .bearer_auth(session)
            .json(result);
        if let Some(tp) = traceparent {
            req = req.header(bcm_telemetry::TRACEPARENT, tp);
        }
        let sent = req.send().await;
        let asked_wait = match &sent {
            Ok(r) => match Answer::of_status(r.status().as_u16()) {
                Answer::Done => return true,
                Answer::SessionEnded => return false,
                Answer::Refused => {
                    tracing::warn!(command = %result.command_id, "sim agent: result refused");
                    return true;
                }
                Answer::Retry => retry_after(r),
            },
            Err(_) => None,
        };
        attempt += 1;
        tokio::select! {
            _ = stop.cancelled() => return false,
            _ = tokio::time::sleep(retry_wait(attempt, rand::random(), asked_wait.as_deref())) => {}
        }
    }
}

/// One long-poll of the session's commands, as `bcd` polls: the commands
/// handed (none when the answer did not read, or after a backoff when the
/// control plane did not answer), or `None` once the session ended or
/// `stop`.
async fn poll(
    http: &reqwest::Client,
    api: &str,
    session: &str,
    attempt: &mut u32,
    address: &str,
    stop: &CancellationToken,
) -> Option<Vec<AgentCommand>> {
    let polled = tokio::select! {
        _ = stop.cancelled() => return None,
        r = http.get(format!("{api}/api/agent/commands?waitMs=25000")).bearer_auth(session).send() => r,
    };
    match polled
        .as_ref()
        .map(|r| Answer::of_status(r.status().as_u16()))
    {
        Ok(Answer::Done) => {
            *attempt = 0;
            match polled {
                Ok(r) => Some(r.json().await.unwrap_or_else(|e| {
                    tracing::warn!(%address, error = %e, "sim agent: a poll's answer did not read; polling again");
                    vec![]
                })),
                Err(_) => Some(vec![]),
            }
        }
        Ok(Answer::SessionEnded) => None,
        _ => {
            *attempt += 1;
            let asked_wait = polled.as_ref().ok().and_then(retry_after);
            tokio::select! {
                _ = stop.cancelled() => None,
                _ = tokio::time::sleep(retry_wait(*attempt, rand::random(), asked_wait.as_deref())) => Some(vec![]),
            }
        }
    }
}

/// Runs the ramdisk agent of the machine at `address` until `stop`.
pub async fn ramdisk(
    http: reqwest::Client,
    cfg: Arc<SimConfig>,
    faults: Faults,
    machines: Machines,
    address: String,
    boot: BootParams,
    stop: CancellationToken,
) {
    if faults.has(&address, Fault::RamdiskNeverJoins) {
        tracing::info!(%address, "sim ramdisk: never joins (fault)");
        return;
    }
    if let Some(command) = cfg.ramdisk_command.clone() {
        return external_ramdisk(&command, &address, &boot, cfg.quorum_anchor.as_ref(), stop).await;
    }
    let Some((key, session_token)) =
        ramdisk_session(&http, &machines, &address, &boot, &stop).await
    else {
        return;
    };
    // Results of the commands already run, by id (and in the site's store):
    // a command offered again (its poll's answer was lost, or the site
    // restarted) is answered from the record, never run twice.
    let mut done: HashMap<String, AgentResult> = HashMap::new();
    let store = machines.store().clone();
    let mut attempt = 0;
    while !stop.is_cancelled() {
        let Some(cmds) = poll(
            &http,
            &boot.api,
            &session_token,
            &mut attempt,
            &address,
            &stop,
        )
        .await
        else {
            return;
        };
        if !cmds.is_empty() && faults.has(&address, Fault::RamdiskFallsSilent) {
            tracing::info!(%address, "sim ramdisk: hangs with its commands (fault)");
            stop.cancelled().await;
            return;
        }
        if !cmds.is_empty() && faults.has(&address, Fault::RamdiskIgnoresCommands) {
            tracing::info!(%address, commands = cmds.len(), "sim ramdisk: leaves its commands unanswered and polls on (fault)");
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            continue;
        }
        for cmd in cmds {
            // The agent's hop in the verb's trace: its result goes on from here.
            let span = tracing::info_span!("agent.command", node_id = %boot.node,
                command_id = %cmd.command_id, command_kind = %cmd.kind.as_str());
            bcm_telemetry::set_remote_parent(&span, cmd.traceparent.as_deref());
            let traceparent = span.in_scope(bcm_telemetry::current_traceparent);
            if !done.contains_key(&cmd.command_id) {
                match store.agent_result(&cmd.command_id).await {
                    Ok(Some(r)) => {
                        done.insert(cmd.command_id.clone(), r);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        // Unknown whether it ran: not now; it is offered again.
                        tracing::warn!(%address, error = %e, "sim ramdisk: cannot read the run record; not running the command");
                        continue;
                    }
                }
            }
            if let Some(result) = done.get(&cmd.command_id) {
                tracing::info!(%address, command = %cmd.command_id, "sim ramdisk: offered again; answering from the record");
                if !post_result(
                    &http,
                    &boot.api,
                    &session_token,
                    result,
                    traceparent.as_deref(),
                    &stop,
                )
                .await
                {
                    return;
                }
                continue;
            }
            if cfg.latency_ms > 0 {
                tokio::time::sleep(Duration::from_millis(cfg.latency_ms)).await;
            }
            // Recorded as begun before it runs. A run begun before the
            // site restarted is one the machine carried on with meanwhile
            // (a real machine does not stop when the control plane's site
            // process does): it is finished now, not noted a second time.
            let began = match store.begin_run(&cmd.command_id).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(%address, error = %e, "sim ramdisk: cannot record the run; not running the command now");
                    continue;
                }
            };
            if began {
                if let Err(e) = store.note_execution(&cmd.command_id).await {
                    tracing::warn!(%address, error = %e, "sim ramdisk: cannot note the run");
                }
            } else {
                tracing::info!(%address, command = %cmd.command_id, "sim ramdisk: finishing a command begun before the site restarted");
            }
            // As bcd does: a destructive command runs only under an
            // approved batch this agent verifies against the site's anchor.
            let authorized = bcm_quorum::check_command(
                cfg.quorum_anchor.as_ref(),
                cmd.kind,
                cmd.command().ok().as_ref(),
                Some(&boot.node),
                cmd.authority.as_ref(),
                chrono::Utc::now().timestamp(),
            );
            let ran = match authorized {
                Ok(()) => execute(&faults, &machines, &address, &boot, &cmd),
                Err(e) => {
                    tracing::warn!(%address, command = %cmd.command_id, error = %e, "sim ramdisk: refused a destructive command without a valid batch authority");
                    Err(e.refusal())
                }
            };
            let unsigned =
                cmd.kind == CommandKind::DiskWipe && faults.has(&address, Fault::UnsignedWipe);
            let mut result = signed(&key, &boot.node, &cmd, ran);
            if unsigned {
                result.signature = None;
            }
            machines.save(&address).await;
            if let Err(e) = store.save_agent_result(&result).await {
                tracing::warn!(%address, error = %e, "sim ramdisk: the result was not kept");
            }
            done.insert(cmd.command_id.clone(), result.clone());
            if !post_result(
                &http,
                &boot.api,
                &session_token,
                &result,
                traceparent.as_deref(),
                &stop,
            )
            .await
            {
                return;
            }
        }
    }
}

/// A kept ed25519 secret key (base64), if it reads as one.
fn decode_key(b64: Option<&str>) -> Option<SigningKey> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64?)
        .ok()?;
    let seed = <[u8; 32]>::try_from(bytes.as_slice()).ok()?;
    Some(SigningKey::from_bytes(&seed))
}

/// The ramdisk agent's key and session: those it had if the machine is
/// still running the boot it had before the site restarted, else a new key
/// (kept before the join, so a join retried across a restart holds the same
/// key and gets the same identity back) and a join.
async fn ramdisk_session(
    http: &reqwest::Client,
    machines: &Machines,
    address: &str,
    boot: &BootParams,
    stop: &CancellationToken,
) -> Option<(SigningKey, String)> {
    let kept = machines.ramdisk_agent(address);
    let key = decode_key(kept.as_ref().map(|a| a.key.as_str()));
    if let (Some(key), Some(session)) = (&key, kept.as_ref().and_then(|a| a.session.clone())) {
        tracing::info!(%address, "sim ramdisk: carries on with its session");
        return Some((key.clone(), session));
    }
    let key = key.unwrap_or_else(|| SigningKey::generate(&mut rand::rngs::OsRng));
    let record = |node_id: Option<String>, session: Option<String>| RamdiskAgent {
        key: base64::engine::general_purpose::STANDARD.encode(key.to_bytes()),
        node_id,
        session,
    };
    machines.set_ramdisk_agent(address, record(None, None));
    machines.save(address).await;
    match join(http, &boot.api, &boot.join, &key, AgentRole::Ramdisk, stop).await {
        Ok(s) => {
            machines.set_ramdisk_agent(
                address,
                record(Some(s.node_id.clone()), Some(s.session_token.clone())),
            );
            machines.save(address).await;
            Some((key, s.session_token))
        }
        Err(e) => {
            tracing::warn!(%address, error = %e, "sim ramdisk: join failed");
            None
        }
    }
}

/// Runs a real ramdisk agent process for the boot; killed at power-off.
async fn external_ramdisk(
    command: &[String],
    address: &str,
    boot: &BootParams,
    anchor: Option<&bcm_quorum::Anchor>,
    stop: CancellationToken,
) {
    let Some((program, args)) = command.split_first() else {
        tracing::warn!(%address, "sim: ramdisk_command is empty");
        return;
    };
    // As a site's boot service does: the site's anchor on the command
    // line, so the real agent verifies destructive commands against it.
    let quorum = anchor
        .map(|a| format!(" bcm.quorum={}", bcm_quorum::anchor_cmdline_value(a)))
        .unwrap_or_default();
    let cmdline = format!(
        "console=ttyS0 bcm.node={} bcm.api={} bcm.join={}{quorum}",
        boot.node, boot.api, boot.join
    );
    let child = tokio::process::Command::new(program)
        .args(args)
        .arg("--cmdline")
        .arg(&cmdline)
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%address, %program, error = %e, "sim: the ramdisk agent did not start");
            return;
        }
    };
    tracing::info!(%address, %program, pid = ?child.id(), "sim machine: booted a real ramdisk agent");
    tokio::select! {
        _ = stop.cancelled() => {
            let _ = child.kill().await;
        }
        status = child.wait() => {
            tracing::info!(%address, ?status, "sim machine: the ramdisk agent exited");
        }
    }
}

/// What the simulated ramdisk does with a command: the output the real
/// `bcd` would report, or why it failed.
fn execute(
    faults: &Faults,
    machines: &Machines,
    address: &str,
    boot: &BootParams,
    cmd: &AgentCommand,
) -> Result<Output, String> {
    let serial = format!("SIM{:08X}", crate::site::fnv(address));
    let disk = DiskInfo {
        name: "nvme0n1".to_owned(),
        path: "/dev/nvme0n1".to_owned(),
        size_bytes: 3_840_755_982_336,
        model: "Better Compute Sim NVMe".to_owned(),
        serial: format!("{serial}-D0"),
        rotational: false,
        transport: Transport::Nvme,
    };
    let command = cmd
        .command()
        .map_err(|e| format!("the command breaks its contract: {e}"))?;
    Ok(match command {
        Command::Inventory(_) => Output::Inventory(Inventory {
            system: SystemInfo {
                vendor: Some("Better Compute Sim".to_owned()),
                model: Some("sim-1".to_owned()),
                serial: Some(serial),
                uuid: Some(boot.node.clone()),
            },
            cpus: 64,
            cpu_model: "Better Compute Sim CPU".to_owned(),
            memory_mib: 524_288,
            disks: vec![disk],
            nics: vec![NicInfo {
                name: "eth0".to_owned(),
                mac: crate::site::mac_of(address),
                link: "up".to_owned(),
                speed_mbps: Some(100_000),
                driver: Some("sim".to_owned()),
            }],
            kernel: None,
            sim: true,
        }),
        Command::DiagDcgm(p) => Output::DiagDcgm(DcgmReport {
            status: DcgmStatus::Pass,
            level: p.level,
            reason: None,
            exit_code: Some(0),
            report: None,
            sim: true,
        }),
        Command::DiskWipe(p) => {
            let failed = faults.has(address, Fault::WipeFailsReadBack);
            let head = Region {
                offset: 0,
                len: 64 << 20,
            };
            let tail = Region {
                offset: disk.size_bytes - (64 << 20),
                len: 64 << 20,
            };
            let checked = |name: &str, r: Region, ok: bool| CheckedRegion {
                name: name.to_owned(),
                offset: r.offset,
                len: r.len,
                ok,
            };
            let serial = if faults.has(address, Fault::DiskSwapped) {
                format!("{serial}-SWAPPED")
            } else {
                disk.serial
            };
            Output::DiskWipe(WipeReport {
                disks: vec![DiskWipe {
                    name: disk.name,
                    serial,
                    model: disk.model,
                    size_bytes: disk.size_bytes,
                    transport: disk.transport,
                    method: p.mode,
                    // What a real agent would use on the sim's NVMe disk:
                    // the first admitted method it can do.
                    erase: bcm_core::erase::candidates(
                        &if p.methods.is_empty() {
                            bcm_core::erase::ErasePolicy::default().for_mode(p.mode)
                        } else {
                            p.methods.clone()
                        },
                        bcm_core::erase::EraseFamily::Nvme,
                    )
                    .first()
                    .copied(),
                    wiped_regions: vec![head, tail],
                    verified_regions: vec![
                        checked("head", head, true),
                        checked("tail", tail, !failed),
                    ],
                    outcome: if failed {
                        WipeOutcome::Failed
                    } else {
                        WipeOutcome::Verified
                    },
                    reason: failed.then(|| "sim: the tail did not read back as zeros".to_owned()),
                    millis: 0,
                }],
                sim: true,
            })
        }
        Command::DeployImage(p) => {
            // The installed OS's bcd reads its join parameters from the
            // file the rendered user data writes (/etc/bcd/join.env).
            // The user data as written: its join references replaced by
            // the tokens handed beside the command.
            let written = p
                .user_data
                .as_deref()
                .map(|u| bcm_pki::join_key::substitute(u, &cmd.join_tokens));
            let Some((token, api)) = written.as_deref().and_then(join_env) else {
                return Err(
                    "the user data gives the installed OS no BCD_JOIN_TOKEN and BCD_API".into(),
                );
            };
            let user_data_bytes = p.user_data.as_deref().map_or(0, str::len);
            machines.install(address, token, api);
            Output::DeployImage(DeployReport {
                disk: disk.name,
                serial: disk.serial,
                format: p.image.format,
                image_sha256: p.image.sha256.clone(),
                bytes_downloaded: 0,
                virtual_size_bytes: p.image.size_bytes,
                bytes_written: 0,
                target_sha256: p.image.sha256,
                millis: 0,
                bytes_per_sec: 0,
                signed_by_key: 0,
                source: None,
                data_ranges_checked: None,
                user_data: Some(SeedReport {
                    partition: "nvme0n1p1".to_owned(),
                    fs_type: "vfat".to_owned(),
                    path: "var/lib/cloud/seed/nocloud".to_owned(),
                    user_data_bytes,
                }),
                sim: true,
            })
        }
        other => return Err(format!("unsupported command {}", other.kind())),
    })
}

/// `BCD_JOIN_TOKEN` and `BCD_API` from rendered user data.
fn join_env(user_data: &str) -> Option<(String, String)> {
    let value = |key: &str| {
        user_data.lines().find_map(|l| {
            l.trim()
                .strip_prefix(key)
                .and_then(|v| v.strip_prefix('='))
                .map(|v| v.trim().to_owned())
        })
    };
    Some((value("BCD_JOIN_TOKEN")?, value("BCD_API")?))
}

/// Runs the installed OS's agent of the machine at `address` until `stop`:
/// joins the first time, heartbeats with role `node` at every boot, and
/// while its heartbeat's answer asks it to (its node runs a workflow)
/// long-polls the commands a deployed OS is sent (`node.powerOff`, a
/// rescue's clean shutdown), checked against the site's quorum anchor as
/// `bcd node` checks them, each answered once from the site's record.
pub async fn os(
    http: reqwest::Client,
    cfg: Arc<SimConfig>,
    faults: Faults,
    machines: Machines,
    address: String,
    stop: CancellationToken,
) {
    if faults.has(&address, Fault::OsNeverJoins) {
        return;
    }
    let Some(disk) = machines.disk(&address) else {
        return;
    };
    let key = match decode_key(disk.key.as_deref()) {
        Some(k) => k,
        None => {
            let k = SigningKey::generate(&mut rand::rngs::OsRng);
            machines.set_os_key(
                &address,
                base64::engine::general_purpose::STANDARD.encode(k.to_bytes()),
            );
            machines.save(&address).await;
            k
        }
    };
    let (session, node) = match (disk.session, disk.node) {
        // Kept before the node was: heartbeats only.
        (Some(s), n) => (s, n),
        (None, _) => {
            match join(
                &http,
                &disk.api,
                &disk.join_token,
                &key,
                AgentRole::Node,
                &stop,
            )
            .await
            {
                Ok(s) => {
                    machines.set_session(&address, s.session_token.clone(), s.node_id.clone());
                    machines.save(&address).await;
                    (s.session_token, Some(s.node_id))
                }
                Err(e) => {
                    tracing::warn!(%address, error = %e, "sim OS: join failed");
                    return;
                }
            }
        }
    };
    let takes_commands = !faults.has(&address, Fault::OsTakesNoCommands);
    // As bcd: it polls only while its heartbeat's answer asks it to.
    let (polls, gate) = tokio::sync::watch::channel(false);
    let polling = node.filter(|_| takes_commands).map(|node| {
        tokio::spawn(os_commands(
            http.clone(),
            cfg,
            machines.clone(),
            address.clone(),
            disk.api.clone(),
            session.clone(),
            node,
            key,
            gate,
            stop.clone(),
        ))
    });
    // The control plane's answer sets the cadence (bcd's default until one
    // comes).
    let mut every = Duration::from_secs(10);
    while !stop.is_cancelled() {
        let sent = http
            .post(format!("{}/api/agent/heartbeat", disk.api))
            .bearer_auth(&session)
            .json(&Heartbeat {
                role: AgentRole::Node,
            })
            .send()
            .await;
        if let Ok(r) = sent {
            if r.status().is_success() {
                if let Ok(ack) = r.json::<HeartbeatAck>().await {
                    every = ack.next();
                    polls.send_replace(ack.poll_commands);
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
    if let Some(p) = polling {
        let _ = p.await;
    }
}

/// The installed OS's commands: long-polled while the heartbeat's answer
/// asks for it (`gate`), until `stop` or the session ends;
/// `node.powerOff` is answered, then the machine goes off.
#[allow(clippy::too_many_arguments)]
async fn os_commands(
    http: reqwest::Client,
    cfg: Arc<SimConfig>,
    machines: Machines,
    address: String,
    api: String,
    session: String,
    node: String,
    key: SigningKey,
    mut gate: tokio::sync::watch::Receiver<bool>,
    stop: CancellationToken,
) {
    let store = machines.store().clone();
    let mut attempt = 0;
    while !stop.is_cancelled() {
        tokio::select! {
            _ = stop.cancelled() => return,
            open = gate.wait_for(|poll| *poll) => if open.is_err() { return },
        }
        let Some(cmds) = poll(&http, &api, &session, &mut attempt, &address, &stop).await else {
            return;
        };
        for cmd in cmds {
            let kept = match store.agent_result(&cmd.command_id).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(%address, error = %e, "sim OS: cannot read the run record; not running the command");
                    continue;
                }
            };
            let (result, power_off) = match kept {
                Some(r) => (r, false),
                None => {
                    let authorized = bcm_quorum::check_command(
                        cfg.quorum_anchor.as_ref(),
                        cmd.kind,
                        cmd.command().ok().as_ref(),
                        Some(&node),
                        cmd.authority.as_ref(),
                        chrono::Utc::now().timestamp(),
                    );
                    let ran = match (authorized, cmd.command()) {
                        (Err(e), _) => Err(e.refusal()),
                        (Ok(()), Ok(Command::NodePowerOff(_))) => {
                            Ok(Output::NodePowerOff(bcm_contracts::outputs::PoweringOff {
                                powering_off: true,
                            }))
                        }
                        (Ok(()), Ok(other)) => Err(format!(
                            "sim OS: an installed OS does not run {}",
                            other.kind()
                        )),
                        (Ok(()), Err(e)) => Err(format!("the command breaks its contract: {e}")),
                    };
                    let power_off = ran.is_ok();
                    let result = signed(&key, &node, &cmd, ran);
                    if let Err(e) = store.save_agent_result(&result).await {
                        tracing::warn!(%address, error = %e, "sim OS: the result was not kept");
                    }
                    (result, power_off)
                }
            };
            if !post_result(&http, &api, &session, &result, None, &stop).await {
                return;
            }
            if power_off {
                tracing::info!(%address, command = %cmd.command_id, "sim OS: powering the machine off (node.powerOff)");
                machines.os_powered_off(&address);
                machines.save(&address).await;
                return;
            }
        }
    }
}

/// A result signed by the agent's key, as `bcd` signs it.
fn signed(
    key: &SigningKey,
    node: &str,
    cmd: &AgentCommand,
    ran: Result<Output, String>,
) -> AgentResult {
    match ran {
        Ok(output) => bcm_pki::signed_result(key, node, cmd, true, output.to_json(), None),
        Err(e) => bcm_pki::signed_result(key, node, cmd, false, serde_json::json!({}), Some(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_parsing() {
        let p = parse_cmdline("console=ttyS0 bcm.node=node_1 bcm.api=http://x:1 bcm.join=bcmj_abc")
            .expect("params");
        assert_eq!(
            p,
            BootParams {
                node: "node_1".into(),
                api: "http://x:1".into(),
                join: "bcmj_abc".into()
            }
        );
        assert!(parse_cmdline("console=ttyS0 bcm.node=n").is_none());
    }
}
