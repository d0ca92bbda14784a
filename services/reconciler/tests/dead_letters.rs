//! A shard's reconcile consumer (`reconcile-<shard>`) against requests that
//! break the contract: they are dead-lettered with their reason and the
//! node they name does not change; a good request behind them is handled.

use bcm_bus::subjects::shard_of;
use bcm_contracts::CloudEvent;
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

#[tokio::test]
async fn malformed_reconcile_requests_are_dead_lettered_and_change_nothing() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.enroll_sim("dl-reconcile").await;
    env.wait_state(&id, bcm_core::ProvisionState::Ready, T)
        .await
        .expect("ready");
    let before = env.node(&id).await.expect("node");
    let subject = env.subjects().reconcile(&id);
    let shard = shard_of(&id, env.subjects().shards());

    env.publish_raw(&subject, b"reconcile please")
        .await
        .expect("publish");
    let extra = CloudEvent::new(
        "x1".into(),
        bcm_contracts::events::types::WORK_RECONCILE.into(),
        Some(id.to_string()),
        None,
        json!({ "nodeId": id, "version": 1, "reason": "test", "priority": "high" }),
    );
    env.publish_raw(&subject, &serde_json::to_vec(&extra).expect("json"))
        .await
        .expect("publish");
    let bad_id = CloudEvent::new(
        "x2".into(),
        bcm_contracts::events::types::WORK_RECONCILE.into(),
        None,
        None,
        json!({ "nodeId": "node_not-a-ulid", "version": 1, "reason": "test" }),
    );
    env.publish_raw(&subject, &serde_json::to_vec(&bad_id).expect("json"))
        .await
        .expect("publish");

    let dead = env
        .dead_letters(&format!("reconcile-{shard}"), 3, T)
        .await
        .expect("dead letters");
    assert!(
        dead.iter().all(|d| d.reason.starts_with("undecodable")),
        "{dead:?}"
    );
    assert!(
        dead.iter().any(|d| d.reason.contains("priority")),
        "names the unknown field: {dead:?}"
    );
    let after = env.node(&id).await.expect("node");
    assert_eq!(after.version, before.version, "the node did not change");
    env.stop();
}
