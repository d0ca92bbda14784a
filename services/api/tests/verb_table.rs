//! Every (state, verb) pair through the HTTP API against real Postgres:
//! legal moves answer 200 with the spec's target and publish one
//! `node.provision.<target>` event; illegal ones answer 409 `INVALID_STATE`
//! and change nothing (row, version, outbox).

use bcm_core::{NodeId, ProvisionState};
use bcm_testkit::tenant_a;
use bcm_testkit::TestEnv;
use serde_json::{json, Value};
use std::time::Duration;

/// Legal-from sets and targets, copied from the spec's API table by hand.
/// `None` as target: the provision state does not change.
fn spec(verb: &str) -> (&'static [&'static str], Option<&'static str>) {
    match verb {
        "manage" => (&["ready"], Some("enrolling")),
        "inspect" => (&["ready"], Some("inspecting")),
        "provide" => (&["ready"], Some("commissioning")),
        "deploy" => (&["ready"], Some("deploying")),
        "undeploy" => (&["deployed", "rescue"], Some("releasing")),
        "rescue" => (&["deployed"], Some("rescue")),
        "unrescue" => (&["rescue"], None),
        "abort" => (
            &[
                "enrolling",
                "inspecting",
                "commissioning",
                "deploying",
                "releasing",
            ],
            Some("failed"),
        ),
        // failedFrom is `deploying` in this test: recover goes to releasing.
        "recover" => (&["failed"], Some("releasing")),
        "retire" => (
            &["adopting", "adopted", "enrolling", "ready", "failed"],
            Some("retiring"),
        ),
        "power" => (
            &[
                "adopting",
                "adopted",
                "enrolling",
                "ready",
                "deployed",
                "rescue",
                "failed",
                "retiring",
                "retired",
            ],
            None,
        ),
        other => panic!("unknown verb {other}"),
    }
}

fn body(verb: &str, node: &str) -> Value {
    match verb {
        "deploy" => {
            json!({"tenantId": "a", "nodeId": node, "profileId": "ubuntu-24.04-gpu-host", "profileVersion": 1})
        }
        "undeploy" => json!({"tenantId": "a", "nodeId": node, "wipe": "secure-erase"}),
        "abort" => json!({"tenantId": "a", "nodeId": node, "reason": "operator test"}),
        "power" => json!({"tenantId": "a", "nodeId": node, "action": "cycle"}),
        _ => json!({"tenantId": "a", "nodeId": node}),
    }
}

const VERBS: [&str; 11] = [
    "manage", "inspect", "provide", "deploy", "undeploy", "rescue", "unrescue", "abort", "recover",
    "retire", "power",
];

#[tokio::test]
async fn every_state_and_verb_pair_follows_the_spec() {
    let env = TestEnv::start().await.expect("env");
    let reader = env
        .events_consumer(
            "table",
            &env.subjects().provision_events_of_tenant(&tenant_a()),
        )
        .await
        .expect("consumer");
    let mut expected_events = 0usize;
    let mut pairs = 0;
    for state in ProvisionState::ALL {
        for verb in VERBS {
            let node = env.enroll("a", "a-pool").await.expect("enroll");
            expected_events += 1; // node.provision.enrolling
            let id: NodeId = node["nodeId"].as_str().expect("id").parse().expect("id");
            let failed_from =
                (state == ProvisionState::Failed).then_some(ProvisionState::Deploying);
            env.force_state(&id, state, failed_from)
                .await
                .expect("force");
            let before = env.node(&id).await.expect("node");
            let backlog_before = bcm_db::outbox::outbox_count_for_node(&env.db, &id.to_string())
                .await
                .expect("count");

            let (legal_from, target) = spec(verb);
            let (status, answer) = env
                .post(
                    &format!("/api/compute/metal/{verb}"),
                    Some(&env.admin_token),
                    &body(verb, &id.to_string()),
                )
                .await
                .expect("post");
            let after = env.node(&id).await.expect("node");
            let rows = bcm_db::outbox::outbox_count_for_node(&env.db, &id.to_string())
                .await
                .expect("count")
                - backlog_before;
            if legal_from.contains(&state.as_str()) {
                assert_eq!(status, 200, "{verb} from {state}: {answer}");
                let want = target.unwrap_or(state.as_str());
                assert_eq!(answer["provisionState"], want, "{verb} from {state}");
                assert_eq!(after.provision_state.as_str(), want, "{verb} from {state}");
                match (verb, target) {
                    ("power", _) => {
                        assert_eq!(
                            after.version, before.version,
                            "power does not move the node"
                        );
                        assert_eq!(rows, 2, "power queues one command and one event");
                    }
                    ("unrescue", _) => {
                        assert!(after.unrescue_pending);
                        assert_eq!(after.version, before.version + 1);
                        assert_eq!(rows, 2, "node.provision.unrescuing and a reconcile request");
                        expected_events += 1;
                    }
                    (_, Some(_)) => {
                        assert_eq!(after.version, before.version + 1, "{verb} from {state}");
                        assert_eq!(rows, 2, "the event and a reconcile request");
                        expected_events += 1;
                    }
                    _ => unreachable!(),
                }
                if verb == "abort" {
                    assert_eq!(answer["failedFrom"], state.as_str());
                    assert_eq!(answer["maintenance"], true);
                    assert!(answer["lastError"]
                        .as_str()
                        .is_some_and(|e| e.contains("operator test")));
                }
                if verb == "recover" {
                    assert!(
                        answer.get("failedFrom").is_none(),
                        "recover clears failedFrom"
                    );
                    assert_eq!(answer["maintenance"], true, "recover leaves maintenance on");
                }
            } else {
                assert_eq!(status, 409, "{verb} from {state}: {answer}");
                assert_eq!(answer["code"], "INVALID_STATE", "{verb} from {state}");
                assert_eq!(after, before, "{verb} from {state} changed the row");
                assert_eq!(rows, 0, "{verb} from {state} wrote outbox rows");
            }
            pairs += 1;
        }
    }
    assert_eq!(pairs, 13 * 11);
    let events = reader
        .read(expected_events, Duration::from_secs(60))
        .await
        .expect("events");
    assert_eq!(
        events.len(),
        expected_events,
        "one event per enrollment and per legal move"
    );
    let extra = reader
        .read(1, Duration::from_millis(500))
        .await
        .expect("events");
    assert!(
        extra.is_empty(),
        "no event beyond the legal moves: {extra:?}"
    );
}
