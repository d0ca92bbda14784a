//! Stream configurations as data, ensured at start-up. An existing stream
//! whose subjects, retention or storage differ stops the service with a
//! clear error; it is never deleted or changed.

use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};
use std::time::Duration;

use crate::subjects::StreamKind;
use crate::{Bus, BusError};

/// How long a command (and a work item) is kept for delivery: a record
/// kept only so that a redelivered command is not run again (a site's run
/// record) need live no longer after its last write.
pub const COMMAND_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The configuration of `kind` under the bus's namespace.
pub fn config(bus_subjects: &crate::Subjects, kind: StreamKind) -> Config {
    let base = Config {
        name: bus_subjects.stream(kind),
        subjects: bus_subjects.stream_subjects(kind),
        storage: StorageType::File,
        // Publishers retry with the same Nats-Msg-Id within this window.
        duplicate_window: Duration::from_secs(15 * 60),
        ..Default::default()
    };
    match kind {
        StreamKind::Events => Config {
            retention: RetentionPolicy::Limits,
            max_age: Duration::from_secs(30 * 24 * 3600),
            discard: DiscardPolicy::Old,
            ..base
        },
        StreamKind::Work | StreamKind::Commands => Config {
            retention: RetentionPolicy::WorkQueue,
            max_age: COMMAND_RETENTION,
            ..base
        },
        StreamKind::Results => Config {
            retention: RetentionPolicy::Limits,
            max_age: Duration::from_secs(7 * 24 * 3600),
            ..base
        },
        StreamKind::DeadLetter => Config {
            retention: RetentionPolicy::Limits,
            max_age: Duration::from_secs(30 * 24 * 3600),
            discard: DiscardPolicy::Old,
            ..base
        },
    }
}

/// Why `existing` cannot serve as `wanted`, if it cannot.
pub fn incompatibility(existing: &Config, wanted: &Config) -> Option<String> {
    if existing.subjects != wanted.subjects {
        return Some(format!(
            "subjects {:?}, want {:?}",
            existing.subjects, wanted.subjects
        ));
    }
    if existing.retention != wanted.retention {
        return Some(format!(
            "retention {:?}, want {:?}",
            existing.retention, wanted.retention
        ));
    }
    // A site's run record lives the commands' retention after its last
    // write (`Bucket::open_expiring`): a command kept longer could be
    // delivered again after its record expired, and run twice.
    if wanted.retention == RetentionPolicy::WorkQueue
        && (existing.max_age.is_zero() || existing.max_age > wanted.max_age)
    {
        return Some(format!(
            "max_age {:?} (0: for good), want at most {:?}: the sites' run records, \
             which keep a redelivered command from running twice, are kept that long",
            existing.max_age, wanted.max_age
        ));
    }
    if existing.storage != wanted.storage {
        return Some(format!(
            "storage {:?}, want {:?}",
            existing.storage, wanted.storage
        ));
    }
    None
}

/// Creates every missing stream and checks existing ones.
pub async fn ensure_all(bus: &Bus) -> Result<(), BusError> {
    for kind in StreamKind::ALL {
        let wanted = config(bus.subjects(), kind);
        let name = wanted.name.clone();
        let err = |why: String| BusError::Stream {
            stream: name.clone(),
            why,
        };
        // The stream's configuration as the get or create answered it: a
        // second request here would be one more that a NATS restart can
        // time out, outside the wait above (a chaos run lost a relay so).
        let stream = stream_waiting(bus, &wanted)
            .await
            .map_err(|e| err(e.to_string()))?;
        let info = stream.cached_info();
        if let Some(why) = incompatibility(&info.config, &wanted) {
            return Err(BusError::IncompatibleStream { stream: name, why });
        }
    }
    Ok(())
}

/// How long a service starting in a NATS outage (a restart, JetStream
/// still recovering its streams) waits for the streams before it gives up.
pub const STREAMS_WAIT: Duration = Duration::from_secs(180);

/// The stream `wanted`, created if missing; waits with backoff (250 ms
/// doubling to 5 s) through an outage (no answer, JetStream not yet
/// available), for up to [`STREAMS_WAIT`]. Any other refusal
/// (permissions, a bad config) is returned at once.
async fn stream_waiting(
    bus: &Bus,
    wanted: &Config,
) -> Result<async_nats::jetstream::stream::Stream, async_nats::jetstream::context::CreateStreamError>
{
    use async_nats::jetstream::context::CreateStreamErrorKind as Kind;
    use backon::Retryable as _;
    let give_up = std::time::Instant::now() + STREAMS_WAIT;
    let create = || bus.jetstream().get_or_create_stream(wanted.clone());
    create
        .retry(
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(250))
                .with_max_delay(Duration::from_secs(5))
                .without_max_times(),
        )
        .when(|e| matches!(e.kind(), Kind::TimedOut | Kind::JetStreamUnavailable))
        // Give up rather than sleep past the deadline.
        .adjust(|_, pause| pause.filter(|p| std::time::Instant::now() + *p < give_up))
        .notify(|e, pause| tracing::warn!(error = %e, stream = %wanted.name, ?pause, "NATS JetStream is not answering yet; waiting"))
        .await
}

/// Runs `op` again while it fails in a NATS outage (the server does not
/// answer, or its JetStream is not available yet: a restart), pausing
/// 250 ms doubling to 5 s, for up to [`STREAMS_WAIT`]. Whether NATS is
/// away is asked of the server about `stream` (the stream `op` works on),
/// so `op`'s own errors need no kinds. A failure with NATS answering is
/// tried once more (the outage it met may have just ended), then returned:
/// a bad configuration, or a refusal the server answers, is not waited on.
/// A publish the identity's permissions deny is never answered, though (the
/// server sends the client an `-ERR`, which [`Bus`] logs): that looks like
/// an outage and is waited on to the end, as in [`ensure_all`]. For what
/// a process does at start (opening its key-value buckets as NATS
/// restarts), so that it comes up with NATS instead of exiting.
pub async fn through_outage<T, E, F, Fut>(bus: &Bus, stream: &str, op: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let give_up = std::time::Instant::now() + STREAMS_WAIT;
    let mut pause = Duration::from_millis(250);
    let mut tried_with_nats_up = false;
    loop {
        let e = match op().await {
            Ok(done) => return Ok(done),
            Err(e) => e,
        };
        if std::time::Instant::now() + pause >= give_up {
            return Err(e);
        }
        if !jetstream_away(bus, stream).await {
            if tried_with_nats_up {
                return Err(e);
            }
            tried_with_nats_up = true;
            continue;
        }
        tried_with_nats_up = false;
        tracing::warn!(error = %e, %stream, ?pause, "NATS JetStream is not answering yet; waiting");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// Whether JetStream is away: a request about `stream` gets no answer (a
/// timeout, no responders) or a 503 (JetStream still starting). An answer
/// of any other kind (found, not found, refused) means it is up.
async fn jetstream_away(bus: &Bus, stream: &str) -> bool {
    use async_nats::jetstream::context::GetStreamErrorKind as Kind;
    match bus.jetstream().get_stream(stream).await {
        Ok(_) => false,
        Err(e) => match e.kind() {
            Kind::Request => true,
            Kind::JetStream(js) => js.code() == 503,
            _ => false,
        },
    }
}

/// Deletes every stream of the bus's namespace that exists, with their
/// messages and consumers, and the key-value buckets of `sites` under it
/// (by their exact names: [`crate::subjects::KV_BUCKETS`]). For throwaway
/// namespaces (a benchmark's) only: nothing a service runs calls it.
pub async fn delete_all(bus: &Bus, sites: &[bcm_core::SiteId]) -> Result<(), BusError> {
    use futures::StreamExt as _;
    let subjects = bus.subjects();
    let mut ours: Vec<String> = StreamKind::ALL
        .iter()
        .map(|kind| subjects.stream(*kind))
        .collect();
    for site in sites {
        for bucket in crate::subjects::KV_BUCKETS {
            ours.push(format!("KV_{}", subjects.kv_bucket(bucket, site)));
        }
    }
    let mut names = vec![];
    let mut all = bus.jetstream().stream_names();
    while let Some(name) = all.next().await {
        let name = name.map_err(|e| BusError::Stream {
            stream: "(every stream)".into(),
            why: e.to_string(),
        })?;
        if ours.contains(&name) {
            names.push(name);
        }
    }
    for name in names {
        bus.jetstream()
            .delete_stream(&name)
            .await
            .map_err(|e| BusError::Stream {
                stream: name.clone(),
                why: e.to_string(),
            })?;
    }
    Ok(())
}
