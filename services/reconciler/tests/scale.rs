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
    // Every move and every workflow start, in this order; power changes
    // the BMC reports (the workflows power machines on and off) fall in
    // between, each with a version of its own.
    let expected: Vec<&str> = vec![
        "node.enrolled",
        "node.provision.enrolling",
        "node.provision.workflow",
        "node.provision.inspecting",
        "node.provision.workflow",
        "node.provision.commissioning",
        "node.provision.workflow",
        "node.provision.ready",
        "node.provision.deploying",
        "node.provision.workflow",
        "node.provision.deployed",
    ];
    assert_eq!(per_node.len(), ids.len());
    for (node, seq) in per_node {
        // Versions: the enrolment's two events share version 1, then each
        // event has the next one, with no gap and no repeat.
        let versions: Vec<i64> = seq.iter().map(|(_, v)| *v).collect();
        let mut want = vec![1];
        want.extend(1..versions.len() as i64);
        assert_eq!(
            versions, want,
            "node {node}: in version order, no gaps, no duplicates: {seq:?}"
        );
        let moves: Vec<&str> = seq
            .iter()
            .map(|(t, _)| t.as_str())
            .filter(|t| *t != "node.power.changed")
            .collect();
        assert_eq!(moves, expected, "node {node}: {seq:?}");
        assert!(
            seq.iter().any(|(t, _)| t == "node.power.changed"),
            "node {node}: the BMC's power reports are recorded: {seq:?}"
        );
    }
}
