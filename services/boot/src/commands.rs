//! `site.*` commands and the shared entry store. The consumer (`boot-<site>`,
//! shared by every boot process of the site) applies `site.bootEntry.set`
//! and `.clear` to the site's entries bucket and answers on
//! `result.<site>.<commandId>`, acking after the result is stored. Applying
//! is idempotent (a put or delete per MAC), so a redelivery does no harm.
//! Every process watches the bucket into its local [`Entries`].

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::kv::{self, Operation, Store};
use async_nats::jetstream::AckKind;
use bcm_bus::messages::{CloudEvent, CommandEnvelope, CommandResult};
use bcm_bus::subjects::StreamKind;
use bcm_bus::Bus;
use bcm_core::SiteId;
use futures::StreamExt as _;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::entries::{self, BootEntry, Entries, Mac};

/// The site's entries bucket and lease bucket (created if missing).
pub async fn buckets(
    bus: &Bus,
    site: &SiteId,
    lease_ttl: Duration,
) -> anyhow::Result<(Store, Store)> {
    let js = bus.jetstream();
    let subjects = bus.subjects();
    let entries = js
        .create_or_update_key_value(kv::Config {
            bucket: subjects.kv_bucket("boot_entries", site),
            description: "Boot entries per MAC (site.bootEntry)".into(),
            history: 1,
            max_age: Duration::from_secs(entries::MAX_TTL_SECS + 3600),
            ..Default::default()
        })
        .await?;
    let lease = js
        .create_or_update_key_value(kv::Config {
            bucket: subjects.kv_bucket("boot_lease", site),
            description: "The site's active boot server".into(),
            history: 1,
            max_age: lease_ttl,
            ..Default::default()
        })
        .await?;
    Ok((entries, lease))
}

/// Keeps `entries` equal to the bucket until `shutdown` (re-watching after
/// errors), and sweeps expired entries out of the bucket.
pub async fn sync_entries(kv: Store, entries: Arc<Entries>, shutdown: CancellationToken) {
    let mut sweep = tokio::time::interval(Duration::from_secs(30));
    while !shutdown.is_cancelled() {
        let mut watch = match kv.watch_with_history(">").await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "watching boot entries failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = sweep.tick() => {
                    for mac in entries.expired() {
                        entries.remove(&mac);
                        let _ = kv.delete(mac.key()).await;
                    }
                }
                next = watch.next() => match next {
                    Some(Ok(e)) => apply(&entries, &e),
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "boot entry watch failed; re-watching");
                        break;
                    }
                    None => break,
                }
            }
        }
    }
}

fn apply(entries: &Entries, e: &kv::Entry) {
    let Some(mac) = Mac::parse(&e.key) else {
        tracing::warn!(key = %e.key, "a boot entry key that is not a MAC; ignored");
        return;
    };
    match e.operation {
        Operation::Put => match serde_json::from_slice::<BootEntry>(&e.value) {
            Ok(entry) => entries.put(mac, entry),
            Err(err) => tracing::warn!(%mac, error = %err, "an undecodable boot entry; ignored"),
        },
        Operation::Delete | Operation::Purge => entries.remove(&mac),
    }
}

/// Applies one command to the bucket; the result's output.
async fn execute(kv: &Store, cmd: &CommandEnvelope) -> Result<serde_json::Value, String> {
    match cmd.kind.as_str() {
        "site.bootEntry.set" => {
            let (macs, entry) = entries::parse_set(
                &cmd.params,
                cmd.node_id.map(|n| n.to_string()),
                entries::now_secs(),
            )
            .map_err(|e| e.to_string())?;
            let value = serde_json::to_vec(&entry).map_err(|e| e.to_string())?;
            for mac in &macs {
                kv.put(mac.key(), value.clone().into())
                    .await
                    .map_err(|e| format!("storing the boot entry of {mac}: {e}"))?;
            }
            Ok(
                json!({ "macs": macs.iter().map(Mac::to_string).collect::<Vec<_>>(), "expiresAt": entry.expires_at }),
            )
        }
        "site.bootEntry.clear" => {
            let macs = entries::parse_clear(&cmd.params).map_err(|e| e.to_string())?;
            for mac in &macs {
                kv.delete(mac.key())
                    .await
                    .map_err(|e| format!("clearing the boot entry of {mac}: {e}"))?;
            }
            Ok(json!({ "cleared": macs.iter().map(Mac::to_string).collect::<Vec<_>>() }))
        }
        other => Err(format!("unsupported: command kind {other}")),
    }
}

/// Consumes `cmd.<site>.site.>` until `shutdown`.
pub async fn run(bus: Bus, site: SiteId, kv: Store, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        if let Err(e) = consume(&bus, &site, &kv, &shutdown).await {
            tracing::warn!(error = %e, "site command consumer failed; restarting");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

async fn consume(
    bus: &Bus,
    site: &SiteId,
    kv: &Store,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let subjects = bus.subjects();
    let stream = bus
        .jetstream()
        .get_stream(subjects.stream(StreamKind::Commands))
        .await?;
    let name = format!("boot-{site}");
    let consumer = stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: subjects.commands_of_site_family(site, "site"),
                ack_policy: AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_deliver: 50,
                ..Default::default()
            },
        )
        .await?;
    let messages = consumer.messages().await?;
    messages
        .take_until(shutdown.cancelled())
        .for_each_concurrent(16, |m| async move {
            let msg = match m {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "site command delivery failed");
                    return;
                }
            };
            let cmd = match serde_json::from_slice::<CloudEvent<CommandEnvelope>>(&msg.payload) {
                Ok(ev) => ev.data,
                Err(e) => {
                    tracing::warn!(error = %e, subject = %msg.subject, "dropping an undecodable site command");
                    let _ = msg.ack_with(AckKind::Term).await;
                    return;
                }
            };
            let outcome = execute(kv, &cmd).await;
            if let Err(e) = &outcome {
                tracing::warn!(command = %cmd.command_id, kind = %cmd.kind, error = %e, "site command failed");
            } else {
                tracing::info!(command = %cmd.command_id, kind = %cmd.kind, "site command applied");
            }
            let result = match outcome {
                Ok(output) => CommandResult { command_id: cmd.command_id.clone(), ok: true, retryable: false, output, error: None },
                Err(e) => CommandResult { command_id: cmd.command_id.clone(), ok: false, retryable: false, output: json!({}), error: Some(e) },
            };
            let published = bus.publish_result(&cmd, result).await;
            match published {
                Ok(()) => {
                    let _ = msg.ack().await;
                }
                Err(e) => tracing::warn!(command = %cmd.command_id, error = %e, "publishing a site result failed; it will be redelivered"),
            }
        })
        .await;
    Ok(())
}
