//! Consumes site command results from JetStream (`result.>`, durable
//! `engine-results`): records each once on its command row and advances
//! the waiting step in the same transaction (the results that arrived
//! together share one); acked only after the commit. A result that breaks
//! its contract, answers no command, or answers it with another kind is
//! dead-lettered and changes nothing.

use bcm_bus::consumer::{ConsumerSpec, Disposition, Handler, Incoming};
use bcm_bus::subjects::StreamKind;
use bcm_contracts::{CloudEvent, CommandResult, Output};
use bcm_core::PowerState;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::engine::Ctx;

/// Results recorded in one transaction, at most.
const RESULTS_PER_TXN: usize = 64;

/// Transactions of results in flight at once.
const CONCURRENT_TXNS: usize = 4;

/// What became of one result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Stored on its command; the waiting step advanced.
    New,
    /// Its command already had a result (a redelivery): nothing changed.
    Repeat,
    /// It answers no command of its kind: nothing changed.
    Unknown(String),
}

/// A result and the site that answered: the one whose bus identity may
/// publish on the subject it came on.
#[derive(Debug, Clone)]
pub struct SiteResult {
    pub site: bcm_core::SiteId,
    pub result: CommandResult,
    /// The trace context it was published in (the site's span).
    pub traceparent: Option<String>,
}

/// Records one site result and advances the step waiting on it, in one
/// transaction.
pub async fn record(ctx: &Ctx, r: &SiteResult) -> Result<Recorded, bcm_db::DbError> {
    let mut out = record_many(ctx, std::slice::from_ref(r)).await?;
    Ok(out.pop().unwrap_or(Recorded::Repeat))
}

/// Records site results, each once, and advances the steps waiting on them,
/// all in one transaction; one [`Recorded`] per result, in order. The power
/// the results report is recorded first, in a transaction of its own
/// ([`record_powers`]). The workflows are locked in id order; a node a
/// step writes (a completed workflow's move, a forgotten credential) is
/// locked as it is written, after its workflow, the other way round from a
/// verb: the deadlock that can make is Postgres's to break, and the batch
/// is then recorded a result at a time.
pub async fn record_many(
    ctx: &Ctx,
    answered: &[SiteResult],
) -> Result<Vec<Recorded>, bcm_db::DbError> {
    record_powers(ctx, answered).await?;
    let started = std::time::Instant::now();
    let results: Vec<&CommandResult> = answered.iter().map(|a| &a.result).collect();
    let mut tx = ctx.db.begin().await?;
    let rows: Vec<bcm_db::commands::NewResult<'_>> = answered
        .iter()
        .map(|SiteResult { site, result: r, .. }| bcm_db::commands::NewResult {
            command_id: &r.command_id,
            site_id: site.as_str(),
            kind: r.kind.as_str(),
            succeeded: r.ok,
            result: serde_json::json!({ "ok": r.ok, "retryable": r.retryable, "output": r.output_json(), "error": r.error }),
        })
        .collect();
    let mut completed = bcm_db::commands::commands_complete_many_in_txn(&mut tx, &rows).await?;
    completed.sort_by(|a, b| a.1.node_id.cmp(&b.1.node_id).then(a.0.cmp(&b.0)));
    let mut writes = crate::engine::Writes::default();
    // One span per recorded result, a child of the site's span that
    // answered: the events its rotation handling writes go on in the
    // verb's trace (the steps it drives continue their workflows').
    let mut spans = Vec::with_capacity(completed.len());
    for (command_id, done) in &completed {
        let Some(a) = answered.iter().find(|a| a.result.command_id == *command_id) else {
            continue;
        };
        let r = &a.result;
        let span = tracing::info_span!("engine.result", command_id = %r.command_id,
            command_kind = %r.kind.as_str(), node_id = done.node_id.as_deref().unwrap_or(""));
        bcm_telemetry::set_remote_parent(&span, a.traceparent.as_deref());
        // A rotation `metal.rotateCredentials` started (a workflow's — a
        // dedicated teardown's — is its step's to judge).
        if let (Some(node), bcm_contracts::CommandKind::BmcRotateCredentials, None) =
            (&done.node_id, r.kind, &done.step)
        {
            crate::rotation::finish(&mut tx, ctx, node, r, &mut writes.events)
                .instrument(span.clone())
                .await?;
        }
        spans.push(span);
    }
    let steps: Vec<(String, i32)> = completed
        .iter()
        .filter_map(|(_, d)| d.step.clone())
        .collect();
    crate::engine::drive_many(&mut tx, ctx, &steps, &mut writes).await?;
    let observed = writes.flush(&mut tx).await?;
    // Those that completed nothing: a redelivery, or an answer to no
    // command of its kind.
    let missed: Vec<String> = results
        .iter()
        .filter(|r| !completed.iter().any(|(id, _)| *id == r.command_id))
        .map(|r| r.command_id.clone())
        .collect();
    let known = bcm_db::commands::command_kinds_in_txn(&mut tx, &missed).await?;
    tx.commit().await?;
    metrics::histogram!("bcm_workflow_txn_seconds", "what" => "results")
        .record(started.elapsed().as_secs_f64());
    observed.emit();
    drop(spans);
    Ok(answered
        .iter()
        .map(
            |SiteResult {
                 site, result: r, ..
             }| {
                if completed.iter().any(|(id, _)| *id == r.command_id) {
                    return Recorded::New;
                }
                match known.iter().find(|(id, _, _)| *id == r.command_id) {
                    Some((_, _, to)) if to.as_deref() != Some(site.as_str()) => {
                        Recorded::Unknown(format!(
                            "site {site} answered command {}, which was addressed to {}",
                            r.command_id,
                            to.as_deref().unwrap_or("no site")
                        ))
                    }
                    Some((_, kind, _)) if kind == r.kind.as_str() => Recorded::Repeat,
                    Some((_, kind, _)) => Recorded::Unknown(format!(
                        "a {} result for command {}, which is a {kind}",
                        r.kind, r.command_id
                    )),
                    None => Recorded::Unknown(format!("no command {} exists", r.command_id)),
                }
            },
        )
        .collect())
}

/// The power each successful result reports, recorded on its node before
/// the results' own transaction, in a short one of its own: the node's row
/// lock is then held for a few statements, not while the results' steps
/// advance (half a second for 64 results under load), where it held up the
/// verbs, the agents and the other results waiting for that node.
///
/// Only a result whose command still waits for it counts (matched by id,
/// kind and site, as its recording matches it): a redelivery after its
/// command was completed, or a copy from the wrong site, reports nothing.
/// A crash (or a failure) between the two transactions leaves the result
/// unacknowledged; redelivered, its power is recorded again, which changes
/// nothing while the node's power is still the one it reported (should a
/// newer command have changed it meanwhile, the older report is written
/// again, as a late answer always could be), and its command is then
/// completed. Nodes are locked in id order, a node's reports applied in
/// command order (the later command's power stands); a command answered
/// twice in one batch counts its first answer.
async fn record_powers(ctx: &Ctx, answered: &[SiteResult]) -> Result<(), bcm_db::DbError> {
    let reports: Vec<(&SiteResult, PowerState)> = answered
        .iter()
        .filter(|a| a.result.ok)
        .filter_map(|a| {
            a.result
                .output
                .as_ref()
                .and_then(Output::power)
                .map(|p| (a, p))
        })
        .filter(|(_, p)| *p != PowerState::Unknown)
        .collect();
    if reports.is_empty() {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let rows: Vec<bcm_db::commands::NewResult<'_>> = reports
        .iter()
        .map(|(a, _)| bcm_db::commands::NewResult {
            command_id: &a.result.command_id,
            site_id: a.site.as_str(),
            kind: a.result.kind.as_str(),
            succeeded: true,
            result: serde_json::Value::Null,
        })
        .collect();
    let mut tx = ctx.db.begin().await?;
    let mut awaiting = bcm_db::commands::commands_awaiting_nodes_in_txn(&mut tx, &rows).await?;
    if awaiting.is_empty() {
        tx.rollback().await?;
        return Ok(());
    }
    // The first answer of each command; then by node, then command.
    awaiting.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    awaiting.dedup_by(|later, first| later.1 == first.1);
    awaiting.sort_by(|a, b| a.2.cmp(&b.2).then(a.1.cmp(&b.1)));
    let mut events = vec![];
    for (at, command_id, node) in &awaiting {
        let Some((a, power)) = reports.get(*at) else {
            continue;
        };
        let span = tracing::info_span!("engine.result.power", command_id = %command_id,
            command_kind = %a.result.kind.as_str(), node_id = %node);
        bcm_telemetry::set_remote_parent(&span, a.traceparent.as_deref());
        record_power(&mut tx, ctx, node, *power, command_id, &mut events)
            .instrument(span)
            .await?;
    }
    bcm_metal::outbox::write_in_txn(&mut tx, events).await?;
    tx.commit().await?;
    metrics::histogram!("bcm_workflow_txn_seconds", "what" => "power")
        .record(started.elapsed().as_secs_f64());
    Ok(())
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
        bcm_contracts::events::NodePowerChanged {
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

/// The results consumer's handler.
struct ResultsHandler {
    ctx: Arc<Ctx>,
}

impl Handler<CloudEvent<CommandResult>> for ResultsHandler {
    async fn handle(&self, batch: &[Incoming<CloudEvent<CommandResult>>]) -> Vec<Disposition> {
        let subjects = self.ctx.bus.subjects();
        // Each result is taken as the answer of the site its subject names
        // (the only site the bus lets publish there); one on any other
        // subject answers nothing.
        let mut out: Vec<Option<Disposition>> = (0..batch.len()).map(|_| None).collect();
        let mut results: Vec<SiteResult> = Vec::with_capacity(batch.len());
        let mut at: Vec<usize> = Vec::with_capacity(batch.len());
        for (i, m) in batch.iter().enumerate() {
            match subjects.site_of_result(m.subject()) {
                Some(site) => {
                    results.push(SiteResult {
                        site,
                        result: without_nul(m.message.data.clone()),
                        traceparent: m.traceparent(),
                    });
                    at.push(i);
                }
                None => {
                    out[i] = Some(Disposition::Reject(format!(
                        "{} is not a site's result subject",
                        m.subject()
                    )))
                }
            }
        }
        let done = self.record_all(&results).await;
        for (i, d) in at.into_iter().zip(done) {
            out[i] = Some(d);
        }
        out.into_iter()
            .map(|d| d.unwrap_or_else(|| Disposition::Retry("not recorded".into())))
            .collect()
    }
}

impl ResultsHandler {
    async fn record_all(&self, results: &[SiteResult]) -> Vec<Disposition> {
        if results.len() > 1 {
            match record_many(&self.ctx, results).await {
                Ok(recorded) => return recorded.into_iter().map(disposition).collect(),
                Err(e) => {
                    tracing::warn!(error = %e, results = results.len(), "recording a batch of results failed; recording them one by one")
                }
            }
        }
        let mut out = Vec::with_capacity(results.len());
        for r in results {
            out.push(match record(&self.ctx, r).await {
                Ok(recorded) => disposition(recorded),
                Err(e) => {
                    tracing::warn!(error = %e, command = %r.result.command_id, "recording a result failed; will retry");
                    Disposition::Retry(e.to_string())
                }
            });
        }
        out
    }
}

fn disposition(r: Recorded) -> Disposition {
    match r {
        Recorded::New | Recorded::Repeat => Disposition::Done,
        Recorded::Unknown(why) => Disposition::Reject(why),
    }
}

/// The consumer's spec: what has arrived together is recorded together.
pub fn spec(subjects: &bcm_bus::Subjects) -> ConsumerSpec {
    let mut spec = ConsumerSpec::new(
        StreamKind::Results,
        "engine-results",
        vec![subjects.results_all()],
    );
    spec.max_deliver = 20;
    spec.ack_wait = Duration::from_secs(10);
    spec.batch = RESULTS_PER_TXN;
    spec.concurrency = CONCURRENT_TXNS;
    spec
}

/// Consumes `result.>` until `shutdown`.
pub async fn consume(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let spec = spec(ctx.bus.subjects());
    let bus = ctx.bus.clone();
    bcm_bus::consumer::run(bus, spec, Arc::new(ResultsHandler { ctx }), shutdown).await
}

/// A site result without the NUL characters Postgres's `jsonb` cannot hold
/// (some BMC firmware pads its strings with them). Results from site
/// services are not signed, so nothing a signature covers changes.
fn without_nul(mut r: CommandResult) -> CommandResult {
    let mut output = r.output_json();
    let removed = remove_nul(&mut output) + r.error.as_mut().map_or(0, text_without_nul);
    if removed == 0 {
        return r;
    }
    tracing::warn!(command = %r.command_id, removed, "a result held NUL characters (firmware pads strings with them); removed, as Postgres cannot store them");
    if let Some(o) = r.output.as_mut() {
        if let Ok(clean) = Output::decode(r.kind, &output) {
            *o = clean;
        }
    }
    r
}

fn text_without_nul(s: &mut String) -> usize {
    let n = s.matches('\0').count();
    if n > 0 {
        s.retain(|c| c != '\0');
    }
    n
}

/// Removes NUL characters from every string and key of `v`; how many went.
fn remove_nul(v: &mut serde_json::Value) -> usize {
    match v {
        serde_json::Value::String(s) => text_without_nul(s),
        serde_json::Value::Array(items) => items.iter_mut().map(remove_nul).sum(),
        serde_json::Value::Object(map) => {
            let mut n = 0;
            if map.keys().any(|k| k.contains('\0')) {
                let old = std::mem::take(map);
                for (mut k, v) in old {
                    n += text_without_nul(&mut k);
                    map.insert(k, v);
                }
            }
            n + map.values_mut().map(remove_nul).sum::<usize>()
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcm_contracts::outputs::OobInventory;

    #[test]
    fn nul_characters_leave_strings_keys_and_the_error() {
        let mut v = serde_json::json!({
            "serial": "SIM01\0\0", "disks": [{"model": "\0X\0"}], "k\0": 1, "n": 3
        });
        assert_eq!(remove_nul(&mut v), 5);
        assert_eq!(
            v,
            serde_json::json!({"serial": "SIM01", "disks": [{"model": "X"}], "k": 1, "n": 3})
        );
        assert_eq!(remove_nul(&mut v), 0, "a clean value is left as it is");

        let r = CommandResult {
            command_id: "c1".into(),
            kind: bcm_contracts::CommandKind::BmcInspect,
            ok: true,
            retryable: false,
            output: Some(Output::BmcInspect(OobInventory {
                serial: Some("SIM01\0\0".into()),
                macs: vec!["52:54:00:00:00:01".into()],
                ..Default::default()
            })),
            error: Some("bad\0".into()),
        };
        let clean = without_nul(r);
        assert_eq!(clean.error.as_deref(), Some("bad"));
        let Some(Output::BmcInspect(i)) = clean.output else {
            panic!("the output's kind changed")
        };
        assert_eq!(i.serial.as_deref(), Some("SIM01"));
    }
}
