//! The step workers: claim due steps of several workflows, advance each,
//! schedule the next ones, all in one transaction.

use bcm_bus::Bus;
use bcm_contracts::agent::{AgentPresence, AgentPurpose};
use bcm_contracts::events::{StepFinished, WorkflowFinished};
use bcm_contracts::{CommandEnvelope, CommandKind, Output};
use bcm_core::workflow::{
    self, AfterOutcome, NextStep, StepDef, StepKind, StepOutcome, StepStatus, StepTarget,
    WorkflowPhase,
};
use bcm_db::nodes::Node;
use bcm_db::workflows::{Held, StepRow, WorkflowRow};
use bcm_db::{Db, DbError, Tx};
use bcm_metal::outbox;
use chrono::{DateTime, Utc};
use rand::Rng as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::commands;
use crate::EngineConfig;

/// What the workers share.
pub struct Ctx {
    pub db: Db,
    pub bus: Bus,
    pub cfg: EngineConfig,
    /// Wakes idle workers.
    pub wake: tokio::sync::Notify,
    /// Since when the engine has heard the database: its start, or the end
    /// of the last outage it saw. An agent's silence is counted from here at
    /// the earliest: while the control plane could not be reached, no agent
    /// could be heard, and its retries after the outage take a few seconds.
    heard_since: std::sync::Mutex<DateTime<Utc>>,
}

impl Ctx {
    /// The engine's shared state, hearing the database from now.
    pub fn new(db: Db, bus: Bus, cfg: EngineConfig) -> Self {
        Ctx {
            db,
            bus,
            cfg,
            wake: tokio::sync::Notify::new(),
            heard_since: std::sync::Mutex::new(Utc::now()),
        }
    }

    /// The database could not be reached just now.
    fn outage_seen(&self) {
        *self.heard_since.lock().unwrap_or_else(|p| p.into_inner()) = Utc::now();
    }

    fn heard_since(&self) -> DateTime<Utc> {
        *self.heard_since.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Wakes one idle worker per notification of a due step (and when it
/// listens again after a lost connection); a worker that found work wakes
/// the next, so wake-ups fan out with the work instead of every worker
/// polling an empty queue at each notification.
pub async fn listen(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let woken = ctx.clone();
    let reading =
        bcm_db::listen::read_channel(&ctx.db, bcm_db::workflows::NOTIFY_CHANNEL, move |_| {
            woken.wake.notify_one()
        });
    // A stop while the database is away does not wait for the first try.
    let _reader = tokio::select! {
        _ = shutdown.cancelled() => return,
        r = reading => r,
    };
    shutdown.cancelled().await;
}

/// One worker: advances due steps until `shutdown`.
pub async fn worker(ctx: Arc<Ctx>, index: usize, shutdown: CancellationToken) {
    let poll = Duration::from_millis(ctx.cfg.poll_ms.max(10));
    while !shutdown.is_cancelled() {
        match tick(&ctx).await {
            Ok(Tick::Advanced) => {
                ctx.wake.notify_one();
                continue;
            }
            Ok(Tick::Busy) => {
                // Its holder is about to move that step; look again shortly.
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
            Ok(Tick::Idle) => {}
            Err(DbError::Stale) => continue,
            Err(e) => {
                if e.unreachable() {
                    ctx.outage_seen();
                }
                tracing::warn!(worker = index, error = %e, "step failed to advance; retrying")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
            _ = ctx.wake.notified() => {}
        }
    }
}

/// At most this many steps of one workflow advance in one transaction: a
/// workflow's control-plane steps and the start of the step after a
/// finished one share the commit that finished it.
const MAX_STEPS_PER_TXN: usize = 16;

/// What a worker's turn found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    /// Steps advanced.
    Advanced,
    /// Nothing is due.
    Idle,
    /// The due steps' workflows are being advanced by other transactions.
    Busy,
}

/// What an engine transaction writes at its end, in one round trip per
/// table: the steps and workflows it changed, the commands it recorded and
/// its outbox messages (in the order they were made).
#[derive(Debug, Default)]
pub struct Writes {
    steps: Vec<StepRow>,
    workflows: Vec<(WorkflowRow, bool)>,
    commands: Vec<bcm_db::commands::NewCommand>,
    /// Outbox messages to insert with the commit.
    pub events: Vec<bcm_db::outbox::NewOutboxMessage>,
    /// Not a write: the commands of the running steps being advanced, read
    /// ahead in one round trip for the whole batch.
    commands_read: HashMap<String, bcm_db::commands::CommandRow>,
    /// What to count once the transaction committed (a rolled-back batch,
    /// retried one workflow at a time, must not count twice).
    observed: Observed,
}

/// Metrics of a transaction's work, recorded only after it committed.
#[derive(Debug, Default)]
#[must_use = "emit() once the transaction committed"]
pub struct Observed(Vec<Observation>);

#[derive(Debug)]
enum Observation {
    CommandIssued(&'static str),
    StepEnded {
        step: String,
        status: &'static str,
        secs: f64,
    },
    WorkflowEnded {
        profile: String,
        status: &'static str,
        secs: f64,
    },
}

impl Observed {
    /// Records the metrics; call after the commit.
    pub fn emit(self) {
        for o in self.0 {
            match o {
                Observation::CommandIssued(kind) => {
                    metrics::counter!("bcm_workflow_commands_issued_total", "kind" => kind)
                        .increment(1)
                }
                Observation::StepEnded { step, status, secs } => {
                    metrics::histogram!("bcm_workflow_step_seconds", "step" => step, "status" => status)
                        .record(secs)
                }
                Observation::WorkflowEnded {
                    profile,
                    status,
                    secs,
                } => {
                    metrics::counter!("bcm_workflows_finished_total", "profile" => profile.clone(), "status" => status)
                        .increment(1);
                    metrics::histogram!("bcm_workflow_seconds", "profile" => profile, "status" => status)
                        .record(secs)
                }
            }
        }
    }
}

impl Writes {
    /// Writes the changed steps and workflows now, so that a later read in
    /// the same transaction sees them.
    async fn flush_rows(&mut self, tx: &mut Tx<'_>) -> Result<(), DbError> {
        bcm_db::workflows::steps_update_many_in_txn(tx, &std::mem::take(&mut self.steps)).await?;
        bcm_db::workflows::workflows_update_many_in_txn(tx, &std::mem::take(&mut self.workflows))
            .await
    }

    /// Writes everything; call once, just before the commit. Returns the
    /// metrics to record once it committed.
    ///
    /// The messages' CloudEvent `time` is set as they are written
    /// (`bcm_metal::outbox::write_in_txn`), to one instant for all: a batch
    /// of 64 workflows builds its first events long before it commits, and
    /// an event says when its change was written.
    pub async fn flush(mut self, tx: &mut Tx<'_>) -> Result<Observed, DbError> {
        self.flush_rows(tx).await?;
        bcm_db::commands::commands_insert_many_in_txn(tx, &self.commands).await?;
        bcm_metal::outbox::write_in_txn(tx, std::mem::take(&mut self.events)).await?;
        Ok(self.observed)
    }
}

/// Advances up to `batch` due steps of distinct workflows (and the steps
/// they make due at once) in one transaction.
///
/// Lock order: a worker holds the claimed step rows and only *tries* the
/// workflow locks (`SKIP LOCKED`); whoever holds a workflow lock then locks
/// its steps. So a worker never waits while holding a step another needs,
/// and the results consumer (workflow first, waiting) cannot deadlock with
/// it. A batch that fails is retried one workflow per transaction, so one
/// workflow's fault never holds up the others.
pub async fn tick(ctx: &Ctx) -> Result<Tick, DbError> {
    let started = std::time::Instant::now();
    let mut tx = ctx.db.begin().await?;
    let batch = ctx.cfg.batch.max(1) as i64;
    let claimed = bcm_db::workflows::steps_claim_due_many_in_txn(&mut tx, batch).await?;
    if claimed.is_empty() {
        tx.commit().await?;
        return Ok(Tick::Idle);
    }
    match advance_claimed(&mut tx, ctx, &claimed).await {
        Ok((0, _)) => {
            tx.rollback().await?;
            Ok(Tick::Busy)
        }
        Ok((_, observed)) => {
            tx.commit().await?;
            metrics::histogram!("bcm_workflow_txn_seconds", "what" => "steps")
                .record(started.elapsed().as_secs_f64());
            observed.emit();
            Ok(Tick::Advanced)
        }
        Err(e) if claimed.len() > 1 && !matches!(e, DbError::Stale) => {
            tx.rollback().await?;
            tracing::warn!(error = %e, steps = claimed.len(), "a batch of steps failed to advance; advancing its workflows one by one");
            let mut advanced = false;
            for one in &claimed {
                let mut tx = ctx.db.begin().await?;
                match advance_claimed(&mut tx, ctx, std::slice::from_ref(one)).await {
                    Ok((_, observed)) => {
                        tx.commit().await?;
                        observed.emit();
                        advanced = true;
                    }
                    Err(e) => {
                        tracing::warn!(workflow = %one.0, step = one.1, error = %e, "step failed to advance; retrying");
                        tx.rollback().await?;
                    }
                }
            }
            // When none advanced, the worker waits a poll before it looks
            // again instead of spinning on the same failing steps.
            if advanced {
                Ok(Tick::Advanced)
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
    }
}

/// Locks what it can of the claimed steps' workflows, advances them and
/// writes the result; returns how many workflows it advanced, and what to
/// count once the caller committed.
async fn advance_claimed(
    tx: &mut Tx<'_>,
    ctx: &Ctx,
    claimed: &[(String, i32)],
) -> Result<(usize, Observed), DbError> {
    let ids: Vec<String> = claimed.iter().map(|(w, _)| w.clone()).collect();
    let workflows = bcm_db::workflows::workflows_lock_many_in_txn(tx, &ids, Held::Skip).await?;
    if workflows.is_empty() {
        return Ok((0, Observed::default()));
    }
    let advanced = workflows.len();
    let mut writes = Writes::default();
    advance_locked(tx, ctx, workflows, claimed, &mut writes).await?;
    let observed = writes.flush(tx).await?;
    Ok((advanced, observed))
}

/// Advances each locked workflow from its step in `from`: reads all their
/// steps and nodes in two round trips.
async fn advance_locked(
    tx: &mut Tx<'_>,
    ctx: &Ctx,
    workflows: Vec<WorkflowRow>,
    from: &[(String, i32)],
    writes: &mut Writes,
) -> Result<(), DbError> {
    if workflows.is_empty() {
        return Ok(());
    }
    let locked: Vec<String> = workflows.iter().map(|w| w.id.clone()).collect();
    let mut steps_of: HashMap<String, Vec<StepRow>> = HashMap::new();
    for s in bcm_db::workflows::steps_fetch_for_update_many_in_txn(tx, &locked).await? {
        steps_of.entry(s.workflow_id.clone()).or_default().push(s);
    }
    let mut node_ids: Vec<String> = workflows.iter().map(|w| w.node_id.clone()).collect();
    node_ids.sort();
    node_ids.dedup();
    let nodes: HashMap<String, Node> = bcm_db::nodes::nodes_fetch_many_in_txn(tx, &node_ids)
        .await?
        .into_iter()
        .map(|n| (n.id.to_string(), n))
        .collect();
    let running: Vec<String> = from
        .iter()
        .filter_map(|(w, i)| steps_of.get(w)?.iter().find(|s| s.idx == *i))
        .filter(|s| s.status == StepStatus::Running)
        .filter_map(|s| s.command_id.clone())
        .collect();
    writes.commands_read = bcm_db::commands::commands_fetch_many_in_txn(tx, &running)
        .await?
        .into_iter()
        .map(|c| (c.id.clone(), c))
        .collect();
    for wf in workflows {
        let Some(idx) = from.iter().find(|(w, _)| *w == wf.id).map(|(_, i)| *i) else {
            continue;
        };
        let steps = steps_of.remove(&wf.id).unwrap_or_default();
        let node = nodes
            .get(&wf.node_id)
            .cloned()
            .ok_or_else(|| DbError::Corrupt(format!("workflow {} has no node", wf.id)))?;
        drive_locked(tx, ctx, wf, steps, node, idx, writes).await?;
    }
    Ok(())
}

/// Advances each workflow of `targets` from its step inside `tx`, waiting
/// for their locks (taken in id order); what it writes goes into `writes`,
/// for the caller to flush before its commit.
pub async fn drive_many(
    tx: &mut Tx<'_>,
    ctx: &Ctx,
    targets: &[(String, i32)],
    writes: &mut Writes,
) -> Result<(), DbError> {
    // A workflow driven earlier in this transaction is read back as written.
    writes.flush_rows(tx).await?;
    let mut first: Vec<(String, i32)> = vec![];
    let mut again: Vec<(String, i32)> = vec![];
    for t in targets {
        if first.iter().any(|(w, _)| *w == t.0) {
            again.push(t.clone());
        } else {
            first.push(t.clone());
        }
    }
    let ids: Vec<String> = first.iter().map(|(w, _)| w.clone()).collect();
    let workflows = bcm_db::workflows::workflows_lock_many_in_txn(tx, &ids, Held::Wait).await?;
    advance_locked(tx, ctx, workflows, &first, writes).await?;
    for (wf, idx) in again {
        drive(tx, ctx, &wf, idx, writes).await?;
    }
    Ok(())
}

/// Advances workflow `wf_id` from its step `idx` inside `tx` (waiting for
/// its lock), then on through every step that becomes due at once; what it
/// writes goes into `writes`, for the caller to flush before its commit.
pub async fn drive(
    tx: &mut Tx<'_>,
    ctx: &Ctx,
    wf_id: &str,
    idx: i32,
    writes: &mut Writes,
) -> Result<(), DbError> {
    // A workflow driven earlier in this transaction is read back as written.
    writes.flush_rows(tx).await?;
    let wf = bcm_db::workflows::workflow_fetch_for_update_in_txn(tx, wf_id).await?;
    let steps = bcm_db::workflows::steps_fetch_for_update_in_txn(tx, &wf.id).await?;
    let node_id: bcm_core::NodeId = wf
        .node_id
        .parse()
        .map_err(|_| DbError::Corrupt(format!("node id {}", wf.node_id)))?;
    let node = bcm_db::nodes::node_fetch_in_txn(tx, &node_id).await?;
    drive_locked(tx, ctx, wf, steps, node, idx, writes).await
}

async fn drive_locked(
    tx: &mut Tx<'_>,
    ctx: &Ctx,
    mut wf: WorkflowRow,
    mut steps: Vec<StepRow>,
    mut node: Node,
    idx: i32,
    writes: &mut Writes,
) -> Result<(), DbError> {
    let stored = wf.clone();
    let stored_steps = steps.clone();
    let mut next = Some(idx);
    for _ in 0..MAX_STEPS_PER_TXN {
        let Some(idx) = next else { break };
        let span = step_span(&wf, &steps, idx);
        let (after, wrote_node) = step_once(tx, ctx, &mut wf, &mut steps, &node, idx, writes)
            .instrument(span)
            .await?;
        next = after;
        if wrote_node && next.is_some() {
            node = bcm_db::nodes::node_fetch_in_txn(tx, &node.id).await?;
        }
    }
    // Out of budget, a due step stays due for the next transaction.
    writes.steps.extend(
        steps
            .into_iter()
            .zip(stored_steps.iter())
            .filter(|(now, before)| now != *before)
            .map(|(now, _)| now),
    );
    if wf != stored {
        let finished = wf.status.is_final();
        writes.workflows.push((wf, finished));
    }
    Ok(())
}

/// The span of one pass over a workflow's step, a child of the trace the
/// workflow continues (the verb's): the commands and events it issues carry
/// it on.
fn step_span(wf: &WorkflowRow, steps: &[StepRow], idx: i32) -> tracing::Span {
    let name = steps
        .iter()
        .find(|s| s.idx == idx)
        .map(|s| s.name.as_str())
        .unwrap_or("?");
    let span = tracing::info_span!("workflow.step", node_id = %wf.node_id, workflow_id = %wf.id,
        step = idx, step_name = %name, for_state = %wf.for_state,
        command_kind = tracing::field::Empty, command_id = tracing::field::Empty);
    bcm_telemetry::set_remote_parent(&span, wf.traceparent.as_deref());
    span
}

/// How a step's attempt ended: its outcome, the output to keep, and
/// whether it proved a verified wipe.
struct Ended {
    outcome: StepOutcome,
    output: Option<serde_json::Value>,
    wipe_verified: bool,
}

impl Ended {
    fn succeeded(output: Option<serde_json::Value>) -> Self {
        Ended {
            outcome: StepOutcome::Succeeded,
            output,
            wipe_verified: false,
        }
    }

    fn failed(retryable: bool, message: impl Into<String>) -> Self {
        Ended {
            outcome: StepOutcome::Failed {
                retryable,
                message: message.into(),
            },
            output: None,
            wipe_verified: false,
        }
    }

    fn timed_out() -> Self {
        Ended {
            outcome: StepOutcome::TimedOut,
            output: None,
            wipe_verified: false,
        }
    }
}

/// Advances one step of a locked workflow. Returns the step that became due
/// at once (not yet persisted: the caller advances or persists it), and
/// whether the step wrote the node row.
async fn step_once(
    tx: &mut Tx<'_>,
    ctx: &Ctx,
    wf: &mut WorkflowRow,
    steps: &mut [StepRow],
    node: &Node,
    idx: i32,
    writes: &mut Writes,
) -> Result<(Option<i32>, bool), DbError> {
    let Some(pos) = steps.iter().position(|s| s.idx == idx) else {
        return Ok((None, false));
    };
    let now = Utc::now();
    if wf.status.is_final() {
        steps[pos].due_at = None;
        return Ok((None, false));
    }
    if wf.cancel_requested && wf.status == WorkflowPhase::Running {
        begin_cancel(wf, steps, now);
        return Ok((schedule_next(ctx, wf, steps, node, writes), false));
    }
    let def: StepDef = match <StepDef as serde::Deserialize>::deserialize(&steps[pos].definition) {
        Ok(def) => StepDef {
            timeout_secs: ctx.cfg.step_timeout_secs(&def),
            ..def
        },
        Err(e) => {
            // Written by a newer engine or damaged: retrying cannot help, so
            // the step fails for good (its workflow's cleanup still runs)
            // instead of failing every transaction that claims it.
            let message = format!("this engine cannot read the step's definition: {e}");
            tracing::warn!(workflow = %wf.id, step = idx, %message, "failing an unreadable step");
            give_up(ctx, wf, &mut steps[pos], node, message, now, writes);
            return Ok((schedule_next(ctx, wf, steps, node, writes), false));
        }
    };
    let wrote_node = def.kind.writes_node();
    let ended = if steps[pos].status == StepStatus::Pending {
        let at = At {
            ctx,
            wf,
            def: &def,
            node,
            now,
        };
        match start_attempt(tx, &at, &mut steps[pos], writes).await? {
            Started::Sent | Started::AwaitingApproval => None,
            Started::Ended(e) => Some(e),
            Started::InEngine => run_in_engine(tx, &at, steps, pos).await?,
        }
    } else {
        let at = At {
            ctx,
            wf,
            def: &def,
            node,
            now,
        };
        check_running(tx, &at, steps, pos, writes).await?
    };
    let Some(ended) = ended else {
        return Ok((None, wrote_node));
    };
    record_outcome(ctx, wf, &mut steps[pos], &def, node, ended, now, writes);
    if steps[pos].status == StepStatus::Pending {
        reopen_for_retry(wf, steps, pos);
    }
    if steps[pos].status == StepStatus::Skipped && !steps[pos].cleanup {
        skip_following(ctx, wf, steps, node, pos, now, writes);
    }
    let next = if !steps[pos].status.is_open() {
        schedule_next(ctx, wf, steps, node, writes)
    } else {
        None
    };
    Ok((next, wrote_node))
}

/// The definitions of the main steps, in order; `None` when one is
/// unreadable (such a step fails on its own when it is reached).
fn main_defs(steps: &[StepRow]) -> Option<Vec<StepDef>> {
    steps
        .iter()
        .filter(|s| !s.cleanup)
        .map(|s| <StepDef as serde::Deserialize>::deserialize(&s.definition).ok())
        .collect()
}

/// The kinds of the main steps, in order; `None` when one is unreadable.
fn main_kinds(steps: &[StepRow]) -> Option<Vec<StepKind>> {
    main_defs(steps).map(|d| d.into_iter().map(|d| d.kind).collect())
}

/// The optional main steps right after the skipped one at `pos`
/// (`workflow::skipped_after`: they follow from it) are skipped too.
fn skip_following(
    ctx: &Ctx,
    wf: &WorkflowRow,
    steps: &mut [StepRow],
    node: &Node,
    pos: usize,
    now: DateTime<Utc>,
    writes: &mut Writes,
) {
    let Some(main) = main_defs(steps) else {
        return;
    };
    let why = format!("skipped with {}", steps[pos].name);
    for i in workflow::skipped_after(&main, pos) {
        if steps[i].status.is_open() {
            skip(ctx, wf, &mut steps[i], node, Some(why.clone()), now, writes);
        }
    }
}

/// A main step at `pos` about to be retried: where the planner says the
/// retry starts (`workflow::retry_starts_at` — a power action that boots
/// the ramdisk starts again at its boot entry), the steps from there are
/// opened again, each with an attempt of its own (a new command, never the
/// old one's answer), and the retry's backoff moves to the first of them.
fn reopen_for_retry(wf: &WorkflowRow, steps: &mut [StepRow], pos: usize) {
    if steps[pos].cleanup {
        return;
    }
    let Some(main) = main_defs(steps) else {
        return;
    };
    let repeated = workflow::repeated_for_retry(&main, pos);
    let Some(&from) = repeated.first() else {
        return;
    };
    let retried = steps[pos].name.clone();
    tracing::info!(workflow = %wf.id, step = %retried, from = %steps[from].name, "a retried ramdisk boot starts again at its boot entry");
    let due = steps[pos].due_at.take();
    for i in repeated {
        let s = &mut steps[i];
        s.status = StepStatus::Pending;
        s.attempt += 1;
        s.command_id = None;
        s.deadline_at = None;
        s.due_at = None;
        s.finished_at = None;
        s.error = Some(format!("repeated: {retried} is retried"));
    }
    steps[from].due_at = due;
}

/// A cancel stops the main steps (a running command's late result is
/// ignored) and turns to the cleanup steps.
fn begin_cancel(wf: &mut WorkflowRow, steps: &mut [StepRow], now: DateTime<Utc>) {
    for s in steps
        .iter_mut()
        .filter(|s| !s.cleanup && s.status.is_open())
    {
        s.status = StepStatus::Skipped;
        s.due_at = None;
        s.finished_at = Some(now);
    }
    wf.status = WorkflowPhase::CancellingCleanup;
}

/// What every part of advancing one step reads: the engine, the step's
/// workflow and definition, its node, and the time the transaction acts at.
struct At<'a> {
    ctx: &'a Ctx,
    wf: &'a WorkflowRow,
    def: &'a StepDef,
    node: &'a Node,
    now: DateTime<Utc>,
}

/// What starting an attempt came to.
enum Started {
    /// Its command is recorded; the step waits for the result.
    Sent,
    /// A step the engine runs itself: run it now.
    InEngine,
    /// It could not start (its command cannot be built, or no approved
    /// batch allows it).
    Ended(Ended),
    /// Its destructive command waits for its batch's approval: the step
    /// stays pending and is looked at again.
    AwaitingApproval,
}

/// How often a step waiting for its batch's approval looks again.
const APPROVAL_POLL: chrono::Duration = chrono::Duration::seconds(2);

/// The authority a destructive step's command carries: its node's batch,
/// approved, with the node's proof. A main step waits while the batch
/// awaits approval; a cleanup step never waits (nothing destructive ran
/// without approval, so there is nothing to undo by force).
async fn authority_for(
    tx: &mut Tx<'_>,
    node: &Node,
    cleanup: bool,
) -> Result<Result<bcm_contracts::batch::BatchAuthority, Started>, DbError> {
    use bcm_db::batches::AuthorityState;
    let Some(batch) = &node.batch_id else {
        return Ok(Err(Started::Ended(Ended::failed(
            false,
            format!(
                "FORBIDDEN: no approved batch covers node {}: a verb must start its chain",
                node.id
            ),
        ))));
    };
    Ok(
        match bcm_db::batches::authority_in_txn(tx, batch, &node.id.to_string()).await? {
            AuthorityState::Ready(a) => Ok(*a),
            AuthorityState::Awaiting { .. } if !cleanup => Err(Started::AwaitingApproval),
            AuthorityState::Awaiting { .. } => Err(Started::Ended(Ended::failed(
                false,
                format!("FORBIDDEN: batch {batch} was never approved"),
            ))),
            AuthorityState::Refused(why) => Err(Started::Ended(Ended::failed(
                false,
                format!("FORBIDDEN: {why}"),
            ))),
        },
    )
}

/// Starts a pending step's attempt: a step that sends a command records it
/// (and queues a site command's message) and waits for its result.
async fn start_attempt(
    tx: &mut Tx<'_>,
    at: &At<'_>,
    step: &mut StepRow,
    writes: &mut Writes,
) -> Result<Started, DbError> {
    let At {
        ctx,
        wf,
        def,
        node,
        now,
    } = *at;
    let authority = if def.kind.destructive() {
        match authority_for(tx, node, step.cleanup).await? {
            Ok(a) => Some(a),
            Err(Started::AwaitingApproval) => {
                step.due_at = Some(now + APPROVAL_POLL);
                return Ok(Started::AwaitingApproval);
            }
            Err(other) => return Ok(other),
        }
    } else {
        None
    };
    step.status = StepStatus::Running;
    step.attempt = step.attempt.max(1);
    step.started_at = Some(now);
    if def.optional && def.kind.target() == StepTarget::Node {
        // Nobody to ask: an optional ask of the installed OS ends at once
        // rather than wait out its time.
        let purpose = installed_os_purpose(node);
        let silence = chrono::Duration::milliseconds(ctx.cfg.installed_os_silence_ms as i64);
        let heard =
            bcm_db::agents::session_newest_in_txn(tx, &node.id.to_string(), purpose.as_str())
                .await?
                .map(|(_, alive_until)| alive_until.max(ctx.heard_since()));
        if heard.is_none_or(|h| now - h > silence) {
            let why = match heard {
                None => format!("the installed OS's agent has no {purpose} session"),
                // An idle OS in a large fleet beats only every few
                // minutes (the API's fleet-sized idle cadence).
                Some(_) => format!(
                    "the installed OS's agent was not heard in the last {} s",
                    silence.num_seconds()
                ),
            };
            return Ok(Started::Ended(Ended::failed(false, why)));
        }
    }
    step.deadline_at = Some(now + chrono::Duration::seconds(i64::from(def.timeout_secs)));
    let command = match commands::command_for(tx, &ctx.cfg, node, &def.kind).await {
        Ok(Some(c)) => c,
        Ok(None) => return Ok(Started::InEngine),
        Err(commands::ParamsError::Db(e)) => return Err(e),
        Err(commands::ParamsError::Invalid(message)) => {
            return Ok(Started::Ended(Ended::failed(false, message)))
        }
    };
    let cmd_id = bcm_core::CommandId::generate().to_string();
    writes
        .observed
        .0
        .push(Observation::CommandIssued(command.kind().as_str()));
    let span = tracing::Span::current();
    span.record("command_kind", command.kind().as_str());
    span.record("command_id", cmd_id.as_str());
    writes.commands.push(bcm_db::commands::NewCommand {
        id: cmd_id.clone(),
        idempotency_key: format!("{}/{}/{}", wf.id, step.idx, step.attempt),
        workflow_id: Some(wf.id.clone()),
        step_idx: Some(step.idx),
        attempt: step.attempt,
        node_id: Some(node.id.to_string()),
        site_id: Some(node.site_id.to_string()),
        kind: command.kind().as_str().to_owned(),
        target: def.kind.target().as_str().to_owned(),
        params: command.params_json(),
        actor: wf.actor.clone(),
        // The step's span: an agent polling it continues the trace.
        traceparent: bcm_bus::current_traceparent(),
        batch_id: authority.as_ref().map(|a| a.header.batch_id.clone()),
    });
    if def.kind.target() == StepTarget::Site {
        let envelope = CommandEnvelope {
            command_id: cmd_id.clone(),
            site_id: node.site_id.clone(),
            node_id: Some(node.id),
            command,
            issued_at: now,
            // The site refuses it once the engine stopped waiting for it.
            deadline: step.deadline_at,
            authority,
        };
        writes
            .events
            .push(outbox::command(ctx.bus.subjects(), node, &envelope));
    }
    step.command_id = Some(cmd_id);
    step.due_at = step.deadline_at;
    if matches!(def.kind.target(), StepTarget::Ramdisk | StepTarget::Node) {
        // Looked at again when the agent would have been silent too long
        // (its requests move that later; see `check_agent_alive`).
        let silence_ms = match def.kind.target() {
            StepTarget::Node => ctx.cfg.installed_os_silence_ms,
            _ => ctx.cfg.agent_silence_ms,
        };
        let watch = now + chrono::Duration::milliseconds(silence_ms as i64);
        step.due_at = step.due_at.map(|d| d.min(watch)).or(Some(watch));
    }
    Ok(Started::Sent)
}

/// Looks at a running step again: a join it waits for, or its command's
/// result.
async fn check_running(
    tx: &mut Tx<'_>,
    at: &At<'_>,
    steps: &mut [StepRow],
    pos: usize,
    writes: &mut Writes,
) -> Result<Option<Ended>, DbError> {
    match at.def.kind.target() {
        // A join it waits for; or an engine step found running (those end
        // in the transaction that starts them, so only damage leaves one):
        // run it again (each is idempotent).
        StepTarget::ControlPlane => run_in_engine(tx, at, steps, pos).await,
        StepTarget::Site => {
            let command_id = steps[pos].command_id.clone().unwrap_or_default();
            match check_command(tx, &at.def.kind, &mut steps[pos], at.now, writes).await? {
                Some(e) => record_site_result(tx, at, &command_id, e, writes)
                    .await
                    .map(Some),
                None => Ok(None),
            }
        }
        target @ (StepTarget::Ramdisk | StepTarget::Node) => {
            let ended = check_command(tx, &at.def.kind, &mut steps[pos], at.now, writes).await?;
            match ended {
                Some(ended) => Ok(Some(ended)),
                None => check_agent_alive(tx, at, target, &mut steps[pos]).await,
            }
        }
    }
}

/// What a succeeded site result still writes before its step counts as
/// done: a dedicated teardown's rotated credentials (a result without
/// usable ones is retried with the same teardown password), the firmware
/// recorded at commissioning or compared at a teardown (a change fails the
/// step for good).
async fn record_site_result(
    tx: &mut Tx<'_>,
    at: &At<'_>,
    command_id: &str,
    ended: Ended,
    writes: &mut Writes,
) -> Result<Ended, DbError> {
    if ended.outcome != StepOutcome::Succeeded {
        return Ok(ended);
    }
    let output = ended.output.as_ref();
    let refused = match at.def.kind {
        StepKind::RotateBmcPassword => crate::rotation::commit_teardown(
            tx,
            at.ctx,
            at.node,
            command_id,
            output,
            &mut writes.events,
        )
        .await?
        .err()
        .map(|message| (true, message)),
        StepKind::BmcFirmware { check } => firmware_step(tx, at.node, check, output)
            .await?
            .err()
            .map(|message| (false, message)),
        _ => None,
    };
    Ok(match refused {
        None => ended,
        Some((retryable, message)) => Ended {
            outcome: StepOutcome::Failed { retryable, message },
            ..ended
        },
    })
}

/// Runs a step the engine itself carries out, in its transaction.
async fn run_in_engine(
    tx: &mut Tx<'_>,
    at: &At<'_>,
    steps: &mut [StepRow],
    pos: usize,
) -> Result<Option<Ended>, DbError> {
    let node = at.node;
    match &at.def.kind {
        StepKind::StoreMacs => store_macs(tx, steps, node).await.map(Some),
        StepKind::StoreInventory => store_inventory(tx, steps, node).await.map(Some),
        StepKind::RevokeIdentity => {
            let n = bcm_metal::identity::revoke_in_txn(tx, &node.id.to_string()).await?;
            Ok(Some(Ended::succeeded(Some(
                serde_json::json!({ "revokedCerts": n }),
            ))))
        }
        StepKind::ForgetBmcCredentials => {
            bcm_db::nodes::node_forget_bmc_secret_in_txn(tx, &node.id.to_string()).await?;
            Ok(Some(Ended::succeeded(None)))
        }
        StepKind::RetiredEnsureRamdisk => Ok(Some(Ended::failed(
            false,
            "metal.ensureRamdisk is a step of profile v1, which no site service \
             executes any more; recover the node to run this state with v2",
        ))),
        StepKind::WaitRamdiskJoin | StepKind::WaitOsJoin { .. } | StepKind::WaitOsBack { .. } => {
            check_join(tx, at, steps, pos).await
        }
        other => Ok(Some(Ended::failed(
            false,
            format!(
                "{} is not a step the engine runs itself",
                other.command_kind()
            ),
        ))),
    }
}

/// `store-macs`: the MACs the out-of-band inspection found become the
/// node's PXE MACs (IPMI cannot see the host's NICs: then the MACs given at
/// enroll stand).
async fn store_macs(tx: &mut Tx<'_>, steps: &[StepRow], node: &Node) -> Result<Ended, DbError> {
    let inspected = steps
        .iter()
        .filter(|s| s.name == "inspect-oob")
        .filter_map(|s| s.output.as_ref())
        .find_map(|o| match Output::decode(CommandKind::BmcInspect, o) {
            Ok(Output::BmcInspect(i)) => Some(i.macs),
            _ => None,
        })
        .unwrap_or_default();
    let macs = if inspected.is_empty() {
        node.macs.clone()
    } else {
        inspected
    };
    if macs.is_empty() {
        return Ok(Ended::failed(
            false,
            "out-of-band inspection found no PXE MAC and none was given at enroll",
        ));
    }
    let held =
        bcm_db::nodes::mac_holders_in_txn(tx, node.site_id.as_str(), &node.id.to_string(), &macs)
            .await?;
    if !held.is_empty() {
        let list: Vec<String> = held.iter().map(|(m, n)| format!("{m} ({n})")).collect();
        return Ok(Ended::failed(
            false,
            format!(
                "CONFLICT: MACs already held by another node of site {}: {}; a MAC is unique within a site",
                node.site_id,
                list.join(", ")
            ),
        ));
    }
    bcm_db::nodes::node_set_macs_in_txn(tx, &node.id.to_string(), &macs).await?;
    Ok(Ended::succeeded(Some(serde_json::json!({ "macs": macs }))))
}

/// The node fact commissioning's firmware versions are kept in.
const FIRMWARE_FACT: &str = "firmware";

/// `record-firmware` (`check` false) keeps the versions the BMC reported;
/// `check-firmware` compares them with the kept ones: a change is the
/// step's failure (`FIRMWARE_CHANGED: …`), for an operator to look at.
async fn firmware_step(
    tx: &mut Tx<'_>,
    node: &Node,
    check: bool,
    output: Option<&serde_json::Value>,
) -> Result<Result<(), String>, DbError> {
    let now = match output.map(|o| Output::decode(CommandKind::BmcInspect, o)) {
        Some(Ok(Output::BmcInspect(i))) => bcm_core::dedicated::Firmware {
            bios: i.bios_version,
            bmc: i.bmc_firmware,
        },
        _ => return Ok(Err("the BMC's inspection does not read".to_owned())),
    };
    let id = node.id.to_string();
    if !check {
        let value = serde_json::to_value(&now).unwrap_or_default();
        bcm_db::agents::node_fact_upsert_in_txn(tx, &id, FIRMWARE_FACT, &value).await?;
        return Ok(Ok(()));
    }
    let recorded = match bcm_db::agents::node_fact_fetch_in_txn(tx, &id, FIRMWARE_FACT).await? {
        Some(v) => serde_json::from_value::<bcm_core::dedicated::Firmware>(v).unwrap_or_default(),
        None => {
            tracing::warn!(node = %node.id, "no firmware recorded at commissioning: nothing to compare");
            return Ok(Ok(()));
        }
    };
    let changes = bcm_core::dedicated::firmware_changes(&recorded, &now);
    if changes.is_empty() {
        Ok(Ok(()))
    } else {
        Ok(Err(format!(
            "FIRMWARE_CHANGED: {} since commissioning; an operator must look at the machine before it is leased again",
            changes.join(", ")
        )))
    }
}

/// `store-inventory`: the out-of-band inspection (`inspect-oob`) becomes
/// the agentless node's recorded inventory, which its erases must account
/// for.
async fn store_inventory(
    tx: &mut Tx<'_>,
    steps: &[StepRow],
    node: &Node,
) -> Result<Ended, DbError> {
    let inspected = steps
        .iter()
        .filter(|s| s.name == "inspect-oob")
        .filter_map(|s| s.output.as_ref())
        .find(|o| Output::decode(CommandKind::BmcInspect, o).is_ok());
    let Some(inventory) = inspected else {
        return Ok(Ended::failed(
            false,
            "no out-of-band inspection to record (inspect-oob has no readable output)",
        ));
    };
    bcm_db::agents::node_fact_upsert_in_txn(
        tx,
        &node.id.to_string(),
        commands::OOB_INVENTORY_FACT,
        inventory,
    )
    .await?;
    Ok(Ended::succeeded(None))
}

/// A step waiting for an agent to join: done once the agent of the
/// purpose (and role) has joined or reported in since the workflow started
/// — for a ramdisk, since its boot entry's command (the token it joins
/// with) was last made (a ramdisk may join while the power-on step is still
/// finishing) —
/// timed out past the deadline, else looked at again after the join poll.
async fn check_join(
    tx: &mut Tx<'_>,
    at: &At<'_>,
    steps: &mut [StepRow],
    pos: usize,
) -> Result<Option<Ended>, DbError> {
    let At {
        ctx,
        wf,
        def,
        node,
        now,
    } = *at;
    // A join, of the purpose and role the step waits for; unrescue's kept
    // OS is heard by any request of its identity (the API writes a
    // heartbeat only for an identity in force).
    let (fact, role, heard) = match &def.kind {
        StepKind::WaitOsJoin { role, .. } => ("agent:provisioned", Some(role.as_str()), None),
        StepKind::WaitOsBack { role, .. } => (
            "agent:provisioned",
            Some(role.as_str()),
            Some("heartbeat:provisioned"),
        ),
        _ => ("agent:discovery", None, None),
    };
    // Both sides on the database's clock: the join's fact is stamped by
    // Postgres, and so are the workflow and the boot entry's command.
    let mut since = wf.created_at;
    if def.kind == StepKind::WaitRamdiskJoin {
        let entry = main_kinds(steps).and_then(|main| workflow::join_counts_since_step(&main, pos));
        if let Some(cmd_id) = entry.and_then(|i| steps[i].command_id.clone()) {
            let entry_cmd = bcm_db::commands::command_fetch_in_txn(tx, &cmd_id).await?;
            since = since.max(entry_cmd.created_at);
        }
    }
    let step = &mut steps[pos];
    let stored =
        bcm_db::agents::node_fact_since_in_txn(tx, &node.id.to_string(), fact, since).await?;
    let presence = match AgentPresence::from_stored(stored) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(workflow = %wf.id, node = %node.id, error = %e, "an agent presence this engine cannot read; waiting");
            None
        }
    };
    if presence.is_some_and(|p| p.is_join_of(role)) {
        return Ok(Some(Ended::succeeded(None)));
    }
    if let Some(heard) = heard {
        let beat =
            bcm_db::agents::node_fact_since_in_txn(tx, &node.id.to_string(), heard, since).await?;
        if let Ok(Some(p)) = AgentPresence::from_stored(beat) {
            if role.is_none_or(|r| p.role.as_str() == r) {
                return Ok(Some(Ended::succeeded(None)));
            }
        }
    }
    if step.deadline_at.is_some_and(|d| now >= d) {
        return Ok(Some(Ended::timed_out()));
    }
    step.due_at = Some(now + chrono::Duration::milliseconds(ctx.cfg.join_poll_ms as i64));
    Ok(None)
}

/// A step waiting for its command's result: judged once the result is in,
/// timed out past the deadline, else left waiting until the deadline (the
/// result wakes it).
async fn check_command(
    tx: &mut Tx<'_>,
    kind: &StepKind,
    step: &mut StepRow,
    now: DateTime<Utc>,
    writes: &mut Writes,
) -> Result<Option<Ended>, DbError> {
    let Some(cmd_id) = step.command_id.clone() else {
        return Ok(Some(Ended::failed(true, "no command recorded")));
    };
    let cmd = match writes.commands_read.remove(&cmd_id) {
        Some(c) => c,
        None => bcm_db::commands::command_fetch_in_txn(tx, &cmd_id).await?,
    };
    if !cmd.status.is_done() {
        if step.deadline_at.is_some_and(|d| now >= d) {
            return Ok(Some(Ended::timed_out()));
        }
        step.due_at = step.deadline_at;
        return Ok(None);
    }
    let wipe = CommandKind::parse(&cmd.kind)
        .ok()
        .filter(|k| commands::inventory_fact(*k).is_some());
    let recorded = match (&cmd.node_id, wipe) {
        (Some(node), Some(kind)) if cmd.status == bcm_core::workflow::CommandStatus::Succeeded => {
            commands::recorded_disks(tx, node, kind).await?
        }
        _ => None,
    };
    let verdict = commands::judge(&cmd, kind, recorded.as_deref());
    Ok(Some(Ended {
        outcome: verdict.outcome,
        output: verdict.output,
        wipe_verified: verdict.wipe_verified,
    }))
}

/// A step waiting on an agent's result (the ramdisk's, or an adopted OS's): failed (retryably) once the
/// agent has been silent longer than `agent_silence_ms` — no poll, heartbeat
/// or result, and no long poll held open, counted from the engine's start,
/// the end of a database outage, or the API's last turning an agent away
/// unheard at the earliest — else looked at again when that
/// would be (any request of the agent moves it later; a heartbeat also
/// wakes the step).
async fn check_agent_alive(
    tx: &mut Tx<'_>,
    at: &At<'_>,
    target: StepTarget,
    step: &mut StepRow,
) -> Result<Option<Ended>, DbError> {
    let (purpose, who, silence_ms) = match target {
        StepTarget::Node => (
            installed_os_purpose(at.node),
            "the installed OS's agent",
            at.ctx.cfg.installed_os_silence_ms,
        ),
        _ => (
            AgentPurpose::Discovery,
            "the ramdisk agent",
            at.ctx.cfg.agent_silence_ms,
        ),
    };
    let Some((serial, alive_until)) =
        bcm_db::agents::session_newest_in_txn(tx, &at.node.id.to_string(), purpose.as_str())
            .await?
    else {
        // No live session of that agent at all: the deadline decides.
        return Ok(None);
    };
    let silence = chrono::Duration::milliseconds(silence_ms as i64);
    // Heard until the engine's own last outage, and until the API last
    // turned an agent away unheard (its agent pool exhausted): the control
    // plane's own trouble never makes a live agent look silent.
    let turned_away = bcm_db::agents::turnaway_last_in_txn(tx).await?;
    let alive_until = alive_until
        .max(at.ctx.heard_since())
        .max(turned_away.unwrap_or(alive_until));
    let silent_for = at.now - alive_until;
    if silent_for > silence {
        metrics::counter!("bcm_workflow_agent_silent_total", "step" => step.name.clone())
            .increment(1);
        return Ok(Some(Ended::failed(
            true,
            format!(
                "{who} (session of certificate {serial}) has been silent for {}s (no poll, heartbeat or result); command {} is unanswered",
                silent_for.num_seconds(),
                step.command_id.as_deref().unwrap_or("?"),
            ),
        )));
    }
    let check_at = alive_until + silence + chrono::Duration::milliseconds(100);
    step.due_at = match step.deadline_at {
        Some(d) if d < check_at => Some(d),
        _ => Some(check_at),
    };
    Ok(None)
}

/// The purpose of the identity a node's installed OS holds: an adopted
/// machine's own (`node`), or the one a deploy gave it (`provisioned`).
fn installed_os_purpose(node: &Node) -> AgentPurpose {
    if node.is_adopted() {
        AgentPurpose::Node
    } else {
        AgentPurpose::Provisioned
    }
}

/// Applies the planner's answer to an ended attempt: done, retried after a
/// backoff, or failed for good.
#[allow(clippy::too_many_arguments)]
fn record_outcome(
    ctx: &Ctx,
    wf: &mut WorkflowRow,
    step: &mut StepRow,
    def: &StepDef,
    node: &Node,
    ended: Ended,
    now: DateTime<Utc>,
    writes: &mut Writes,
) {
    let attempt = step.attempt.max(1) as u32;
    let jitter: f64 = rand::thread_rng().gen_range(0.0..1.0);
    step.output = ended.output.or(step.output.take());
    match workflow::after_outcome(def, attempt, &ended.outcome, jitter) {
        AfterOutcome::Done => {
            if ended.wipe_verified {
                wf.wipe_verified = true;
            }
            end_step(
                ctx,
                wf,
                step,
                node,
                StepStatus::Succeeded,
                None,
                now,
                writes,
            );
        }
        AfterOutcome::Retry { attempt, after_ms } => {
            tracing::info!(workflow = %wf.id, step = %step.name, attempt, after_ms, "retrying step");
            step.status = StepStatus::Pending;
            step.attempt = attempt as i32;
            step.command_id = None;
            step.deadline_at = None;
            step.error = Some(format!("{:?}", ended.outcome));
            step.due_at = Some(now + chrono::Duration::milliseconds(after_ms as i64));
        }
        AfterOutcome::GiveUp { message } => give_up(ctx, wf, step, node, message, now, writes),
        AfterOutcome::Skip { message } => {
            tracing::info!(workflow = %wf.id, step = %step.name, %message, "skipping an optional step");
            skip(ctx, wf, step, node, Some(message), now, writes);
        }
    }
}

/// Ends an optional step as skipped (the workflow goes on without it),
/// with why.
fn skip(
    ctx: &Ctx,
    wf: &WorkflowRow,
    step: &mut StepRow,
    node: &Node,
    why: Option<String>,
    now: DateTime<Utc>,
    writes: &mut Writes,
) {
    end_step(ctx, wf, step, node, StepStatus::Skipped, why, now, writes);
}

/// Ends a step in `status` with `error`: counted, and its
/// `workflow.step.<status>` event queued.
#[allow(clippy::too_many_arguments)]
fn end_step(
    ctx: &Ctx,
    wf: &WorkflowRow,
    step: &mut StepRow,
    node: &Node,
    status: StepStatus,
    error: Option<String>,
    now: DateTime<Utc>,
    writes: &mut Writes,
) {
    step.status = status;
    step.error = error;
    step.due_at = None;
    step.finished_at = Some(now);
    step_ended(writes, step);
    writes
        .events
        .push(step_event(ctx.bus.subjects(), wf, node, step));
}

/// Fails a step for good; the first main step to fail names the
/// workflow's error.
fn give_up(
    ctx: &Ctx,
    wf: &mut WorkflowRow,
    step: &mut StepRow,
    node: &Node,
    message: String,
    now: DateTime<Utc>,
    writes: &mut Writes,
) {
    if !step.cleanup && wf.error.is_none() {
        wf.error = Some(format!("{}: {message}", step.name));
    }
    end_step(
        ctx,
        wf,
        step,
        node,
        StepStatus::Failed,
        Some(message),
        now,
        writes,
    );
}

/// Counts a step's last attempt (its start to its end) once committed.
fn step_ended(writes: &mut Writes, step: &StepRow) {
    if let (Some(started), Some(finished)) = (step.started_at, step.finished_at) {
        writes.observed.0.push(Observation::StepEnded {
            step: step.name.clone(),
            status: step.status.as_str(),
            secs: (finished - started).num_milliseconds().max(0) as f64 / 1e3,
        });
    }
}

/// The kind of a workflow's profile for a metric label: the built-in
/// profiles by name (`metal-enroll`, …); a tenant's deploy profile (any
/// name) as `deploy`, so labels do not grow with tenants' catalogs.
fn profile_kind(profile_id: &str) -> &str {
    if profile_id.starts_with("metal-") {
        profile_id
    } else {
        "deploy"
    }
}

/// `workflow.step.<status>` of a step that just ended.
fn step_event(
    subjects: &bcm_bus::Subjects,
    wf: &WorkflowRow,
    node: &Node,
    step: &StepRow,
) -> bcm_db::outbox::NewOutboxMessage {
    outbox::event(
        subjects,
        node,
        StepFinished {
            workflow_id: wf.id.clone(),
            node_id: node.id,
            tenant_id: node.tenant_id.clone(),
            profile_id: wf.profile_id.clone(),
            step: step.name.clone(),
            attempt: step.attempt,
            status: step.status,
            error: step.error.clone(),
        },
    )
}

/// Schedules the planner's next step (returned, due now, for the caller to
/// advance or persist), or ends the workflow.
fn schedule_next(
    ctx: &Ctx,
    wf: &mut WorkflowRow,
    steps: &mut [StepRow],
    node: &Node,
    writes: &mut Writes,
) -> Option<i32> {
    let main: Vec<StepStatus> = steps
        .iter()
        .filter(|s| !s.cleanup)
        .map(|s| s.status)
        .collect();
    let cleanup: Vec<StepStatus> = steps
        .iter()
        .filter(|s| s.cleanup)
        .map(|s| s.status)
        .collect();
    let main_len = main.len();
    let mut phase = wf.status;
    if phase == WorkflowPhase::Running && main.contains(&StepStatus::Failed) {
        phase = WorkflowPhase::FailingCleanup;
    }
    let pos = match workflow::next_step(phase, &main, &cleanup) {
        NextStep::Main(i) => i,
        NextStep::Cleanup(i) => main_len + i,
        NextStep::Finish(done) => {
            finish(ctx, wf, node, done, writes);
            return None;
        }
    };
    wf.status = phase;
    let step = &mut steps[pos];
    step.due_at = Some(Utc::now());
    Some(step.idx)
}

/// Ends a workflow: `workflow.<status>` and a reconcile request, so the
/// reconciler applies the state's move.
fn finish(ctx: &Ctx, wf: &mut WorkflowRow, node: &Node, done: WorkflowPhase, writes: &mut Writes) {
    wf.status = done;
    let events = &mut writes.events;
    events.push(outbox::event(
        ctx.bus.subjects(),
        node,
        WorkflowFinished {
            workflow_id: wf.id.clone(),
            node_id: node.id,
            tenant_id: node.tenant_id.clone(),
            profile_id: wf.profile_id.clone(),
            status: done,
            error: wf.error.clone(),
        },
    ));
    events.push(outbox::reconcile(
        ctx.bus.subjects(),
        node,
        &format!("workflow {}", done.as_str()),
    ));
    writes.observed.0.push(Observation::WorkflowEnded {
        profile: profile_kind(&wf.profile_id).to_owned(),
        status: done.as_str(),
        secs: (Utc::now() - wf.created_at).num_milliseconds().max(0) as f64 / 1e3,
    });
}
