//! The event sequence of every node, as a durable subscriber sees it.
//! (Several reconciler processes sharing the work: allinone's
//! `tests/reconcilers.rs`.)

use bcm_core::ProvisionState;
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

#[tokio::test]
async fn a_durable_subscriber_sees_the_spec_sequence_per_node() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let reader = env
        .events_consumer(
            "seq",
            &env.subjects().events_of_tenant(&bcm_testkit::tenant_a()),
        )
        .await
        .expect("consumer");
    let ids = env.enroll_sims("seq", 10).await;
    for id in &ids {
        env.wait_state(id, ProvisionState::Ready, Duration::from_secs(60))
            .await
            .expect("ready");
        env.verb_ok("deploy", id, json!({"profileId": "p", "profileVersion": 1}))
            .await;
    }
    for id in &ids {
        env.wait_state(id, ProvisionState::Deployed, Duration::from_secs(60))
            .await
            .expect("deployed");
    }
    let events = reader
        .drain(Duration::from_millis(1500))
        .await
        .expect("events");
    let mut per_node: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    for e in events.iter().filter(|e| e.event.ty.starts_with("node.")) {
        per_node
            .entry(e.event.subject.clone().expect("subject"))
            .or_default()
            .push((e.event.ty.clone(), e.event.nodeversion.expect("version")));
    }
    let expected: Vec<(String, i64)> = [
        ("node.enrolled", 1),
        ("node.provision.enrolling", 1),
        ("node.provision.workflow", 2),
        ("node.provision.inspecting", 3),
        ("node.provision.workflow", 4),
        ("node.provision.commissioning", 5),
        ("node.provision.workflow", 6),
        ("node.provision.ready", 7),
        ("node.provision.deploying", 8),
        ("node.provision.workflow", 9),
        ("node.provision.deployed", 10),
    ]
    .into_iter()
    .map(|(t, v)| (t.to_owned(), v))
    .collect();
    assert_eq!(per_node.len(), ids.len());
    for (node, seq) in per_node {
        assert_eq!(
            seq, expected,
            "node {node}: in version order, no gaps, no duplicates"
        );
    }
}
