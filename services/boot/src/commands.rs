//! `site.*` commands and the shared entry store. The consumer (`boot-<site>`,
//! shared by every boot process of the site) applies `site.bootEntry.set`
//! and `.clear` to the site's entries bucket, runs `site.httpProxy` (a
//! catalog image fetched into the image cache, through the site's proxy) and answers on
//! `result.<site>.<commandId>`, acking after the result is stored. A MAC is
//! unique within the site: a set or clear for a MAC whose live entry was
//! made for another node is refused (`CONFLICT`) and changes nothing; every
//! write is a compare-and-set on the entry read, so two commands racing for
//! one MAC cannot both win. Applying is otherwise idempotent, so a
//! redelivery does no harm.
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
use tracing::Instrument as _;

use crate::entries::{self, BootEntry, Entries, Mac};
use crate::BootError;

/// The site's entries bucket and lease bucket (created if missing),
/// waiting through a NATS outage (a restart as this service starts).
pub async fn buckets(
    bus: &Bus,
    site: &SiteId,
    lease_ttl: Duration,
) -> Result<(Store, Store), BootError> {
    let probe = format!("KV_{}", bus.subjects().kv_bucket("boot_entries", site));
    bcm_bus::streams::through_outage(bus, &probe, || buckets_once(bus, site, lease_ttl)).await
}

async fn buckets_once(
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

/// A MAC's stored entry: the live value (if a put) and the revision to
/// compare-and-set against (0: never written).
async fn stored(kv: &Store, mac: &Mac) -> Result<(Option<BootEntry>, u64), String> {
    match kv.entry(mac.key()).await {
        Ok(None) => Ok((None, 0)),
        Ok(Some(e)) => {
            let value = match e.operation {
                Operation::Put => serde_json::from_slice::<BootEntry>(&e.value).ok(),
                Operation::Delete | Operation::Purge => None,
            };
            Ok((value, e.revision))
        }
        Err(e) => Err(format!("reading the boot entry of {mac}: {e}")),
    }
}

/// How many times a write that lost a compare-and-set race is tried again.
const CAS_TRIES: usize = 5;

/// Every MAC of `macs` with the revision it was read at, and those whose
/// live entry another node holds (named with their holder).
async fn read_all(
    kv: &Store,
    macs: &[Mac],
    node: Option<&str>,
) -> Result<(Vec<(Mac, u64)>, Vec<String>), String> {
    let now = entries::now_secs();
    let mut read = Vec::with_capacity(macs.len());
    let mut held = vec![];
    for mac in macs {
        let (entry, revision) = stored(kv, mac).await?;
        if entries::held_by_other(entry.as_ref(), node, now) {
            let owner = entry
                .and_then(|e| e.node_id)
                .unwrap_or_else(|| "an entry without a node".into());
            held.push(format!("{mac} ({owner})"));
        }
        read.push((*mac, revision));
    }
    Ok((read, held))
}

/// What a site command may touch besides the entries bucket: the image
/// cache and the proxy the boot service's own configuration names.
#[derive(Debug, Clone)]
pub struct Cache {
    pub dir: std::path::PathBuf,
    /// `upstream_proxy` of the configuration: used when the command names
    /// no proxy of the site's.
    pub upstream_proxy: Option<String>,
}

/// Applies one command to the bucket or the cache; the result's output.
async fn execute(
    kv: &Store,
    cache: &Cache,
    has_join_key: bool,
    cmd: &CommandEnvelope,
) -> Result<Output, String> {
    let node = cmd.node_id.map(|n| n.to_string());
    match &cmd.command {
        Command::SiteHttpProxy(p) => {
            let proxy = p
                .upstream_proxy
                .as_deref()
                .or(cache.upstream_proxy.as_deref());
            crate::images::cache(&cache.dir, &p.image, proxy)
                .await
                .map(Output::SiteHttpProxy)
                .map_err(|e| e.to_string())
        }
        Command::BootEntrySet(p)
            if !has_join_key && bcm_pki::join_key::has_reference(&p.boot_entry.cmdline) =>
        {
            // The script could not carry the token: the machine would boot
            // a ramdisk that can never join. Say so now.
            Err("INVALID_CONFIG: the boot entry carries a join reference and this boot service holds no join key for its site (join_key.file)".into())
        }
        Command::BootEntrySet(p) => {
            let (macs, entry) = entries::entry_of(&p.boot_entry, node.clone(), entries::now_secs())
                .map_err(|e| e.to_string())?;
            let value: bytes::Bytes = serde_json::to_vec(&entry)
                .map_err(|e| e.to_string())?
                .into();
            let mut todo = macs.clone();
            for _ in 0..CAS_TRIES {
                let (read, held) = read_all(kv, &todo, node.as_deref()).await?;
                if !held.is_empty() {
                    return Err(format!(
                        "CONFLICT: the boot entry of {} is held by another node; a MAC is unique within a site",
                        held.join(", ")
                    ));
                }
                let mut lost = vec![];
                for (mac, revision) in read {
                    let wrote = if revision == 0 {
                        kv.create(mac.key(), value.clone())
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    } else {
                        kv.update(mac.key(), value.clone(), revision)
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string())
                    };
                    if let Err(e) = wrote {
                        tracing::debug!(%mac, error = %e, "a boot entry changed while it was written; reading it again");
                        lost.push(mac);
                    }
                }
                if lost.is_empty() {
                    return Ok(Output::BootEntrySet(BootEntryStored {
                        macs: macs.iter().map(Mac::to_string).collect(),
                        expires_at: entry.expires_at,
                        sim: false,
                    }));
                }
                todo = lost;
            }
            Err(format!(
                "the boot entries of {} kept changing while they were written",
                todo.iter()
                    .map(Mac::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
        Command::BootEntryClear(p) => {
            let macs = entries::macs_of(&p.macs).map_err(|e| e.to_string())?;
            let (_, held) = read_all(kv, &macs, node.as_deref()).await?;
            if !held.is_empty() {
                return Err(format!(
                    "CONFLICT: the boot entry of {} is held by another node; not cleared",
                    held.join(", ")
                ));
            }
            for mac in &macs {
                let mut cleared = false;
                for _ in 0..CAS_TRIES {
                    let (entry, revision) = stored(kv, mac).await?;
                    if entries::held_by_other(entry.as_ref(), node.as_deref(), entries::now_secs())
                    {
                        return Err(format!(
                            "CONFLICT: the boot entry of {mac} was taken by another node; not cleared"
                        ));
                    }
                    if entry.is_none() {
                        // Never written, already cleared, or unreadable.
                        cleared = true;
                        break;
                    }
                    if kv
                        .delete_expect_revision(mac.key(), Some(revision))
                        .await
                        .is_ok()
                    {
                        cleared = true;
                        break;
                    }
                }
                if !cleared {
                    return Err(format!(
                        "the boot entry of {mac} kept changing while it was cleared"
                    ));
                }
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
    cache: Cache,
    has_join_key: bool,
}

impl Handler<CloudEvent<CommandEnvelope>> for SiteHandler {
    async fn handle(&self, batch: &[Incoming<CloudEvent<CommandEnvelope>>]) -> Vec<Disposition> {
        let mut out = Vec::with_capacity(batch.len());
        for m in batch {
            let span = bcm_bus::command_span("boot", m);
            let started = std::time::Instant::now();
            // A long fetch (`site.httpProxy`) tells the server it is still
            // at it, so the command is not redelivered meanwhile.
            let work = self.one(m.subject(), &m.message.data).instrument(span);
            tokio::pin!(work);
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            tick.tick().await;
            let d = loop {
                tokio::select! {
                    d = &mut work => break d,
                    _ = tick.tick() => m.in_progress().await,
                }
            };
            bcm_bus::command_handled("boot", m, started.elapsed(), &d);
            out.push(d);
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
            match execute(&self.kv, &self.cache, self.has_join_key, cmd).await {
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
pub async fn run(
    bus: Bus,
    site: SiteId,
    kv: Store,
    cache: Cache,
    has_join_key: bool,
    shutdown: CancellationToken,
) {
    // The name and filter its bus identity may use.
    let (durable, filter) = bcm_bus::auth::boot_consumer(bus.subjects(), &site);
    let mut spec = ConsumerSpec::new(StreamKind::Commands, durable, vec![filter]);
    spec.max_deliver = 50;
    spec.concurrency = 16;
    let handler = Arc::new(SiteHandler {
        bus: bus.clone(),
        site,
        kv,
        cache,
        has_join_key,
    });
    bcm_bus::consumer::run(bus, spec, handler, shutdown).await
}
