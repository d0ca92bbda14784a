//! The destructive-batch quorum's records: approvers and their keys,
//! batches (the header approvers sign, with the policy they were made
//! under), each batch's nodes (leaf index, inclusion proof, bulk progress)
//! and the approvals. Deciding what a signature is worth is `bcm-quorum`'s;
//! this module stores and reads.

use bcm_contracts::batch::{ApprovalSignature, BatchAuthority, BatchHeader};
use bcm_contracts::events::BulkCounts;
use bcm_core::batch::{BatchState, BulkNodeState, Operation};
use bcm_core::WipeMode;
use chrono::{DateTime, Utc};

use crate::{Db, DbError, Tx};

/// A registered approver.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Approver {
    pub id: String,
    pub tenant_id: String,
    pub principal: String,
    pub public_key: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// Registers an approver (a repeated id is [`DbError::Duplicate`]).
pub async fn approver_insert(db: &Db, a: &Approver) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO approvers (id, tenant_id, principal, public_key) VALUES ($1, $2, $3, $4)",
    )
    .bind(&a.id)
    .bind(&a.tenant_id)
    .bind(&a.principal)
    .bind(&a.public_key)
    .execute(db.pool())
    .await?;
    Ok(())
}

/// Reads an approver.
pub async fn approver_fetch(db: &Db, id: &str) -> Result<Approver, DbError> {
    Ok(sqlx::query_as("SELECT id, tenant_id, principal, public_key, created_at, revoked_at FROM approvers WHERE id = $1")
        .bind(id)
        .fetch_one(db.pool())
        .await?)
}

/// A tenant's approvers (every tenant's when `None`), revoked ones too.
pub async fn approvers_list(db: &Db, tenant: Option<&str>) -> Result<Vec<Approver>, DbError> {
    Ok(sqlx::query_as(
        "SELECT id, tenant_id, principal, public_key, created_at, revoked_at FROM approvers \
         WHERE ($1::text IS NULL OR tenant_id = $1) ORDER BY id",
    )
    .bind(tenant)
    .fetch_all(db.pool())
    .await?)
}

/// Revokes an approver: its later signatures are refused.
pub async fn approver_revoke(db: &Db, id: &str) -> Result<(), DbError> {
    let n =
        sqlx::query("UPDATE approvers SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL")
            .bind(id)
            .execute(db.pool())
            .await?
            .rows_affected();
    if n == 0 {
        return Err(DbError::NotFound);
    }
    Ok(())
}

/// A pool's quorum policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuorumPolicy {
    /// Distinct approvers a batch needs.
    pub required: i32,
    /// Whether the requester may be one of them.
    pub requester_may_approve: bool,
    /// Whether a one-node batch of an ordinary verb is approved by policy.
    pub auto_approve_single: bool,
    /// How many of a bulk's nodes run at once.
    pub bulk_concurrency: i32,
}

impl QuorumPolicy {
    /// The policy with at least `floor` approvers (the edges' anchor's
    /// quorum: fewer would be approved here and refused at every edge).
    pub fn at_least(self, floor: u32) -> Self {
        Self {
            required: self.required.max(i32::try_from(floor).unwrap_or(i32::MAX)),
            ..self
        }
    }
}

/// A pool's quorum policy, in the caller's transaction.
pub async fn pool_policy_in_txn(tx: &mut Tx<'_>, pool: &str) -> Result<QuorumPolicy, DbError> {
    let (required, requester_may_approve, auto_approve_single, bulk_concurrency): (
        i32,
        bool,
        bool,
        i32,
    ) = sqlx::query_as(
        "SELECT quorum_required, requester_may_approve, auto_approve_single, bulk_concurrency FROM pools WHERE id = $1",
    )
    .bind(pool)
    .fetch_one(&mut **tx)
    .await?;
    Ok(QuorumPolicy {
        required,
        requester_may_approve,
        auto_approve_single,
        bulk_concurrency,
    })
}

/// Sets a pool's quorum policy.
pub async fn pool_policy_set(db: &Db, pool: &str, p: &QuorumPolicy) -> Result<(), DbError> {
    let n = sqlx::query(
        "UPDATE pools SET quorum_required = $2, requester_may_approve = $3, auto_approve_single = $4, bulk_concurrency = $5 WHERE id = $1",
    )
    .bind(pool)
    .bind(p.required)
    .bind(p.requester_may_approve)
    .bind(p.auto_approve_single)
    .bind(p.bulk_concurrency)
    .execute(db.pool())
    .await?
    .rows_affected();
    if n == 0 {
        return Err(DbError::NotFound);
    }
    Ok(())
}

/// A batch as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub header: BatchHeader,
    pub site_id: String,
    /// `node` or `bulk`.
    pub scope: String,
    pub reason: String,
    pub requested_by: String,
    pub state: BatchState,
    pub quorum_required: i32,
    pub requester_may_approve: bool,
    pub state_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub approved_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct BatchRow {
    id: String,
    tenant_id: String,
    pool_id: String,
    site_id: String,
    scope: String,
    operation: String,
    wipe: Option<String>,
    reason: String,
    reason_sha256: String,
    requested_by: String,
    state: String,
    quorum_required: i32,
    requester_may_approve: bool,
    expires_at: DateTime<Utc>,
    root: String,
    leaf_count: i32,
    state_reason: Option<String>,
    created_at: DateTime<Utc>,
    approved_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, tenant_id, pool_id, site_id, scope, operation, wipe, reason, reason_sha256, requested_by, state, quorum_required, requester_may_approve, expires_at, root, leaf_count, state_reason, created_at, approved_at, finished_at";

fn corrupt(what: &str, v: &str) -> DbError {
    DbError::Corrupt(format!("batch {what} {v:?}"))
}

impl TryFrom<BatchRow> for Batch {
    type Error = DbError;
    fn try_from(r: BatchRow) -> Result<Self, DbError> {
        Ok(Batch {
            header: BatchHeader {
                operation: Operation::parse(&r.operation)
                    .ok_or_else(|| corrupt("operation", &r.operation))?,
                wipe: r
                    .wipe
                    .as_deref()
                    .map(|w| WipeMode::parse(w).ok_or_else(|| corrupt("wipe", w)))
                    .transpose()?,
                batch_id: r.id,
                tenant_id: r.tenant_id,
                pool_id: r.pool_id,
                reason_sha256: r.reason_sha256,
                expires_at: r.expires_at.timestamp(),
                root: r.root,
                leaf_count: u32::try_from(r.leaf_count)
                    .map_err(|_| corrupt("leaf count", &r.leaf_count.to_string()))?,
            },
            site_id: r.site_id,
            scope: r.scope,
            reason: r.reason,
            requested_by: r.requested_by,
            state: BatchState::parse(&r.state).ok_or_else(|| corrupt("state", &r.state))?,
            quorum_required: r.quorum_required,
            requester_may_approve: r.requester_may_approve,
            state_reason: r.state_reason,
            created_at: r.created_at,
            approved_at: r.approved_at,
            finished_at: r.finished_at,
        })
    }
}

/// A node of a new batch: admitted (with its leaf index and proof) or
/// refused at admission (with a code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBatchNode {
    pub node_id: String,
    pub position: i32,
    pub leaf_index: Option<i32>,
    /// The sibling hashes, hex.
    pub proof: Vec<String>,
    pub state: BulkNodeState,
    pub code: Option<String>,
    pub message: Option<String>,
}

/// Stores a new batch and its nodes in the caller's transaction (one
/// statement for the nodes, however many).
pub async fn batch_insert_in_txn(
    tx: &mut Tx<'_>,
    b: &Batch,
    nodes: &[NewBatchNode],
    held_message: Option<&serde_json::Value>,
) -> Result<(), DbError> {
    let h = &b.header;
    let expires = DateTime::<Utc>::from_timestamp(h.expires_at, 0)
        .ok_or_else(|| DbError::Unstorable("expiry out of range".into()))?;
    sqlx::query(&format!(
        "INSERT INTO batches ({COLUMNS}, held_message) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)"
    ))
    .bind(&h.batch_id)
    .bind(&h.tenant_id)
    .bind(&h.pool_id)
    .bind(&b.site_id)
    .bind(&b.scope)
    .bind(h.operation.as_str())
    .bind(h.wipe.map(|w| w.as_str()))
    .bind(&b.reason)
    .bind(&h.reason_sha256)
    .bind(&b.requested_by)
    .bind(b.state.as_str())
    .bind(b.quorum_required)
    .bind(b.requester_may_approve)
    .bind(expires)
    .bind(&h.root)
    .bind(h.leaf_count as i32)
    .bind(&b.state_reason)
    .bind(b.created_at)
    .bind(b.approved_at)
    .bind(b.finished_at)
    .bind(held_message)
    .execute(&mut **tx)
    .await?;
    if nodes.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = nodes.iter().map(|n| n.node_id.as_str()).collect();
    let positions: Vec<i32> = nodes.iter().map(|n| n.position).collect();
    let leaves: Vec<Option<i32>> = nodes.iter().map(|n| n.leaf_index).collect();
    let proofs: Vec<Option<String>> = nodes
        .iter()
        .map(|n| n.leaf_index.map(|_| n.proof.concat()))
        .collect();
    let states: Vec<&str> = nodes.iter().map(|n| n.state.as_str()).collect();
    let codes: Vec<Option<&str>> = nodes.iter().map(|n| n.code.as_deref()).collect();
    let messages: Vec<Option<&str>> = nodes.iter().map(|n| n.message.as_deref()).collect();
    sqlx::query(
        "INSERT INTO batch_nodes (batch_id, node_id, position, leaf_index, proof, state, code, message, finished_at) \
         SELECT $1, node, pos, leaf, proof, st, code, msg, CASE WHEN st = 'refused' THEN now() END \
         FROM unnest($2::text[], $3::int[], $4::int[], $5::text[], $6::text[], $7::text[], $8::text[]) \
         AS t(node, pos, leaf, proof, st, code, msg)",
    )
    .bind(&h.batch_id)
    .bind(&ids)
    .bind(&positions)
    .bind(&leaves)
    .bind(&proofs)
    .bind(&states)
    .bind(&codes)
    .bind(&messages)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Reads a batch.
pub async fn batch_fetch(db: &Db, id: &str) -> Result<Batch, DbError> {
    let r: BatchRow = sqlx::query_as(&format!("SELECT {COLUMNS} FROM batches WHERE id = $1"))
        .bind(id)
        .fetch_one(db.pool())
        .await?;
    r.try_into()
}

/// Reads and locks a batch.
pub async fn batch_fetch_for_update_in_txn(tx: &mut Tx<'_>, id: &str) -> Result<Batch, DbError> {
    let r: BatchRow = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM batches WHERE id = $1 FOR UPDATE"
    ))
    .bind(id)
    .fetch_one(&mut **tx)
    .await?;
    r.try_into()
}

/// A tenant's batches (every tenant's when `None`), newest first.
pub async fn batches_list(
    db: &Db,
    tenant: Option<&str>,
    limit: i64,
) -> Result<Vec<Batch>, DbError> {
    let rows: Vec<BatchRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM batches WHERE ($1::text IS NULL OR tenant_id = $1) AND scope = 'bulk' ORDER BY id DESC LIMIT $2"
    ))
    .bind(tenant)
    .bind(limit)
    .fetch_all(db.pool())
    .await?;
    rows.into_iter().map(TryInto::try_into).collect()
}

/// The batches that name `node` as a leaf or a refusal (its verbs' own
/// batches and the bulks that named it), newest first.
pub async fn batches_of_node(db: &Db, node: &str, limit: i64) -> Result<Vec<Batch>, DbError> {
    let rows: Vec<BatchRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM batches WHERE id IN (SELECT batch_id FROM batch_nodes WHERE node_id = $1) ORDER BY id DESC LIMIT $2"
    ))
    .bind(node)
    .bind(limit)
    .fetch_all(db.pool())
    .await?;
    rows.into_iter().map(TryInto::try_into).collect()
}

/// Moves a batch to `to` if it is in one of `from`; whether it moved.
pub async fn batch_set_state_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
    from: &[BatchState],
    to: BatchState,
    reason: Option<&str>,
) -> Result<bool, DbError> {
    let from: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
    let n = sqlx::query(
        "UPDATE batches SET state = $3, state_reason = coalesce($4, state_reason), \
         approved_at = CASE WHEN $3 = 'approved' THEN now() ELSE approved_at END, \
         finished_at = CASE WHEN $3 IN ('finished', 'expired', 'rejected', 'cancelled') THEN now() ELSE finished_at END \
         WHERE id = $1 AND state = ANY($2)",
    )
    .bind(id)
    .bind(&from)
    .bind(to.as_str())
    .bind(reason)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// Records an approval (a second one by the same approver is
/// [`DbError::Duplicate`]).
pub async fn approval_insert_in_txn(
    tx: &mut Tx<'_>,
    batch: &str,
    a: &ApprovalSignature,
    principal: &str,
) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO batch_approvals (batch_id, approver_id, principal, signature) VALUES ($1, $2, $3, $4)",
    )
    .bind(batch)
    .bind(&a.approver_id)
    .bind(principal)
    .bind(&a.signature)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A batch's approvals, oldest first.
pub async fn approvals_in_txn(
    tx: &mut Tx<'_>,
    batch: &str,
) -> Result<Vec<(ApprovalSignature, String, DateTime<Utc>)>, DbError> {
    let rows: Vec<(String, String, String, DateTime<Utc>)> = sqlx::query_as(
        "SELECT approver_id, signature, principal, approved_at FROM batch_approvals WHERE batch_id = $1 ORDER BY approved_at, approver_id",
    )
    .bind(batch)
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(approver_id, signature, principal, at)| {
            (
                ApprovalSignature {
                    approver_id,
                    signature,
                },
                principal,
                at,
            )
        })
        .collect())
}

/// Takes the message a one-leaf batch held until its approval.
pub async fn held_message_take_in_txn(
    tx: &mut Tx<'_>,
    batch: &str,
) -> Result<Option<serde_json::Value>, DbError> {
    let held: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT held_message FROM batches WHERE id = $1 FOR UPDATE")
            .bind(batch)
            .fetch_optional(&mut **tx)
            .await?
            .flatten();
    if held.is_some() {
        sqlx::query("UPDATE batches SET held_message = NULL WHERE id = $1")
            .bind(batch)
            .execute(&mut **tx)
            .await?;
    }
    Ok(held)
}

/// Why a node's batch cannot authorize a command now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorityState {
    /// Its approvals, proof and header.
    Ready(Box<BatchAuthority>),
    /// Not approved yet: wait (until the header's expiry).
    Awaiting { expires_at: i64 },
    /// It never will: expired, rejected, cancelled, or the node is not in it.
    Refused(String),
}

/// What a destructive command for `node` sent under `batch` carries, in
/// one round trip: the header, the node's leaf index and proof, and every
/// approval.
pub async fn authority_in_txn(
    tx: &mut Tx<'_>,
    batch: &str,
    node: &str,
) -> Result<AuthorityState, DbError> {
    authority_read(&mut **tx, batch, node).await
}

/// [`authority_in_txn`] as the batch stands now, outside a transaction
/// (an agent's poll reads it just after taking the command).
pub async fn authority(db: &Db, batch: &str, node: &str) -> Result<AuthorityState, DbError> {
    authority_read(db.pool(), batch, node).await
}

async fn authority_read<'e>(
    e: impl sqlx::PgExecutor<'e>,
    batch: &str,
    node: &str,
) -> Result<AuthorityState, DbError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        batch: BatchRow,
        leaf_index: Option<i32>,
        proof: Option<String>,
        node_state: Option<String>,
        approvals: serde_json::Value,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT b.id, b.tenant_id, b.pool_id, b.site_id, b.scope, b.operation, b.wipe, b.reason, b.reason_sha256, \
         b.requested_by, b.state, b.quorum_required, b.requester_may_approve, b.expires_at, b.root, b.leaf_count, \
         b.state_reason, b.created_at, b.approved_at, b.finished_at, bn.leaf_index, bn.proof, bn.state AS node_state, \
         coalesce((SELECT json_agg(json_build_object('approverId', a.approver_id, 'signature', a.signature) ORDER BY a.approved_at, a.approver_id) \
                   FROM batch_approvals a WHERE a.batch_id = b.id), '[]'::json) AS approvals \
         FROM batches b LEFT JOIN batch_nodes bn ON bn.batch_id = b.id AND bn.node_id = $2 WHERE b.id = $1"
    )
    .bind(batch)
    .bind(node)
    .fetch_optional(e)
    .await?;
    let Some(row) = row else {
        return Ok(AuthorityState::Refused(format!(
            "batch {batch} does not exist"
        )));
    };
    let b: Batch = row.batch.try_into()?;
    let (Some(leaf), Some(proof)) = (row.leaf_index, row.proof) else {
        return Ok(AuthorityState::Refused(format!(
            "node {node} is not a leaf of batch {batch}"
        )));
    };
    if Utc::now().timestamp() >= b.header.expires_at {
        return Ok(AuthorityState::Refused(format!(
            "batch {batch} expired at {}",
            DateTime::<Utc>::from_timestamp(b.header.expires_at, 0).unwrap_or_default()
        )));
    }
    // A node a bulk started finishes its chain even when the bulk was
    // cancelled or rejected meanwhile (only nodes not yet started stop).
    let started = row.node_state.as_deref() == Some("started");
    match b.state {
        s if s.authorizes() => {}
        BatchState::Cancelled | BatchState::Rejected if started && b.scope == "bulk" => {}
        BatchState::AwaitingApproval => {
            return Ok(AuthorityState::Awaiting {
                expires_at: b.header.expires_at,
            })
        }
        s => {
            return Ok(AuthorityState::Refused(format!(
                "batch {batch} is {s}{}",
                b.state_reason.map(|r| format!(": {r}")).unwrap_or_default()
            )))
        }
    }
    let approvals: Vec<ApprovalSignature> = serde_json::from_value(row.approvals)
        .map_err(|e| DbError::Corrupt(format!("approvals of {batch}: {e}")))?;
    let proof = proof
        .as_bytes()
        .chunks(64)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    Ok(AuthorityState::Ready(Box::new(BatchAuthority {
        header: b.header,
        leaf_index: u32::try_from(leaf).map_err(|_| DbError::Corrupt("leaf index".into()))?,
        proof,
        approvals,
    })))
}

/// A node of a batch as listed.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BatchNodeRow {
    pub node_id: String,
    pub position: i32,
    pub leaf_index: Option<i32>,
    pub state: String,
    pub code: Option<String>,
    pub message: Option<String>,
}

/// A batch's nodes by position, a page at a time.
pub async fn batch_nodes_list(
    db: &Db,
    batch: &str,
    after: i32,
    limit: i64,
) -> Result<Vec<BatchNodeRow>, DbError> {
    Ok(sqlx::query_as(
        "SELECT node_id, position, leaf_index, state, code, message FROM batch_nodes \
         WHERE batch_id = $1 AND position > $2 ORDER BY position LIMIT $3",
    )
    .bind(batch)
    .bind(after)
    .bind(limit)
    .fetch_all(db.pool())
    .await?)
}

/// A batch's node counts by state, and by refusal or failure code.
pub async fn batch_counts(
    db: &Db,
    batch: &str,
) -> Result<(BulkCounts, std::collections::BTreeMap<String, u64>), DbError> {
    counts_with(db.pool(), batch).await
}

/// [`batch_counts`], read in the transaction (what it changed included).
pub async fn batch_counts_in_txn(
    tx: &mut Tx<'_>,
    batch: &str,
) -> Result<(BulkCounts, std::collections::BTreeMap<String, u64>), DbError> {
    counts_with(&mut **tx, batch).await
}

async fn counts_with<'e>(
    ex: impl sqlx::PgExecutor<'e>,
    batch: &str,
) -> Result<(BulkCounts, std::collections::BTreeMap<String, u64>), DbError> {
    let rows: Vec<(String, Option<String>, i64)> = sqlx::query_as(
        "SELECT state, code, count(*) FROM batch_nodes WHERE batch_id = $1 GROUP BY state, code ORDER BY state, code",
    )
    .bind(batch)
    .fetch_all(ex)
    .await?;
    let mut c = BulkCounts::default();
    let mut errors = std::collections::BTreeMap::new();
    for (state, code, n) in rows {
        let n = n as u64;
        let slot =
            match BulkNodeState::parse(&state).ok_or_else(|| corrupt("node state", &state))? {
                BulkNodeState::Queued => &mut c.queued,
                BulkNodeState::Refused => &mut c.refused,
                BulkNodeState::Started => &mut c.started,
                BulkNodeState::Succeeded => &mut c.succeeded,
                BulkNodeState::Failed => &mut c.failed,
                BulkNodeState::Cancelled => &mut c.cancelled,
            };
        *slot += n;
        if let Some(code) = code {
            *errors.entry(code).or_insert(0) += n;
        }
    }
    Ok((c, errors))
}

/// Open bulk batches the runner drives (approved or running), oldest first.
pub async fn bulk_runnable(db: &Db) -> Result<Vec<Batch>, DbError> {
    let rows: Vec<BatchRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM batches WHERE state IN ('approved', 'running') AND scope = 'bulk' ORDER BY id"
    ))
    .fetch_all(db.pool())
    .await?;
    rows.into_iter().map(TryInto::try_into).collect()
}

/// Batches waiting for approval past their expiry.
pub async fn batches_expired(db: &Db) -> Result<Vec<Batch>, DbError> {
    let rows: Vec<BatchRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM batches WHERE state IN ('awaiting-approval', 'approved', 'running') AND expires_at <= now() ORDER BY id LIMIT 1000"
    ))
    .fetch_all(db.pool())
    .await?;
    rows.into_iter().map(TryInto::try_into).collect()
}

/// A started node of a bulk as it is now.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StartedNode {
    pub node_id: String,
    pub provision_state: String,
    /// The batch its current verb runs under.
    pub batch_id: Option<String>,
    pub last_error: Option<String>,
    /// No workflow of its runs (none, or its current one ended).
    pub workflow_done: bool,
}

/// Started nodes of a bulk, with their node's state now.
pub async fn bulk_started(db: &Db, batch: &str) -> Result<Vec<StartedNode>, DbError> {
    Ok(sqlx::query_as(
        "SELECT bn.node_id, n.provision_state, n.batch_id, n.last_error, \
         (w.id IS NULL OR w.status IN ('succeeded', 'failed', 'cancelled')) AS workflow_done \
         FROM batch_nodes bn JOIN nodes n ON n.id = bn.node_id LEFT JOIN workflows w ON w.id = n.workflow_id \
         WHERE bn.batch_id = $1 AND bn.state = 'started'",
    )
    .bind(batch)
    .fetch_all(db.pool())
    .await?)
}

/// Bulk batches that ended (cancelled, rejected, expired) with nodes still
/// running their chains.
pub async fn bulk_ended_with_started(db: &Db) -> Result<Vec<Batch>, DbError> {
    let rows: Vec<BatchRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM batches b WHERE scope = 'bulk' AND state IN ('cancelled', 'rejected', 'expired') \
         AND finished_at > now() - interval '7 days' \
         AND EXISTS (SELECT 1 FROM batch_nodes bn WHERE bn.batch_id = b.id AND bn.state = 'started') ORDER BY id LIMIT 100"
    ))
    .fetch_all(db.pool())
    .await?;
    rows.into_iter().map(TryInto::try_into).collect()
}

/// The next `n` queued nodes of a bulk, by position, locked (`SKIP LOCKED`:
/// another runner never takes them too).
pub async fn bulk_queued_take_in_txn(
    tx: &mut Tx<'_>,
    batch: &str,
    n: i64,
) -> Result<Vec<String>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT node_id FROM batch_nodes WHERE batch_id = $1 AND state = 'queued' \
         ORDER BY position LIMIT $2 FOR UPDATE SKIP LOCKED",
    )
    .bind(batch)
    .bind(n)
    .fetch_all(&mut **tx)
    .await?)
}

/// How many nodes of a pool's bulks (of any state: a cancelled bulk's
/// started nodes still run) are started and not finished.
pub async fn pool_in_flight_in_txn(tx: &mut Tx<'_>, pool: &str) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM batch_nodes bn JOIN batches b ON b.id = bn.batch_id \
         WHERE b.pool_id = $1 AND b.scope = 'bulk' AND bn.state = 'started'",
    )
    .bind(pool)
    .fetch_one(&mut **tx)
    .await?)
}

/// How many nodes of a site's bulks are started and not finished.
pub async fn site_in_flight_in_txn(tx: &mut Tx<'_>, site: &str) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM batch_nodes bn JOIN batches b ON b.id = bn.batch_id \
         WHERE b.site_id = $1 AND b.scope = 'bulk' AND bn.state = 'started'",
    )
    .bind(site)
    .fetch_one(&mut **tx)
    .await?)
}

/// Sets the state (and code, message) of some of a batch's nodes.
pub async fn batch_nodes_set_in_txn(
    tx: &mut Tx<'_>,
    batch: &str,
    updates: &[(String, BulkNodeState, Option<String>, Option<String>)],
) -> Result<(), DbError> {
    if updates.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = updates.iter().map(|u| u.0.as_str()).collect();
    let states: Vec<&str> = updates.iter().map(|u| u.1.as_str()).collect();
    let codes: Vec<Option<&str>> = updates.iter().map(|u| u.2.as_deref()).collect();
    let msgs: Vec<Option<&str>> = updates.iter().map(|u| u.3.as_deref()).collect();
    sqlx::query(
        "UPDATE batch_nodes bn SET state = u.st, code = coalesce(u.code, bn.code), message = coalesce(u.msg, bn.message), \
         started_at = CASE WHEN u.st = 'started' THEN now() ELSE bn.started_at END, \
         finished_at = CASE WHEN u.st NOT IN ('queued', 'started') THEN now() ELSE bn.finished_at END \
         FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS u(node, st, code, msg) \
         WHERE bn.batch_id = $1 AND bn.node_id = u.node",
    )
    .bind(batch)
    .bind(&ids)
    .bind(&states)
    .bind(&codes)
    .bind(&msgs)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Cancels a batch's queued nodes; how many.
pub async fn bulk_cancel_queued_in_txn(tx: &mut Tx<'_>, batch: &str) -> Result<u64, DbError> {
    Ok(sqlx::query(
        "UPDATE batch_nodes SET state = 'cancelled', finished_at = now() WHERE batch_id = $1 AND state = 'queued'",
    )
    .bind(batch)
    .execute(&mut **tx)
    .await?
    .rows_affected())
}
