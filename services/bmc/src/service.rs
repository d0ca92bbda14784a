//! The command loop: consumes `cmd.<site>.bmc.>` from JetStream, executes
//! each command against its BMC, publishes the result on
//! `result.<site>.<commandId>` and acks only after JetStream stored it.
//!
//! Never twice: before acting, the loop looks for a stored result of the
//! command id in the results stream (a redelivery after a crash between
//! publish and ack finds it and only acks); a command already executing
//! here is not started again; a long operation keeps its message with
//! progress acks so it is not redelivered meanwhile. A command that changes
//! the machine (power, boot device) is also recorded as begun before it
//! runs and with its result after, in the site's bucket
//! `BCM_BMC_RUNS_<site>` (`Run`): one redelivered after the service
//! died while it ran is answered as interrupted (retryably), never run
//! again — the engine's retry of a power action starts again at its boot
//! entry — and one whose result was not published is answered from the
//! record.

use base64::Engine as _;
use bcm_bus::consumer::{ConsumerSpec, Disposition, Handler, Incoming};
use bcm_bus::subjects::StreamKind;
use bcm_bus::Bus;
use bcm_contracts::commands::{BmcTarget, Command, Family, MediaAction, SealedValue};
use bcm_contracts::outputs::{MediaReport, PowerChanged, PowerRead, RotationReport, RotationStep};
use bcm_contracts::{CloudEvent, CommandEnvelope, CommandKind, CommandResult, Output};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::driver::{Driver, DriverSettings};
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
    /// The site's run records, opened at first use.
    runs: tokio::sync::OnceCell<bcm_bus::kv::Bucket>,
    /// The site's quorum trust anchor: a destructive command runs only
    /// with an approved batch's authority this service verifies itself.
    pub anchor: Option<Arc<bcm_quorum::Anchor>>,
}

/// How far a machine-changing command got here, as kept in the site's run
/// bucket.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "run", rename_all = "camelCase")]
enum Run {
    Started,
    Done { result: Box<CommandResult> },
}

/// What the run record says of a command about to run.
enum Begun {
    /// Recorded as begun now: run it.
    Now,
    /// Begun before and never finished (the service died while it ran).
    Interrupted,
    /// Finished before: its result.
    Finished(Box<CommandResult>),
}

/// Whether the command changes the machine, so must never run twice.
fn changes_machine(command: &Command) -> bool {
    matches!(
        command,
        Command::BmcPower(_)
            | Command::BmcBootDevice(_)
            | Command::BmcVirtualMedia(_)
            | Command::BmcDiskErase(_)
    )
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
            runs: tokio::sync::OnceCell::new(),
            anchor: None,
        }
    }

    /// The same context, verifying destructive commands against `anchor`.
    pub fn with_anchor(mut self, anchor: Option<bcm_quorum::Anchor>) -> Self {
        self.anchor = anchor.map(Arc::new);
        self
    }

    /// The command no longer executes here.
    fn done_with(&self, command_id: &str) {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(command_id);
    }

    async fn runs(&self) -> Result<&bcm_bus::kv::Bucket, bcm_bus::BusError> {
        self.runs
            .get_or_try_init(|| async {
                let name = self.bus.subjects().kv_bucket("bmc_runs", &self.site);
                // A run record is needed while its command can be
                // delivered again, and no longer.
                bcm_bus::kv::Bucket::open_expiring(
                    &self.bus,
                    &name,
                    bcm_bus::streams::COMMAND_RETENTION,
                )
                .await
            })
            .await
    }

    /// Records `command_id` as begun unless it began before.
    async fn begin_run(&self, command_id: &str) -> Result<Begun, bcm_bus::BusError> {
        let runs = self.runs().await?;
        let key = bcm_bus::kv::key_token(command_id);
        match runs.get::<Run>(&key).await? {
            Some(Run::Done { result }) => return Ok(Begun::Finished(result)),
            Some(Run::Started) => return Ok(Begun::Interrupted),
            None => {}
        }
        Ok(if runs.create(&key, &Run::Started).await? {
            Begun::Now
        } else {
            Begun::Interrupted
        })
    }

    /// Records the result of a run; a failure is logged (a redelivery then
    /// answers the command as interrupted, never runs it again).
    async fn finish_run(&self, result: &CommandResult) {
        let kept = match self.runs().await {
            Ok(runs) => {
                runs.put(
                    &bcm_bus::kv::key_token(&result.command_id),
                    &Run::Done {
                        result: Box::new(result.clone()),
                    },
                )
                .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = kept {
            tracing::warn!(command = %result.command_id, error = %e, "the run's result was not recorded");
        }
    }
}

/// Runs the loop until `shutdown`, setting the consumer up again on errors.
pub async fn run(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let subjects = ctx.bus.subjects();
    // The name and filter its bus identity may use.
    let (durable, filter) = bcm_bus::auth::bmc_consumer(subjects, &ctx.site);
    let mut spec = ConsumerSpec::new(StreamKind::Commands, durable, vec![filter]);
    spec.max_deliver = 50;
    spec.concurrency = ctx.concurrency.max(1);
    let bus = ctx.bus.clone();
    bcm_bus::consumer::run(bus, spec, Arc::new(BmcHandler { ctx }), shutdown).await
}

/// The consumer's handler: one command at a time per call, many calls at
/// once.
struct BmcHandler {
    ctx: Arc<Ctx>,
}

impl Handler<CloudEvent<CommandEnvelope>> for BmcHandler {
    async fn handle(&self, batch: &[Incoming<CloudEvent<CommandEnvelope>>]) -> Vec<Disposition> {
        let mut out = Vec::with_capacity(batch.len());
        for m in batch {
            let span = bcm_bus::command_span("bmc", m);
            let started = std::time::Instant::now();
            let d = handle(&self.ctx, m).instrument(span).await;
            bcm_bus::command_handled("bmc", m, started.elapsed(), &d);
            out.push(d);
        }
        out
    }
}

/// Why a delivered command is not this service's to run, if it is not.
fn misaddressed(ctx: &Ctx, subject: &str, cmd: &CommandEnvelope) -> Option<String> {
    if cmd.kind().family() != Family::Bmc {
        return Some(format!("{} is not a bmc command", cmd.kind()));
    }
    let expected = ctx
        .bus
        .subjects()
        .command(&cmd.site_id, cmd.kind().as_str());
    if cmd.site_id != ctx.site || expected != subject {
        return Some(format!(
            "a {} command for site {} arrived on {subject}",
            cmd.kind(),
            cmd.site_id
        ));
    }
    None
}

async fn handle(ctx: &Ctx, m: &Incoming<CloudEvent<CommandEnvelope>>) -> Disposition {
    let cmd = &m.message.data;
    if let Some(why) = misaddressed(ctx, m.subject(), cmd) {
        return Disposition::Reject(why);
    }
    // A redelivery of a command that changes the machine is answered from
    // its run record below; one that only reads is read again (harmless).
    // The results stream is not read: this service's bus identity may not
    // read other sites' results, and needs not.
    if !ctx
        .in_flight
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(cmd.command_id.clone())
    {
        // The first delivery is still executing; it answers when done.
        return Disposition::InFlight;
    }
    let result = if changes_machine(&cmd.command) {
        match ctx.begin_run(&cmd.command_id).await {
            Ok(Begun::Now) => {
                let r = run_with_progress(ctx, m).await;
                ctx.finish_run(&r).await;
                r
            }
            Ok(Begun::Finished(r)) => {
                tracing::info!(command = %cmd.command_id, "redelivered command ran before; answering from the record");
                *r
            }
            Ok(Begun::Interrupted) => {
                tracing::warn!(command = %cmd.command_id, kind = %cmd.kind(), "redelivered command began before the service restarted; answered as interrupted, not run again");
                CommandResult::failed(
                    cmd,
                    true,
                    "the bmc service restarted while this command ran; it is not run again",
                )
            }
            Err(e) => {
                ctx.done_with(&cmd.command_id);
                return Disposition::Retry(format!("recording the run: {e}"));
            }
        }
    } else {
        run_with_progress(ctx, m).await
    };
    let published = ctx.bus.publish_result(cmd, result).await;
    ctx.done_with(&cmd.command_id);
    match published {
        Ok(()) => Disposition::Done,
        // Redelivered, and the stored-result check above makes sure it is
        // not executed again if the publish landed.
        Err(e) => Disposition::Retry(format!("publishing the result: {e}")),
    }
}

/// Executes the command, keeping its message with progress acks, and
/// makes its result.
async fn run_with_progress(ctx: &Ctx, m: &Incoming<CloudEvent<CommandEnvelope>>) -> CommandResult {
    let cmd = &m.message.data;
    if cmd.expired(chrono::Utc::now()) {
        // The control plane stopped waiting for it: running it now would
        // act behind the engine's back.
        tracing::warn!(command = %cmd.command_id, kind = %cmd.kind(), deadline = ?cmd.deadline, "refused a command past its deadline; not run");
        metrics::counter!("bcm_bmc_commands_expired_total", "kind" => cmd.kind().as_str())
            .increment(1);
        return CommandResult::expired(cmd);
    }
    if let Err(e) = bcm_quorum::check_command(
        ctx.anchor.as_deref(),
        cmd.kind(),
        Some(&cmd.command),
        cmd.node_id.map(|n| n.to_string()).as_deref(),
        cmd.authority.as_ref(),
        chrono::Utc::now().timestamp(),
    ) {
        tracing::warn!(command = %cmd.command_id, kind = %cmd.kind(), node = %cmd.node_id.map(|n| n.to_string()).unwrap_or_default(), error = %e, "refused a destructive command without a valid batch authority; not run");
        metrics::counter!("bcm_bmc_commands_unauthorized_total", "kind" => cmd.kind().as_str())
            .increment(1);
        return CommandResult::failed(cmd, false, e.refusal());
    }
    let result = {
        let work = execute(ctx, cmd);
        tokio::pin!(work);
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        tick.tick().await;
        loop {
            tokio::select! {
                r = &mut work => break r,
                _ = tick.tick() => m.in_progress().await,
            }
        }
    };
    match result {
        Ok(output) => CommandResult::succeeded(cmd, output),
        Err(e) => {
            tracing::warn!(command = %cmd.command_id, kind = %cmd.kind(), error = %e, "bmc command failed");
            let mut r = CommandResult::failed(cmd, e.retryable(), e.to_string());
            if let BmcError::RotationRolledBack(_) = e {
                r.output = Some(Output::BmcRotateCredentials(RotationReport {
                    outcome: RotationStep::RolledBack,
                    recovered: false,
                    sealed_credentials: None,
                }));
            }
            r
        }
    }
}

/// The command's BMC, its node id and its opened credentials (bound to the
/// node).
pub(crate) fn open_target<'a>(
    ctx: &Ctx,
    cmd: &'a CommandEnvelope,
) -> Result<(&'a BmcTarget, String, bcm_seal::BmcCredentials), BmcError> {
    let kind = cmd.kind();
    let bmc = cmd
        .command
        .bmc()
        .ok_or_else(|| BmcError::Invalid(format!("{kind}: not a bmc command")))?;
    let sealed = bmc
        .sealed_credentials
        .as_ref()
        .ok_or_else(|| BmcError::Invalid(format!("{kind}: the node has no BMC credentials")))?;
    let node = cmd
        .node_id
        .map(|n| n.to_string())
        .ok_or_else(|| BmcError::Invalid(format!("{kind}: no node id")))?;
    let creds = open_sealed(ctx, kind, sealed, &node)?;
    Ok((bmc, node, creds))
}

/// Opens one sealed value of a command, checking it is bound to `node`.
pub(crate) fn open_sealed(
    ctx: &Ctx,
    kind: CommandKind,
    sealed: &SealedValue,
    node: &str,
) -> Result<bcm_seal::BmcCredentials, BmcError> {
    if sealed.owner != node {
        return Err(BmcError::Invalid(format!(
            "{kind}: the credentials are sealed for another node"
        )));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let sealed = bcm_seal::Sealed {
        key_id: sealed.key_id.clone(),
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
    let (bmc, _, creds) = open_target(ctx, cmd)?;
    Driver::open(
        bmc.driver,
        &bmc.address,
        creds.username,
        creds.password,
        &ctx.drivers,
        bmc.tls.as_ref(),
    )
}

async fn execute(ctx: &Ctx, cmd: &CommandEnvelope) -> Result<Output, BmcError> {
    let count = || {
        ctx.executed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!("bcm_bmc_commands_total", "kind" => cmd.kind().as_str()).increment(1);
    };
    if let Command::BmcRotateCredentials(p) = &cmd.command {
        count();
        return crate::rotation::rotate(ctx, cmd, p).await;
    }
    let driver = driver_for(ctx, cmd)?;
    count();
    let out = run_on(&driver, &cmd.command).await;
    driver.close().await;
    out
}

/// Runs one command on a connected driver.
async fn run_on(driver: &Driver, command: &Command) -> Result<Output, BmcError> {
    Ok(match command {
        Command::BmcVerify(_) => Output::BmcVerify(driver.verify().await?),
        Command::BmcInspect(_) => Output::BmcInspect(driver.inspect().await?),
        Command::BmcPowerStatus(_) => Output::BmcPowerStatus(PowerRead {
            power: driver.power_state().await?,
            sim: false,
        }),
        Command::BmcPower(p) => Output::BmcPower(PowerChanged {
            action: p.action,
            power: driver.power(p.action).await?,
            sim: false,
        }),
        Command::BmcBootDevice(p) => {
            Output::BmcBootDevice(driver.boot(p.device, p.persistent, p.mode).await?)
        }
        Command::BmcVirtualMedia(p) => {
            let state = match (p.action, p.image.as_deref()) {
                (MediaAction::Insert, Some(image)) => driver.insert_media(image).await?,
                (MediaAction::Insert, None) => {
                    return Err(BmcError::Invalid(
                        "bmc.virtualMedia insert names no image".into(),
                    ))
                }
                (MediaAction::Eject, _) => driver.eject_media().await?,
            };
            Output::BmcVirtualMedia(MediaReport {
                slot: state.slot,
                inserted: state.inserted,
                image: state.image,
                sim: false,
            })
        }
        Command::BmcDiskErase(_) => Output::BmcDiskErase(driver.erase_drives().await?),
        other => {
            return Err(BmcError::Unsupported(format!(
                "command kind {}",
                other.kind()
            )))
        }
    })
}
