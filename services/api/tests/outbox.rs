//! The outbox: an event exists if and only if its transaction committed,
//! and a relay that dies after publishing but before marking loses and
//! duplicates nothing.

use bcm_api::relay::{RelayConfig, RelayFaults};
use bcm_core::{NodeId, ProvisionState};
use bcm_testkit::tenant_a;
use bcm_testkit::{eventually, EventReader, Options, TestEnv};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

#[tokio::test]
async fn a_relay_killed_between_publish_and_mark_delivers_every_event_once_in_order() {
    let (env, reader) = without_relay("crash").await;
    let mut events = 0;
    for _ in 0..10 {
        let node = env.enroll("a", "a-pool").await.expect("enroll");
        events += 2; // node.enrolled, node.provision.enrolling
        let id: NodeId = node["nodeId"].as_str().expect("id").parse().expect("id");
        env.force_state(&id, ProvisionState::Ready, None)
            .await
            .expect("ready");
        for verb in ["provide", "abort", "recover"] {
            let (s, b) = env
                .post(
                    &format!("/api/compute/metal/{verb}"),
                    Some(&env.admin_token),
                    &json!({"tenantId": "a", "nodeId": id.to_string()}),
                )
                .await
                .expect("post");
            assert_eq!(s, 200, "{verb}: {b}");
            events += 1;
        }
    }
    let backlog = bcm_db::outbox::outbox_backlog(&env.db)
        .await
        .expect("backlog");
    assert_eq!(
        backlog,
        events as i64 + 40,
        "events plus one reconcile request per verb, nothing published yet"
    );

    // The first relay publishes three batches and dies: the first was
    // marked (while the second was acknowledged), the second was
    // acknowledged and the third published, neither marked.
    let left = backlog_after_a_relay_with(
        &env,
        RelayFaults {
            halt_after_publishing_batches: Some(3),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        left,
        backlog - 7,
        "only the first batch was marked; the second and third were published but not marked"
    );

    // A new relay republishes from the first unmarked row.
    a_new_relay_delivers_each_once_in_order(&env, &reader, events).await;
}

/// A relay publishing 7 rows a batch.
fn small_batches() -> RelayConfig {
    RelayConfig {
        enabled: true,
        batch: 7,
        poll_ms: 50,
        linger_ms: 5,
    }
}

/// An environment whose outbox no relay reads.
async fn an_env_without_relay() -> TestEnv {
    TestEnv::start_with(Options {
        relay: false,
        ..Default::default()
    })
    .await
    .expect("env")
}

/// A test environment without a relay, and a reader of tenant `a`'s events.
async fn without_relay(reader: &str) -> (TestEnv, EventReader) {
    let env = an_env_without_relay().await;
    let reader = env
        .events_consumer(reader, &env.subjects().events_of_tenant(&tenant_a()))
        .await
        .expect("consumer");
    (env, reader)
}

/// Runs a relay of small batches with `faults` until the fault stops it;
/// the outbox's backlog after.
async fn backlog_after_a_relay_with(env: &TestEnv, faults: RelayFaults) -> i64 {
    env.spawn_relay_with(small_batches(), faults)
        .await
        .expect("relay task");
    bcm_db::outbox::outbox_backlog(&env.db)
        .await
        .expect("backlog")
}

/// A healthy relay drains the outbox, and every one of `events` events
/// arrives exactly once, each node's in version order.
async fn a_new_relay_delivers_each_once_in_order(
    env: &TestEnv,
    reader: &EventReader,
    events: usize,
) {
    let _relay = env.spawn_relay_with(small_batches(), RelayFaults::default());
    eventually(Duration::from_secs(30), || async {
        Ok((bcm_db::outbox::outbox_backlog(&env.db).await? == 0).then_some(()))
    })
    .await
    .expect("backlog drains");

    let got = reader
        .read(events, Duration::from_secs(30))
        .await
        .expect("events");
    let extra = reader
        .read(1, Duration::from_millis(500))
        .await
        .expect("events");
    assert!(extra.is_empty(), "a duplicate arrived: {extra:?}");
    assert_eq!(got.len(), events);
    let ids: HashSet<&str> = got.iter().map(|e| e.event.id.as_str()).collect();
    assert_eq!(ids.len(), events, "every CloudEvents id exactly once");
    let mut last: HashMap<String, i64> = HashMap::new();
    for e in &got {
        let node = e.event.subject.clone().expect("subject");
        let v = e.event.nodeversion.expect("version");
        let prev = last.insert(node.clone(), v).unwrap_or(0);
        assert!(v >= prev, "node {node}: version {v} after {prev}");
    }
}

#[tokio::test]
async fn a_relay_that_gives_up_on_nats_marks_what_nats_acknowledged() {
    let (env, reader) = without_relay("refused").await;
    let mut events = 0;
    for _ in 0..10 {
        env.enroll("a", "a-pool").await.expect("enroll");
        events += 2; // node.enrolled, node.provision.enrolling
    }
    let backlog = bcm_db::outbox::outbox_backlog(&env.db)
        .await
        .expect("backlog");
    assert_eq!(backlog, 30, "two events and a reconcile request per node");

    // Batches 1 and 2 go out; while 2 is acknowledged, the read marks 1 and
    // reads 3; NATS refuses 3. Batch 2 was acknowledged and not yet marked:
    // the relay marks it before it gives up, so that it is not published
    // again after an outage longer than JetStream's duplicate window.
    let left = backlog_after_a_relay_with(
        &env,
        RelayFaults {
            refuse_publishing_batch: Some(3),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        left,
        backlog - 14,
        "both acknowledged batches are marked, the refused one is not"
    );

    a_new_relay_delivers_each_once_in_order(&env, &reader, events).await;
}

#[tokio::test]
async fn a_rolled_back_enroll_leaves_no_event_and_no_secret() {
    let env = an_env_without_relay().await;
    let body = json!({"tenantId": "a", "poolId": "a-pool",
        "hardwareProfile": "ipmi", "bmc": {"driver": "ipmi", "address": "10.1.1.1:623", "username": "u", "password": "p"}});
    let (s, b) = env
        .post("/api/compute/metal/enroll", Some(&env.admin_token), &body)
        .await
        .expect("post");
    assert_eq!(s, 200, "{b}");
    let backlog = bcm_db::outbox::outbox_backlog(&env.db)
        .await
        .expect("backlog");
    let secrets = bcm_db::secrets::secret_count(&env.db)
        .await
        .expect("secrets");
    // The same BMC again: the node insert fails after the secret insert, and
    // the whole transaction rolls back.
    let (s, b) = env
        .post("/api/compute/metal/enroll", Some(&env.admin_token), &body)
        .await
        .expect("post");
    assert_eq!(s, 409, "{b}");
    assert_eq!(b["code"], "CONFLICT");
    assert_eq!(
        bcm_db::outbox::outbox_backlog(&env.db)
            .await
            .expect("backlog"),
        backlog,
        "no event"
    );
    assert_eq!(
        bcm_db::secrets::secret_count(&env.db)
            .await
            .expect("secrets"),
        secrets,
        "no orphan secret"
    );
}

#[tokio::test]
async fn two_relays_publish_each_event_once() {
    let env = TestEnv::start().await.expect("env"); // one relay running already
    let _second = env.spawn_relay(RelayFaults::default());
    let reader = env
        .events_consumer("two", &env.subjects().events_of_tenant(&tenant_a()))
        .await
        .expect("consumer");
    for _ in 0..20 {
        env.enroll("a", "a-pool").await.expect("enroll");
    }
    let got = reader
        .read(40, Duration::from_secs(30))
        .await
        .expect("events");
    assert_eq!(got.len(), 40);
    assert!(reader
        .read(1, Duration::from_millis(500))
        .await
        .expect("events")
        .is_empty());
}

/// Every service writes its events through `bcm_metal::outbox::write_in_txn`:
/// an event's CloudEvents `time` is the instant it was written, however
/// long before its transaction built it; a payload that is not a
/// CloudEvent is stored as it was given.
#[tokio::test]
async fn an_event_is_stamped_as_its_transaction_writes_it() {
    let env = an_env_without_relay().await;
    let built_long_ago = "2001-02-03T04:05:06Z";
    let message = |id: &str, payload: serde_json::Value| bcm_db::outbox::NewOutboxMessage {
        id: id.to_owned(),
        subject: "stamp.test".into(),
        payload,
        headers: Default::default(),
        node_id: None,
    };
    let before = chrono::Utc::now();
    let mut tx = env.db.begin().await.expect("tx");
    bcm_metal::outbox::write_in_txn(
        &mut tx,
        vec![
            message(
                "ev-stamped",
                json!({"specversion": "1.0", "id": "ev-stamped", "time": built_long_ago}),
            ),
            message("ev-bare", json!({"not": "a cloudevent"})),
        ],
    )
    .await
    .expect("write");
    let after = chrono::Utc::now();
    tx.commit().await.expect("commit");

    let mut lease = bcm_db::outbox::RelayLease::try_acquire(&env.db)
        .await
        .expect("lease")
        .expect("no relay runs here");
    let rows = lease.mark_and_fetch(&[], &[], 100).await.expect("read");
    let payload = |id: &str| {
        rows.iter()
            .find(|r| r.id == id)
            .map(|r| r.payload.clone())
            .unwrap_or_else(|| panic!("{id} was not written"))
    };
    let time: chrono::DateTime<chrono::Utc> = payload("ev-stamped")["time"]
        .as_str()
        .expect("a time")
        .parse()
        .expect("an RFC 3339 time");
    assert!(
        before <= time && time <= after,
        "stamped {time}, written between {before} and {after}"
    );
    assert_eq!(payload("ev-bare"), json!({"not": "a cloudevent"}));
}
