//! 50 concurrent verbs on one node: the legal ones win in some serial
//! order, the rest get `CONFLICT` or `INVALID_STATE`; the version rises by
//! exactly the number of wins, and exactly one event per win reaches a
//! durable JetStream consumer, in version order, replayable through the
//! state table.

use bcm_core::table::NodeFacts;
use bcm_core::{apply, Move, NodeId, ProvisionState, Verb};
use bcm_testkit::tenant_a;
use bcm_testkit::TestEnv;
use serde_json::json;
use std::time::Duration;

const VERBS: [(&str, Verb); 9] = [
    ("manage", Verb::Manage),
    ("inspect", Verb::Inspect),
    ("provide", Verb::Provide),
    ("deploy", Verb::Deploy),
    ("abort", Verb::Abort),
    ("recover", Verb::Recover),
    ("undeploy", Verb::Release),
    ("rescue", Verb::Rescue),
    ("retire", Verb::Retire),
];

#[tokio::test]
async fn fifty_concurrent_verbs_serialize() {
    let env = TestEnv::start().await.expect("env");
    let node = env.enroll("a", "a-pool").await.expect("enroll");
    let id: NodeId = node["nodeId"].as_str().expect("id").parse().expect("id");
    let start_version = env
        .force_state(&id, ProvisionState::Ready, None)
        .await
        .expect("ready");
    let reader = env
        .events_consumer(
            "conc",
            &env.subjects().provision_events_of_tenant(&tenant_a()),
        )
        .await
        .expect("consumer");

    let calls = (0..50).map(|i| {
        let (path, _) = VERBS[(i * 7) % VERBS.len()];
        let body = match path {
            "deploy" => json!({"tenantId": "a", "nodeId": id.to_string(), "profileId": "p", "profileVersion": 1}),
            _ => json!({"tenantId": "a", "nodeId": id.to_string()}),
        };
        let env = &env;
        async move { env.post(&format!("/api/compute/metal/{path}"), Some(&env.admin_token), &body).await }
    });
    let answers = futures::future::join_all(calls).await;
    let mut wins = 0i64;
    for a in &answers {
        let (status, body) = a.as_ref().expect("answer");
        match status {
            200 => wins += 1,
            409 => assert!(
                body["code"] == "INVALID_STATE" || body["code"] == "CONFLICT",
                "{body}"
            ),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(wins >= 1, "the first verb from ready must win");
    let after = env.node(&id).await.expect("node");
    assert_eq!(
        after.version,
        start_version + wins,
        "version rises by exactly the wins"
    );

    // One event per win (plus the enrollment's), in version order, each a
    // legal move of the table from the state before it.
    let all = reader
        .read(1 + wins as usize, Duration::from_secs(30))
        .await
        .expect("events");
    let more = reader
        .read(1, Duration::from_millis(500))
        .await
        .expect("events");
    assert!(more.is_empty(), "an event without a win: {more:?}");
    let mine: Vec<_> = all
        .into_iter()
        .filter(|e| e.event.nodeversion.is_some_and(|v| v > start_version))
        .collect();
    assert_eq!(mine.len() as i64, wins);
    let mut facts = NodeFacts::at(ProvisionState::Ready);
    for (i, e) in mine.iter().enumerate() {
        assert_eq!(
            e.event.nodeversion,
            Some(start_version + 1 + i as i64),
            "in version order, no gaps"
        );
        let name = e.event.data["move"].as_str().expect("move");
        let verb = Verb::ALL
            .into_iter()
            .find(|v| v.as_str() == name)
            .expect("a verb");
        let t = apply(facts, Move::Verb(verb)).expect("each win is legal from the state before it");
        assert_eq!(e.event.data["provisionState"], t.to.as_str());
        facts = NodeFacts {
            state: t.to,
            failed_from: t.failed_from,
            unrescue_pending: t.unrescue_pending,
            rescue_booting: false,
            rotation_pending: false,
        };
    }
    assert_eq!(facts.state, after.provision_state);
}
