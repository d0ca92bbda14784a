//! The one durable-consumer discipline every JetStream consumer follows.
//!
//! A [`ConsumerSpec`] names the stream, the durable consumer and its
//! filters; a [`Handler`] decides what each delivered message comes to
//! ([`Disposition`]). [`run`] does the rest, the same way for everyone:
//!
//! - a message that does not decode as the consumer's type, or that the
//!   handler rejects, goes to the dead-letter subject (`dlq.<consumer>`)
//!   byte for byte, with headers that name the consumer, the original
//!   subject and stream sequence, the delivery count and the reason; it is
//!   counted (`bcm_bus_dead_letters_total`), logged, and terminated in its
//!   stream, and the consumer carries on;
//! - a message is acked only when its handler said `Done`, which a handler
//!   says only after its transaction committed;
//! - a failure is redelivered with exponential backoff, at most
//!   `max_deliver` times; a message delivered more often than that (it
//!   failed every time, or killed the process handling it) is dead-lettered
//!   instead of being handled again;
//! - on shutdown no new message is taken, and those in flight get `drain`
//!   to finish (what does not finish is redelivered to the next holder);
//! - a broken subscription (NATS restarted, the consumer deleted) is set up
//!   again with backoff, from the consumer's durable position.
//!
//! Delivery is at-least-once: a handler must be idempotent (every one here
//! dedupes by command id, version or row state).

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::{self, AckKind};
use async_nats::HeaderMap;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::subjects::StreamKind;
use crate::{Bus, BusError, MSG_ID_HEADER};

/// Header of a dead letter: the consumer that gave up on it.
pub const DLQ_CONSUMER: &str = "Bcm-Dlq-Consumer";
/// Header of a dead letter: the subject it was published on.
pub const DLQ_SUBJECT: &str = "Bcm-Dlq-Subject";
/// Header of a dead letter: its sequence in the original stream.
pub const DLQ_SEQUENCE: &str = "Bcm-Dlq-Stream-Sequence";
/// Header of a dead letter: how often it was delivered.
pub const DLQ_DELIVERIES: &str = "Bcm-Dlq-Deliveries";
/// Header of a dead letter: why.
pub const DLQ_REASON: &str = "Bcm-Dlq-Reason";

/// What a durable consumer reads and how.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub stream: StreamKind,
    /// The durable name; also the dead-letter subject's last token.
    pub durable: String,
    /// The subjects it takes (one or more).
    pub filters: Vec<String>,
    /// Deliveries before a message is dead-lettered.
    pub max_deliver: i64,
    /// How long a delivery may go unanswered before it is redelivered (a
    /// long handler sends progress acks meanwhile).
    pub ack_wait: Duration,
    /// Redelivery backoff: the first delay, doubled per delivery up to `max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Deliveries outstanding at once.
    pub max_ack_pending: i64,
    /// Handler calls in flight at once.
    pub concurrency: usize,
    /// Messages handed to one handler call, at most (what has arrived
    /// together, up to this many).
    pub batch: usize,
    /// How long shutdown waits for handlers in flight.
    pub drain: Duration,
}

impl ConsumerSpec {
    /// A spec with the defaults: 10 deliveries, 30 s ack wait, backoff from
    /// 200 ms to 30 s, one message per call, 16 calls in flight, 5 s drain.
    pub fn new(stream: StreamKind, durable: impl Into<String>, filters: Vec<String>) -> Self {
        Self {
            stream,
            durable: durable.into(),
            filters,
            max_deliver: 10,
            ack_wait: Duration::from_secs(30),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            max_ack_pending: 10_000,
            concurrency: 16,
            batch: 1,
            drain: Duration::from_secs(5),
        }
    }

    /// The redelivery delay after the `delivered`-th delivery failed.
    pub fn backoff(&self, delivered: i64) -> Duration {
        let doublings = (delivered.max(1) - 1).min(20) as u32;
        self.backoff_initial
            .saturating_mul(1u32 << doublings)
            .min(self.backoff_max)
    }
}

/// A delivered message, decoded.
pub struct Incoming<M> {
    pub message: M,
    raw: jetstream::Message,
    /// Its sequence in the stream.
    pub stream_sequence: u64,
    /// How often it has been delivered, this time included.
    pub delivered: i64,
}

impl<M> Incoming<M> {
    /// The subject it was published on.
    pub fn subject(&self) -> &str {
        self.raw.subject.as_str()
    }

    /// The W3C trace context it carries.
    pub fn traceparent(&self) -> Option<String> {
        crate::traceparent_of(self.raw.headers.as_ref())
    }

    /// Tells the server the handler is still at it, so the message is not
    /// redelivered meanwhile.
    pub async fn in_progress(&self) {
        let _ = self.raw.ack_with(AckKind::Progress).await;
    }
}

/// What a handled message comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Handled (its transaction committed, or there was nothing to do): ack.
    Done,
    /// It may succeed later: redeliver after the backoff (dead-lettered at
    /// the last delivery).
    Retry(String),
    /// It can never succeed (it breaks its contract): dead-letter it now.
    Reject(String),
    /// Another delivery of it is being handled here now: leave this one
    /// unanswered (that one answers).
    InFlight,
}

/// What a consumer does with what it takes.
pub trait Handler<M>: Send + Sync + 'static {
    /// Handles a batch (at most `spec.batch` messages, in delivery order);
    /// returns one disposition per message, in the same order.
    fn handle<'a>(
        &'a self,
        batch: &'a [Incoming<M>],
    ) -> impl Future<Output = Vec<Disposition>> + Send + 'a;
}

/// Runs `spec`'s consumer with `handler` until `shutdown`, setting it up
/// again whenever the subscription breaks.
pub async fn run<M, H>(bus: Bus, spec: ConsumerSpec, handler: Arc<H>, shutdown: CancellationToken)
where
    M: DeserializeOwned + Send + Sync + 'static,
    H: Handler<M>,
{
    let spec = Arc::new(spec);
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let work = consume(&bus, &spec, &handler, &shutdown);
        tokio::pin!(work);
        let ended = tokio::select! {
            r = &mut work => r,
            _ = shutdown.cancelled() => match tokio::time::timeout(spec.drain, &mut work).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!(consumer = %spec.durable, drain_ms = spec.drain.as_millis() as u64,
                        "shutdown: handlers still running after the drain; their messages are redelivered");
                    Ok(())
                }
            },
        };
        match ended {
            Ok(()) => failures = 0,
            Err(e) => {
                failures = failures.saturating_add(1);
                let pause =
                    Duration::from_millis(250u64 << failures.min(6)).min(Duration::from_secs(15));
                tracing::warn!(consumer = %spec.durable, error = %e, retry_in_ms = pause.as_millis() as u64,
                    "consumer stopped; setting it up again");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

async fn consume<M, H>(
    bus: &Bus,
    spec: &Arc<ConsumerSpec>,
    handler: &Arc<H>,
    shutdown: &CancellationToken,
) -> Result<(), BusError>
where
    M: DeserializeOwned + Send + Sync + 'static,
    H: Handler<M>,
{
    let err = |e: String| BusError::Consumer(format!("{}: {e}", spec.durable));
    let stream = bus
        .jetstream()
        .get_stream(bus.subjects().stream(spec.stream))
        .await
        .map_err(|e| err(e.to_string()))?;
    let (filter_subject, filter_subjects) = match spec.filters.as_slice() {
        [one] => (one.clone(), vec![]),
        many => (String::new(), many.to_vec()),
    };
    let consumer = stream
        .get_or_create_consumer(
            &spec.durable,
            pull::Config {
                durable_name: Some(spec.durable.clone()),
                filter_subject,
                filter_subjects,
                ack_policy: AckPolicy::Explicit,
                // Bounded here, not by the server: a message the server
                // stopped delivering would sit unanswered forever.
                max_deliver: -1,
                ack_wait: spec.ack_wait,
                max_ack_pending: spec.max_ack_pending,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| err(e.to_string()))?;
    let messages = consumer.messages().await.map_err(|e| err(e.to_string()))?;
    messages
        .take_until(shutdown.cancelled())
        .ready_chunks(spec.batch.max(1))
        .map(Ok::<_, BusError>)
        .try_for_each_concurrent(spec.concurrency.max(1), |chunk| async move {
            let mut batch = Vec::with_capacity(chunk.len());
            let mut broken = None;
            for m in chunk {
                match m {
                    Ok(raw) => {
                        if let Some(incoming) = admit(bus, spec, raw).await {
                            batch.push(incoming);
                        }
                    }
                    Err(e) => broken = Some(err(e.to_string())),
                }
            }
            if !batch.is_empty() {
                let dispositions = handler.handle(&batch).await;
                settle(bus, spec, batch, dispositions).await;
            }
            broken.map_or(Ok(()), Err)
        })
        .await
}

/// Decodes a delivery, or dead-letters it (undecodable, or delivered more
/// often than the spec allows).
async fn admit<M: DeserializeOwned>(
    bus: &Bus,
    spec: &ConsumerSpec,
    raw: jetstream::Message,
) -> Option<Incoming<M>> {
    let (stream_sequence, delivered) = match raw.info() {
        Ok(i) => (i.stream_sequence, i.delivered),
        Err(_) => (0, 1),
    };
    if delivered > 1 {
        metrics::counter!("bcm_bus_redeliveries_total", "consumer" => spec.durable.clone())
            .increment(1);
    }
    if delivered > spec.max_deliver {
        let why = format!("delivered {delivered} times without being handled");
        dead_letter(
            bus,
            spec,
            &raw,
            stream_sequence,
            delivered,
            "max-deliveries",
            &why,
        )
        .await;
        return None;
    }
    match serde_json::from_slice::<M>(&raw.payload) {
        Ok(message) => Some(Incoming {
            message,
            raw,
            stream_sequence,
            delivered,
        }),
        Err(e) => {
            let why = format!("undecodable: {e}");
            dead_letter(
                bus,
                spec,
                &raw,
                stream_sequence,
                delivered,
                "undecodable",
                &why,
            )
            .await;
            None
        }
    }
}

/// Answers each handled message as its disposition says.
async fn settle<M>(
    bus: &Bus,
    spec: &ConsumerSpec,
    batch: Vec<Incoming<M>>,
    dispositions: Vec<Disposition>,
) {
    let mut dispositions = dispositions.into_iter();
    for m in batch {
        let d = dispositions
            .next()
            .unwrap_or_else(|| Disposition::Retry("the handler gave no answer".into()));
        match d {
            Disposition::Done => {
                if let Err(e) = m.raw.ack().await {
                    tracing::warn!(consumer = %spec.durable, subject = %m.subject(), seq = m.stream_sequence,
                        error = %e, "ack failed; the message is redelivered and deduplicated");
                }
            }
            Disposition::InFlight => {}
            Disposition::Reject(why) => {
                dead_letter(
                    bus,
                    spec,
                    &m.raw,
                    m.stream_sequence,
                    m.delivered,
                    "rejected",
                    &why,
                )
                .await
            }
            Disposition::Retry(why) if m.delivered >= spec.max_deliver => {
                let why = format!("failed at its last delivery ({}): {why}", m.delivered);
                dead_letter(
                    bus,
                    spec,
                    &m.raw,
                    m.stream_sequence,
                    m.delivered,
                    "max-deliveries",
                    &why,
                )
                .await
            }
            Disposition::Retry(why) => {
                let delay = spec.backoff(m.delivered);
                tracing::debug!(consumer = %spec.durable, subject = %m.subject(), seq = m.stream_sequence,
                    delivered = m.delivered, delay_ms = delay.as_millis() as u64, %why, "redelivering");
                let _ = m.raw.ack_with(AckKind::Nak(Some(delay))).await;
            }
        }
    }
}

/// Moves a message to `dlq.<consumer>` and terminates it in its stream.
/// Should the dead-letter publish fail, the message is naked instead, so
/// it is never dropped unrecorded.
async fn dead_letter(
    bus: &Bus,
    spec: &ConsumerSpec,
    raw: &jetstream::Message,
    stream_sequence: u64,
    delivered: i64,
    reason: &'static str,
    why: &str,
) {
    let subject = bus.subjects().dead_letter(&spec.durable);
    let mut headers = HeaderMap::new();
    headers.insert(
        MSG_ID_HEADER,
        format!("dlq-{}-{stream_sequence}", spec.durable).as_str(),
    );
    headers.insert(DLQ_CONSUMER, spec.durable.as_str());
    headers.insert(DLQ_SUBJECT, raw.subject.as_str());
    headers.insert(DLQ_SEQUENCE, stream_sequence.to_string().as_str());
    headers.insert(DLQ_DELIVERIES, delivered.to_string().as_str());
    let short: String = why
        .chars()
        .take(512)
        .collect::<String>()
        .replace(['\r', '\n'], " ");
    headers.insert(DLQ_REASON, short.as_str());
    if let Some(tp) = crate::traceparent_of(raw.headers.as_ref()) {
        headers.insert(bcm_telemetry::TRACEPARENT, tp.as_str());
    }
    let stored = match bus
        .jetstream()
        .publish_with_headers(subject.clone(), headers, raw.payload.clone())
        .await
    {
        Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match stored {
        Ok(()) => {
            metrics::counter!("bcm_bus_dead_letters_total", "consumer" => spec.durable.clone(), "reason" => reason)
                .increment(1);
            tracing::warn!(consumer = %spec.durable, subject = %raw.subject, seq = stream_sequence, delivered,
                dead_letter = %subject, %why, "dead-lettered a message");
            let _ = raw.ack_with(AckKind::Term).await;
        }
        Err(e) => {
            tracing::warn!(consumer = %spec.durable, subject = %raw.subject, seq = stream_sequence,
                error = %e, %why, "could not dead-letter a message; it is redelivered");
            let _ = raw
                .ack_with(AckKind::Nak(Some(spec.backoff(delivered))))
                .await;
        }
    }
}

/// A message a consumer gave up on, as `dlq.<consumer>` holds it.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The subject it was first published on.
    pub subject: String,
    /// Its sequence in its first stream.
    pub sequence: u64,
    pub deliveries: i64,
    pub reason: String,
    /// The original payload, unchanged.
    pub payload: bytes::Bytes,
}

/// What `consumer` has dead-lettered so far, oldest first (for operators
/// and tests; it takes nothing away).
pub async fn dead_letters(bus: &Bus, consumer: &str) -> Result<Vec<DeadLetter>, BusError> {
    let err = |e: String| BusError::Consumer(format!("reading dead letters of {consumer}: {e}"));
    let stream = bus
        .jetstream()
        .get_stream(bus.subjects().stream(StreamKind::DeadLetter))
        .await
        .map_err(|e| err(e.to_string()))?;
    let reader = stream
        .create_consumer(pull::Config {
            filter_subject: bus.subjects().dead_letter(consumer),
            ack_policy: AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .map_err(|e| err(e.to_string()))?;
    let mut out = vec![];
    loop {
        let mut batch = reader
            .fetch()
            .max_messages(256)
            .expires(Duration::from_millis(300))
            .messages()
            .await
            .map_err(|e| err(e.to_string()))?;
        let before = out.len();
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| err(e.to_string()))?;
            let header = |k: &str| {
                m.headers
                    .as_ref()
                    .and_then(|h| h.get(k))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default()
            };
            out.push(DeadLetter {
                subject: header(DLQ_SUBJECT),
                sequence: header(DLQ_SEQUENCE).parse().unwrap_or(0),
                deliveries: header(DLQ_DELIVERIES).parse().unwrap_or(0),
                reason: header(DLQ_REASON),
                payload: m.payload.clone(),
            });
        }
        if out.len() == before {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_first_delay_up_to_the_cap() {
        let mut spec = ConsumerSpec::new(StreamKind::Work, "t", vec![]);
        spec.backoff_initial = Duration::from_millis(100);
        spec.backoff_max = Duration::from_secs(1);
        let delays: Vec<u128> = (1..=6).map(|d| spec.backoff(d).as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(spec.backoff(0).as_millis(), 100);
        assert_eq!(spec.backoff(i64::MAX), Duration::from_secs(1));
    }
}
