//! The command loop: consumes `cmd.<site>.bmc.>` from JetStream, executes
//! each command against its BMC, publishes the result on
//! `result.<site>.<commandId>` and acks only after JetStream stored it.
//!
//! Never twice: before acting, the loop looks for a stored result of the
//! command id in the results stream (a redelivery after a crash between
//! publish and ack finds it and only acks); a command already executing
//! here is not started again; a long operation keeps its message with
//! progress acks so it is not redelivered meanwhile.

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::AckKind;
use base64::Engine as _;
use bcm_bus::messages::{CloudEvent, CommandEnvelope, CommandResult};
use bcm_bus::subjects::StreamKind;
use bcm_bus::Bus;
use bcm_core::{BmcDriver, BmcTls, PowerAction};
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::driver::{BootDevice, BootMode, Driver, DriverSettings};
use crate::error::BmcError;

/// What the loop shares.
pub struct Ctx {
    pub bus: Bus,
    pub site: bcm_core::SiteId,
    pub sealer: bcm_seal::Sealer,
    pub drivers: DriverSettings,
    pub concurrency: usize,
    /// Command ids executing now.
    in_flight: Mutex<HashSet<String>>,
    /// BMC operations executed so far (a redelivery must not add one).
    pub executed: std::sync::atomic::AtomicU64,
}

impl Ctx {
    pub fn new(
        bus: Bus,
        site: bcm_core::SiteId,
        sealer: bcm_seal::Sealer,
        drivers: DriverSettings,
        concurrency: usize,
    ) -> Self {
        Self {
            bus,
            site,
            sealer,
            drivers,
            concurrency,
            in_flight: Mutex::default(),
            executed: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

/// The `bmc` part of a command's parameters (sealed credentials).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BmcParams {
    pub driver: BmcDriver,
    pub address: String,
    #[serde(default)]
    pub tls: Option<BmcTls>,
    sealed_credentials: Option<SealedParams>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SealedParams {
    key_id: String,
    nonce: String,
    ciphertext: String,
    owner: String,
}

/// Runs the loop until `shutdown`, reconnecting on errors.
pub async fn run(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        if let Err(e) = consume(&ctx, &shutdown).await {
            tracing::warn!(error = %e, "bmc command consumer failed; restarting");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

async fn consume(ctx: &Arc<Ctx>, shutdown: &CancellationToken) -> anyhow::Result<()> {
    let subjects = ctx.bus.subjects();
    let stream = ctx
        .bus
        .jetstream()
        .get_stream(subjects.stream(StreamKind::Commands))
        .await?;
    let name = format!("bmc-{}", ctx.site);
    let consumer = stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: subjects.commands_of_site_family(&ctx.site, "bmc"),
                ack_policy: AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_deliver: 50,
                max_ack_pending: 10_000,
                ..Default::default()
            },
        )
        .await?;
    let messages = consumer.messages().await?;
    messages
        .take_until(shutdown.cancelled())
        .for_each_concurrent(ctx.concurrency.max(1), |m| async move {
            match m {
                Ok(msg) => handle(ctx, msg).await,
                Err(e) => tracing::warn!(error = %e, "bmc command delivery failed"),
            }
        })
        .await;
    Ok(())
}

/// A stored result of `command_id`, if the results stream has one.
async fn stored_result(ctx: &Ctx, command_id: &str) -> Option<()> {
    let subjects = ctx.bus.subjects();
    let stream = ctx
        .bus
        .jetstream()
        .get_stream(subjects.stream(StreamKind::Results))
        .await
        .ok()?;
    stream
        .get_last_raw_message_by_subject(&subjects.result(&ctx.site, command_id))
        .await
        .ok()
        .map(|_| ())
}

async fn handle(ctx: &Ctx, msg: async_nats::jetstream::Message) {
    let cmd: CommandEnvelope = match serde_json::from_slice::<CloudEvent<CommandEnvelope>>(
        &msg.payload,
    ) {
        Ok(ev) => ev.data,
        Err(e) => {
            tracing::warn!(error = %e, subject = %msg.subject, "dropping an undecodable bmc command");
            let _ = msg.ack_with(AckKind::Term).await;
            return;
        }
    };
    if stored_result(ctx, &cmd.command_id).await.is_some() {
        tracing::info!(command = %cmd.command_id, "redelivered command already has a result; acking");
        let _ = msg.ack().await;
        return;
    }
    if !ctx
        .in_flight
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(cmd.command_id.clone())
    {
        // The first delivery is still executing; it acks when done.
        return;
    }
    let result = {
        let work = execute(ctx, &cmd);
        tokio::pin!(work);
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        tick.tick().await;
        loop {
            tokio::select! {
                r = &mut work => break r,
                _ = tick.tick() => { let _ = msg.ack_with(AckKind::Progress).await; }
            }
        }
    };
    let result = match result {
        Ok(output) => CommandResult {
            command_id: cmd.command_id.clone(),
            ok: true,
            retryable: false,
            output,
            error: None,
        },
        Err(e) => {
            tracing::warn!(command = %cmd.command_id, kind = %cmd.kind, error = %e, "bmc command failed");
            CommandResult {
                command_id: cmd.command_id.clone(),
                ok: false,
                retryable: e.retryable(),
                output: match e {
                    BmcError::RotationRolledBack(_) => json!({ "outcome": "rolled-back" }),
                    _ => json!({}),
                },
                error: Some(e.to_string()),
            }
        }
    };
    let published = ctx
        .bus
        .publish_result(&cmd, result)
        .await
        .map_err(|e| e.to_string());
    ctx.in_flight
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&cmd.command_id);
    match published {
        Ok(()) => {
            let _ = msg.ack().await;
        }
        Err(e) => {
            // Not acked: redelivered, and the stored-result check above
            // makes sure it is not executed again if the publish landed.
            tracing::warn!(command = %cmd.command_id, error = %e, "publishing a bmc result failed");
        }
    }
}

/// The command's `bmc` parameters, its node id and its opened credentials
/// (bound to the node).
pub(crate) fn open_params(
    ctx: &Ctx,
    cmd: &CommandEnvelope,
) -> Result<(BmcParams, String, bcm_seal::BmcCredentials), BmcError> {
    let mut bmc: BmcParams =
        serde_json::from_value(cmd.params.get("bmc").cloned().unwrap_or(Value::Null))
            .map_err(|e| BmcError::Invalid(format!("{}: bad bmc parameters: {e}", cmd.kind)))?;
    let sealed = bmc.sealed_credentials.take().ok_or_else(|| {
        BmcError::Invalid(format!("{}: the node has no BMC credentials", cmd.kind))
    })?;
    let node = cmd
        .node_id
        .map(|n| n.to_string())
        .ok_or_else(|| BmcError::Invalid(format!("{}: no node id", cmd.kind)))?;
    let creds = open_sealed(ctx, cmd, sealed, &node)?;
    Ok((bmc, node, creds))
}

/// Opens one sealed value of a command, checking it is bound to `node`.
pub(crate) fn open_sealed(
    ctx: &Ctx,
    cmd: &CommandEnvelope,
    sealed: SealedParams,
    node: &str,
) -> Result<bcm_seal::BmcCredentials, BmcError> {
    if sealed.owner != node {
        return Err(BmcError::Invalid(format!(
            "{}: the credentials are sealed for another node",
            cmd.kind
        )));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let sealed = bcm_seal::Sealed {
        key_id: sealed.key_id,
        nonce: b64
            .decode(&sealed.nonce)
            .map_err(|_| BmcError::Invalid("sealed credentials: bad nonce".into()))?,
        ciphertext: b64
            .decode(&sealed.ciphertext)
            .map_err(|_| BmcError::Invalid("sealed credentials: bad ciphertext".into()))?,
    };
    ctx.sealer
        .open_credentials(&sealed, node)
        .map_err(|e| BmcError::Invalid(format!("sealed credentials: {e}")))
}

/// Opens the command's credentials and its driver.
fn driver_for(ctx: &Ctx, cmd: &CommandEnvelope) -> Result<Driver, BmcError> {
    let (bmc, _, creds) = open_params(ctx, cmd)?;
    Driver::open(
        bmc.driver,
        &bmc.address,
        creds.username,
        creds.password,
        &ctx.drivers,
        bmc.tls.as_ref(),
    )
}

async fn execute(ctx: &Ctx, cmd: &CommandEnvelope) -> Result<Value, BmcError> {
    if cmd.kind == "bmc.rotateCredentials" {
        ctx.executed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return crate::rotation::rotate(ctx, cmd).await;
    }
    let driver = driver_for(ctx, cmd)?;
    let out = run_kind(ctx, &driver, cmd).await;
    driver.close().await;
    out
}

async fn run_kind(ctx: &Ctx, driver: &Driver, cmd: &CommandEnvelope) -> Result<Value, BmcError> {
    ctx.executed
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    metrics::counter!("bcm_bmc_commands_total", "kind" => cmd.kind.clone()).increment(1);
    let p = &cmd.params;
    match cmd.kind.as_str() {
        "bmc.verify" => Ok(json!(driver.verify().await?)),
        "bmc.inspect" => Ok(json!(driver.inspect().await?)),
        "bmc.powerStatus" => Ok(json!({ "power": driver.power_state().await? })),
        "bmc.power" => {
            let action: PowerAction = serde_json::from_value(
                p.get("action").cloned().unwrap_or(Value::Null),
            )
            .map_err(|_| {
                BmcError::Invalid("bmc.power: action must be on, off, cycle or reset".into())
            })?;
            Ok(json!({ "action": action, "power": driver.power(action).await? }))
        }
        "bmc.bootDevice" => {
            let device: BootDevice = serde_json::from_value(
                p.get("device").cloned().unwrap_or(Value::Null),
            )
            .map_err(|_| {
                BmcError::Invalid("bmc.bootDevice: device must be pxe, disk or uefi-http".into())
            })?;
            let persistent = p
                .get("persistent")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let mode: Option<BootMode> = match p.get("mode") {
                None | Some(Value::Null) => None,
                Some(m) => Some(serde_json::from_value(m.clone()).map_err(|_| {
                    BmcError::Invalid("bmc.bootDevice: mode must be uefi or legacy".into())
                })?),
            };
            Ok(json!(driver.boot(device, persistent, mode).await?))
        }
        other => Err(BmcError::Unsupported(format!("command kind {other}"))),
    }
}
