//! Commands: every command is a row before it is sent, with an idempotency
//! key of (workflow, step, attempt), so a restarted engine never sends it
//! twice and executors dedupe by command id.

use bcm_core::workflow::CommandStatus;
use chrono::{DateTime, Utc};

use crate::{Db, DbError, Tx};

/// A command to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewCommand {
    pub id: String,
    pub idempotency_key: String,
    pub workflow_id: Option<String>,
    pub step_idx: Option<i32>,
    pub attempt: i32,
    pub node_id: Option<String>,
    pub site_id: Option<String>,
    pub kind: String,
    pub target: String,
    pub params: serde_json::Value,
    /// The principal whose verb issued it (directly, or through the
    /// workflow the verb started); none for the control plane's own work.
    pub actor: Option<String>,
    /// The W3C trace context of the span that issued it, handed to the
    /// agent that runs it.
    pub traceparent: Option<String>,
    /// The approved batch a destructive command is sent under.
    pub batch_id: Option<String>,
}

/// A stored command.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CommandRow {
    pub id: String,
    pub node_id: Option<String>,
    pub site_id: Option<String>,
    pub kind: String,
    pub target: String,
    pub params: serde_json::Value,
    /// An unknown stored status fails the read ([`DbError::Corrupt`]).
    #[sqlx(try_from = "String")]
    pub status: CommandStatus,
    pub result: Option<serde_json::Value>,
    pub signature: Option<Vec<u8>>,
    /// The certificate serial the attestation service verified the
    /// signature against.
    pub attested_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub completed_at: Option<DateTime<Utc>>,
    /// The principal whose verb issued it.
    pub actor: Option<String>,
    /// The W3C trace context of the span that issued it.
    pub traceparent: Option<String>,
    /// The approved batch a destructive command is sent under.
    pub batch_id: Option<String>,
}

const COLUMNS: &str = "id, node_id, site_id, kind, target, params, status, result, signature, attested_by, created_at, completed_at, actor, traceparent, batch_id";

/// Records a command as pending. A repeated idempotency key is
/// [`DbError::Duplicate`].
pub async fn command_insert_in_txn(tx: &mut Tx<'_>, c: &NewCommand) -> Result<(), DbError> {
    commands_insert_many_in_txn(tx, std::slice::from_ref(c)).await
}

/// Records commands as pending, in one round trip. A repeated idempotency
/// key is [`DbError::Duplicate`] (and nothing is recorded).
pub async fn commands_insert_many_in_txn(
    tx: &mut Tx<'_>,
    cs: &[NewCommand],
) -> Result<(), DbError> {
    if cs.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = cs.iter().map(|c| c.id.as_str()).collect();
    let keys: Vec<&str> = cs.iter().map(|c| c.idempotency_key.as_str()).collect();
    let workflows: Vec<Option<&str>> = cs.iter().map(|c| c.workflow_id.as_deref()).collect();
    let steps: Vec<Option<i32>> = cs.iter().map(|c| c.step_idx).collect();
    let attempts: Vec<i32> = cs.iter().map(|c| c.attempt).collect();
    let nodes: Vec<Option<&str>> = cs.iter().map(|c| c.node_id.as_deref()).collect();
    let sites: Vec<Option<&str>> = cs.iter().map(|c| c.site_id.as_deref()).collect();
    let kinds: Vec<&str> = cs.iter().map(|c| c.kind.as_str()).collect();
    let targets: Vec<&str> = cs.iter().map(|c| c.target.as_str()).collect();
    let params: Vec<&serde_json::Value> = cs.iter().map(|c| &c.params).collect();
    let actors: Vec<Option<&str>> = cs.iter().map(|c| c.actor.as_deref()).collect();
    let traces: Vec<Option<&str>> = cs.iter().map(|c| c.traceparent.as_deref()).collect();
    let batches: Vec<Option<&str>> = cs.iter().map(|c| c.batch_id.as_deref()).collect();
    // An agent's command wakes its long-poll on commit (same round trip).
    sqlx::query(
        "WITH c AS (INSERT INTO commands (id, idempotency_key, workflow_id, step_idx, attempt, node_id, site_id, kind, target, params, actor, traceparent, batch_id, status) \
         SELECT id, key, wf, step, attempt, node, site, kind, target, params, actor, tp, batch, 'pending' \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::int[], $6::text[], $7::text[], $8::text[], $9::text[], $10::jsonb[], $12::text[], $13::text[], $14::text[]) \
         AS t(id, key, wf, step, attempt, node, site, kind, target, params, actor, tp, batch) RETURNING node_id, target) \
         SELECT pg_notify($11, node_id) FROM c WHERE target IN ('ramdisk', 'node') AND node_id IS NOT NULL",
    )
    .bind(&ids)
    .bind(&keys)
    .bind(&workflows)
    .bind(&steps)
    .bind(&attempts)
    .bind(&nodes)
    .bind(&sites)
    .bind(&kinds)
    .bind(&targets)
    .bind(&params)
    .bind(AGENT_CHANNEL)
    .bind(&actors)
    .bind(&traces)
    .bind(&batches)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The channel a commit with new agent commands notifies, with the node id.
pub const AGENT_CHANNEL: &str = "bcm_agent";

/// An agent command that may be handed out: never handed out, or handed
/// out by a poll whose lease ran out with no result (that poll's answer
/// may never have reached the agent; the agent answers a repeat from its
/// record) — and, a workflow's, only while its step still waits for it. A
/// command its step gave up on, skipped or was cancelled from is never
/// offered, taken or not: an installed OS that comes back long after a
/// rescue skipped asking it to power off must not power off then.
const OFFERABLE: &str = "((status = 'pending' OR (status = 'sent' \
     AND lease_until IS NOT NULL AND lease_until < now())) \
     AND (commands.workflow_id IS NULL OR EXISTS (SELECT 1 FROM workflow_steps w \
       WHERE w.command_id = commands.id AND w.status = 'running')))";

async fn command_by_id<'e>(
    e: impl sqlx::PgExecutor<'e>,
    id: &str,
    for_update: bool,
) -> Result<CommandRow, DbError> {
    let lock = if for_update { " FOR UPDATE" } else { "" };
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM commands WHERE id = $1{lock}"
    ))
    .bind(id)
    .fetch_one(e)
    .await?)
}

/// Reads a command.
pub async fn command_fetch_in_txn(tx: &mut Tx<'_>, id: &str) -> Result<CommandRow, DbError> {
    command_by_id(&mut **tx, id, false).await
}

/// Reads commands (those that exist), in one round trip.
pub async fn commands_fetch_many_in_txn(
    tx: &mut Tx<'_>,
    ids: &[String],
) -> Result<Vec<CommandRow>, DbError> {
    if ids.is_empty() {
        return Ok(vec![]);
    }
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM commands WHERE id = ANY($1)"
    ))
    .bind(ids)
    .fetch_all(&mut **tx)
    .await?)
}

/// Reads and locks a command.
pub async fn command_fetch_for_update_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
) -> Result<CommandRow, DbError> {
    command_by_id(&mut **tx, id, true).await
}

/// Records the result of one of `node_id`'s unanswered commands and returns
/// the row as stored (JSONB normalised), or `None` when the command is not
/// the node's, unknown, or already answered.
pub async fn command_complete_returning_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
    node_id: &str,
    succeeded: bool,
    result: &serde_json::Value,
    signature: Option<&[u8]>,
) -> Result<Option<CommandRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "UPDATE commands SET status = $3, result = $4, signature = $5, completed_at = now() \
         WHERE id = $1 AND node_id = $2 AND status IN ('pending', 'sent') RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(node_id)
    .bind(done_status(succeeded))
    .bind(result)
    .bind(signature)
    .fetch_optional(&mut **tx)
    .await?)
}

fn done_status(succeeded: bool) -> &'static str {
    if succeeded {
        CommandStatus::Succeeded.as_str()
    } else {
        CommandStatus::Failed.as_str()
    }
}

/// What follows a result just recorded, in one round trip: the
/// certificate its signature verified against (`attested_by`, none for an
/// unsigned result) and the step waiting on the command made due now.
pub async fn command_attest_and_wake_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
    attested_by: Option<&str>,
) -> Result<(), DbError> {
    sqlx::query(
        "WITH attested AS (UPDATE commands SET attested_by = $2, attested_at = now() \
           WHERE id = $1 AND $2::text IS NOT NULL), \
         woken AS (UPDATE workflow_steps SET due_at = now() WHERE command_id = $1 AND status = 'running' RETURNING 1) \
         SELECT pg_notify($3, '') WHERE EXISTS (SELECT 1 FROM woken)",
    )
    .bind(id)
    .bind(attested_by)
    .bind(crate::workflows::NOTIFY_CHANNEL)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Reads a command.
pub async fn command_fetch(db: &Db, id: &str) -> Result<CommandRow, DbError> {
    command_by_id(db.pool(), id, false).await
}

/// A command whose result was just recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Completed {
    /// The workflow step that sent it, if a workflow did.
    pub step: Option<(String, i32)>,
    pub kind: String,
    pub node_id: Option<String>,
}

/// Records a command's result once; `None` when it already had one (a
/// redelivered result changes nothing).
pub async fn command_complete_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
    succeeded: bool,
    result: &serde_json::Value,
    signature: Option<&[u8]>,
) -> Result<Option<Completed>, DbError> {
    #[derive(sqlx::FromRow)]
    struct Done {
        workflow_id: Option<String>,
        step_idx: Option<i32>,
        kind: String,
        node_id: Option<String>,
    }
    let row: Option<Done> = sqlx::query_as(
        "UPDATE commands SET status = $2, result = $3, signature = $4, completed_at = now() \
         WHERE id = $1 AND status IN ('pending', 'sent') RETURNING workflow_id, step_idx, kind, node_id",
    )
    .bind(id)
    .bind(done_status(succeeded))
    .bind(result)
    .bind(signature)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row.map(|d| Completed {
        step: d.workflow_id.zip(d.step_idx),
        kind: d.kind,
        node_id: d.node_id,
    }))
}

/// A result to record on its command.
#[derive(Debug, Clone)]
pub struct NewResult<'a> {
    pub command_id: &'a str,
    /// The site that answered (from the subject its identity may publish
    /// on): a command addressed to another site is left alone.
    pub site_id: &'a str,
    /// The kind the result says it answers: a command of another kind is
    /// left alone.
    pub kind: &'a str,
    pub succeeded: bool,
    pub result: serde_json::Value,
}

/// Records unsigned results (a site service's) once each, in one round
/// trip; returns the commands that had none yet, with their command id (a
/// redelivered result, or one whose kind is not its command's, changes
/// nothing and is left out).
pub async fn commands_complete_many_in_txn(
    tx: &mut Tx<'_>,
    results: &[NewResult<'_>],
) -> Result<Vec<(String, Completed)>, DbError> {
    #[derive(sqlx::FromRow)]
    struct Done {
        id: String,
        workflow_id: Option<String>,
        step_idx: Option<i32>,
        kind: String,
        node_id: Option<String>,
    }
    if results.is_empty() {
        return Ok(vec![]);
    }
    let ids: Vec<&str> = results.iter().map(|r| r.command_id).collect();
    let kinds: Vec<&str> = results.iter().map(|r| r.kind).collect();
    let sites: Vec<&str> = results.iter().map(|r| r.site_id).collect();
    let status: Vec<&str> = results.iter().map(|r| done_status(r.succeeded)).collect();
    let bodies: Vec<&serde_json::Value> = results.iter().map(|r| &r.result).collect();
    let rows: Vec<Done> = sqlx::query_as(
        "UPDATE commands c SET status = t.status, result = t.result, completed_at = now() \
         FROM (SELECT DISTINCT ON (id) id, kind, site, status, result FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::text[], $5::text[]) AS u(id, status, result, kind, site)) AS t \
         WHERE c.id = t.id AND c.kind = t.kind AND c.site_id = t.site AND c.status IN ('pending', 'sent') \
         RETURNING c.id, c.workflow_id, c.step_idx, c.kind, c.node_id",
    )
    .bind(&ids)
    .bind(&status)
    .bind(&bodies)
    .bind(&kinds)
    .bind(&sites)
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|d| {
            (
                d.id,
                Completed {
                    step: d.workflow_id.zip(d.step_idx),
                    kind: d.kind,
                    node_id: d.node_id,
                },
            )
        })
        .collect())
}

/// Which of `results` answer a command that still waits for its result,
/// matched as [`commands_complete_many_in_txn`] matches them (id, kind,
/// site), in one round trip and without recording anything: `(position in
/// results, command id, node id)`, one per matching result (a command
/// answered twice in `results` appears twice). Commands of no node are
/// left out.
pub async fn commands_awaiting_nodes_in_txn(
    tx: &mut Tx<'_>,
    results: &[NewResult<'_>],
) -> Result<Vec<(usize, String, String)>, DbError> {
    if results.is_empty() {
        return Ok(vec![]);
    }
    let ids: Vec<&str> = results.iter().map(|r| r.command_id).collect();
    let kinds: Vec<&str> = results.iter().map(|r| r.kind).collect();
    let sites: Vec<&str> = results.iter().map(|r| r.site_id).collect();
    let rows: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT t.n, c.id, c.node_id FROM commands c \
         JOIN unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS t(id, kind, site, n) \
           ON c.id = t.id AND c.kind = t.kind AND c.site_id = t.site \
         WHERE c.status IN ('pending', 'sent') AND c.node_id IS NOT NULL \
         ORDER BY t.n",
    )
    .bind(&ids)
    .bind(&kinds)
    .bind(&sites)
    .fetch_all(&mut **tx)
    .await?;
    rows.into_iter()
        .map(|(n, id, node)| {
            usize::try_from(n - 1)
                .ok()
                .filter(|i| *i < results.len())
                .map(|i| (i, id, node))
                .ok_or_else(|| {
                    DbError::Corrupt(format!("position {n} of {} results", results.len()))
                })
        })
        .collect()
}

/// The kind and site of each command of `ids` that exists: `(id, kind,
/// site)`.
pub async fn command_kinds_in_txn(
    tx: &mut Tx<'_>,
    ids: &[String],
) -> Result<Vec<(String, String, Option<String>)>, DbError> {
    if ids.is_empty() {
        return Ok(vec![]);
    }
    Ok(
        sqlx::query_as("SELECT id, kind, site_id FROM commands WHERE id = ANY($1)")
            .bind(ids)
            .fetch_all(&mut **tx)
            .await?,
    )
}

/// Hands the offerable commands of `kinds` (those an identity of `purpose`
/// runs) to a node's agent, marking them sent under a lease of `lease_ms` —
/// only to the agent of the node's newest live session of that purpose
/// (`cert_serial` is the session's certificate): an installed OS never gets
/// a ramdisk command. A machine runs one agent at a time: a poll still open
/// from before a reboot (its connection half-open, nobody reading) must
/// never take a command the new agent is waiting for.
///
/// One statement, committed on its own: a poll that finds nothing costs
/// one round trip, and one that takes costs no more.
pub async fn commands_take_for_agent(
    db: &Db,
    node_id: &str,
    cert_serial: &str,
    purpose: &str,
    kinds: &[&str],
    limit: i64,
    lease_ms: u64,
) -> Result<Vec<CommandRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "UPDATE commands SET status = 'sent', sent_at = now(), \
           lease_until = now() + make_interval(secs => $4) WHERE id IN ( \
           SELECT id FROM commands WHERE node_id = $1 AND target IN ('ramdisk', 'node') AND kind = ANY($6) AND {OFFERABLE} \
           AND EXISTS (SELECT 1 FROM agent_sessions s WHERE s.node_id = $1 AND s.cert_serial = $3 \
             AND s.purpose = $5 AND s.expires_at > now() \
             AND NOT EXISTS (SELECT 1 FROM agent_sessions n WHERE n.node_id = $1 \
               AND n.purpose = s.purpose AND n.created_at > s.created_at)) \
           ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING {COLUMNS}"
    ))
    .bind(node_id)
    .bind(limit)
    .bind(cert_serial)
    .bind(lease_ms as f64 / 1000.0)
    .bind(purpose)
    .bind(kinds)
    .fetch_all(db.pool())
    .await?)
}

/// What one ask of [`sessions_touch_and_take`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Touched {
    /// The session is unknown, ended or out of force; nothing was taken.
    Unknown,
    /// The session's row is held by another transaction and its mark had
    /// to move: passed over (only where the statement does not wait for
    /// locks), to be asked again on its own.
    Busy,
    /// The session, heard, and the commands taken for it.
    Heard(crate::agents::LiveSession, Vec<CommandRow>),
}

/// Agent requests' session touches, in one round trip for all of them:
/// each session's touch (the semantics [`crate::agents::session_touch_live`]
/// documents for one)
/// and, for each ask that takes commands (a poll's first look) whose
/// session is heard, the take of its node's offerable commands of the
/// kinds its purpose runs, at most `limit` each (as
/// [`commands_take_for_agent`] does it). `runs` pairs a purpose with each
/// kind it runs. The answer has one entry per ask, in order.
///
/// A fleet's agents ask faster than one statement each can be served:
/// gathered, a hundred touches cost one statement and at most one commit.
/// Unless `wait_for_locks`, the statement never waits for a row lock: a
/// session another transaction holds (being ended, say) whose mark must
/// move is [`Touched::Busy`], so one ask cannot hold up the others; asked
/// again on its own with `wait_for_locks`, it waits and is answered as
/// that transaction left it. A command is handed to one ask only, even
/// where one session asks twice (each command row is updated once, for one
/// of them). The take reads with the statement's one snapshot: where a
/// touch waited for its session's row, the writer could only have ended or
/// rekeyed the session, and then the touch finds no row, so nothing is
/// taken for it.
pub async fn sessions_touch_and_take(
    db: &Db,
    asks: &[crate::agents::TouchAsk<'_>],
    runs: &[(&str, &str)],
    limit: i64,
    lease_ms: u64,
    wait_for_locks: bool,
) -> Result<Vec<Touched>, DbError> {
    use sqlx::{FromRow as _, Row as _};
    let purposes: Vec<&str> = runs.iter().map(|(p, _)| *p).collect();
    let kinds: Vec<&str> = runs.iter().map(|(_, k)| *k).collect();
    let (hashes, marks, slacks) = crate::agents::TouchAsk::binds(asks);
    let takes: Vec<bool> = asks.iter().map(|a| a.takes_commands).collect();
    let rows = sqlx::query(&format!(
        "WITH {touch}, picked AS ( \
           SELECT heard.ask AS p_ask, pick.id AS p_id FROM heard, LATERAL ( \
             SELECT commands.id FROM commands \
             WHERE NOT heard.busy AND ($8::bool[])[heard.ask::int] \
               AND commands.node_id = heard.node_id AND commands.target IN ('ramdisk', 'node') \
               AND (heard.purpose, commands.kind) IN (SELECT * FROM unnest($6::text[], $7::text[])) \
               AND {OFFERABLE} \
               AND NOT EXISTS (SELECT 1 FROM agent_sessions n WHERE n.node_id = heard.node_id \
                 AND n.purpose = heard.purpose AND n.created_at > heard.created_at) \
             ORDER BY commands.created_at LIMIT $5 FOR UPDATE OF commands SKIP LOCKED) pick \
         ), taken AS ( \
           UPDATE commands SET status = 'sent', sent_at = now(), \
             lease_until = now() + make_interval(secs => $4) \
           FROM picked WHERE commands.id = picked.p_id \
           RETURNING picked.p_ask AS t_ask, {COLUMNS} \
         ) \
         SELECT heard.ask AS s_ask, heard.busy AS s_busy, heard.node_id AS s_node_id, \
           heard.cert_serial AS s_cert_serial, heard.purpose AS s_purpose, \
           heard.workflow_running AS s_workflow_running, heard.alive_left_ms AS s_alive_left_ms, taken.* \
         FROM heard LEFT JOIN taken ON taken.t_ask = heard.ask ORDER BY heard.ask, taken.created_at",
        touch = crate::agents::touch_ctes(wait_for_locks)
    ))
    .bind(hashes)
    .bind(marks)
    .bind(slacks)
    .bind(lease_ms as f64 / 1000.0)
    .bind(limit)
    .bind(&purposes)
    .bind(&kinds)
    .bind(&takes)
    .fetch_all(&mut *db.acquire().await?)
    .await?;
    let mut answers: Vec<Touched> = vec![Touched::Unknown; asks.len()];
    for row in &rows {
        let ask: i64 = row.try_get("s_ask")?;
        let slot = usize::try_from(ask - 1)
            .ok()
            .and_then(|i| answers.get_mut(i))
            .ok_or_else(|| DbError::Corrupt(format!("a touch answered ask {ask}")))?;
        if row.try_get::<bool, _>("s_busy")? {
            // Waited for and gone: ended or rekeyed meanwhile.
            *slot = if wait_for_locks {
                Touched::Unknown
            } else {
                Touched::Busy
            };
            continue;
        }
        if *slot == Touched::Unknown {
            *slot = Touched::Heard(
                crate::agents::LiveSession {
                    node_id: row.try_get("s_node_id")?,
                    cert_serial: row.try_get("s_cert_serial")?,
                    purpose: row.try_get("s_purpose")?,
                    workflow_running: row.try_get("s_workflow_running")?,
                    alive_left_ms: row.try_get("s_alive_left_ms")?,
                },
                Vec::new(),
            );
        }
        if let (Touched::Heard(_, taken), Some(_)) = (slot, row.try_get::<Option<String>, _>("id")?)
        {
            taken.push(CommandRow::from_row(row)?);
        }
    }
    Ok(answers)
}

/// Every command of a node, oldest first.
pub async fn commands_of_node(db: &Db, node_id: &str) -> Result<Vec<CommandRow>, DbError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM commands WHERE node_id = $1 ORDER BY created_at, id"
    ))
    .bind(node_id)
    .fetch_all(db.pool())
    .await?)
}

/// How many `kind` commands wait for a result (pending or sent).
pub async fn commands_outstanding(db: &Db, kind: &str) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM commands WHERE kind = $1 AND status IN ('pending', 'sent')",
    )
    .bind(kind)
    .fetch_one(db.pool())
    .await?)
}

/// Deletes finished commands that no workflow refers to (power reads,
/// `metal.power`) completed more than `keep` ago; returns how many.
/// Workflow commands stay with their workflow's history.
pub async fn commands_prune_leaves(db: &Db, keep: std::time::Duration) -> Result<u64, DbError> {
    Ok(sqlx::query(
        "DELETE FROM commands WHERE workflow_id IS NULL AND status IN ('succeeded', 'failed') \
         AND completed_at < now() - make_interval(secs => $1)",
    )
    .bind(keep.as_secs_f64())
    .execute(db.pool())
    .await?
    .rows_affected())
}

/// Names the batch a held command is sent under (a one-leaf command
/// released by its batch's approval).
pub async fn command_set_batch_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
    batch: &str,
) -> Result<(), DbError> {
    sqlx::query("UPDATE commands SET batch_id = $2 WHERE id = $1")
        .bind(id)
        .bind(batch)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
