//! The agent endpoints the ramdisk and installed-OS agents speak (the same
//! for `bcd` and the simulated site): join with a one-time token and a
//! public key, heartbeat, long-poll for commands, and post results signed
//! over the signing input rebuilt from the STORED command row.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::Json;
use base64::Engine as _;
use bcm_bus::messages::{self, AgentCommand, AgentResult, Heartbeat, JoinRequest, JoinResponse};
use bcm_core::ErrorCode;
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use serde::Deserialize;
use std::time::Duration;

use crate::auth::{new_token_secret, token_hash};
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

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// `POST /api/agent/join`.
pub async fn join(
    State(app): State<AppState>,
    Body(req): Body<JoinRequest>,
) -> Result<Json<JoinResponse>, ApiError> {
    let key = b64()
        .decode(req.public_key.as_bytes())
        .ok()
        .and_then(|k| <[u8; 32]>::try_from(k).ok())
        .and_then(|k| VerifyingKey::from_bytes(&k).ok())
        .ok_or_else(|| ApiError::invalid("publicKey must be a base64 ed25519 public key"))?;
    let db = &app.inner.db;
    let mut tx = db.begin().await?;
    let Some((purpose, node_id)) =
        bcm_db::agents::join_token_consume_in_txn(&mut tx, &token_hash(&req.token)).await?
    else {
        return Err(ApiError::new(
            ErrorCode::Unauthenticated,
            "unknown, used or expired join token",
        ));
    };
    let now = chrono::Utc::now();
    let life = if purpose == "discovery" {
        chrono::Duration::hours(24)
    } else {
        chrono::Duration::days(365)
    };
    let serial = format!("crt_{}", ulid::Ulid::new().to_string().to_lowercase());
    bcm_db::agents::cert_insert_in_txn(
        &mut tx,
        &bcm_db::agents::CertRow {
            serial: serial.clone(),
            node_id: node_id.clone(),
            public_key: key.to_bytes().to_vec(),
            // X.509 issuance comes with the attestation service; until then
            // the record holds the verified public key only.
            cert_pem: String::new(),
            not_before: now,
            not_after: now + life,
            revoked_at: None,
        },
    )
    .await?;
    let session = new_token_secret();
    bcm_db::agents::session_insert_in_txn(
        &mut tx,
        &token_hash(&session),
        &node_id,
        &serial,
        &purpose,
        now + life,
    )
    .await?;
    bcm_db::agents::node_fact_upsert_in_txn(
        &mut tx,
        &node_id,
        &format!("agent:{purpose}"),
        &serde_json::json!({ "role": req.role, "event": "join" }),
    )
    .await?;
    bcm_db::workflows::steps_wake_for_node_in_txn(&mut tx, &node_id).await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    tracing::info!(node = %node_id, %purpose, "agent joined");
    Ok(Json(JoinResponse {
        node_id,
        session_token: session,
        cert_serial: serial,
    }))
}

/// `POST /api/agent/heartbeat`.
pub async fn heartbeat(
    State(app): State<AppState>,
    agent: Agent,
    Body(hb): Body<Heartbeat>,
) -> Result<axum::http::StatusCode, ApiError> {
    let mut tx = app.inner.db.begin().await?;
    bcm_db::agents::node_fact_upsert_in_txn(
        &mut tx,
        &agent.node_id,
        &format!("agent:{}", agent.purpose),
        &serde_json::json!({ "role": hb.role, "event": "heartbeat" }),
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
pub async fn commands(
    State(app): State<AppState>,
    agent: Agent,
    Query(q): Query<PollParams>,
) -> Result<Json<Vec<AgentCommand>>, ApiError> {
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(q.wait_ms.unwrap_or(0).min(30_000));
    let mut wakeups = app.inner.agent_wakeups.subscribe();
    loop {
        if bcm_db::commands::commands_pending_for_agent(&app.inner.db, &agent.node_id).await? {
            let mut tx = app.inner.db.begin().await?;
            let taken =
                bcm_db::commands::commands_take_for_agent_in_txn(&mut tx, &agent.node_id, 16)
                    .await?;
            tx.commit().await.map_err(bcm_db::DbError::from)?;
            if !taken.is_empty() {
                return Ok(Json(
                    taken
                        .into_iter()
                        .map(|c| AgentCommand {
                            command_id: c.id,
                            kind: c.kind,
                            params: c.params,
                        })
                        .collect(),
                ));
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

/// `POST /api/agent/results`: a result for one of the node's commands. A
/// signature must verify against the session's key over the input rebuilt
/// from the stored command; an unsigned result is kept as unsigned.
pub async fn results(
    State(app): State<AppState>,
    agent: Agent,
    Body(r): Body<AgentResult>,
) -> Result<axum::http::StatusCode, ApiError> {
    let db = &app.inner.db;
    let mut tx = db.begin().await?;
    let cmd = match bcm_db::commands::command_fetch_in_txn(&mut tx, &r.command_id).await {
        Ok(c) if c.node_id.as_deref() == Some(agent.node_id.as_str()) => c,
        Ok(_) | Err(bcm_db::DbError::NotFound) => {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                "no such command for this node",
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let signature = match &r.signature {
        None => None,
        Some(sig) => {
            let cert = bcm_db::agents::cert_fetch_live_in_txn(&mut tx, &agent.cert_serial)
                .await?
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::Forbidden,
                        "the agent's certificate is revoked or expired",
                    )
                })?;
            let key = <[u8; 32]>::try_from(cert.public_key.as_slice())
                .ok()
                .and_then(|k| VerifyingKey::from_bytes(&k).ok())
                .ok_or_else(|| ApiError::internal("stored public key is malformed"))?;
            let sig_bytes = b64()
                .decode(sig.as_bytes())
                .map_err(|_| ApiError::invalid("signature is not base64"))?;
            let sig = Signature::from_slice(&sig_bytes)
                .map_err(|_| ApiError::invalid("signature is not an ed25519 signature"))?;
            let input = messages::signing_input(
                &cmd.id,
                &agent.node_id,
                &cmd.kind,
                &cmd.params,
                r.ok,
                &r.output,
                r.error.as_deref(),
            );
            key.verify(&input, &sig).map_err(|_| {
                ApiError::new(
                    ErrorCode::Forbidden,
                    "the result's signature does not verify",
                )
            })?;
            Some(sig_bytes)
        }
    };
    let body = serde_json::json!({ "ok": r.ok, "retryable": r.retryable, "output": r.output, "error": r.error });
    if bcm_db::commands::command_complete_in_txn(
        &mut tx,
        &cmd.id,
        r.ok,
        &body,
        signature.as_deref(),
    )
    .await?
    .is_some()
    {
        if cmd.kind == "inventory" && r.ok {
            bcm_db::agents::node_fact_upsert_in_txn(
                &mut tx,
                &agent.node_id,
                "inventory",
                &r.output,
            )
            .await?;
        }
        bcm_db::workflows::step_wake_for_command_in_txn(&mut tx, &cmd.id).await?;
    }
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}
