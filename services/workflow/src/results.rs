//! Consumes site command results from JetStream: records each once on its
//! command row and wakes the waiting step; acks only after the commit.
//! Undecodable messages are terminated and logged, never retried forever.

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::AckKind;
use bcm_bus::messages::{CloudEvent, CommandResult};
use bcm_bus::subjects::StreamKind;
use bcm_bus::Bus;
use bcm_db::Db;
use futures::StreamExt as _;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Records one result; true when it was new.
pub async fn record(
    db: &Db,
    r: &CommandResult,
    signature: Option<&[u8]>,
) -> Result<bool, bcm_db::DbError> {
    let mut tx = db.begin().await?;
    let body = serde_json::json!({ "ok": r.ok, "retryable": r.retryable, "output": r.output, "error": r.error });
    let new =
        bcm_db::commands::command_complete_in_txn(&mut tx, &r.command_id, r.ok, &body, signature)
            .await?;
    if new {
        bcm_db::workflows::step_wake_for_command_in_txn(&mut tx, &r.command_id).await?;
    }
    tx.commit().await?;
    Ok(new)
}

/// Consumes `result.>` until `shutdown`.
pub async fn consume(db: Db, bus: Bus, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        if let Err(e) = consume_once(&db, &bus, &shutdown).await {
            tracing::warn!(error = %e, "results consumer failed; restarting");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

async fn consume_once(db: &Db, bus: &Bus, shutdown: &CancellationToken) -> anyhow::Result<()> {
    let subjects = bus.subjects();
    let stream = bus
        .jetstream()
        .get_stream(subjects.stream(StreamKind::Results))
        .await?;
    let consumer = stream
        .get_or_create_consumer(
            "engine-results",
            pull::Config {
                durable_name: Some("engine-results".to_owned()),
                filter_subject: subjects.results_all(),
                ack_policy: AckPolicy::Explicit,
                max_deliver: 20,
                ack_wait: Duration::from_secs(10),
                ..Default::default()
            },
        )
        .await?;
    let mut messages = consumer.messages().await?;
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            m = messages.next() => match m {
                Some(m) => m.map_err(|e| anyhow::anyhow!("{e}"))?,
                None => return Ok(()),
            },
        };
        let parsed: Result<CloudEvent<CommandResult>, _> = serde_json::from_slice(&msg.payload);
        match parsed {
            Ok(ev) => match record(db, &ev.data, None).await {
                Ok(_) => msg.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?,
                Err(e) => {
                    tracing::warn!(error = %e, command = %ev.data.command_id, "recording a result failed; will retry");
                    let _ = msg
                        .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                        .await;
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, subject = %msg.subject, "dropping an undecodable result");
                let _ = msg.ack_with(AckKind::Term).await;
            }
        }
    }
}
