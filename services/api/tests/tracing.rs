//! One trace follows a verb: the `traceparent` a caller sends reaches the
//! NATS headers of every event the verb publishes through the outbox.

use bcm_testkit::tenant_a;
use bcm_testkit::TestEnv;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn the_callers_trace_id_reaches_the_published_events() {
    let env = TestEnv::start().await.expect("env");
    let reader = env
        .events_consumer("trace", &env.subjects().events_of_tenant(&tenant_a()))
        .await
        .expect("consumer");
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let res = env
        .http
        .post(format!("{}/api/compute/metal/enroll", env.base))
        .bearer_auth(&env.admin_token)
        .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .json(&json!({"tenantId": "a", "poolId": "a-pool",
            "hardwareProfile": "sim", "bmc": {"driver": "sim", "address": "sim://1", "username": "u", "password": "p"}}))
        .send()
        .await
        .expect("post");
    assert_eq!(res.status().as_u16(), 200);
    let events = reader
        .read(2, Duration::from_secs(10))
        .await
        .expect("events");
    assert_eq!(events.len(), 2);
    for e in events {
        let tp = e.traceparent.expect("traceparent header");
        assert_eq!(bcm_telemetry::trace_id_of(&tp), Some(trace_id), "{tp}");
    }
    let (s, metrics) = env.get("/metrics", None).await.expect("metrics");
    assert_eq!(s, 200);
    assert!(
        metrics
            .as_str()
            .is_some_and(|m| m.contains("bcm_api_verbs_total")),
        "{metrics}"
    );
}
