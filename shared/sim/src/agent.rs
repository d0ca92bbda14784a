//! Simulated agents over the real agent endpoints: the ramdisk agent (join
//! with the discovery token from the kernel command line, long-poll,
//! execute, post signed results) and the installed OS's agent (join with the
//! provisioned token from user data, heartbeat with role `node`).

use base64::Engine as _;
use bcm_bus::messages::{AgentCommand, AgentResult, Heartbeat, JoinRequest, JoinResponse};
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::site::Machines;
use crate::{Fault, Faults, SimConfig};

/// The boot parameters a ramdisk reads from `/proc/cmdline`.
#[derive(Debug, Clone, PartialEq, Eq)]
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

async fn join(
    http: &reqwest::Client,
    api: &str,
    token: &str,
    key: &SigningKey,
    role: &str,
) -> anyhow::Result<JoinResponse> {
    let req = JoinRequest {
        token: token.to_owned(),
        csr: bcm_pki::csr_pem(key, role)?,
        role: role.to_owned(),
        hostname: None,
    };
    let res = http
        .post(format!("{api}/api/agent/join"))
        .json(&req)
        .send()
        .await?;
    if !res.status().is_success() {
        anyhow::bail!(
            "join refused: {} {}",
            res.status(),
            res.text().await.unwrap_or_default()
        );
    }
    Ok(res.json().await?)
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
        return external_ramdisk(&command, &address, &boot, stop).await;
    }
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let session = match join(&http, &boot.api, &boot.join, &key, "ramdisk").await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%address, error = %e, "sim ramdisk: join failed");
            return;
        }
    };
    while !stop.is_cancelled() {
        let polled = tokio::select! {
            _ = stop.cancelled() => return,
            r = http.get(format!("{}/api/agent/commands?waitMs=25000", boot.api)).bearer_auth(&session.session_token).send() => r,
        };
        let cmds: Vec<AgentCommand> = match polled {
            Ok(r) if r.status().is_success() => r.json().await.unwrap_or_default(),
            Ok(r) if r.status().as_u16() == 401 => return,
            _ => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        for cmd in cmds {
            if cfg.latency_ms > 0 {
                tokio::time::sleep(Duration::from_millis(cfg.latency_ms)).await;
            }
            let (ok, output, error) = execute(&faults, &machines, &address, &boot, &cmd);
            let unsigned = cmd.kind == "disk.wipe" && faults.has(&address, Fault::UnsignedWipe);
            let finished_at = chrono::Utc::now();
            let signature = (!unsigned).then(|| {
                let input = bcm_pki::signing_input(&bcm_pki::SignedFacts {
                    command_id: &cmd.command_id,
                    node_id: &boot.node,
                    kind: &cmd.kind,
                    params: &cmd.params,
                    issued_at: cmd.issued_at,
                    ok,
                    output: &output,
                    error: error.as_deref(),
                    finished_at,
                });
                base64::engine::general_purpose::STANDARD.encode(key.sign(&input).to_bytes())
            });
            let result = AgentResult {
                command_id: cmd.command_id.clone(),
                ok,
                retryable: false,
                output,
                error,
                finished_at,
                signature,
            };
            let posted = http
                .post(format!("{}/api/agent/results", boot.api))
                .bearer_auth(&session.session_token)
                .json(&result)
                .send()
                .await;
            if let Err(e) = posted {
                tracing::warn!(%address, error = %e, "sim ramdisk: posting a result failed");
            }
        }
    }
}

/// Runs a real ramdisk agent process for the boot; killed at power-off.
async fn external_ramdisk(
    command: &[String],
    address: &str,
    boot: &BootParams,
    stop: CancellationToken,
) {
    let Some((program, args)) = command.split_first() else {
        tracing::warn!(%address, "sim: ramdisk_command is empty");
        return;
    };
    let cmdline = format!(
        "console=ttyS0 bcm.node={} bcm.api={} bcm.join={}",
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

fn execute(
    faults: &Faults,
    machines: &Machines,
    address: &str,
    boot: &BootParams,
    cmd: &AgentCommand,
) -> (bool, Value, Option<String>) {
    let serial = format!("SIM{:08X}", crate::site::fnv(address));
    match cmd.kind.as_str() {
        "inventory" => (
            true,
            json!({
                "sim": true,
                "system": { "vendor": "Better Compute Sim", "model": "sim-1", "serial": serial, "uuid": boot.node },
                "cpus": 64,
                "memoryMiB": 524_288,
                "disks": [{ "name": "nvme0n1", "serial": format!("{serial}-D0"), "sizeBytes": 3_840_755_982_336u64, "rotational": false, "transport": "nvme" }],
                "nics": [{ "mac": crate::site::mac_of(address), "link": "up" }],
            }),
            None,
        ),
        "diag.dcgm" => (
            true,
            json!({ "sim": true, "status": "pass", "level": cmd.params.get("level") }),
            None,
        ),
        "disk.wipe" => {
            let method = cmd.params.get("mode").cloned().unwrap_or(Value::Null);
            let failed = faults.has(address, Fault::WipeFailsReadBack);
            (
                true,
                json!({
                    "sim": true,
                    "disks": [{
                        "serial": format!("{serial}-D0"),
                        "method": method,
                        "verifiedRegions": ["head", "tail", "stripe-1", "stripe-2", "stripe-3"],
                        "outcome": if failed { "failed" } else { "verified" },
                    }],
                }),
                None,
            )
        }
        "deploy.image" => {
            // The installed OS's bcd reads its join parameters from the
            // file the rendered user data writes (/etc/bcd/join.env).
            let user_data = cmd.params.get("userData").and_then(Value::as_str);
            match user_data.and_then(join_env) {
                Some((token, api)) => {
                    machines.install(address, token, api);
                    (true, json!({ "sim": true, "written": true }), None)
                }
                None => (
                    false,
                    json!({}),
                    Some(
                        "the user data gives the installed OS no BCD_JOIN_TOKEN and BCD_API".into(),
                    ),
                ),
            }
        }
        other => (
            false,
            json!({}),
            Some(format!("unsupported command {other}")),
        ),
    }
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
/// joins the first time, heartbeats with role `node` at every boot.
pub async fn os(
    http: reqwest::Client,
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
    let session = match disk.session {
        Some(s) => s,
        None => {
            let key = SigningKey::generate(&mut rand::rngs::OsRng);
            match join(&http, &disk.api, &disk.join_token, &key, "node").await {
                Ok(s) => {
                    machines.set_session(&address, s.session_token.clone());
                    s.session_token
                }
                Err(e) => {
                    tracing::warn!(%address, error = %e, "sim OS: join failed");
                    return;
                }
            }
        }
    };
    while !stop.is_cancelled() {
        let _ = http
            .post(format!("{}/api/agent/heartbeat", disk.api))
            .bearer_auth(&session)
            .json(&Heartbeat {
                role: "node".into(),
            })
            .send()
            .await;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
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
