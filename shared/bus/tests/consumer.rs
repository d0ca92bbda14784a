//! The durable-consumer discipline against a real JetStream: what does not
//! decode and what keeps failing goes to the dead-letter subject with its
//! reason while the consumer carries on; a message is acked only when its
//! handler is done; shutdown takes nothing new and lets what runs finish.

use bcm_bus::consumer::{self, ConsumerSpec, Disposition, Handler, Incoming};
use bcm_bus::subjects::StreamKind;
use bcm_bus::Bus;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

mod support;
use support::bus;

#[derive(serde::Deserialize)]
struct Job {
    n: u32,
}

/// Fails job 13 for good (`Retry` every time), rejects job 7, does the rest.
#[derive(Default)]
struct Worker {
    done: Mutex<Vec<u32>>,
    started: AtomicUsize,
    tries_of_13: AtomicUsize,
    slow_ms: u64,
}

impl Handler<Job> for Worker {
    async fn handle(&self, batch: &[Incoming<Job>]) -> Vec<Disposition> {
        let mut out = vec![];
        for m in batch {
            self.started.fetch_add(1, Ordering::SeqCst);
            if self.slow_ms > 0 {
                tokio::time::sleep(Duration::from_millis(self.slow_ms)).await;
            }
            out.push(match m.message.n {
                13 => {
                    self.tries_of_13.fetch_add(1, Ordering::SeqCst);
                    Disposition::Retry("thirteen never works".into())
                }
                7 => Disposition::Reject("seven breaks its contract".into()),
                n => {
                    self.done.lock().expect("lock").push(n);
                    Disposition::Done
                }
            });
        }
        out
    }
}

fn spec(bus: &Bus) -> ConsumerSpec {
    let mut s = ConsumerSpec::new(
        StreamKind::Work,
        "jobs",
        vec![bus.subjects().reconcile_shard(0)],
    );
    s.max_deliver = 3;
    s.backoff_initial = Duration::from_millis(20);
    s.backoff_max = Duration::from_millis(50);
    s.ack_wait = Duration::from_secs(2);
    s
}

async fn publish(bus: &Bus, id: &str, payload: &[u8]) {
    let subject = format!(
        "{}.{id}",
        bus.subjects().reconcile_shard(0).trim_end_matches(".*")
    );
    bus.publish_durable(&subject, id, &[], payload.to_vec().into())
        .await
        .expect("publish");
}

async fn until<F: Fn() -> bool>(within: Duration, what: &str, f: F) {
    let deadline = tokio::time::Instant::now() + within;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn poison_goes_to_the_dead_letter_subject_and_the_consumer_carries_on() {
    let bus = bus("dlq").await;
    let worker = Arc::new(Worker::default());
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer::run(
        bus.clone(),
        spec(&bus),
        worker.clone(),
        stop.clone(),
    ));

    publish(&bus, "a", br#"{"n": 1}"#).await;
    publish(&bus, "b", b"not json at all").await;
    publish(&bus, "c", br#"{"n": "one"}"#).await;
    publish(&bus, "d", br#"{"n": 13}"#).await;
    publish(&bus, "e", br#"{"n": 7}"#).await;
    publish(&bus, "f", br#"{"n": 2}"#).await;

    until(Duration::from_secs(20), "the good jobs", || {
        worker.done.lock().expect("lock").len() == 2
    })
    .await;
    let mut dead = vec![];
    for _ in 0..100 {
        dead = consumer::dead_letters(&bus, "jobs").await.expect("read");
        if dead.len() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead.len(), 4, "{dead:?}");
    let by_payload = |p: &[u8]| {
        dead.iter()
            .find(|d| d.payload.as_ref() == p)
            .unwrap_or_else(|| {
                panic!(
                    "{} was not dead-lettered: {dead:?}",
                    String::from_utf8_lossy(p)
                )
            })
    };
    let garbage = by_payload(b"not json at all");
    assert!(
        garbage.reason.starts_with("undecodable"),
        "{}",
        garbage.reason
    );
    assert!(
        garbage.subject.ends_with(".b"),
        "the original subject: {}",
        garbage.subject
    );
    assert!(garbage.sequence > 0);
    assert!(by_payload(br#"{"n": "one"}"#)
        .reason
        .starts_with("undecodable"));
    let failing = by_payload(br#"{"n": 13}"#);
    assert_eq!(failing.deliveries, 3, "bounded redelivery: {failing:?}");
    assert!(
        failing.reason.contains("thirteen never works"),
        "{}",
        failing.reason
    );
    assert_eq!(worker.tries_of_13.load(Ordering::SeqCst), 3);
    let rejected = by_payload(br#"{"n": 7}"#);
    assert_eq!(rejected.deliveries, 1, "rejected at once");
    assert!(rejected.reason.contains("seven breaks its contract"));
    assert_eq!(
        *worker.done.lock().expect("lock"),
        vec![1, 2],
        "the consumer carried on, in order"
    );

    // Nothing is left in the work-queue stream: every message was answered.
    let mut stream = bus
        .jetstream()
        .get_stream(bus.subjects().stream(StreamKind::Work))
        .await
        .expect("stream");
    let mut left = u64::MAX;
    for _ in 0..50 {
        left = stream.info().await.expect("info").state.messages;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, 0, "messages still in the work queue");
    stop.cancel();
    task.await.expect("the consumer stops");
}

#[tokio::test]
async fn shutdown_takes_nothing_new_and_lets_the_handler_in_flight_finish() {
    let bus = bus("drain").await;
    let worker = Arc::new(Worker {
        slow_ms: 300,
        ..Default::default()
    });
    let stop = CancellationToken::new();
    let mut s = spec(&bus);
    s.concurrency = 1;
    let task = tokio::spawn(consumer::run(bus.clone(), s, worker.clone(), stop.clone()));
    for i in 1..=5u32 {
        publish(
            &bus,
            &format!("j{i}"),
            format!(r#"{{"n": {i}}}"#).as_bytes(),
        )
        .await;
    }
    until(Duration::from_secs(10), "the first job to start", || {
        worker.started.load(Ordering::SeqCst) > 0
    })
    .await;
    assert!(
        worker.done.lock().expect("lock").is_empty(),
        "it is still at it"
    );
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .expect("the drain ends")
        .expect("task");
    let done = worker.done.lock().expect("lock").clone();
    assert!(
        !done.is_empty() && done.len() < 5,
        "the one in flight finished, the rest wait: {done:?}"
    );

    // The rest are still there for the next holder, none lost.
    let again = Arc::new(Worker::default());
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer::run(
        bus.clone(),
        spec(&bus),
        again.clone(),
        stop.clone(),
    ));
    until(Duration::from_secs(20), "the rest", || {
        again.done.lock().expect("lock").len() + done.len() == 5
    })
    .await;
    let mut all: Vec<u32> = done
        .iter()
        .chain(again.done.lock().expect("lock").iter())
        .copied()
        .collect();
    all.sort();
    assert_eq!(all, vec![1, 2, 3, 4, 5]);
    stop.cancel();
    task.await.expect("stops");
}
