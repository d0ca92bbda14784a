//! The destructive-batch quorum over HTTP: `metal.bulk` (a verb over up to
//! 10,000 nodes of one pool, admitted node by node into one batch that
//! approvers sign once), batch reads (counts per node state and per error,
//! the leaves, the digest and the message approvers sign), approvals
//! (each signature checked as it arrives; the one that completes the
//! quorum approves the batch and releases what it held), rejection and
//! cancel, and the approvers' registry. Decided on the pool; every write
//! names the acting principal.

use std::collections::{BTreeMap, HashMap, HashSet};

use axum::extract::State;
use axum::Json;
use bcm_contracts::batch::{ApprovalSignature, BatchHeader};
use bcm_contracts::events::{BulkApproved, BulkCounts, BulkCreated, BulkFinished};
use bcm_core::authz::{Action, Placement};
use bcm_core::batch::{BatchState, BulkNodeState, Operation, BULK_MAX_NODES};
use bcm_core::{ErrorCode, NodeFacts, NodeId, PoolId, TenantId, WipeMode};
use bcm_db::batches::Batch;
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{Body, Path, Query};
use crate::AppState;

/// The longest reason approvers read.
const MAX_REASON: usize = 1024;
/// A bulk's default expiry.
const DEFAULT_BULK_TTL_SECS: u64 = 86_400;

/// `metal.bulk`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BulkRequest {
    pub tenant_id: TenantId,
    pub pool_id: PoolId,
    /// `manage`, `inspect`, `provide`, `undeploy`, `rescue` or `retire`.
    pub verb: bcm_core::batch::BulkVerb,
    /// 1 to 10,000 node ids of the pool, each once.
    #[schema(min_items = 1, max_items = 10000)]
    pub node_ids: Vec<NodeId>,
    /// `undeploy` only: the release's wipe (default: the pool's
    /// `releaseWipe`; `none` is refused).
    #[serde(default)]
    #[schema(schema_with = crate::openapi::release_wipe_schema)]
    pub wipe: Option<WipeMode>,
    /// What approvers read.
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001f\\u007f]*$"
    )]
    pub reason: String,
    /// How long approvals and the batch's commands count (60 s to the
    /// configured maximum; a day by default).
    #[serde(default, deserialize_with = "crate::whole_number::optional")]
    #[schema(minimum = 60, maximum = 604800)]
    pub expires_in_secs: Option<u64>,
}

/// A node refused at admission, with its code.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    pub node_id: String,
    pub code: ErrorCode,
    pub message: String,
}

/// A batch as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchView {
    pub header: BatchHeader,
    /// SHA-256 (hex) of the header's canonical bytes.
    pub digest: String,
    /// The exact bytes an approver signs (ed25519), as text.
    pub approval_message: String,
    /// `node` (one verb's chain) or `bulk`.
    pub scope: String,
    pub state: BatchState,
    pub reason: String,
    pub requested_by: String,
    pub quorum_required: i32,
    pub requester_may_approve: bool,
    pub approvals: Vec<ApprovalView>,
    pub counts: BulkCounts,
    /// Refused and failed nodes by code.
    pub errors: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_reason: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// One approval of a batch.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalView {
    pub approver_id: String,
    pub principal: String,
    pub approved_at: chrono::DateTime<chrono::Utc>,
}

/// What `metal.bulk` answers: the batch and the nodes refused at admission.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BulkView {
    pub batch: BatchView,
    pub refused: Vec<Refusal>,
}

/// A batch's view, with its counts and approvals.
pub async fn view(app: &AppState, b: Batch) -> Result<BatchView, ApiError> {
    let a = &app.inner;
    let (counts, errors) = bcm_db::batches::batch_counts(&a.db, &b.header.batch_id).await?;
    let mut tx = a.db.begin().await?;
    let approvals = bcm_db::batches::approvals_in_txn(&mut tx, &b.header.batch_id).await?;
    tx.rollback().await.map_err(bcm_db::DbError::from)?;
    Ok(BatchView {
        digest: hex::encode(bcm_quorum::digest(&b.header)),
        approval_message: String::from_utf8_lossy(&bcm_quorum::approval_message(&b.header))
            .into_owned(),
        approvals: approvals
            .into_iter()
            .map(|(s, principal, at)| ApprovalView {
                approver_id: s.approver_id,
                principal,
                approved_at: at,
            })
            .collect(),
        header: b.header,
        scope: b.scope,
        state: b.state,
        reason: b.reason,
        requested_by: b.requested_by,
        quorum_required: b.quorum_required,
        requester_may_approve: b.requester_may_approve,
        counts,
        errors,
        state_reason: b.state_reason,
        created_at: b.created_at,
        approved_at: b.approved_at,
        finished_at: b.finished_at,
    })
}

/// `POST /api/compute/metal/bulk`: admits each node on its own (a node the
/// pool does not hold is `NOT_FOUND`, one whose state refuses the verb is
/// `INVALID_STATE`; the others go ahead) into one batch awaiting the
/// pool's approvers.
#[utoipa::path(post, path = "/api/compute/metal/bulk", operation_id = "bulk", request_body = BulkRequest, tag = "metal",
    responses((status = 200, body = BulkView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn create(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<BulkRequest>,
) -> Result<Json<BulkView>, ApiError> {
    let a = &app.inner;
    let op = req.verb.operation();
    if req.node_ids.is_empty() || req.node_ids.len() > BULK_MAX_NODES {
        return Err(ApiError::invalid(format!(
            "nodeIds must name 1 to {BULK_MAX_NODES} nodes, not {}",
            req.node_ids.len()
        )));
    }
    if !bcm_core::text::is_free_text(&req.reason, 1, MAX_REASON) {
        return Err(ApiError::invalid(format!(
            "reason must be 1-{MAX_REASON} characters without control characters"
        )));
    }
    let wipe = match (op, req.wipe) {
        (Operation::Undeploy, Some(w)) if !w.can_reach_ready() => {
            return Err(ApiError::invalid(bcm_core::node::WIPE_NONE_REFUSED))
        }
        // The pool's default, once the pool is read.
        (Operation::Undeploy, w) => Some(w),
        (_, None) => None,
        (op, Some(_)) => {
            return Err(ApiError::new(
                ErrorCode::InvalidConfig,
                format!("wipe applies to undeploy only, not {op}"),
            ))
        }
    };
    let ttl = req.expires_in_secs.unwrap_or(DEFAULT_BULK_TTL_SECS);
    if ttl < 60 || ttl > a.quorum.bulk_max_ttl_secs {
        return Err(ApiError::invalid(format!(
            "expiresInSecs must be 60 to {}",
            a.quorum.bulk_max_ttl_secs
        )));
    }
    let ids = &req.node_ids;
    let mut seen = HashSet::with_capacity(ids.len());
    for (i, id) in ids.iter().enumerate() {
        // A node named twice would be two leaves for one machine.
        if !seen.insert(*id) {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("nodeIds[{i}] repeats node {id}"),
            ));
        }
    }
    // Decided on the pool.
    let pool = match bcm_db::tenancy::pool_fetch(&a.db, &req.pool_id).await {
        Ok(p) if p.tenant_id == req.tenant_id => p,
        Ok(_) | Err(bcm_db::DbError::NotFound) => {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!("pool {} not found in tenant {}", req.pool_id, req.tenant_id),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let verb = op
        .verb()
        .ok_or_else(|| ApiError::internal("a bulk operation without a verb"))?;
    let at = Placement {
        tenant: pool.tenant_id.clone(),
        pool: pool.id.clone(),
    };
    who.require(Action::for_verb(verb), &at, || format!("pool {}", pool.id))?;
    let wipe = match wipe {
        Some(Some(w)) => Some(w),
        Some(None) => Some(WipeMode::parse(&pool.release_wipe).ok_or_else(|| {
            ApiError::internal(format!("pool {} has a bad release wipe", pool.id))
        })?),
        None => None,
    };
    // Each node on its own, as the verb it applies.
    let id_texts: Vec<String> = ids.iter().map(ToString::to_string).collect();
    let mut tx = a.db.begin().await?;
    let nodes = bcm_db::nodes::nodes_fetch_many_in_txn(&mut tx, &id_texts).await?;
    tx.rollback().await.map_err(bcm_db::DbError::from)?;
    let by_id: HashMap<NodeId, &bcm_db::nodes::Node> = nodes.iter().map(|n| (n.id, n)).collect();
    let mut admitted = vec![];
    let mut positions = vec![];
    let mut refused: Vec<(usize, String, String, String)> = vec![];
    for (i, id) in ids.iter().enumerate() {
        let refuse = match by_id.get(id) {
            Some(n) if n.pool_id == pool.id && n.tenant_id == pool.tenant_id => {
                match bcm_core::apply(NodeFacts::at(n.provision_state), bcm_core::Move::Verb(verb))
                {
                    Ok(_) => None,
                    Err(e) => Some((ErrorCode::InvalidState, e.to_string())),
                }
            }
            _ => Some((
                ErrorCode::NotFound,
                format!("node {id} not found in pool {}", pool.id),
            )),
        };
        match refuse {
            None => {
                admitted.push(id.to_string());
                positions.push(i);
            }
            Some((code, message)) => {
                refused.push((i, id.to_string(), code.as_str().to_owned(), message))
            }
        }
    }
    let refusals: Vec<Refusal> = refused
        .iter()
        .map(|(_, n, code, message)| Refusal {
            node_id: n.clone(),
            code: ErrorCode::parse(code).unwrap_or(ErrorCode::InvalidState),
            message: message.clone(),
        })
        .collect();
    if admitted.is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidState,
            format!(
                "no node of the request can {}: {}",
                op,
                refusals
                    .iter()
                    .take(5)
                    .map(|r| format!("{} {}", r.node_id, r.code))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let mut tx = a.db.begin().await?;
    let policy = bcm_db::batches::pool_policy_in_txn(&mut tx, pool.id.as_str())
        .await?
        .at_least(a.edge_quorum);
    let expires = chrono::Utc::now() + chrono::Duration::seconds(ttl as i64);
    let built = bcm_metal::batches::bulk_batch(
        pool.tenant_id.as_str(),
        pool.id.as_str(),
        pool.site_id.as_str(),
        op,
        wipe,
        &req.reason,
        &who.name,
        expires,
        &policy,
        &admitted,
        &refused,
        &positions,
    )
    .ok_or_else(|| ApiError::internal("a batch of no node"))?;
    bcm_db::batches::batch_insert_in_txn(&mut tx, &built.batch, &built.nodes, None).await?;
    let h = &built.batch.header;
    let created = bcm_bus::outgoing::batch_event(
        a.bus.subjects(),
        &pool.tenant_id,
        &h.batch_id,
        bcm_contracts::events::types::BULK_CREATED,
        BulkCreated {
            batch_id: h.batch_id.clone(),
            tenant_id: pool.tenant_id.clone(),
            pool_id: pool.id.clone(),
            operation: op,
            digest: hex::encode(bcm_quorum::digest(h)),
            reason: req.reason.clone(),
            requested_by: who.name.clone(),
            admitted: admitted.len() as u64,
            refused: refused.len() as u64,
            quorum_required: policy.required as u32,
            expires_at: expires,
        },
    );
    bcm_metal::outbox::write_in_txn(&mut tx, vec![bcm_metal::outbox::row(created)]).await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    metrics::counter!("bcm_bulk_requests_total", "verb" => op.as_str()).increment(1);
    tracing::info!(batch = %h.batch_id, verb = %op, admitted = admitted.len(), refused = refused.len(), by = %who.name, "bulk admitted");
    let batch = bcm_db::batches::batch_fetch(&a.db, &h.batch_id).await?;
    Ok(Json(BulkView {
        batch: view(&app, batch).await?,
        refused: refusals,
    }))
}

/// Whether `id` could name a batch (`bat_` and a lowercase ULID).
fn valid_batch_id(id: &str) -> bool {
    id.len() == 30
        && id.starts_with("bat_")
        && id[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
}

/// A batch the principal may read: its pool's nodes are readable to them.
async fn readable(app: &AppState, who: &Principal, id: &str) -> Result<Batch, ApiError> {
    let not_found = || ApiError::new(ErrorCode::NotFound, format!("batch {id:.40} not found"));
    if !valid_batch_id(id) {
        return Err(not_found());
    }
    let b = match bcm_db::batches::batch_fetch(&app.inner.db, id).await {
        Ok(b) => b,
        Err(bcm_db::DbError::NotFound) => return Err(not_found()),
        Err(e) => return Err(e.into()),
    };
    let at = placement(&b)?;
    if !who.admin
        && bcm_core::authz::decide(&who.grants, Action::NodesRead, &at)
            != bcm_core::authz::Decision::Allow
    {
        return Err(not_found());
    }
    Ok(b)
}

fn placement(b: &Batch) -> Result<Placement, ApiError> {
    Ok(Placement {
        tenant: b
            .header
            .tenant_id
            .parse()
            .map_err(|_| ApiError::internal("a stored batch with a bad tenant"))?,
        pool: b
            .header
            .pool_id
            .parse()
            .map_err(|_| ApiError::internal("a stored batch with a bad pool"))?,
    })
}

/// `GET /api/compute/metal/batches/{id}`.
#[utoipa::path(get, path = "/api/compute/metal/batches/{id}", operation_id = "getBatch", tag = "metal",
    params(("id" = String, Path)), responses((status = 200, body = BatchView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn get(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<Json<BatchView>, ApiError> {
    let b = readable(&app, &who, &id).await?;
    Ok(Json(view(&app, b).await?))
}

/// A page of a batch's nodes.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct NodesPage {
    /// Nodes after this position.
    pub after: Option<i32>,
    /// At most this many (1000 by default).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<i64>,
}

/// A node of a batch.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchNodeView {
    pub node_id: String,
    pub position: i32,
    /// Its leaf index; none when refused at admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaf_index: Option<i32>,
    pub state: BulkNodeState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `GET /api/compute/metal/batches/{id}/nodes`: the nodes by position, so
/// an approver can rebuild the Merkle root from the leaves.
#[utoipa::path(get, path = "/api/compute/metal/batches/{id}/nodes", operation_id = "listBatchNodes", tag = "metal",
    params(("id" = String, Path), NodesPage), responses((status = 200, body = Vec<BatchNodeView>), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn nodes(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Query(page): Query<NodesPage>,
) -> Result<Json<Vec<BatchNodeView>>, ApiError> {
    let limit = page.limit.unwrap_or(1000);
    if !(1..=10_000).contains(&limit) {
        return Err(ApiError::invalid("limit must be 1 to 10000"));
    }
    let b = readable(&app, &who, &id).await?;
    let rows = bcm_db::batches::batch_nodes_list(
        &app.inner.db,
        &b.header.batch_id,
        page.after.unwrap_or(-1),
        limit,
    )
    .await?;
    let nodes = rows
        .into_iter()
        .map(|r| {
            Ok(BatchNodeView {
                state: BulkNodeState::parse(&r.state).ok_or_else(|| {
                    ApiError::internal(format!("a stored bulk node state {:?}", r.state))
                })?,
                node_id: r.node_id,
                position: r.position,
                leaf_index: r.leaf_index,
                code: r.code,
                message: r.message,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Json(nodes))
}

/// Which batches to list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListBatches {
    pub tenant_id: Option<TenantId>,
    /// The batches naming this node (its verbs' one-node batches too).
    pub node_id: Option<NodeId>,
}

/// `GET /api/compute/metal/batches`: bulk batches, newest first (100); with
/// `nodeId`, every batch naming the node.
#[utoipa::path(get, path = "/api/compute/metal/batches", operation_id = "listBatches", tag = "metal",
    params(ListBatches), responses((status = 200, body = Vec<BatchView>), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn list(
    State(app): State<AppState>,
    who: Principal,
    Query(q): Query<ListBatches>,
) -> Result<Json<Vec<BatchView>>, ApiError> {
    let batches = match &q.node_id {
        Some(n) => bcm_db::batches::batches_of_node(&app.inner.db, &n.to_string(), 100).await?,
        None => {
            bcm_db::batches::batches_list(
                &app.inner.db,
                q.tenant_id.as_ref().map(|t| t.as_str()),
                100,
            )
            .await?
        }
    };
    let mut out = vec![];
    for b in batches {
        let at = placement(&b)?;
        if who.admin
            || bcm_core::authz::decide(&who.grants, Action::NodesRead, &at)
                == bcm_core::authz::Decision::Allow
        {
            out.push(view(&app, b).await?);
        }
    }
    Ok(Json(out))
}

/// An approval.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApproveRequest {
    pub approver_id: String,
    /// ed25519 over the batch's approval message, base64.
    pub signature: String,
    /// The digest the approver checked (hex); refused when it is not the
    /// batch's.
    #[serde(default)]
    pub digest: Option<String>,
}

/// An approver acting on a batch: registered, not revoked, of the batch's
/// tenant, posting as its own principal, and not the requester where the
/// policy forbids it.
async fn acting_approver(
    app: &AppState,
    who: &Principal,
    b: &Batch,
    approver_id: &str,
) -> Result<bcm_db::batches::Approver, ApiError> {
    let forbidden = |m: String| ApiError::new(ErrorCode::Forbidden, m);
    if !bcm_core::text::is_profile_id(approver_id) {
        return Err(forbidden(format!(
            "approver {approver_id:.64} is not registered: its key is unknown"
        )));
    }
    let approver = match bcm_db::batches::approver_fetch(&app.inner.db, approver_id).await {
        Ok(a) => a,
        Err(bcm_db::DbError::NotFound) => {
            return Err(forbidden(format!(
                "approver {approver_id:.64} is not registered: its key is unknown"
            )))
        }
        Err(e) => return Err(e.into()),
    };
    if approver.revoked_at.is_some() {
        return Err(forbidden(format!("approver {approver_id} was revoked")));
    }
    if approver.tenant_id != b.header.tenant_id {
        return Err(forbidden(format!(
            "approver {approver_id} does not approve for tenant {}",
            b.header.tenant_id
        )));
    }
    if approver.principal != who.name {
        return Err(forbidden(format!(
            "{} may not sign as approver {approver_id}",
            who.name
        )));
    }
    if approver.principal == b.requested_by && !b.requester_may_approve {
        return Err(forbidden(format!(
            "{} requested batch {} and the pool's policy forbids the requester to approve it",
            who.name, b.header.batch_id
        )));
    }
    Ok(approver)
}

/// `POST /api/compute/metal/batches/{id}/approve`: records one approver's
/// signature; the one that completes the quorum approves the batch.
#[utoipa::path(post, path = "/api/compute/metal/batches/{id}/approve", operation_id = "approveBatch", tag = "metal", request_body = ApproveRequest,
    params(("id" = String, Path)), responses((status = 200, body = BatchView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn approve(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Body(req): Body<ApproveRequest>,
) -> Result<Json<BatchView>, ApiError> {
    let a = &app.inner;
    let b = batch_for_approver(&app, &id).await?;
    let approver = acting_approver(&app, &who, &b, &req.approver_id).await?;
    let digest = hex::encode(bcm_quorum::digest(&b.header));
    if let Some(d) = &req.digest {
        if !d.eq_ignore_ascii_case(&digest) {
            return Err(ApiError::invalid(format!(
                "the signed digest {d:.64} is not batch {}'s ({digest})",
                b.header.batch_id
            )));
        }
    }
    let mut tx = a.db.begin().await?;
    let b = bcm_db::batches::batch_fetch_for_update_in_txn(&mut tx, &b.header.batch_id).await?;
    if !matches!(
        b.state,
        BatchState::AwaitingApproval | BatchState::Approved | BatchState::Running
    ) {
        return Err(ApiError::new(
            ErrorCode::InvalidState,
            format!("batch {} is {}", b.header.batch_id, b.state),
        ));
    }
    let existing = bcm_db::batches::approvals_in_txn(&mut tx, &b.header.batch_id).await?;
    let already: Vec<String> = existing
        .iter()
        .map(|(s, _, _)| s.approver_id.clone())
        .collect();
    let signature = ApprovalSignature {
        approver_id: approver.id.clone(),
        signature: req.signature.clone(),
    };
    bcm_quorum::verify_approval(
        &b.header,
        &approver.public_key,
        &signature,
        &already,
        chrono::Utc::now().timestamp(),
    )
    .map_err(|e| match e {
        bcm_quorum::QuorumError::Expired { .. } => {
            ApiError::new(ErrorCode::InvalidState, e.to_string())
        }
        bcm_quorum::QuorumError::Duplicate(_) => ApiError::new(ErrorCode::Conflict, e.to_string()),
        bcm_quorum::QuorumError::BadKey(_) => ApiError::new(
            ErrorCode::Forbidden,
            format!("approver {}'s registered key is unusable: {e}", approver.id),
        ),
        other => ApiError::new(ErrorCode::Forbidden, other.to_string()),
    })?;
    bcm_db::batches::approval_insert_in_txn(&mut tx, &b.header.batch_id, &signature, &who.name)
        .await?;
    // Distinct people: a principal holding two approver ids counts once
    // (the policy key is nobody).
    let mut principals: Vec<String> = existing
        .iter()
        .filter(|(_, principal, _)| principal != bcm_quorum::POLICY_PRINCIPAL)
        .map(|(_, principal, _)| principal.clone())
        .collect();
    principals.push(who.name.clone());
    principals.sort();
    principals.dedup();
    let mut approvers: Vec<String> = existing
        .into_iter()
        .filter(|(_, principal, _)| principal != bcm_quorum::POLICY_PRINCIPAL)
        .map(|(s, _, _)| s.approver_id)
        .collect();
    approvers.push(approver.id.clone());
    let mut rows = vec![];
    if b.state == BatchState::AwaitingApproval && principals.len() as i32 >= b.quorum_required {
        bcm_db::batches::batch_set_state_in_txn(
            &mut tx,
            &b.header.batch_id,
            &[BatchState::AwaitingApproval],
            BatchState::Approved,
            Some(&format!("approved by {}", approvers.join(", "))),
        )
        .await?;
        if b.scope == "bulk" {
            rows.push(bcm_metal::outbox::row(bcm_bus::outgoing::batch_event(
                a.bus.subjects(),
                &placement(&b)?.tenant,
                &b.header.batch_id,
                bcm_contracts::events::types::BULK_APPROVED,
                BulkApproved {
                    batch_id: b.header.batch_id.clone(),
                    tenant_id: placement(&b)?.tenant,
                    approvers: approvers.clone(),
                },
            )));
        }
        rows.extend(bcm_metal::batches::release_held_in_txn(&mut tx, &b.header.batch_id).await?);
        tracing::info!(batch = %b.header.batch_id, approvers = %approvers.join(","), "batch approved");
    }
    bcm_metal::outbox::write_in_txn(&mut tx, rows).await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    metrics::counter!("bcm_batch_approvals_total").increment(1);
    tracing::info!(batch = %b.header.batch_id, approver = %approver.id, by = %who.name, "approval recorded");
    let b = bcm_db::batches::batch_fetch(&a.db, &b.header.batch_id).await?;
    Ok(Json(view(&app, b).await?))
}

/// A batch an approver acts on: [`acting_approver`] decides whether they
/// may (an approver needs no read grant on the pool).
async fn batch_for_approver(app: &AppState, id: &str) -> Result<Batch, ApiError> {
    let not_found = || ApiError::new(ErrorCode::NotFound, format!("batch {id:.40} not found"));
    if !valid_batch_id(id) {
        return Err(not_found());
    }
    match bcm_db::batches::batch_fetch(&app.inner.db, id).await {
        Ok(b) => Ok(b),
        Err(bcm_db::DbError::NotFound) => Err(not_found()),
        Err(e) => Err(e.into()),
    }
}

/// A rejection: the approver rejecting, and why.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RejectRequest {
    pub approver_id: String,
    #[serde(default)]
    #[schema(max_length = 1024, pattern = "^[^\\u0000-\\u001f\\u007f]*$")]
    pub reason: Option<String>,
}

/// A cancel, and why.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancelRequest {
    #[serde(default)]
    #[schema(max_length = 1024, pattern = "^[^\\u0000-\\u001f\\u007f]*$")]
    pub reason: Option<String>,
}

/// Ends a batch (`rejected` or `cancelled`): its queued nodes are cancelled
/// (never started); started nodes finish their chains.
async fn end(app: &AppState, b: &Batch, to: BatchState, reason: String) -> Result<(), ApiError> {
    let a = &app.inner;
    // A verb's own batch ends only before anything ran under it: once its
    // chain runs, `abort` stops it (and runs its cleanup under the batch).
    let endable: &[BatchState] = if b.scope == "bulk" {
        &[
            BatchState::AwaitingApproval,
            BatchState::Approved,
            BatchState::Running,
        ]
    } else {
        &[BatchState::AwaitingApproval]
    };
    let mut tx = a.db.begin().await?;
    let moved = bcm_db::batches::batch_set_state_in_txn(
        &mut tx,
        &b.header.batch_id,
        endable,
        to,
        Some(&reason),
    )
    .await?;
    if !moved {
        return Err(ApiError::new(
            ErrorCode::InvalidState,
            if b.scope == "bulk" {
                format!("batch {} has ended already", b.header.batch_id)
            } else {
                format!(
                    "batch {} is not awaiting approval: a verb's running chain is stopped with abort",
                    b.header.batch_id
                )
            },
        ));
    }
    bcm_db::batches::bulk_cancel_queued_in_txn(&mut tx, &b.header.batch_id).await?;
    // A held one-leaf command goes out without authority: the site refuses
    // it, and its result ends it the usual way (a rotation rolls back).
    let refused =
        bcm_metal::batches::release_held_refused_in_txn(&mut tx, &b.header.batch_id).await?;
    bcm_metal::outbox::write_in_txn(&mut tx, refused.into_iter().collect()).await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    if b.scope == "bulk" {
        let (counts, _) = bcm_db::batches::batch_counts(&a.db, &b.header.batch_id).await?;
        let mut tx = a.db.begin().await?;
        let ev = bcm_bus::outgoing::batch_event(
            a.bus.subjects(),
            &placement(b)?.tenant,
            &b.header.batch_id,
            bcm_contracts::events::types::BULK_FINISHED,
            BulkFinished {
                batch_id: b.header.batch_id.clone(),
                tenant_id: placement(b)?.tenant,
                state: to,
                counts,
                reason: Some(reason),
            },
        );
        bcm_metal::outbox::write_in_txn(&mut tx, vec![bcm_metal::outbox::row(ev)]).await?;
        tx.commit().await.map_err(bcm_db::DbError::from)?;
    }
    Ok(())
}

fn check_reason(r: &Option<String>) -> Result<(), ApiError> {
    if r.as_ref()
        .is_some_and(|r| !bcm_core::text::is_free_text(r, 0, MAX_REASON))
    {
        return Err(ApiError::invalid(format!(
            "reason must be at most {MAX_REASON} characters without control characters"
        )));
    }
    Ok(())
}

/// `POST /api/compute/metal/batches/{id}/reject`: an approver refuses the
/// batch; nothing of it that has not started ever will.
#[utoipa::path(post, path = "/api/compute/metal/batches/{id}/reject", operation_id = "rejectBatch", tag = "metal", request_body = RejectRequest,
    params(("id" = String, Path)), responses((status = 200, body = BatchView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn reject(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Body(req): Body<RejectRequest>,
) -> Result<Json<BatchView>, ApiError> {
    check_reason(&req.reason)?;
    let b = batch_for_approver(&app, &id).await?;
    let approver = acting_approver(&app, &who, &b, &req.approver_id).await?;
    let reason = format!(
        "rejected by {}{}",
        approver.id,
        req.reason.map(|r| format!(": {r}")).unwrap_or_default()
    );
    end(&app, &b, BatchState::Rejected, reason).await?;
    tracing::info!(batch = %b.header.batch_id, by = %who.name, "batch rejected");
    let b = bcm_db::batches::batch_fetch(&app.inner.db, &b.header.batch_id).await?;
    Ok(Json(view(&app, b).await?))
}

/// `POST /api/compute/metal/batches/{id}/cancel`: the requester (or anyone
/// who may apply its verb on the pool) stops it; nodes not yet started are
/// left alone.
#[utoipa::path(post, path = "/api/compute/metal/batches/{id}/cancel", operation_id = "cancelBatch", tag = "metal", request_body = CancelRequest,
    params(("id" = String, Path)), responses((status = 200, body = BatchView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn cancel(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Body(req): Body<CancelRequest>,
) -> Result<Json<BatchView>, ApiError> {
    check_reason(&req.reason)?;
    let b = readable(&app, &who, &id).await?;
    if let Some(verb) = b.header.operation.verb() {
        who.require(Action::for_verb(verb), &placement(&b)?, || {
            format!("batch {}", b.header.batch_id)
        })?;
    }
    let reason = format!(
        "cancelled by {}{}",
        who.name,
        req.reason.map(|r| format!(": {r}")).unwrap_or_default()
    );
    end(&app, &b, BatchState::Cancelled, reason).await?;
    tracing::info!(batch = %b.header.batch_id, by = %who.name, "batch cancelled");
    let b = bcm_db::batches::batch_fetch(&app.inner.db, &b.header.batch_id).await?;
    Ok(Json(view(&app, b).await?))
}

/// An approver to register.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApproverRequest {
    pub tenant_id: TenantId,
    /// The principal (token name) who signs as this approver.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    pub principal: String,
    /// ed25519, base64 of the 32 bytes (`metalctl batch keygen` prints it).
    #[schema(pattern = "^[A-Za-z0-9+/]{43}=$")]
    pub public_key: String,
}

/// A registered approver.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApproverView {
    pub id: String,
    pub tenant_id: String,
    pub principal: String,
    pub public_key: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl From<bcm_db::batches::Approver> for ApproverView {
    fn from(a: bcm_db::batches::Approver) -> Self {
        Self {
            id: a.id,
            tenant_id: a.tenant_id,
            principal: a.principal,
            public_key: a.public_key,
            created_at: a.created_at,
            revoked_at: a.revoked_at,
        }
    }
}

/// `PUT /api/compute/admin/approvers/{id}`: registers an approver's key
/// (an id is registered once; a new key is a new approver).
#[utoipa::path(put, path = "/api/compute/admin/approvers/{id}", operation_id = "putApprover", tag = "admin", request_body = ApproverRequest,
    params(("id" = String, Path, pattern = "^[a-z0-9._-]{1,64}$")), responses((status = 200, body = ApproverView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn put_approver(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Body(req): Body<ApproverRequest>,
) -> Result<Json<ApproverView>, ApiError> {
    who.require_admin()?;
    if !bcm_core::text::is_profile_id(&id) {
        return Err(ApiError::invalid(
            "an approver id is 1-64 characters of a-z, 0-9, '.', '-' or '_'",
        ));
    }
    if id == app.inner.quorum.policy_approver_id {
        return Err(ApiError::invalid(format!(
            "{id} names the control plane's policy key"
        )));
    }
    crate::verbs::check_text("principal", &req.principal, 128)?;
    let shaped = req.public_key.len() == 44
        && req.public_key.ends_with('=')
        && req.public_key[..43]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/');
    if !shaped {
        return Err(ApiError::invalid(
            "publicKey must be the base64 of 32 bytes (44 characters ending in '=')",
        ));
    }
    // Well shaped, yet not a usable ed25519 key (not a curve point, or a
    // weak one): nothing could ever verify with it.
    bcm_quorum::public_key(&req.public_key).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidConfig,
            format!("publicKey is not a usable ed25519 public key: {e}"),
        )
    })?;
    let approver = bcm_db::batches::Approver {
        id: id.clone(),
        tenant_id: req.tenant_id.to_string(),
        principal: req.principal,
        public_key: req.public_key,
        created_at: chrono::Utc::now(),
        revoked_at: None,
    };
    bcm_db::batches::approver_insert(&app.inner.db, &approver)
        .await
        .map_err(|e| match e {
            bcm_db::DbError::Duplicate { constraint } if constraint == "approvers_key" => {
                ApiError::new(
                    ErrorCode::Conflict,
                    "this public key is registered to another approver already",
                )
            }
            bcm_db::DbError::Duplicate { .. } => ApiError::new(
                ErrorCode::Conflict,
                format!("approver {id} is registered already; register a new key under a new id"),
            ),
            bcm_db::DbError::MissingReference { .. } => ApiError::new(
                ErrorCode::NotFound,
                format!("tenant {} not found", approver.tenant_id),
            ),
            other => other.into(),
        })?;
    tracing::info!(approver = %id, by = %who.name, "approver registered");
    Ok(Json(
        bcm_db::batches::approver_fetch(&app.inner.db, &id)
            .await?
            .into(),
    ))
}

/// `GET /api/compute/admin/approvers`.
#[utoipa::path(get, path = "/api/compute/admin/approvers", operation_id = "listApprovers", tag = "admin",
    responses((status = 200, body = Vec<ApproverView>), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn list_approvers(
    State(app): State<AppState>,
    who: Principal,
) -> Result<Json<Vec<ApproverView>>, ApiError> {
    who.require_admin()?;
    Ok(Json(
        bcm_db::batches::approvers_list(&app.inner.db, None)
            .await?
            .into_iter()
            .map(Into::into)
            .collect(),
    ))
}

/// `DELETE /api/compute/admin/approvers/{id}`: its later signatures are
/// refused (the edges' anchors must drop its key too).
#[utoipa::path(delete, path = "/api/compute/admin/approvers/{id}", operation_id = "revokeApprover", tag = "admin",
    params(("id" = String, Path)), responses((status = 204), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn revoke_approver(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<axum::http::StatusCode, ApiError> {
    who.require_admin()?;
    bcm_db::batches::approver_revoke(&app.inner.db, &id)
        .await
        .map_err(|e| match e {
            bcm_db::DbError::NotFound => ApiError::new(
                ErrorCode::NotFound,
                format!("approver {id:.64} not found or already revoked"),
            ),
            other => other.into(),
        })?;
    tracing::info!(approver = %id, by = %who.name, "approver revoked");
    Ok(axum::http::StatusCode::NO_CONTENT)
}
