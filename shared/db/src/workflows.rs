//! Workflows and their steps. The engine claims due steps with
//! `FOR UPDATE SKIP LOCKED`, so several engines share the work and a step is
//! handled by one of them at a time; every change is persisted before the
//! next step runs, so a restarted engine resumes where the last one stopped.

use bcm_core::workflow::{StepStatus, WorkflowPhase};
use chrono::{DateTime, Utc};

use crate::{Db, DbError, Tx};

/// The channel that wakes engines when a step becomes due.
pub const NOTIFY_CHANNEL: &str = "bcm_workflow";

/// A workflow to create.
#[derive(Debug, Clone)]
pub struct NewWorkflow {
    pub id: String,
    pub node_id: String,
    pub owner: String,
    pub profile_id: String,
    pub profile_version: i32,
    pub for_state: String,
    pub for_version: i64,
    pub definition: serde_json::Value,
    pub steps: Vec<NewStep>,
    /// The principal whose verb started the state it runs.
    pub actor: Option<String>,
    /// The W3C trace context its steps' spans continue (the verb's trace).
    pub traceparent: Option<String>,
}

/// A step to create.
#[derive(Debug, Clone)]
pub struct NewStep {
    pub name: String,
    pub target: String,
    pub cleanup: bool,
    pub definition: serde_json::Value,
}

/// A stored workflow.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct WorkflowRow {
    pub id: String,
    pub node_id: String,
    pub owner: String,
    pub profile_id: String,
    pub profile_version: i32,
    pub for_state: String,
    pub for_version: i64,
    /// An unknown stored status fails the read ([`DbError::Corrupt`]).
    #[sqlx(try_from = "String")]
    pub status: WorkflowPhase,
    pub error: Option<String>,
    pub cancel_requested: bool,
    pub wipe_verified: bool,
    // Its `definition` (the whole profile, every step's definition with
    // it) is written for the record and never read back here: every lock
    // of a workflow would decode it, and its steps carry their own.
    pub created_at: DateTime<Utc>,
    /// The principal whose verb started the state it runs.
    pub actor: Option<String>,
    /// The W3C trace context its steps' spans continue (the verb's trace).
    pub traceparent: Option<String>,
}

impl WorkflowRow {
    /// The workflow as the reconciler's decision takes it.
    pub fn summary(&self) -> bcm_core::reconcile::WorkflowSummary {
        bcm_core::reconcile::WorkflowSummary {
            profile_id: self.profile_id.clone(),
            phase: self.status,
            wipe_verified: self.wipe_verified,
            error: self.error.clone(),
        }
    }
}

/// A stored step.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StepRow {
    pub workflow_id: String,
    pub idx: i32,
    pub name: String,
    pub target: String,
    pub cleanup: bool,
    /// An unknown stored status fails the read ([`DbError::Corrupt`]):
    /// read as `pending` it would run the step again.
    #[sqlx(try_from = "String")]
    pub status: StepStatus,
    pub attempt: i32,
    pub output: Option<serde_json::Value>,
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub due_at: Option<DateTime<Utc>>,
    pub deadline_at: Option<DateTime<Utc>>,
    pub command_id: Option<String>,
    pub definition: serde_json::Value,
}

const WF_COLUMNS: &str =
    "id, node_id, owner, profile_id, profile_version, for_state, for_version, status, error, \
    cancel_requested, wipe_verified, created_at, actor, traceparent";
const STEP_COLUMNS: &str =
    "workflow_id, idx, name, target, cleanup, status, attempt, output, error, started_at, \
    finished_at, due_at, deadline_at, command_id, definition";

/// Creates a workflow and its steps; the first main step is due at once.
/// A second workflow for the same node state entry is [`DbError::Duplicate`].
pub async fn workflow_insert_in_txn(tx: &mut Tx<'_>, w: &NewWorkflow) -> Result<(), DbError> {
    let idx: Vec<i32> = (0..w.steps.len() as i32).collect();
    let names: Vec<&str> = w.steps.iter().map(|s| s.name.as_str()).collect();
    let targets: Vec<&str> = w.steps.iter().map(|s| s.target.as_str()).collect();
    let cleanup: Vec<bool> = w.steps.iter().map(|s| s.cleanup).collect();
    let defs: Vec<serde_json::Value> = w.steps.iter().map(|s| s.definition.clone()).collect();
    // The workflow and every step in one round trip; the first main step is
    // due at once and its notification wakes the engines on commit.
    sqlx::query(
        "WITH wf AS (INSERT INTO workflows (id, node_id, owner, profile_id, profile_version, for_state, for_version, status, definition, actor, traceparent) \
           VALUES ($1, $8, $9, $10, $11, $12, $13, 'running', $14, $15, $16)), \
         rows AS (INSERT INTO workflow_steps (workflow_id, idx, name, target, cleanup, status, definition, due_at) \
         SELECT $1, idx, name, target, cleanup, 'pending', definition, \
                CASE WHEN idx = (SELECT min(i) FROM unnest($2::int[], $5::bool[]) AS f(i, c) WHERE NOT c) THEN now() END \
         FROM unnest($2::int[], $3::text[], $4::text[], $5::bool[], $6::jsonb[]) AS t(idx, name, target, cleanup, definition) \
         RETURNING 1) \
         SELECT pg_notify($7, '') FROM (SELECT count(*) FROM rows) AS c",
    )
    .bind(&w.id)
    .bind(&idx)
    .bind(&names)
    .bind(&targets)
    .bind(&cleanup)
    .bind(&defs)
    .bind(NOTIFY_CHANNEL)
    .bind(&w.node_id)
    .bind(&w.owner)
    .bind(&w.profile_id)
    .bind(w.profile_version)
    .bind(&w.for_state)
    .bind(w.for_version)
    .bind(&w.definition)
    .bind(&w.actor)
    .bind(&w.traceparent)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn notify_in_txn(tx: &mut Tx<'_>) -> Result<(), DbError> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(NOTIFY_CHANNEL)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Whether a read locks what it reads for the rest of the transaction.
#[derive(Clone, Copy)]
enum Lock {
    No,
    ForUpdate,
}

impl Lock {
    fn suffix(self) -> &'static str {
        match self {
            Lock::No => "",
            Lock::ForUpdate => " FOR UPDATE",
        }
    }
}

async fn workflow_by_id<'e>(
    e: impl sqlx::PgExecutor<'e>,
    id: &str,
    lock: Lock,
) -> Result<WorkflowRow, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {WF_COLUMNS} FROM workflows WHERE id = $1{}",
        lock.suffix()
    ))
    .bind(id)
    .fetch_one(e)
    .await?)
}

async fn steps_of<'e>(
    e: impl sqlx::PgExecutor<'e>,
    workflow_id: &str,
    lock: Lock,
) -> Result<Vec<StepRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {STEP_COLUMNS} FROM workflow_steps WHERE workflow_id = $1 ORDER BY idx{}",
        lock.suffix()
    ))
    .bind(workflow_id)
    .fetch_all(e)
    .await?)
}

/// Reads a workflow.
pub async fn workflow_fetch(db: &Db, id: &str) -> Result<WorkflowRow, DbError> {
    workflow_by_id(db.pool(), id, Lock::No).await
}

/// Reads a workflow in a transaction without locking it.
pub async fn workflow_fetch_in_txn(tx: &mut Tx<'_>, id: &str) -> Result<WorkflowRow, DbError> {
    workflow_by_id(&mut **tx, id, Lock::No).await
}

/// Reads and locks a workflow.
pub async fn workflow_fetch_for_update_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
) -> Result<WorkflowRow, DbError> {
    workflow_by_id(&mut **tx, id, Lock::ForUpdate).await
}

/// Every step of a workflow in order, locked for the transaction: a
/// concurrent wake-up waits for the commit instead of being overwritten.
pub async fn steps_fetch_for_update_in_txn(
    tx: &mut Tx<'_>,
    workflow_id: &str,
) -> Result<Vec<StepRow>, DbError> {
    steps_of(&mut **tx, workflow_id, Lock::ForUpdate).await
}

/// Every step of a workflow in order.
pub async fn steps_fetch_in_txn(
    tx: &mut Tx<'_>,
    workflow_id: &str,
) -> Result<Vec<StepRow>, DbError> {
    steps_of(&mut **tx, workflow_id, Lock::No).await
}

/// Every step of a workflow in order.
pub async fn steps_fetch(db: &Db, workflow_id: &str) -> Result<Vec<StepRow>, DbError> {
    steps_of(db.pool(), workflow_id, Lock::No).await
}

/// Claims up to `limit` due steps of distinct workflows, locked for the
/// transaction; others skip them. One step per workflow: the rest of a
/// workflow's due steps wait for a later claim.
pub async fn steps_claim_due_many_in_txn(
    tx: &mut Tx<'_>,
    limit: i64,
) -> Result<Vec<(String, i32)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT DISTINCT ON (workflow_id) workflow_id, idx FROM \
         (SELECT workflow_id, idx, due_at FROM workflow_steps WHERE due_at <= now() ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED) AS d \
         ORDER BY workflow_id, due_at",
    )
    .bind(limit)
    .fetch_all(&mut **tx)
    .await?)
}

/// How [`workflows_lock_many_in_txn`] treats a workflow another
/// transaction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Wait for it.
    Wait,
    /// Leave it out.
    Skip,
}

/// Reads and locks workflows in id order (so two transactions that lock
/// overlapping sets cannot deadlock), waiting for or skipping those another
/// transaction holds.
pub async fn workflows_lock_many_in_txn(
    tx: &mut Tx<'_>,
    ids: &[String],
    held: Held,
) -> Result<Vec<WorkflowRow>, DbError> {
    let skip = if held == Held::Skip {
        " SKIP LOCKED"
    } else {
        ""
    };
    Ok(sqlx::query_as(&format!(
        "SELECT {WF_COLUMNS} FROM workflows WHERE id = ANY($1) ORDER BY id FOR UPDATE{skip}"
    ))
    .bind(ids)
    .fetch_all(&mut **tx)
    .await?)
}

/// Every step of the workflows, by workflow and index, locked for the
/// transaction.
pub async fn steps_fetch_for_update_many_in_txn(
    tx: &mut Tx<'_>,
    workflow_ids: &[String],
) -> Result<Vec<StepRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {STEP_COLUMNS} FROM workflow_steps WHERE workflow_id = ANY($1) ORDER BY workflow_id, idx FOR UPDATE"
    ))
    .bind(workflow_ids)
    .fetch_all(&mut **tx)
    .await?)
}

/// Writes the mutable fields of steps, in one round trip.
pub async fn steps_update_many_in_txn(tx: &mut Tx<'_>, steps: &[StepRow]) -> Result<(), DbError> {
    if steps.is_empty() {
        return Ok(());
    }
    let wf: Vec<&str> = steps.iter().map(|s| s.workflow_id.as_str()).collect();
    let idx: Vec<i32> = steps.iter().map(|s| s.idx).collect();
    let status: Vec<&str> = steps.iter().map(|s| s.status.as_str()).collect();
    let attempt: Vec<i32> = steps.iter().map(|s| s.attempt).collect();
    let output: Vec<Option<&serde_json::Value>> = steps.iter().map(|s| s.output.as_ref()).collect();
    let error: Vec<Option<&str>> = steps.iter().map(|s| s.error.as_deref()).collect();
    let started: Vec<Option<DateTime<Utc>>> = steps.iter().map(|s| s.started_at).collect();
    let finished: Vec<Option<DateTime<Utc>>> = steps.iter().map(|s| s.finished_at).collect();
    let due: Vec<Option<DateTime<Utc>>> = steps.iter().map(|s| s.due_at).collect();
    let deadline: Vec<Option<DateTime<Utc>>> = steps.iter().map(|s| s.deadline_at).collect();
    let command: Vec<Option<&str>> = steps.iter().map(|s| s.command_id.as_deref()).collect();
    sqlx::query(
        "UPDATE workflow_steps s SET status = t.status, attempt = t.attempt, output = t.output, error = t.error, \
         started_at = t.started_at, finished_at = t.finished_at, due_at = t.due_at, deadline_at = t.deadline_at, \
         command_id = t.command_id \
         FROM unnest($1::text[], $2::int[], $3::text[], $4::int[], $5::jsonb[], $6::text[], $7::timestamptz[], \
                     $8::timestamptz[], $9::timestamptz[], $10::timestamptz[], $11::text[]) \
         AS t(workflow_id, idx, status, attempt, output, error, started_at, finished_at, due_at, deadline_at, command_id) \
         WHERE s.workflow_id = t.workflow_id AND s.idx = t.idx",
    )
    .bind(&wf)
    .bind(&idx)
    .bind(&status)
    .bind(&attempt)
    .bind(&output)
    .bind(&error)
    .bind(&started)
    .bind(&finished)
    .bind(&due)
    .bind(&deadline)
    .bind(&command)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Writes workflows' status, error and wipe verdict (`finished` stamps the
/// end), in one round trip.
pub async fn workflows_update_many_in_txn(
    tx: &mut Tx<'_>,
    workflows: &[(WorkflowRow, bool)],
) -> Result<(), DbError> {
    if workflows.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = workflows.iter().map(|(w, _)| w.id.as_str()).collect();
    let status: Vec<&str> = workflows.iter().map(|(w, _)| w.status.as_str()).collect();
    let error: Vec<Option<&str>> = workflows.iter().map(|(w, _)| w.error.as_deref()).collect();
    let wipe: Vec<bool> = workflows.iter().map(|(w, _)| w.wipe_verified).collect();
    let finished: Vec<bool> = workflows.iter().map(|(_, f)| *f).collect();
    sqlx::query(
        "UPDATE workflows w SET status = t.status, error = t.error, wipe_verified = t.wipe, updated_at = now(), \
         finished_at = CASE WHEN t.finished THEN now() ELSE w.finished_at END \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::bool[], $5::bool[]) AS t(id, status, error, wipe, finished) \
         WHERE w.id = t.id",
    )
    .bind(&ids)
    .bind(&status)
    .bind(&error)
    .bind(&wipe)
    .bind(&finished)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Writes a workflow's status, error and wipe verdict.
pub async fn workflow_update_in_txn(
    tx: &mut Tx<'_>,
    w: &WorkflowRow,
    finished: bool,
) -> Result<(), DbError> {
    workflows_update_many_in_txn(tx, &[(w.clone(), finished)]).await
}

/// Asks a running workflow to cancel: the engine stops the running step and
/// runs the cleanup steps. Returns false when it had already ended.
pub async fn workflow_request_cancel_in_txn(tx: &mut Tx<'_>, id: &str) -> Result<bool, DbError> {
    let n = sqlx::query(
        "UPDATE workflows SET cancel_requested = true, updated_at = now() \
         WHERE id = $1 AND status IN ('running', 'failing-cleanup')",
    )
    .bind(id)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if n > 0 {
        sqlx::query(
            "UPDATE workflow_steps SET due_at = now() WHERE workflow_id = $1 AND status IN ('pending', 'running') \
             AND due_at IS NOT NULL",
        )
        .bind(id)
        .execute(&mut **tx)
        .await?;
        notify_in_txn(tx).await?;
    }
    Ok(n > 0)
}

/// The running step waiting on `command_id`, if any.
pub async fn step_waiting_on_command_in_txn(
    tx: &mut Tx<'_>,
    command_id: &str,
) -> Result<Option<(String, i32)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT workflow_id, idx FROM workflow_steps WHERE command_id = $1 AND status = 'running'",
    )
    .bind(command_id)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Whether the node has a running workflow (the agent endpoints read the
/// same with a session's touch: `LiveSession::workflow_running`).
pub async fn workflow_running_for_node(db: &Db, node_id: &str) -> Result<bool, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM workflows WHERE node_id = $1 AND status = 'running')",
    )
    .bind(node_id)
    .fetch_one(db.pool())
    .await?)
}

/// Makes the running steps of the node's running workflows that wait for an
/// agent due now (an agent joined or reported in); other steps wait for
/// their command's result and are left alone.
pub async fn steps_wake_for_node_in_txn(tx: &mut Tx<'_>, node_id: &str) -> Result<(), DbError> {
    // First wait for any engine transaction advancing the node's workflows
    // (it holds the workflow lock), then wake in a statement of its own, so
    // its snapshot sees the step that transaction just started: a join that
    // lands while the previous step finishes is never lost. (The nudge's
    // SKIP LOCKED skips no row this transaction holds.)
    sqlx::query("SELECT id FROM workflows WHERE node_id = $1 AND status = 'running' FOR UPDATE")
        .bind(node_id)
        .execute(&mut **tx)
        .await?;
    steps_nudge_for_node_in_txn(tx, node_id).await
}

/// The nudge of [`steps_nudge_for_node_in_txn`] as common table
/// expressions over `$1` (the node), the last of them `woken` (a row per
/// step made due): for a statement that nudges beside other work
/// (`agents::heartbeat_record`).
macro_rules! steps_nudge_ctes {
    () => {
        "free AS (SELECT id FROM workflows WHERE node_id = $1 AND status = 'running' FOR UPDATE SKIP LOCKED), \
         woken AS (UPDATE workflow_steps s SET due_at = now() FROM free \
         WHERE s.workflow_id = free.id AND s.status = 'running' \
         AND s.definition->>'kind' IN ('waitRamdiskJoin', 'waitOsJoin', 'waitOsBack') RETURNING 1)"
    };
}
pub(crate) use steps_nudge_ctes;

/// [`steps_wake_for_node_in_txn`] for a sign of life that is not a join (a
/// heartbeat): never waits for an engine transaction. A workflow an
/// engine holds is left alone (that engine is advancing it; the agent's
/// next heartbeat, or the join poll, looks again), so a heartbeat never
/// holds a connection of the agents' pool behind an engine's batch.
pub async fn steps_nudge_for_node_in_txn(tx: &mut Tx<'_>, node_id: &str) -> Result<(), DbError> {
    sqlx::query(concat!(
        "WITH ",
        steps_nudge_ctes!(),
        " SELECT pg_notify($2, '') WHERE EXISTS (SELECT 1 FROM woken)"
    ))
    .bind(node_id)
    .bind(NOTIFY_CHANNEL)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Status of a workflow, or `None` when it does not exist.
pub async fn workflow_status_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
) -> Result<Option<WorkflowPhase>, DbError> {
    let s: Option<String> = sqlx::query_scalar("SELECT status FROM workflows WHERE id = $1")
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
    s.map(|s| WorkflowPhase::try_from(s).map_err(|e| DbError::Corrupt(e.to_string())))
        .transpose()
}

/// A workflow of the node that has not ended (running, or running its
/// cleanup steps): one a verb cancelled when it moved the node out of that
/// workflow's state, which the new state's workflow waits for.
pub async fn workflow_unfinished_of_node_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM workflows WHERE node_id = $1 \
         AND status IN ('running', 'failing-cleanup', 'cancelling-cleanup') LIMIT 1",
    )
    .bind(node_id)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Every workflow of a node, oldest first.
pub async fn workflows_of_node(db: &Db, node_id: &str) -> Result<Vec<WorkflowRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {WF_COLUMNS} FROM workflows WHERE node_id = $1 ORDER BY created_at, id"
    ))
    .bind(node_id)
    .fetch_all(db.pool())
    .await?)
}

/// How many commands each step of a workflow recorded: `(step, attempt, commands)`.
pub async fn command_counts_by_step(
    db: &Db,
    workflow_id: &str,
) -> Result<Vec<(i32, i32, i64)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT s.idx, s.attempt, count(c.id) FROM workflow_steps s \
         LEFT JOIN commands c ON c.workflow_id = s.workflow_id AND c.step_idx = s.idx \
         WHERE s.workflow_id = $1 GROUP BY s.idx, s.attempt ORDER BY s.idx",
    )
    .bind(workflow_id)
    .fetch_all(db.pool())
    .await?)
}

/// A workflow with a step overdue: due (or past its deadline) more than
/// the grace ago, and not looked at since.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct OverdueWorkflow {
    pub workflow_id: String,
    pub node_id: String,
    pub profile_id: String,
    pub step: String,
    pub step_status: String,
    pub overdue_secs: i64,
    /// Reported stalled already.
    pub reported: bool,
}

/// Every open workflow with an open step overdue by more than
/// `grace_secs` (its most overdue step), at most `limit`.
pub async fn workflows_overdue(
    db: &Db,
    grace_secs: u64,
    limit: i64,
) -> Result<Vec<OverdueWorkflow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT DISTINCT ON (w.id) w.id AS workflow_id, w.node_id, w.profile_id, s.name AS step, \
           s.status AS step_status, \
           floor(extract(epoch FROM now() - LEAST(s.due_at, s.deadline_at)))::bigint AS overdue_secs, \
           w.stalled_reported_at IS NOT NULL AS reported \
         FROM workflows w JOIN workflow_steps s ON s.workflow_id = w.id \
         WHERE w.status IN ('running', 'cancelling') AND s.status IN ('pending', 'running') \
           AND LEAST(s.due_at, s.deadline_at) < now() - make_interval(secs => $1) \
         ORDER BY w.id, LEAST(s.due_at, s.deadline_at) LIMIT $2",
    )
    .bind(grace_secs as f64)
    .bind(limit)
    .fetch_all(db.pool())
    .await?)
}

/// Marks a workflow reported stalled: true if this call did (so one
/// reporter emits the event).
pub async fn workflow_mark_stalled_in_txn(tx: &mut Tx<'_>, id: &str) -> Result<bool, DbError> {
    Ok(sqlx::query(
        "UPDATE workflows SET stalled_reported_at = now() WHERE id = $1 AND stalled_reported_at IS NULL",
    )
    .bind(id)
    .execute(&mut **tx)
    .await?
    .rows_affected()
        > 0)
}
