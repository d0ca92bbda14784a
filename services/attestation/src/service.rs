//! The request loop: `attest.join`, `attest.rejoin` and `attest.result` in
//! the queue group `attestation`. A malformed request is answered INVALID_ARGUMENT and
//! logged, never a crash.
//!
//! As many requests are worked on at once as the database pool has
//! connections; the rest wait their turn, and one that could not start
//! within [`START_WITHIN`] of its arrival, three fifths of the API's wait
//! for an answer (`attest::ASK_TIMEOUT`), is dropped unanswered: its asker
//! has given up on it or is about to and asks again (every request is
//! idempotent), and working through asks nobody waits for is what turns a
//! storm of results into a collapse (every ask then waiting out the pool
//! and failing).

use std::sync::Arc;

use bcm_bus::Bus;
use bcm_contracts::attest::AttestJoin;
use bcm_contracts::attest::AttestRejoin;
use bcm_contracts::attest::AttestReply;
use bcm_contracts::attest::AttestResult;
use bcm_core::ErrorCode;
use bcm_db::Db;
use bcm_pki::Ca;
use futures::StreamExt;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::{AttestError, AttestationConfig};

struct Ctx {
    db: Db,
    subjects: bcm_bus::Subjects,
    ca: Ca,
    cfg: AttestationConfig,
    client: async_nats::Client,
    /// A permit per database connection: the requests worked on at once.
    working: Arc<tokio::sync::Semaphore>,
}

/// The drops of asks that waited past [`START_WITHIN`]: logged the first of
/// each second, with how many went unlogged since.
static SHED_LOG: bcm_telemetry::OncePerSecond = bcm_telemetry::OncePerSecond::new();

/// How long an ask may wait for its turn before it is dropped: leaves two
/// fifths of the asker's wait (`attest::ASK_TIMEOUT`, counted from before
/// the bus delivered it) for the work and the answer.
const START_WITHIN: std::time::Duration =
    std::time::Duration::from_millis(bcm_contracts::attest::ASK_TIMEOUT.as_millis() as u64 * 3 / 5);

fn reply<T: Serialize>(r: Result<T, AttestError>) -> Vec<u8> {
    let body = match r {
        Ok(v) => AttestReply::Ok(v),
        Err(e) => {
            metrics::counter!("bcm_attest_errors_total", "code" => e.code().as_str()).increment(1);
            if e.code() == ErrorCode::Internal {
                tracing::error!(error = %e, "attestation request failed");
            }
            AttestReply::Err {
                code: e.code(),
                message: e.public_message(),
            }
        }
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The requests this service answers.
#[derive(Debug, Clone, Copy)]
enum What {
    Join,
    Rejoin,
    Result,
}

impl What {
    fn as_str(self) -> &'static str {
        match self {
            What::Join => "join",
            What::Rejoin => "rejoin",
            What::Result => "result",
        }
    }
}

async fn answer(ctx: Arc<Ctx>, msg: async_nats::Message, what: What) {
    let span = tracing::info_span!("attest", what = what.as_str());
    bcm_telemetry::set_remote_parent(
        &span,
        bcm_bus::traceparent_of(msg.headers.as_ref()).as_deref(),
    );
    let started = std::time::Instant::now();
    let turn = tokio::time::timeout(START_WITHIN, ctx.working.clone().acquire_owned()).await;
    let Ok(Ok(_working)) = turn else {
        metrics::counter!("bcm_attest_shed_total", "what" => what.as_str()).increment(1);
        if let Some(unlogged) = SHED_LOG.due(chrono::Utc::now().timestamp()) {
            tracing::warn!(
                what = what.as_str(),
                unlogged,
                waited_ms = START_WITHIN.as_millis() as u64,
                "an attestation request could not start in time for its asker; dropped (the API asks again)"
            );
        }
        return;
    };
    answer_in(ctx, msg, what).instrument(span).await;
    metrics::counter!("bcm_attest_requests_total", "what" => what.as_str()).increment(1);
    metrics::histogram!("bcm_attest_seconds", "what" => what.as_str())
        .record(started.elapsed().as_secs_f64());
}

/// A request's payload, or the INVALID_ARGUMENT answer to a malformed one.
fn decoded<T: serde::de::DeserializeOwned>(what: What, payload: &[u8]) -> Result<T, Vec<u8>> {
    serde_json::from_slice::<T>(payload).map_err(|e| {
        tracing::warn!(error = %e, what = what.as_str(), "malformed attestation request dropped");
        reply::<()>(Err(AttestError::Invalid(format!("malformed request: {e}"))))
    })
}

async fn answer_in(ctx: Arc<Ctx>, msg: async_nats::Message, what: What) {
    let Some(to) = msg.reply.clone() else {
        tracing::warn!(subject = %msg.subject, "attestation request without a reply subject dropped");
        return;
    };
    let payload = match what {
        What::Join => match decoded::<AttestJoin>(what, &msg.payload) {
            Ok(req) => {
                reply(crate::join::join(&ctx.db, &ctx.subjects, &ctx.ca, &ctx.cfg, &req).await)
            }
            Err(refusal) => refusal,
        },
        What::Rejoin => match decoded::<AttestRejoin>(what, &msg.payload) {
            Ok(req) => reply(crate::rejoin::rejoin(&ctx.db, &ctx.ca, &ctx.cfg, &req).await),
            Err(refusal) => refusal,
        },
        What::Result => match decoded::<AttestResult>(what, &msg.payload) {
            Ok(req) => reply(crate::results::record(&ctx.db, &ctx.ca, &ctx.cfg, &req).await),
            Err(refusal) => refusal,
        },
    };
    if let Err(e) = ctx.client.publish(to, payload.into()).await {
        tracing::warn!(error = %e, "attestation reply not sent");
    }
}

/// Runs the service until `shutdown`.
pub async fn run(
    db: Db,
    bus: Bus,
    cfg: AttestationConfig,
    shutdown: CancellationToken,
) -> Result<(), AttestError> {
    let running = start(db, bus, cfg, shutdown).await?;
    let _ = running.await;
    Ok(())
}

/// Loads the CA and subscribes (flushed: the server knows the
/// subscriptions when this returns), then answers requests in a task until
/// `shutdown`.
pub async fn start(
    db: Db,
    bus: Bus,
    cfg: AttestationConfig,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, AttestError> {
    let ca = crate::ca_store::load(&cfg)?;
    let client = bus.client().clone();
    let s = bus.subjects();
    let sub = |what: &str| {
        let client = client.clone();
        let subject = s.attest(what);
        async move { client.queue_subscribe(subject, "attestation".into()).await }
    };
    let mut joins = sub("join")
        .await
        .map_err(|e| AttestError::Config(format!("subscribing: {e}")))?;
    let mut rejoins = sub("rejoin")
        .await
        .map_err(|e| AttestError::Config(format!("subscribing: {e}")))?;
    let mut results = sub("result")
        .await
        .map_err(|e| AttestError::Config(format!("subscribing: {e}")))?;
    client
        .flush()
        .await
        .map_err(|e| AttestError::Config(format!("subscribing: {e}")))?;
    let working = Arc::new(tokio::sync::Semaphore::new(
        db.max_connections().max(1) as usize
    ));
    let ctx = Arc::new(Ctx {
        db,
        subjects: bus.subjects().clone(),
        ca,
        cfg,
        client,
        working,
    });
    tracing::info!("attestation service ready");
    Ok(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(m) = joins.next() => { tokio::spawn(answer(ctx.clone(), m, What::Join)); }
                Some(m) = rejoins.next() => { tokio::spawn(answer(ctx.clone(), m, What::Rejoin)); }
                Some(m) = results.next() => { tokio::spawn(answer(ctx.clone(), m, What::Result)); }
                else => break,
            }
        }
        let _ = joins.unsubscribe().await;
        let _ = rejoins.unsubscribe().await;
        let _ = results.unsubscribe().await;
    }))
}
