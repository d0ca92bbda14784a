//! Consumes site command results from JetStream: records each once on its
//! command row and advances the waiting step in the same transaction; acks
//! only after the commit. Undecodable messages are terminated and logged,
//! never retried forever.

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::AckKind;
use bcm_bus::messages::{CloudEvent, CommandResult};
use bcm_bus::subjects::StreamKind;
use bcm_core::PowerState;
use futures::{StreamExt as _, TryStreamExt as _};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::engine::Ctx;

/// Results handled at once.
const CONCURRENT_RESULTS: usize = 16;

/// Records one site result and advances the step waiting on it, in one
/// transaction; true when the result was new (a redelivery changes nothing).
pub async fn record(ctx: &Ctx, r: &CommandResult) -> Result<bool, bcm_db::DbError> {
    let mut tx = ctx.db.begin().await?;
    let body = serde_json::json!({ "ok": r.ok, "retryable": r.retryable, "output": r.output, "error": r.error });
    let completed =
        bcm_db::commands::command_complete_in_txn(&mut tx, &r.command_id, r.ok, &body, None)
            .await?;
    let mut events = vec![];
    if let Some(done) = &completed {
        // The power axis first (node lock before workflow lock, as verbs).
        if let (true, Some(node)) = (r.ok, &done.node_id) {
            if let Some(power) = r
                .output
                .get("power")
                .and_then(|p| p.as_str())
                .and_then(PowerState::parse)
            {
                record_power(&mut tx, ctx, node, power, &r.command_id, &mut events).await?;
            }
        }
        if let (Some(node), "bmc.rotateCredentials") = (&done.node_id, done.kind.as_str()) {
            crate::rotation::finish(&mut tx, ctx, node, r, &mut events).await?;
        }
        if let Some((wf, idx)) = &done.step {
            events.extend(crate::engine::drive(&mut tx, ctx, wf, *idx).await?);
        }
    }
    bcm_db::outbox::outbox_insert_in_txn(&mut tx, &events).await?;
    tx.commit().await?;
    Ok(completed.is_some())
}

/// Records the power state a BMC reported; a change bumps the node's
/// version and emits `node.power.changed`.
async fn record_power(
    tx: &mut bcm_db::Tx<'_>,
    ctx: &Ctx,
    node_id: &str,
    power: PowerState,
    command_id: &str,
    events: &mut Vec<bcm_db::outbox::NewOutboxMessage>,
) -> Result<(), bcm_db::DbError> {
    let Ok(id) = node_id.parse::<bcm_core::NodeId>() else {
        return Ok(());
    };
    let node = bcm_db::nodes::node_fetch_for_update_in_txn(tx, &id).await?;
    if node.power == power || power == PowerState::Unknown {
        return Ok(());
    }
    let previous = node.power;
    let mut next = node.clone();
    next.power = power;
    let version = bcm_db::nodes::node_update_guarded_in_txn(tx, &next).await?;
    next.version = version;
    events.push(bcm_metal::outbox::event(
        ctx.bus.subjects(),
        &next,
        bcm_bus::messages::types::NODE_POWER_CHANGED,
        bcm_bus::messages::NodePowerChanged {
            node_id: next.id,
            tenant_id: next.tenant_id.clone(),
            power,
            previous,
            command_id: command_id.to_owned(),
            version,
        },
    ));
    Ok(())
}

/// Consumes `result.>` until `shutdown`.
pub async fn consume(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        if let Err(e) = consume_once(&ctx, &shutdown).await {
            tracing::warn!(error = %e, "results consumer failed; restarting");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

async fn consume_once(ctx: &Arc<Ctx>, shutdown: &CancellationToken) -> anyhow::Result<()> {
    let subjects = ctx.bus.subjects();
    let stream = ctx
        .bus
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
    let messages = consumer.messages().await?;
    let handled = messages
        .take_until(shutdown.cancelled())
        .map(|m| m.map_err(|e| anyhow::anyhow!("{e}")))
        .try_for_each_concurrent(CONCURRENT_RESULTS, |msg| async move {
            handle(ctx, msg).await;
            Ok(())
        });
    handled.await
}

/// Records one delivered result, then acks it; a failure naks it for a
/// redelivery, an undecodable one is terminated.
async fn handle(ctx: &Ctx, msg: async_nats::jetstream::Message) {
    let parsed: Result<CloudEvent<CommandResult>, _> = serde_json::from_slice(&msg.payload);
    match parsed {
        Ok(ev) => match record(ctx, &ev.data).await {
            Ok(_) => {
                if let Err(e) = msg.ack().await {
                    tracing::warn!(error = %e, command = %ev.data.command_id, "acking a result failed; it will be redelivered and deduplicated");
                }
            }
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
