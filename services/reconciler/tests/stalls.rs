//! A workflow whose step is overdue and that no engine looks at — the
//! engine is down — is reported: `node.workflow.stalled` once, naming the
//! workflow, the node and the step, and counted in
//! `bcm_reconciler_stalled_workflows`; a healthy lifecycle reports nothing.

use bcm_core::ProvisionState;
use bcm_testkit::{Options, ReconcilerConfig, TestEnv};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn watching() -> ReconcilerConfig {
    ReconcilerConfig {
        metal_poll_ms: 1000,
        lease_ttl_ms: 3000,
        stall_check_secs: 1,
        stall_grace_secs: 2,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_workflow_no_engine_advances_is_reported_stalled_once() {
    let env = TestEnv::start_with(Options {
        engine: false,
        reconcilers: 0,
        ..Options::with_site()
    })
    .await
    .expect("env");
    env.spawn_reconciler_with(watching());
    let subject = env
        .subjects()
        .event(&bcm_testkit::tenant_a(), "node.workflow.stalled");
    let reader = env
        .events_consumer("stalls", &subject)
        .await
        .expect("consumer");
    let id = env.enroll_sim("stalled").await;
    let got = reader.read(1, T).await.expect("a stall is reported");
    let data = &got[0].event.data;
    assert_eq!(data["nodeId"], serde_json::json!(id.to_string()));
    assert_eq!(data["profileId"], "metal-enroll");
    assert!(data["step"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(
        data["overdueSecs"].as_i64().is_some_and(|s| s >= 2),
        "{data}"
    );
    // Once per workflow, however many passes see it.
    let more = reader.drain(Duration::from_secs(4)).await.expect("drain");
    assert!(more.is_empty(), "reported again: {more:?}");
    let n = env.node(&id).await.expect("node");
    assert_eq!(n.provision_state, ProvisionState::Enrolling);
    env.stop();
}

#[tokio::test]
async fn a_healthy_lifecycle_reports_no_stall() {
    let env = TestEnv::start_with(Options {
        reconcilers: 0,
        ..Options::with_site()
    })
    .await
    .expect("env");
    env.spawn_reconciler_with(watching());
    let subject = env
        .subjects()
        .event(&bcm_testkit::tenant_a(), "node.workflow.stalled");
    let reader = env
        .events_consumer("stalls", &subject)
        .await
        .expect("consumer");
    let id = env.enroll_sim("healthy").await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");
    let seen = reader.drain(Duration::from_secs(4)).await.expect("drain");
    assert!(seen.is_empty(), "{seen:?}");
    env.stop();
}
