//! The agent endpoints the ramdisk and installed-OS agents speak (the same
//! for `bcd` and the simulated site): join with a one-time token and a CSR,
//! heartbeat, long-poll for commands, and post results signed over the
//! signing input the attestation service rebuilds from the STORED command
//! row. Joins and results are forwarded to the attestation service.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::Json;
use bcm_contracts::agent::{
    AgentCommand, AgentResult, Heartbeat, JoinRequest, JoinResponse, PresenceEvent,
};
use bcm_contracts::attest::{AttestJoin, AttestReply, AttestResult, ResultRecorded};
use bcm_contracts::CommandKind;
use bcm_core::ErrorCode;
use serde::Deserialize;
use std::time::Duration;

use crate::auth::token_hash;
use crate::error::ApiError;
use crate::extract::{Body, Query};
use crate::AppState;

/// A joined agent, from its session bearer token.
#[derive(Debug, Clone)]
pub struct Agent {
    pub node_id: String,
    pub cert_serial: String,
    pub purpose: String,
}

impl FromRequestParts<AppState> for Agent {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let bad = || {
            ApiError::new(
                ErrorCode::Unauthenticated,
                "missing or unknown agent session",
            )
        };
        let secret = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(bad)?;
        match bcm_db::agents::session_fetch_live(&state.inner.db, &token_hash(secret)).await? {
            Some((node_id, cert_serial, purpose)) => Ok(Agent {
                node_id,
                cert_serial,
                purpose,
            }),
            None => Err(bad()),
        }
    }
}

/// Asks the attestation service (request/reply, queue group
/// `attestation`) and maps its answer to the API's errors.
async fn attest<Req: serde::Serialize, Resp: serde::de::DeserializeOwned>(
    app: &AppState,
    what: &str,
    req: &Req,
) -> Result<Resp, ApiError> {
    let bus = &app.inner.bus;
    let payload =
        serde_json::to_vec(req).map_err(|e| ApiError::internal(format!("encoding: {e}")))?;
    let asked = tokio::time::timeout(
        Duration::from_secs(15),
        bus.client()
            .request(bus.subjects().attest(what), payload.into()),
    )
    .await;
    let msg = match asked {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "attestation request failed");
            return Err(ApiError::new(
                ErrorCode::Unavailable,
                "the attestation service is not answering; retry later",
            ));
        }
        Err(_) => {
            return Err(ApiError::new(
                ErrorCode::Unavailable,
                "the attestation service timed out; retry later",
            ))
        }
    };
    match serde_json::from_slice::<AttestReply<Resp>>(&msg.payload) {
        Ok(AttestReply::Ok(v)) => Ok(v),
        Ok(AttestReply::Err { code, message }) => Err(ApiError::new(code, message)),
        Err(e) => Err(ApiError::internal(format!(
            "malformed attestation reply: {e}"
        ))),
    }
}

/// `POST /api/agent/join`: forwarded to the attestation service, which
/// alone holds the node CA.
#[utoipa::path(post, path = "/api/agent/join", request_body = JoinRequest, tag = "agent",
    description = "Exchange a one-time join token and a CSR for a node certificate and a session token. It takes no credential but the token in the body.",
    responses((status = 200, body = JoinResponse), crate::error::ErrorResponses), security(()))]
pub async fn join(
    State(app): State<AppState>,
    Body(req): Body<JoinRequest>,
) -> Result<Json<JoinResponse>, ApiError> {
    req.check().map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(Json(attest(&app, "join", &AttestJoin { join: req }).await?))
}

/// `POST /api/agent/heartbeat`.
#[utoipa::path(post, path = "/api/agent/heartbeat", request_body = Heartbeat, tag = "agent",
    description = "The agent is alive in its role; wakes the steps waiting for it.",
    responses((status = 204), crate::error::ErrorResponses),
    security(("agentSession" = [])))]
pub async fn heartbeat(
    State(app): State<AppState>,
    agent: Agent,
    Body(hb): Body<Heartbeat>,
) -> Result<axum::http::StatusCode, ApiError> {
    let mut tx = app.inner.db.begin().await?;
    bcm_db::agents::node_fact_merge_in_txn(
        &mut tx,
        &agent.node_id,
        &format!("agent:{}", agent.purpose),
        &serde_json::json!({ "role": hb.role, "event": PresenceEvent::Heartbeat }),
    )
    .await?;
    bcm_db::workflows::steps_wake_for_node_in_txn(&mut tx, &agent.node_id).await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// Long-poll parameters.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PollParams {
    /// How long to wait for a command, at most 30 s.
    pub wait_ms: Option<u64>,
}

/// `GET /api/agent/commands`: the node's pending ramdisk commands, waiting
/// up to `waitMs` for one.
#[utoipa::path(get, path = "/api/agent/commands", tag = "agent",
    params(("waitMs" = Option<u64>, Query, minimum = 0, maximum = 30000, description = "How long to wait for a command, at most 30000 ms.")),
    responses((status = 200, body = Vec<AgentCommand>), crate::error::ErrorResponses),
    security(("agentSession" = [])))]
pub async fn commands(
    State(app): State<AppState>,
    agent: Agent,
    Query(q): Query<PollParams>,
) -> Result<Json<Vec<AgentCommand>>, ApiError> {
    let wait = q.wait_ms.unwrap_or(0);
    if wait > 30_000 {
        return Err(ApiError::invalid("waitMs must be at most 30000"));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait);
    let mut wakeups = app.inner.agent_wakeups.subscribe();
    loop {
        if bcm_db::commands::commands_pending_for_agent(&app.inner.db, &agent.node_id).await? {
            let mut tx = app.inner.db.begin().await?;
            let taken = bcm_db::commands::commands_take_for_agent_in_txn(
                &mut tx,
                &agent.node_id,
                &agent.cert_serial,
                16,
            )
            .await?;
            tx.commit().await.map_err(bcm_db::DbError::from)?;
            if !taken.is_empty() {
                let mut handed = Vec::with_capacity(taken.len());
                for c in taken {
                    match CommandKind::parse(&c.kind) {
                        Ok(kind) => handed.push(AgentCommand {
                            command_id: c.id,
                            kind,
                            params: c.params,
                            issued_at: c.created_at,
                        }),
                        // Written by a newer control plane, or damage: the
                        // agent is not handed what it cannot read, and its
                        // step times out instead.
                        Err(e) => {
                            tracing::error!(command = %c.id, node = %agent.node_id, error = %e, "not handing out a command of an unknown kind")
                        }
                    }
                }
                return Ok(Json(handed));
            }
        }
        // Wait for a notification for this node (or a lagged channel), and
        // re-check at least every few seconds in case one was missed.
        let wait = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(Duration::from_secs(15));
        if wait.is_zero() {
            return Ok(Json(vec![]));
        }
        let _ = tokio::time::timeout(wait, async {
            loop {
                match wakeups.recv().await {
                    Ok(node) if node == agent.node_id => return,
                    Ok(_) => continue,
                    Err(_) => return,
                }
            }
        })
        .await;
    }
}

/// `POST /api/agent/results`: a result for one of the node's commands,
/// recorded by the attestation service, which verifies a signature against
/// the stored command row (a bad one is FORBIDDEN and nothing is kept); an
/// unsigned result is kept as unsigned.
#[utoipa::path(post, path = "/api/agent/results", request_body = AgentResult, tag = "agent",
    description = "A result for one of the node's commands, signed over the signing input of the stored command row (bcm_pki::signing_input).",
    responses((status = 204), crate::error::ErrorResponses),
    security(("agentSession" = [])))]
pub async fn results(
    State(app): State<AppState>,
    agent: Agent,
    Body(r): Body<AgentResult>,
) -> Result<axum::http::StatusCode, ApiError> {
    r.check().map_err(|e| ApiError::invalid(e.to_string()))?;
    let recorded: ResultRecorded = attest(
        &app,
        "result",
        &AttestResult {
            node_id: agent.node_id,
            cert_serial: agent.cert_serial,
            result: r,
        },
    )
    .await?;
    tracing::debug!(recorded = recorded.recorded, attested_by = ?recorded.attested_by, "agent result");
    Ok(axum::http::StatusCode::NO_CONTENT)
}
