//! Destructive batches in the caller's transaction: the one-node batch a
//! verb's chain runs under (approved by the pool's policy, signed with the
//! control plane's policy key, or left for approvers), the batch a bulk
//! request makes, the authority a held one-leaf command is released with,
//! and the approval that completes a quorum. What a signature is worth is
//! `bcm-quorum`'s; the records are `bcm-db`'s.

use bcm_contracts::batch::{ApprovalSignature, BatchAuthority, BatchHeader};
use bcm_core::batch::{BatchState, BulkNodeState, Operation};
use bcm_core::WipeMode;
use bcm_db::batches::{Batch, NewBatchNode, QuorumPolicy};
use bcm_db::nodes::Node;
use bcm_db::outbox::NewOutboxMessage;
use bcm_db::{DbError, Tx};
use chrono::{DateTime, Utc};
use ed25519_dalek::SigningKey;

/// The control plane's policy key: its signature approves a one-node batch
/// where the pool's policy (and the edges' trust anchor) allow it. Only
/// the API holds it.
#[derive(Clone)]
pub struct PolicySigner {
    /// The approver id the edges' anchors name it by.
    pub id: String,
    pub key: SigningKey,
}

impl std::fmt::Debug for PolicySigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicySigner")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A new batch id (`bat_` + ULID).
pub fn new_batch_id() -> String {
    format!("bat_{}", ulid::Ulid::new().to_string().to_lowercase())
}

/// What a verb's one-node batch came out as.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeBatch {
    pub id: String,
    pub state: BatchState,
    /// The held command's outbox row to send now, carrying the batch's
    /// authority: set when the pool's policy approved the batch as it was
    /// made (the row was not stored). `None` when the batch awaits its
    /// approvers (the row waits with it) or no row was held.
    pub send_now: Option<NewOutboxMessage>,
}

/// Makes the one-node batch `node`'s verb runs under, in the caller's
/// transaction: approved at once (signed with `signer`) when the pool
/// approves one-node batches by policy and this control plane holds the
/// policy key; otherwise awaiting the pool's approvers, at least
/// `min_required` of them (the edges' anchor's quorum). `held` is a
/// one-leaf command's outbox row: stored with a batch left for approvers,
/// to be published by the approval that completes its quorum; returned,
/// authorized, in [`NodeBatch::send_now`] from a batch approved at once.
#[allow(clippy::too_many_arguments)]
pub async fn node_batch_in_txn(
    tx: &mut Tx<'_>,
    node: &Node,
    op: Operation,
    wipe: Option<WipeMode>,
    requested_by: &str,
    reason: &str,
    ttl: chrono::Duration,
    signer: Option<&PolicySigner>,
    min_required: u32,
    held: Option<NewOutboxMessage>,
) -> Result<NodeBatch, DbError> {
    let policy = bcm_db::batches::pool_policy_in_txn(tx, node.pool_id.as_str())
        .await?
        .at_least(min_required);
    let id = new_batch_id();
    let node_id = node.id.to_string();
    let wipe = wipe.filter(|_| op.takes_wipe());
    let built = bcm_quorum::build(std::slice::from_ref(&node_id), op, wipe)
        .ok_or_else(|| DbError::Unstorable("a batch of no node".into()))?;
    let now = Utc::now();
    let header = BatchHeader {
        batch_id: id.clone(),
        tenant_id: node.tenant_id.to_string(),
        pool_id: node.pool_id.to_string(),
        operation: op,
        wipe,
        reason_sha256: bcm_quorum::reason_sha256(reason),
        expires_at: (now + ttl).timestamp(),
        root: built.root,
        leaf_count: 1,
    };
    let auto = signer.filter(|_| policy.auto_approve_single);
    let state = if auto.is_some() {
        BatchState::Approved
    } else {
        BatchState::AwaitingApproval
    };
    let batch = Batch {
        header,
        site_id: node.site_id.to_string(),
        scope: "node".into(),
        reason: reason.to_owned(),
        requested_by: requested_by.to_owned(),
        state,
        quorum_required: policy.required,
        requester_may_approve: policy.requester_may_approve,
        state_reason: auto.map(|_| "approved by the pool's policy".to_owned()),
        created_at: now,
        approved_at: auto.map(|_| now),
        finished_at: None,
    };
    let leaf = NewBatchNode {
        node_id,
        position: 0,
        leaf_index: Some(0),
        proof: vec![],
        state: BulkNodeState::Started,
        code: None,
        message: None,
    };
    let stored = held.as_ref().filter(|_| auto.is_none()).map(held_json);
    bcm_db::batches::batch_insert_in_txn(tx, &batch, &[leaf], stored.as_ref()).await?;
    let mut send_now = None;
    if let Some(s) = auto {
        let approval = ApprovalSignature {
            approver_id: s.id.clone(),
            signature: bcm_quorum::sign(&s.key, &batch.header),
        };
        bcm_db::batches::approval_insert_in_txn(tx, &id, &approval, bcm_quorum::POLICY_PRINCIPAL)
            .await?;
        // As `bcm_db::batches::authority_in_txn` would read it back: the
        // header, the only leaf (no proof), the one approval.
        let authority = BatchAuthority {
            header: batch.header,
            leaf_index: 0,
            proof: vec![],
            approvals: vec![approval],
        };
        if let Some(row) = held {
            send_now = Some(release_approved_in_txn(tx, &id, &authority, row).await?);
        }
    }
    Ok(NodeBatch {
        id,
        state,
        send_now,
    })
}

fn held_json(m: &NewOutboxMessage) -> serde_json::Value {
    serde_json::json!({
        "id": m.id,
        "subject": m.subject,
        "payload": m.payload,
        "headers": m.headers,
        "nodeId": m.node_id,
    })
}

/// The held one-leaf command of an approved batch, released: its envelope
/// now carries the batch's authority and a fresh deadline; its command row
/// names the batch. `None` when the batch held nothing.
pub async fn release_held_in_txn(
    tx: &mut Tx<'_>,
    batch: &str,
) -> Result<Option<NewOutboxMessage>, DbError> {
    let Some(held) = bcm_db::batches::held_message_take_in_txn(tx, batch).await? else {
        return Ok(None);
    };
    let bad = |w: &str| DbError::Corrupt(format!("held message of {batch}: {w}"));
    let node = held["nodeId"]
        .as_str()
        .ok_or_else(|| bad("node"))?
        .to_owned();
    let mut payload = held["payload"].clone();
    let command_id = payload["data"]["commandId"]
        .as_str()
        .ok_or_else(|| bad("command id"))?
        .to_owned();
    let authority = match bcm_db::batches::authority_in_txn(tx, batch, &node).await? {
        bcm_db::batches::AuthorityState::Ready(a) => a,
        other => return Err(bad(&format!("not ready to release: {other:?}"))),
    };
    authorize(&mut payload, &authority).map_err(|e| bad(&e))?;
    bcm_db::commands::command_set_batch_in_txn(tx, &command_id, batch).await?;
    Ok(Some(NewOutboxMessage {
        id: held["id"].as_str().ok_or_else(|| bad("id"))?.to_owned(),
        subject: held["subject"]
            .as_str()
            .ok_or_else(|| bad("subject"))?
            .to_owned(),
        payload,
        headers: held["headers"].as_object().cloned().unwrap_or_default(),
        node_id: Some(node),
    }))
}

/// A one-leaf command's outbox row under a batch the pool's policy approved
/// as it was made, released in the same transaction
/// ([`NodeBatch::send_now`]): it carries the batch's authority and a fresh
/// deadline, and its command row names the batch. What
/// [`release_held_in_txn`] does for a command held until its approvers
/// signed, without storing the command in the batch only to take it back
/// and read the authority again.
async fn release_approved_in_txn(
    tx: &mut Tx<'_>,
    batch: &str,
    authority: &BatchAuthority,
    mut row: NewOutboxMessage,
) -> Result<NewOutboxMessage, DbError> {
    let bad = |w: &str| DbError::Corrupt(format!("command released under {batch}: {w}"));
    let command_id = row.payload["data"]["commandId"]
        .as_str()
        .ok_or_else(|| bad("command id"))?
        .to_owned();
    authorize(&mut row.payload, authority).map_err(|e| bad(&e))?;
    bcm_db::commands::command_set_batch_in_txn(tx, &command_id, batch).await?;
    Ok(row)
}

/// Sets a command envelope's (CloudEvent payload's) authority and a fresh
/// deadline.
fn authorize(payload: &mut serde_json::Value, authority: &BatchAuthority) -> Result<(), String> {
    payload["data"]["authority"] = serde_json::to_value(authority).map_err(|e| e.to_string())?;
    payload["data"]["deadline"] = serde_json::json!(Utc::now() + crate::bmc::LEAF_COMMAND_TTL);
    Ok(())
}

/// The held one-leaf command of a batch that ended unapproved (rejected,
/// cancelled, expired), sent without authority and with a fresh deadline:
/// the site refuses it unrun (`FORBIDDEN`), and that result ends the
/// command the usual way — a held rotation rolls back instead of leaving
/// the node waiting for an answer that would never come.
pub async fn release_held_refused_in_txn(
    tx: &mut Tx<'_>,
    batch: &str,
) -> Result<Option<NewOutboxMessage>, DbError> {
    let Some(held) = bcm_db::batches::held_message_take_in_txn(tx, batch).await? else {
        return Ok(None);
    };
    let bad = |w: &str| DbError::Corrupt(format!("held message of {batch}: {w}"));
    let mut payload = held["payload"].clone();
    payload["data"]["deadline"] = serde_json::json!(Utc::now() + crate::bmc::LEAF_COMMAND_TTL);
    Ok(Some(NewOutboxMessage {
        id: held["id"].as_str().ok_or_else(|| bad("id"))?.to_owned(),
        subject: held["subject"]
            .as_str()
            .ok_or_else(|| bad("subject"))?
            .to_owned(),
        payload,
        headers: held["headers"].as_object().cloned().unwrap_or_default(),
        node_id: held["nodeId"].as_str().map(str::to_owned),
    }))
}

/// A bulk request's batch: the header over the admitted nodes (in request
/// order) and every node's row, refused ones with their code.
pub struct BulkBatch {
    pub batch: Batch,
    pub nodes: Vec<NewBatchNode>,
}

/// Builds a bulk's batch (nothing stored): `admitted` become the leaves,
/// `refused` are kept with their code and message.
#[allow(clippy::too_many_arguments)]
pub fn bulk_batch(
    tenant: &str,
    pool: &str,
    site: &str,
    op: Operation,
    wipe: Option<WipeMode>,
    reason: &str,
    requested_by: &str,
    expires_at: DateTime<Utc>,
    policy: &QuorumPolicy,
    admitted: &[String],
    refused: &[(usize, String, String, String)],
    positions: &[usize],
) -> Option<BulkBatch> {
    let wipe = wipe.filter(|_| op.takes_wipe());
    let built = bcm_quorum::build(admitted, op, wipe)?;
    let now = Utc::now();
    let header = BatchHeader {
        batch_id: new_batch_id(),
        tenant_id: tenant.to_owned(),
        pool_id: pool.to_owned(),
        operation: op,
        wipe,
        reason_sha256: bcm_quorum::reason_sha256(reason),
        expires_at: expires_at.timestamp(),
        root: built.root,
        leaf_count: admitted.len() as u32,
    };
    let mut nodes: Vec<NewBatchNode> = admitted
        .iter()
        .zip(built.proofs)
        .zip(positions)
        .enumerate()
        .map(|(i, ((n, proof), pos))| NewBatchNode {
            node_id: n.clone(),
            position: *pos as i32,
            leaf_index: Some(i as i32),
            proof,
            state: BulkNodeState::Queued,
            code: None,
            message: None,
        })
        .collect();
    nodes.extend(refused.iter().map(|(pos, n, code, msg)| NewBatchNode {
        node_id: n.clone(),
        position: *pos as i32,
        leaf_index: None,
        proof: vec![],
        state: BulkNodeState::Refused,
        code: Some(code.clone()),
        message: Some(msg.clone()),
    }));
    Some(BulkBatch {
        batch: Batch {
            header,
            site_id: site.to_owned(),
            scope: "bulk".into(),
            reason: reason.to_owned(),
            requested_by: requested_by.to_owned(),
            state: BatchState::AwaitingApproval,
            quorum_required: policy.required,
            requester_may_approve: policy.requester_may_approve,
            state_reason: None,
            created_at: now,
            approved_at: None,
            finished_at: None,
        },
        nodes,
    })
}
