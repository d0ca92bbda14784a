//! `site.*` commands and the shared entry store. The consumer (`boot-<site>`,
//! shared by every boot process of the site) applies `site.bootEntry.set`
//! and `.clear` to the site's entries bucket and answers on
//! `result.<site>.<commandId>`, acking after the result is stored. Applying
//! is idempotent (a put or delete per MAC), so a redelivery does no harm.
//! Every process watches the bucket into its local [`Entries`].

use async_nats::jetstream::kv::{self, Operation, Store};
use bcm_bus::consumer::{ConsumerSpec, Disposition, Handler, Incoming};
use bcm_bus::subjects::StreamKind;
use bcm_bus::Bus;
use bcm_contracts::commands::{Command, Family};
use bcm_contracts::outputs::{BootEntryCleared, BootEntryStored};
use bcm_contracts::{CloudEvent, CommandEnvelope, CommandResult, Output};
use bcm_core::SiteId;
use futures::StreamExt as _;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::entries::{self, BootEntry, Entries, Mac};
use crate::BootError;

/// The site's entries bucket and lease bucket (created if missing).
pub async fn buckets(
    bus: &Bus,
    site: &SiteId,
    lease_ttl: Duration,
) -> Result<(Store, Store), BootError> {
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
        .await
        .map_err(|e| BootError::Kv(e.to_string()))?;
    let lease = js
        .create_or_update_key_value(kv::Config {
            bucket: subjects.kv_bucket("boot_lease", site),
            description: "The site's active boot server".into(),
            history: 1,
            max_age: lease_ttl,
            ..Default::default()
        })
        .await
        .map_err(|e| BootError::Kv(e.to_string()))?;
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
async fn execute(kv: &Store, cmd: &CommandEnvelope) -> Result<Output, String> {
    match &cmd.command {
        Command::BootEntrySet(p) => {
            let (macs, entry) = entries::entry_of(
                &p.boot_entry,
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
            Ok(Output::BootEntrySet(BootEntryStored {
                macs: macs.iter().map(Mac::to_string).collect(),
                expires_at: entry.expires_at,
                sim: false,
            }))
        }
        Command::BootEntryClear(p) => {
            let macs = entries::macs_of(&p.macs).map_err(|e| e.to_string())?;
            for mac in &macs {
                kv.delete(mac.key())
                    .await
                    .map_err(|e| format!("clearing the boot entry of {mac}: {e}"))?;
            }
            Ok(Output::BootEntryClear(BootEntryCleared {
                cleared: macs.iter().map(Mac::to_string).collect(),
                sim: false,
            }))
        }
        other => Err(format!("unsupported: command kind {}", other.kind())),
    }
}

/// The `site.*` consumer's handler. Applying is idempotent (a put or a
/// delete per MAC), so a redelivery does no harm.
struct SiteHandler {
    bus: Bus,
    site: SiteId,
    kv: Store,
}

impl Handler<CloudEvent<CommandEnvelope>> for SiteHandler {
    async fn handle(&self, batch: &[Incoming<CloudEvent<CommandEnvelope>>]) -> Vec<Disposition> {
        let mut out = Vec::with_capacity(batch.len());
        for m in batch {
            out.push(self.one(m.subject(), &m.message.data).await);
        }
        out
    }
}

impl SiteHandler {
    async fn one(&self, subject: &str, cmd: &CommandEnvelope) -> Disposition {
        let expected = self
            .bus
            .subjects()
            .command(&cmd.site_id, cmd.kind().as_str());
        if cmd.kind().family() != Family::Site || cmd.site_id != self.site || expected != subject {
            return Disposition::Reject(format!(
                "a {} command for site {} arrived on {subject}",
                cmd.kind(),
                cmd.site_id
            ));
        }
        let result = if cmd.expired(chrono::Utc::now()) {
            // The control plane stopped waiting for it: an entry written
            // now could boot a machine nobody expects to boot.
            tracing::warn!(command = %cmd.command_id, kind = %cmd.kind(), deadline = ?cmd.deadline, "refused a command past its deadline; not run");
            CommandResult::expired(cmd)
        } else {
            match execute(&self.kv, cmd).await {
                Ok(output) => {
                    tracing::info!(command = %cmd.command_id, kind = %cmd.kind(), "site command applied");
                    CommandResult::succeeded(cmd, output)
                }
                Err(e) => {
                    tracing::warn!(command = %cmd.command_id, kind = %cmd.kind(), error = %e, "site command failed");
                    CommandResult::failed(cmd, false, e)
                }
            }
        };
        match self.bus.publish_result(cmd, result).await {
            Ok(()) => Disposition::Done,
            Err(e) => Disposition::Retry(format!("publishing the result: {e}")),
        }
    }
}

/// Consumes `cmd.<site>.site.>` (durable `boot-<site>`, shared by every
/// boot process of the site) until `shutdown`.
pub async fn run(bus: Bus, site: SiteId, kv: Store, shutdown: CancellationToken) {
    // The name and filter its bus identity may use.
    let (durable, filter) = bcm_bus::auth::boot_consumer(bus.subjects(), &site);
    let mut spec = ConsumerSpec::new(StreamKind::Commands, durable, vec![filter]);
    spec.max_deliver = 50;
    spec.concurrency = 16;
    let handler = Arc::new(SiteHandler {
        bus: bus.clone(),
        site,
        kv,
    });
    bcm_bus::consumer::run(bus, spec, handler, shutdown).await
}
