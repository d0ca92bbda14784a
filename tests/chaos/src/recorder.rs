//! The durable event recorder: a durable JetStream consumer on the events
//! stream from the first message, created before the run starts and read
//! throughout — across the NATS restart, resuming from its durable
//! position — recording every event id and the stream sequences it was
//! stored under (two sequences for one id: an event stored twice).

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use bcm_bus::subjects::StreamKind;
use bcm_bus::Bus;
use futures::StreamExt as _;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// What the recorder saw.
#[derive(Clone, Default)]
pub struct Recorded {
    inner: Arc<Mutex<Seen>>,
}

#[derive(Default)]
struct Seen {
    /// Event id -> stream sequences it was stored under.
    by_id: HashMap<String, BTreeSet<u64>>,
    deliveries: u64,
    last: Option<Instant>,
}

impl Recorded {
    /// Event ids seen.
    pub fn ids(&self) -> std::collections::HashSet<String> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .keys()
            .cloned()
            .collect()
    }

    /// Ids stored under more than one stream sequence.
    pub fn stored_twice(&self) -> Vec<String> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .iter()
            .filter(|(_, seqs)| seqs.len() > 1)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Deliveries in all (a redelivery counts again).
    pub fn deliveries(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .deliveries
    }

    /// How long since the last delivery.
    pub fn quiet_for(&self) -> Duration {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last
            .map(|t| t.elapsed())
            .unwrap_or(Duration::MAX)
    }
}

/// Creates the durable consumer (before anything is published).
pub async fn create(bus: &Bus) -> anyhow::Result<()> {
    let stream = bus
        .jetstream()
        .get_stream(bus.subjects().stream(StreamKind::Events))
        .await?;
    stream
        .get_or_create_consumer(
            "chaos-recorder",
            pull::Config {
                durable_name: Some("chaos-recorder".to_owned()),
                deliver_policy: DeliverPolicy::All,
                ack_policy: AckPolicy::Explicit,
                ack_wait: Duration::from_secs(10),
                ..Default::default()
            },
        )
        .await?;
    Ok(())
}

/// Reads the consumer until `stop`, re-attaching after every error (the
/// NATS restart) with a pause.
pub async fn run(bus: Bus, recorded: Recorded, stop: CancellationToken) {
    while !stop.is_cancelled() {
        if let Err(e) = read(&bus, &recorded, &stop).await {
            eprintln!("chaos recorder: {e:#}; re-attaching");
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }
}

async fn read(bus: &Bus, recorded: &Recorded, stop: &CancellationToken) -> anyhow::Result<()> {
    let stream = bus
        .jetstream()
        .get_stream(bus.subjects().stream(StreamKind::Events))
        .await?;
    let consumer: async_nats::jetstream::consumer::PullConsumer = stream
        .get_consumer("chaos-recorder")
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut messages = consumer
        .stream()
        .heartbeat(Duration::from_secs(2))
        .expires(Duration::from_secs(5))
        .messages()
        .await?;
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            m = messages.next() => m,
        };
        let Some(m) = next else {
            anyhow::bail!("the message stream ended");
        };
        let m = m.map_err(|e| anyhow::anyhow!("{e}"))?;
        let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
        let id = serde_json::from_slice::<serde_json::Value>(&m.payload)
            .ok()
            .and_then(|v| v["id"].as_str().map(str::to_owned));
        {
            let mut seen = recorded.inner.lock().unwrap_or_else(|p| p.into_inner());
            seen.deliveries += 1;
            seen.last = Some(Instant::now());
            match id {
                Some(id) => {
                    seen.by_id.entry(id).or_default().insert(seq);
                }
                None => eprintln!("chaos recorder: an event without an id at sequence {seq}"),
            }
        }
        if let Err(e) = m.ack().await {
            // Delivered again later: counted once by its id.
            eprintln!("chaos recorder: ack failed: {e}");
        }
    }
}
