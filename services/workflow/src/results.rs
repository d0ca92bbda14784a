//! Consumes site command results from JetStream: records each once on its
//! command row and advances the waiting step in the same transaction (the
//! results that arrived together share one); acks only after the commit. Undecodable messages are terminated and logged,
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

/// Results recorded in one transaction, at most.
const RESULTS_PER_TXN: usize = 64;

/// Transactions of results in flight at once.
const CONCURRENT_TXNS: usize = 4;

/// Records one site result and advances the step waiting on it, in one
/// transaction; true when the result was new (a redelivery changes nothing).
pub async fn record(ctx: &Ctx, r: &CommandResult) -> Result<bool, bcm_db::DbError> {
    Ok(record_many(ctx, std::slice::from_ref(r)).await? == 1)
}

/// Records site results, each once, and advances the steps waiting on them,
/// all in one transaction; returns how many were new. Locks are taken as
/// verbs take them, node before workflow: first the nodes whose power a
/// result reports (in id order), then every workflow (in id order).
pub async fn record_many(ctx: &Ctx, results: &[CommandResult]) -> Result<usize, bcm_db::DbError> {
    let mut tx = ctx.db.begin().await?;
    let rows: Vec<bcm_db::commands::NewResult<'_>> = results
        .iter()
        .map(|r| bcm_db::commands::NewResult {
            command_id: &r.command_id,
            succeeded: r.ok,
            result: serde_json::json!({ "ok": r.ok, "retryable": r.retryable, "output": r.output, "error": r.error }),
        })
        .collect();
    let mut completed = bcm_db::commands::commands_complete_many_in_txn(&mut tx, &rows).await?;
    completed.sort_by(|a, b| a.1.node_id.cmp(&b.1.node_id).then(a.0.cmp(&b.0)));
    let mut writes = crate::engine::Writes::default();
    for (command_id, done) in &completed {
        let Some(r) = results.iter().find(|r| r.command_id == *command_id) else {
            continue;
        };
        if let (true, Some(node)) = (r.ok, &done.node_id) {
            if let Some(power) = r
                .output
                .get("power")
                .and_then(|p| p.as_str())
                .and_then(PowerState::parse)
            {
                record_power(&mut tx, ctx, node, power, command_id, &mut writes.events).await?;
            }
        }
        if let (Some(node), "bmc.rotateCredentials") = (&done.node_id, done.kind.as_str()) {
            crate::rotation::finish(&mut tx, ctx, node, r, &mut writes.events).await?;
        }
    }
    let steps: Vec<(String, i32)> = completed
        .iter()
        .filter_map(|(_, d)| d.step.clone())
        .collect();
    crate::engine::drive_many(&mut tx, ctx, &steps, &mut writes).await?;
    writes.flush(&mut tx).await?;
    tx.commit().await?;
    Ok(completed.len())
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
    // What has arrived is recorded together: one transaction per batch.
    let handled = messages
        .take_until(shutdown.cancelled())
        .ready_chunks(RESULTS_PER_TXN)
        .map(Ok::<_, anyhow::Error>)
        .try_for_each_concurrent(CONCURRENT_TXNS, |chunk| async move {
            let mut batch = Vec::with_capacity(chunk.len());
            let mut broken = None;
            for m in chunk {
                match m {
                    Ok(m) => batch.push(m),
                    Err(e) => broken = Some(anyhow::anyhow!("{e}")),
                }
            }
            handle_batch(ctx, batch).await;
            broken.map_or(Ok(()), Err)
        });
    handled.await
}

/// Records a batch of delivered results in one transaction, then acks
/// them; when the batch fails each result is recorded on its own (a
/// failure naks it for a redelivery). Undecodable ones are terminated.
async fn handle_batch(ctx: &Ctx, batch: Vec<async_nats::jetstream::Message>) {
    let mut decoded = Vec::with_capacity(batch.len());
    for msg in batch {
        match serde_json::from_slice::<CloudEvent<CommandResult>>(&msg.payload) {
            Ok(ev) => {
                let mut r = ev.data;
                let removed = remove_nul(&mut r);
                if removed > 0 {
                    tracing::warn!(command = %r.command_id, removed, "a result held NUL characters (firmware pads strings with them); removed, as Postgres cannot store them");
                }
                decoded.push((msg, r))
            }
            Err(e) => {
                tracing::warn!(error = %e, subject = %msg.subject, "dropping an undecodable result");
                let _ = msg.ack_with(AckKind::Term).await;
            }
        }
    }
    if decoded.is_empty() {
        return;
    }
    if decoded.len() > 1 {
        let results: Vec<CommandResult> = decoded.iter().map(|(_, r)| r.clone()).collect();
        match record_many(ctx, &results).await {
            Ok(_) => {
                for (msg, r) in &decoded {
                    ack(msg, r).await;
                }
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, results = decoded.len(), "recording a batch of results failed; recording them one by one");
            }
        }
    }
    for (msg, r) in &decoded {
        match record(ctx, r).await {
            Ok(_) => ack(msg, r).await,
            Err(e) => {
                tracing::warn!(error = %e, command = %r.command_id, "recording a result failed; will retry");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
            }
        }
    }
}

async fn ack(msg: &async_nats::jetstream::Message, r: &CommandResult) {
    if let Err(e) = msg.ack().await {
        tracing::warn!(error = %e, command = %r.command_id, "acking a result failed; it will be redelivered and deduplicated");
    }
}

/// Removes NUL characters from a site result's output and error, which
/// Postgres's `jsonb` cannot hold (some BMC firmware pads its strings with
/// them); returns how many went. Results from site services are not
/// signed, so nothing a signature covers changes.
fn remove_nul(r: &mut CommandResult) -> usize {
    fn text(s: &mut String) -> usize {
        let n = s.matches('\0').count();
        if n > 0 {
            s.retain(|c| c != '\0');
        }
        n
    }
    fn value(v: &mut serde_json::Value) -> usize {
        match v {
            serde_json::Value::String(s) => text(s),
            serde_json::Value::Array(items) => items.iter_mut().map(value).sum(),
            serde_json::Value::Object(map) => {
                let mut n = 0;
                if map.keys().any(|k| k.contains('\0')) {
                    let old = std::mem::take(map);
                    for (mut k, v) in old {
                        n += text(&mut k);
                        map.insert(k, v);
                    }
                }
                n + map.values_mut().map(value).sum::<usize>()
            }
            _ => 0,
        }
    }
    value(&mut r.output) + r.error.as_mut().map_or(0, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_characters_leave_strings_keys_and_the_error() {
        let mut r = CommandResult {
            command_id: "c1".into(),
            ok: true,
            retryable: false,
            output: serde_json::json!({
                "serial": "SIM01\0\0", "disks": [{"model": "\0X\0"}], "k\0": 1, "n": 3
            }),
            error: Some("bad\0".into()),
        };
        assert_eq!(remove_nul(&mut r), 6);
        assert_eq!(
            r.output,
            serde_json::json!({"serial": "SIM01", "disks": [{"model": "X"}], "k": 1, "n": 3})
        );
        assert_eq!(r.error.as_deref(), Some("bad"));
        assert_eq!(remove_nul(&mut r), 0, "a clean result is left as it is");
    }
}
