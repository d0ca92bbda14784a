//! The agent endpoints the ramdisk and installed-OS agents speak (the same
//! for `bcd` and the simulated site): join with a one-time token and a CSR,
//! rejoin with a kept identity (an installed OS after a reboot, signed by
//! its certificate's key; with a CSR a renewal), heartbeat, long-poll for commands, and post results signed over the
//! signing input the attestation service rebuilds from the STORED command
//! row. Joins, rejoins and results are forwarded to the attestation service.
//!
//! Any answer can be lost, so every exchange can be retried: a join retried
//! with the same token and key gets the same identity back (the attestation
//! service decides); a command handed out by a poll is leased and offered
//! again if no result comes (agents run a command id at most once and
//! answer a repeat from their record); a result is recorded once however
//! often it is posted; a join or result is forwarded again while the bus or
//! the attestation service is away, and only then answered `UNAVAILABLE`.
//! Every request of a session marks the agent alive (a long poll for as
//! long as it waits), which is what a step waiting on it watches.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::Json;
use bcm_contracts::agent::{
    AgentCommand, AgentPurpose, AgentResult, Heartbeat, HeartbeatAck, JoinRequest, JoinResponse,
    PresenceEvent, RejoinRequest,
};
use bcm_contracts::attest::{
    AttestJoin, AttestRejoin, AttestReply, AttestResult, JoinGranted, ResultRecorded,
};
use bcm_contracts::CommandKind;
use bcm_core::ErrorCode;
use serde::Deserialize;
use std::time::Duration;

use crate::auth::token_hash;
use crate::error::ApiError;
use crate::extract::Body;
use crate::AppState;

/// A joined agent, from its session bearer token.
#[derive(Debug, Clone)]
pub struct Agent {
    pub node_id: String,
    pub cert_serial: String,
    pub purpose: String,
    /// Whether the node had a running workflow when the request came.
    pub workflow_running: bool,
    /// How long the session stays marked alive from the request on, in
    /// milliseconds (a long poll waits no longer).
    pub alive_left_ms: u64,
}

impl FromRequestParts<AppState> for Agent {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // A heartbeat, a result: a sign of life now (a poll, which marks
        // the agent alive for as long as it waits, touches its session in
        // the statement that takes its commands: `commands`).
        let hash = session_hash(parts)?;
        Agent::touch(state, &hash, 0).await
    }
}

/// The session token's hash from a request's bearer credentials.
fn session_hash(parts: &Parts) -> Result<Vec<u8>, ApiError> {
    let secret = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .ok_or_else(unknown_session)?;
    Ok(token_hash(secret))
}

fn unknown_session() -> ApiError {
    ApiError::new(
        ErrorCode::Unauthenticated,
        "missing or unknown agent session",
    )
}

/// What a session's touch failing means for the request: an agent turned
/// away unheard (the agent pool exhausted, or the database away) is noted,
/// so the engine does not count it silent for it.
fn touch_failed(state: &AppState, failed: crate::touches::Failed) -> ApiError {
    if failed.unreachable {
        state.inner.turnaways.note(&state.inner.db);
    }
    failed.error
}

/// The slack a poll waiting `alive_for_ms` leaves its mark of life:
/// [`POLL_MARK_SLACK_MS`], at most a tenth of its wait.
fn poll_slack_ms(alive_for_ms: u64) -> u64 {
    POLL_MARK_SLACK_MS.min(alive_for_ms / 10)
}

impl From<bcm_db::agents::LiveSession> for Agent {
    fn from(s: bcm_db::agents::LiveSession) -> Self {
        Agent {
            node_id: s.node_id,
            cert_serial: s.cert_serial,
            purpose: s.purpose,
            workflow_running: s.workflow_running,
            alive_left_ms: s.alive_left_ms.max(0) as u64,
        }
    }
}

impl Agent {
    /// Touches the session of token hash `hash`, marking it alive for
    /// `alive_for_ms` from now (a long poll made just after another that
    /// marked it finds the mark in place, within its slack).
    async fn touch(state: &AppState, hash: &[u8], alive_for_ms: u64) -> Result<Agent, ApiError> {
        let touched = state
            .inner
            .touches
            .touch(hash, alive_for_ms, poll_slack_ms(alive_for_ms));
        match heard_while_waiting(state, touched).await {
            Ok(Some(s)) => Ok(s.into()),
            Ok(None) => Err(unknown_session()),
            Err(e) => Err(touch_failed(state, e)),
        }
    }

    /// The command kinds this session's identity runs (none for a purpose
    /// this build does not know).
    fn runs(&self) -> Vec<CommandKind> {
        AgentPurpose::parse(&self.purpose)
            .map(CommandKind::run_by_purpose)
            .unwrap_or_default()
    }
}

/// When agents' requests were last turned away before their session could
/// be touched, or held in line for the agent pool a second or more,
/// recorded (`agent_turnaways`) for the engine's silence verdict: at most
/// once a second, through the API's main pool (the agent pool is the one
/// that was exhausted), off the request's path.
#[derive(Debug, Default)]
pub struct TurnAways {
    /// The seconds recorded, or being recorded.
    recorded: crate::once_per_second::OncePerSecond,
}

impl TurnAways {
    /// Whether a turning away in second `now` is to be recorded: the first
    /// of each second is.
    pub fn due(&self, now: i64) -> bool {
        self.recorded.due(now).is_some()
    }

    /// Notes a turning away now, recording it in the background when due.
    pub fn note(&self, db: &bcm_db::Db) {
        metrics::counter!("bcm_api_agent_turned_away_total").increment(1);
        self.record(db);
    }

    /// Records (when due) that an agent was heard now but not yet served:
    /// its request waits in line for the agent pool.
    fn record(&self, db: &bcm_db::Db) {
        if !self.due(chrono::Utc::now().timestamp()) {
            return;
        }
        let db = db.clone();
        tokio::spawn(async move {
            if let Err(e) = bcm_db::agents::turnaway_record(&db).await {
                tracing::warn!(error = %e, "could not record agents turned away; the engine may count them silent");
            }
        });
    }
}

/// Runs `touch`, the statement of an agent request that marks its session
/// alive, noting each second it waits for the agent pool
/// (`agents.pool_wait_ms`: a fleet's requests wait in line there rather
/// than being turned away) that an agent was heard ([`TurnAways`]): an
/// agent in that line has asked, and the engine must not count it silent
/// for the control plane's own queue. Each whole second waited is
/// counted (`bcm_api_agent_waiting_seconds_total`).
async fn heard_while_waiting<T>(
    state: &AppState,
    touch: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(touch);
    let second = Duration::from_secs(1);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + second, second);
    loop {
        tokio::select! {
            done = &mut touch => return done,
            _ = ticks.tick() => {
                metrics::counter!("bcm_api_agent_waiting_seconds_total").increment(1);
                state.inner.turnaways.record(&state.inner.db);
            }
        }
    }
}

/// Records each agent request's duration by endpoint and status
/// (`bcm_api_agent_request_seconds`): which endpoint holds the agent pool
/// when a fleet's agents crowd it, and how often they are turned away
/// (`503` when the pool had no connection in time).
pub async fn measured(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let endpoint: &'static str = match req.uri().path().rsplit('/').next() {
        Some("join") => "join",
        Some("rejoin") => "rejoin",
        Some("heartbeat") => "heartbeat",
        Some("commands") => "commands",
        Some("results") => "results",
        _ => "other",
    };
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    metrics::histogram!(
        "bcm_api_agent_request_seconds",
        "endpoint" => endpoint,
        "status" => response.status().as_str().to_owned(),
    )
    .record(started.elapsed().as_secs_f64());
    response
}

/// The longest long poll, in milliseconds.
const POLL_MAX_MS: u64 = 30_000;

/// A poll's mark of life is left as it is where it already holds to within
/// this long (and a tenth of the poll's wait) of what the poll asks: a poll
/// made at once after another (a command taken, its result sent) then costs
/// no write, and waits at most as long as the mark holds.
const POLL_MARK_SLACK_MS: u64 = 2_000;

/// Asks the attestation service (request/reply, queue group
/// `attestation`) and maps its answer to the API's errors. Both requests
/// are idempotent (a join retried with the same token and key, a result
/// posted again), so one that got no answer — the bus restarting, no
/// replica subscribed, a reply lost — is asked again with backoff for up to
/// `attest_retry_ms`, and only then is the agent told to retry.
async fn attest<Req: serde::Serialize, Resp: serde::de::DeserializeOwned>(
    app: &AppState,
    what: &str,
    req: &Req,
) -> Result<Resp, ApiError> {
    let bus = &app.inner.bus;
    let payload =
        serde_json::to_vec(req).map_err(|e| ApiError::internal(format!("encoding: {e}")))?;
    let give_up_at =
        tokio::time::Instant::now() + Duration::from_millis(app.inner.agents.attest_retry_ms);
    let mut pause = Duration::from_millis(100);
    let msg = loop {
        let left = give_up_at.saturating_duration_since(tokio::time::Instant::now());
        let asked = tokio::time::timeout(
            left.clamp(
                Duration::from_millis(500),
                bcm_contracts::attest::ASK_TIMEOUT,
            ),
            bus.client().request_with_headers(
                bus.subjects().attest(what),
                // The request span's trace: the attestation service goes on.
                bcm_bus::trace_header_map(),
                payload.clone().into(),
            ),
        )
        .await;
        let why = match asked {
            Ok(Ok(m)) => break m,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer in time".to_owned(),
        };
        if tokio::time::Instant::now() + pause >= give_up_at {
            tracing::warn!(
                what,
                why,
                "the attestation service did not answer; the agent is told to retry"
            );
            metrics::counter!("bcm_api_attest_unavailable_total", "what" => what.to_owned())
                .increment(1);
            return Err(ApiError::new(
                ErrorCode::Unavailable,
                "the attestation service is not answering; retry later",
            ));
        }
        tracing::debug!(what, why, ?pause, "attestation request: asking again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
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
    // Neither the join token nor the session token goes on the bus: the
    // attestation service gets their hashes, and the session token is
    // derived here, the same for every answer to one join.
    let key = join_key(&app, "join")?;
    let (session, session_hash) = key.session_token(&req.token, &req.csr);
    let ask = AttestJoin {
        token_hash: hex::encode(bcm_pki::tokens::hash(&req.token)),
        session_hash: hex::encode(session_hash),
        csr: req.csr,
        role: req.role,
        hostname: req.hostname,
        inventory: req.inventory,
    };
    let granted: JoinGranted = attest(&app, "join", &ask).await?;
    Ok(Json(answer(granted, session)))
}

/// The join key session tokens are derived under: without one, agents
/// cannot `what` (join, rejoin).
fn join_key<'a>(app: &'a AppState, what: &str) -> Result<&'a bcm_pki::JoinKey, ApiError> {
    app.inner.join_key.as_ref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidConfig,
            format!(
                "the control plane holds no join key (api.join_key.file); agents cannot {what}"
            ),
        )
    })
}

/// The agent's answer to a join or a rejoin: the identity the attestation
/// service granted, and the session token derived here.
fn answer(granted: JoinGranted, session_token: String) -> JoinResponse {
    JoinResponse {
        node_id: granted.node_id,
        session_token,
        cert_serial: granted.cert_serial,
        certificate: granted.certificate,
        ca_certificate: granted.ca_certificate,
        image_keys: granted.image_keys,
    }
}

/// `POST /api/agent/rejoin`: an installed OS's agent back with the identity
/// it kept, forwarded to the attestation service. The session token is
/// derived from the signature (under the join key), so the same signed
/// request asked again gets the same session.
#[utoipa::path(post, path = "/api/agent/rejoin", request_body = RejoinRequest, tag = "agent",
    description = "Rejoin with a kept identity: the key of a node certificate in force signs the node, the serial, the time and an optional CSR (which renews the certificate). It takes no credential but that signature.",
    responses((status = 200, body = JoinResponse), crate::error::ErrorResponses), security(()))]
pub async fn rejoin(
    State(app): State<AppState>,
    Body(req): Body<RejoinRequest>,
) -> Result<Json<JoinResponse>, ApiError> {
    req.check().map_err(|e| ApiError::invalid(e.to_string()))?;
    let key = join_key(&app, "rejoin")?;
    let (session, session_hash) = key.session_token(&req.signature, &req.cert_serial);
    let ask = AttestRejoin {
        node_id: req.node_id,
        cert_serial: req.cert_serial,
        signed_at: req.signed_at,
        csr: req.csr,
        signature: req.signature,
        session_hash: hex::encode(session_hash),
    };
    let granted: JoinGranted = attest(&app, "rejoin", &ask).await?;
    Ok(Json(answer(granted, session)))
}

/// `POST /api/agent/heartbeat`.
#[utoipa::path(post, path = "/api/agent/heartbeat", request_body = Heartbeat, tag = "agent",
    description = "The agent is alive in its role; wakes the steps waiting for it. The answer says when the control plane wants the next heartbeat.",
    responses((status = 200, body = HeartbeatAck), crate::error::ErrorResponses),
    security(("agentSession" = [])))]
pub async fn heartbeat(
    State(app): State<AppState>,
    agent: Agent,
    Body(hb): Body<Heartbeat>,
) -> Result<Json<HeartbeatAck>, ApiError> {
    // The session's touch (in the extractor) is what keeps it alive, and
    // says whether the node runs a workflow. A node with none has no step
    // waiting on a join and nothing to record: an idle fleet's heartbeats
    // cost one statement each. A workflow that starts just after the touch
    // sees the agent's next heartbeat.
    let running = agent.workflow_running;
    let ack = HeartbeatAck {
        next_heartbeat_secs: heartbeat_cadence(
            &app.inner.agents,
            &agent.purpose,
            running,
            app.inner.idle_fleet.get(),
            rand::random::<f64>(),
        ),
        poll_commands: polls_commands(&agent.purpose, running),
    };
    // Only a deployed OS's heartbeat is something a step waits for (the
    // machine back after a reboot, `waitOsBack`); a ramdisk's steps wait
    // for its join and its results, and nothing reads an adopted OS's
    // heartbeat, so theirs record nothing beyond the touch.
    let heard = matches!(
        AgentPurpose::parse(&agent.purpose),
        Ok(AgentPurpose::Provisioned)
    );
    if !running || !heard {
        return Ok(Json(ack));
    }
    // Recorded apart from the join's fact (`agent:<purpose>`): a heartbeat
    // is never taken for a join. The steps waiting on the agent are nudged
    // in the same statement, never behind an engine's batch (a workflow an
    // engine holds is being looked at already).
    bcm_db::agents::heartbeat_record(
        &app.inner.agent_db,
        &agent.node_id,
        &format!("heartbeat:{}", agent.purpose),
        &serde_json::json!({ "role": hb.role, "event": PresenceEvent::Heartbeat }),
    )
    .await?;
    Ok(Json(ack))
}

/// Whether an installed OS's agent is asked to hold a poll open: an
/// adopted machine's always (nothing else reaches it, and they are few), a
/// deployed OS's only while its node runs a workflow (which may ask it to
/// power off), so an idle deployed fleet holds no polls.
fn polls_commands(purpose: &str, workflow_running: bool) -> bool {
    match AgentPurpose::parse(purpose) {
        Ok(AgentPurpose::Node) => true,
        Ok(AgentPurpose::Provisioned) => workflow_running,
        _ => false,
    }
}

/// The cadence asked of an agent: busy while its node runs a workflow or
/// it is a ramdisk (whose silence the engine watches), else idle (sized to
/// the `idle_fleet` installed OSes, `idle_fleet.rs`), moved by up to a
/// tenth either way (`jitter` in 0..1) so a fleet spreads out, and never
/// beyond what an agent keeps (1 s to [`HeartbeatAck::MAX_SECS`]).
fn heartbeat_cadence(
    cfg: &crate::AgentProtocolConfig,
    purpose: &str,
    workflow_running: bool,
    idle_fleet: u64,
    jitter: f64,
) -> u32 {
    let installed_os = matches!(
        AgentPurpose::parse(purpose),
        Ok(AgentPurpose::Provisioned | AgentPurpose::Node)
    );
    if workflow_running || !installed_os {
        return cfg.busy_heartbeat_secs;
    }
    let idle = f64::from(crate::idle_fleet::idle_cadence_secs(
        cfg.idle_heartbeat_secs,
        cfg.max_idle_heartbeats_per_sec,
        idle_fleet,
    ));
    let jitter = if jitter.is_finite() {
        jitter.clamp(0.0, 1.0)
    } else {
        0.5
    };
    let spread = idle * 0.1 * (2.0 * jitter - 1.0);
    ((idle + spread).round() as u32).clamp(1, HeartbeatAck::MAX_SECS)
}

/// Long-poll parameters.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PollParams {
    /// How long to wait for a command, at most 30 s.
    pub wait_ms: Option<u64>,
}

/// `GET /api/agent/commands`: the pending commands of the session's purpose (a ramdisk's, or an adopted machine's own OS's), waiting
/// up to `waitMs` for one.
#[utoipa::path(get, path = "/api/agent/commands", tag = "agent",
    params(("waitMs" = Option<u64>, Query, minimum = 0, maximum = 30000, description = "How long to wait for a command, at most 30000 ms.")),
    responses((status = 200, body = Vec<AgentCommand>), crate::error::ErrorResponses),
    security(("agentSession" = [])))]
pub async fn commands(
    State(app): State<AppState>,
    poller: Poller,
    uri: axum::http::Uri,
) -> Result<Json<Vec<AgentCommand>>, ApiError> {
    // Who asks is answered before what is wrong with the asking: a bad
    // `waitMs` from an unknown session is `401`, as for any agent request.
    let wait = match axum::extract::Query::<PollParams>::try_from_uri(&uri) {
        Ok(axum::extract::Query(q)) if q.wait_ms.unwrap_or(0) <= POLL_MAX_MS => {
            q.wait_ms.unwrap_or(0)
        }
        bad => {
            Agent::touch(&app, &poller.hash, 0).await?;
            return Err(ApiError::invalid(match bad {
                Err(rejection) => rejection.body_text(),
                Ok(_) => "waitMs must be at most 30000".to_owned(),
            }));
        }
    };
    // The first look touches the session (marking it alive for as long as
    // the poll may wait) and takes its commands in one statement, shared
    // with the other agent requests asking meanwhile (`touches.rs`).
    let looked_at = std::time::Instant::now();
    let arrived = tokio::time::Instant::now();
    let first_look = app
        .inner
        .touches
        .poll(&poller.hash, wait, poll_slack_ms(wait));
    let (session, mut taken) = match heard_while_waiting(&app, first_look).await {
        Ok(Some(found)) => found,
        Ok(None) => return Err(unknown_session()),
        Err(failed) => return Err(touch_failed(&app, failed)),
    };
    let agent = Agent::from(session);
    // `waitMs` from the request's arrival, time in line for the agent pool
    // included (a poll that waited in line past it is answered as soon as
    // its first look is done, not a whole wait later), and no longer than the session
    // is marked alive (by the database's clock, to within the round trip),
    // so a held poll ends before its mark runs out and the engine does not
    // count its agent silent meanwhile.
    let deadline = (arrived + Duration::from_millis(wait))
        .min(tokio::time::Instant::now() + Duration::from_millis(agent.alive_left_ms));
    // Registered once the session named its node: a command written since
    // the first look began wakes it at once.
    let mut woken = app
        .inner
        .agent_wakeups
        .register_since(&agent.node_id, looked_at);
    let kinds = agent.runs();
    let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
    loop {
        if !taken.is_empty() {
            // A destructive command carries its batch's authority as the
            // batch stands now, read just after the take (the agent
            // verifies it; one no longer valid is handed without, and the
            // agent refuses it). Should this answer fail, the command's
            // lease runs out and a later poll is offered it again.
            let mut handed = Vec::with_capacity(taken.len());
            for c in taken {
                let authority = match &c.batch_id {
                    Some(b) => {
                        match bcm_db::batches::authority(&app.inner.agent_db, b, &agent.node_id)
                            .await?
                        {
                            bcm_db::batches::AuthorityState::Ready(a) => Some(*a),
                            other => {
                                tracing::warn!(command = %c.id, batch = %b, state = ?other, "handing a command whose batch no longer authorizes it");
                                None
                            }
                        }
                    }
                    None => None,
                };
                match CommandKind::parse(&c.kind) {
                    Ok(kind) => handed.push(AgentCommand {
                        join_tokens: join_tokens(&app, &c),
                        command_id: c.id,
                        kind,
                        params: c.params,
                        issued_at: c.created_at,
                        traceparent: c.traceparent,
                        authority,
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
        // Wait for a wake-up of this node (a missed one is covered by the
        // wake-up of every poll when the listener reconnects), and look again
        // at least once per command lease, in case one ran out.
        let wait = deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .min(Duration::from_millis(
                app.inner.agents.command_lease_ms.max(100),
            ));
        if wait.is_zero() {
            return Ok(Json(vec![]));
        }
        let woken_now = tokio::time::timeout(wait, woken.woken()).await.is_ok();
        // At the deadline with no wake-up, answer at once rather than look
        // again: the agent polls again at once, and that poll's first look
        // takes what this one would have (a look here would hold an agent
        // connection for nothing, and a 503 from it would throw away the
        // whole wait).
        if !woken_now && tokio::time::Instant::now() >= deadline {
            return Ok(Json(vec![]));
        }
        taken = bcm_db::commands::commands_take_for_agent(
            &app.inner.agent_db,
            &agent.node_id,
            &agent.cert_serial,
            &agent.purpose,
            &kinds,
            POLL_TAKE_LIMIT,
            app.inner.agents.command_lease_ms,
        )
        .await?;
    }
}

/// The most commands one poll is handed.
const POLL_TAKE_LIMIT: i64 = 16;

/// What every poll's first look takes: the kinds each purpose runs, at
/// most [`POLL_TAKE_LIMIT`], under the configured command lease.
pub fn poll_takes(cfg: &crate::AgentProtocolConfig) -> crate::touches::Takes {
    crate::touches::Takes {
        runs: AgentPurpose::ALL
            .iter()
            .flat_map(|p| {
                CommandKind::run_by_purpose(*p)
                    .into_iter()
                    .map(move |k| (p.as_str().to_owned(), k.as_str().to_owned()))
            })
            .collect(),
        limit: POLL_TAKE_LIMIT,
        lease_ms: cfg.command_lease_ms,
    }
}

/// A poll's session, before its touch: the bearer token's hash (the poll
/// touches it in the statement that takes its commands).
pub struct Poller {
    hash: Vec<u8>,
}

impl FromRequestParts<AppState> for Poller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, ApiError> {
        Ok(Poller {
            hash: session_hash(parts)?,
        })
    }
}

/// The tokens a command's join references stand for, derived under its
/// site's join key; none without a key (the agent then writes the
/// reference, and whatever joins with it is refused).
fn join_tokens(
    app: &AppState,
    c: &bcm_db::commands::CommandRow,
) -> std::collections::BTreeMap<String, String> {
    let text = c.params.to_string();
    if !bcm_pki::join_key::has_reference(&text) {
        return Default::default();
    }
    match (&app.inner.join_key, &c.site_id) {
        (Some(master), Some(site)) => master.for_site(site).tokens_for(&text),
        _ => {
            tracing::error!(command = %c.id, "a command holds join references but no join key (or site) is configured; handed without tokens");
            Default::default()
        }
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

#[cfg(test)]
mod tests {
    use super::{heartbeat_cadence, poll_slack_ms, polls_commands, TurnAways};
    use crate::AgentProtocolConfig;

    #[test]
    fn agents_turned_away_are_recorded_once_a_second_whoever_notes_them() {
        let t = TurnAways::default();
        assert!(t.due(100), "the first of a second");
        assert!(!t.due(100), "not again in that second");
        assert!(!t.due(99), "nor for an earlier one");
        assert!(t.due(101));
        // Many callers at once in one second: exactly one records it.
        let t = std::sync::Arc::new(TurnAways::default());
        let recorded: usize = (0..8)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || (0..1000).filter(|_| t.due(5)).count())
            })
            .map(|h| h.join().unwrap_or(0))
            .sum();
        assert_eq!(recorded, 1);
    }

    #[test]
    fn an_idle_deployed_os_holds_no_poll_and_an_adopted_one_always_does() {
        assert!(!polls_commands("provisioned", false));
        assert!(polls_commands("provisioned", true));
        assert!(polls_commands("node", false));
        assert!(!polls_commands("discovery", true), "a ramdisk polls anyway");
        assert!(!polls_commands("what-is-this", true));
    }

    #[test]
    fn an_idle_installed_os_beats_slowly_with_jitter_and_a_busy_or_ramdisk_agent_often() {
        let cfg = AgentProtocolConfig::default();
        let small = 10;
        assert_eq!(heartbeat_cadence(&cfg, "provisioned", true, small, 0.5), 10);
        assert_eq!(heartbeat_cadence(&cfg, "discovery", false, small, 0.5), 10);
        assert_eq!(
            heartbeat_cadence(&cfg, "what-is-this", false, small, 0.5),
            10
        );
        assert_eq!(
            heartbeat_cadence(&cfg, "provisioned", false, small, 0.5),
            60
        );
        assert_eq!(heartbeat_cadence(&cfg, "node", false, small, 0.0), 54);
        assert_eq!(heartbeat_cadence(&cfg, "node", false, small, 1.0), 66);
        for odd in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(heartbeat_cadence(&cfg, "node", false, small, odd), 60);
        }
        assert_eq!(heartbeat_cadence(&cfg, "node", false, small, -1.0), 54);
        assert_eq!(heartbeat_cadence(&cfg, "node", false, small, 2.0), 66);
        let fast = AgentProtocolConfig {
            idle_heartbeat_secs: 1,
            ..AgentProtocolConfig::default()
        };
        assert_eq!(
            heartbeat_cadence(&fast, "node", false, small, 0.0),
            1,
            "never 0"
        );
    }

    #[test]
    fn a_large_idle_fleet_beats_slower_and_never_beyond_an_hour_while_busy_agents_stay_at_ten() {
        let cfg = AgentProtocolConfig::default(); // 100 a second
        let fleet = 100_000;
        assert_eq!(
            heartbeat_cadence(&cfg, "provisioned", false, fleet, 0.0),
            900
        );
        assert_eq!(
            heartbeat_cadence(&cfg, "provisioned", false, fleet, 0.5),
            1_000
        );
        assert_eq!(heartbeat_cadence(&cfg, "node", false, fleet, 1.0), 1_100);
        assert_eq!(heartbeat_cadence(&cfg, "provisioned", true, fleet, 1.0), 10);
        assert_eq!(heartbeat_cadence(&cfg, "discovery", false, fleet, 1.0), 10);
        // At the cap a tenth more is still an hour, never above it (an
        // agent refuses more), whether the cap comes from the fleet or
        // from the configured floor itself.
        let huge = u64::MAX;
        assert_eq!(heartbeat_cadence(&cfg, "node", false, huge, 1.0), 3_600);
        assert_eq!(heartbeat_cadence(&cfg, "node", false, huge, 0.0), 3_240);
        let hourly = AgentProtocolConfig {
            idle_heartbeat_secs: 3_600,
            ..AgentProtocolConfig::default()
        };
        assert_eq!(heartbeat_cadence(&hourly, "node", false, 0, 1.0), 3_600);
        // 0 a second: the fixed cadence, whatever the fleet.
        let fixed = AgentProtocolConfig {
            max_idle_heartbeats_per_sec: 0,
            ..AgentProtocolConfig::default()
        };
        assert_eq!(heartbeat_cadence(&fixed, "node", false, huge, 0.5), 60);
    }

    #[test]
    fn cadences_an_agent_would_not_keep_are_refused_at_start() {
        let mut cfg = AgentProtocolConfig::default();
        assert!(cfg.check().is_ok());
        cfg.idle_heartbeat_secs = 0;
        assert!(cfg
            .check()
            .is_err_and(|e| e.contains("idle_heartbeat_secs")));
        cfg.idle_heartbeat_secs = 60;
        cfg.busy_heartbeat_secs = 7200;
        assert!(cfg
            .check()
            .is_err_and(|e| e.contains("busy_heartbeat_secs")));
        cfg.busy_heartbeat_secs = 10;
        for refresh in [0, 3_601] {
            cfg.idle_fleet_refresh_secs = refresh;
            assert!(cfg
                .check()
                .is_err_and(|e| e.contains("idle_fleet_refresh_secs")));
        }
        cfg.idle_fleet_refresh_secs = 30;
        cfg.max_idle_heartbeats_per_sec = 1_000_001;
        assert!(cfg
            .check()
            .is_err_and(|e| e.contains("max_idle_heartbeats_per_sec")));
        cfg.max_idle_heartbeats_per_sec = 0;
        assert!(cfg.check().is_ok(), "0: a fixed cadence");
    }

    #[test]
    fn a_polls_mark_is_left_in_place_within_a_tenth_of_its_wait_at_most_two_seconds() {
        assert_eq!(poll_slack_ms(0), 0, "a heartbeat or result always touches");
        assert_eq!(poll_slack_ms(5_000), 500);
        assert_eq!(poll_slack_ms(30_000), 2_000);
    }
}
