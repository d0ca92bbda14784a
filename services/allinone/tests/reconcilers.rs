//! Three reconciler processes (`bcm --services reconciler`) share 200 nodes
//! through shard leases; one is SIGKILLed midway and its shards move to the
//! other two. Every node ends exactly as with one reconciler: one workflow
//! per state entry, each succeeded, and the unique index refuses a second.

use bcm_core::{NodeId, ProvisionState};
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use std::collections::BTreeSet;
use std::process::Child;

mod common;
use common::{all_reach, child_config, count_in, spawn_child, spawn_child_with, T};

const NODES: usize = 200;

async fn holders(env: &TestEnv) -> BTreeSet<String> {
    bcm_db::leases::lease_holders(&env.db, bcm_reconciler::shards::KIND)
        .await
        .expect("leases")
        .into_iter()
        .map(|(_, h)| h)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_reconciler_processes_on_200_nodes_end_as_one() {
    let env = TestEnv::start_with(Options {
        reconcilers: 0,
        ..Options::with_site()
    })
    .await
    .expect("env");
    let dir = std::env::temp_dir().join(format!("bcm-reconcilers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = child_config(&env, &dir);
    // The last one serves its metrics (`api.telemetry.metrics_listen`), as a
    // process without the API does where one is given.
    let metrics_listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .to_string();
    let mut children: Vec<Child> = (0..2)
        .map(|i| spawn_child(&config, "reconciler", &dir.join(format!("r{i}.log"))))
        .collect();
    children.push(spawn_child_with(
        &config,
        "reconciler",
        &dir.join("r2.log"),
        &[("BCM_ALL_API__TELEMETRY__METRICS_LISTEN", &metrics_listen)],
    ));
    bcm_testkit::eventually(T, || async {
        Ok((holders(&env).await.len() == 3).then_some(()))
    })
    .await
    .expect("three processes share the shards");

    let ids: Vec<NodeId> = env.enroll_sims("three", NODES).await;
    // One process dies with the work half done.
    bcm_testkit::eventually(T, || async {
        Ok((count_in(&env, &ids, ProvisionState::Ready).await >= NODES / 4).then_some(()))
    })
    .await
    .expect("progress");
    let mut dead = children.remove(0);
    dead.kill().expect("SIGKILL");
    let _ = dead.wait();
    bcm_testkit::eventually(T, || async {
        let leases = bcm_db::leases::lease_holders(&env.db, bcm_reconciler::shards::KIND).await?;
        let owners: BTreeSet<_> = leases.iter().map(|(_, h)| h.clone()).collect();
        Ok((owners.len() == 2 && leases.len() == env.bus_config.shards as usize).then_some(()))
    })
    .await
    .expect("the dead process's shards moved to the two living");
    all_reach(&env, &ids, ProvisionState::Ready).await;

    for id in &ids {
        env.verb_ok("deploy", id, json!({"profileId": "p", "profileVersion": 1}))
            .await;
    }
    all_reach(&env, &ids, ProvisionState::Deployed).await;
    let scraped = reqwest::get(format!("http://{metrics_listen}/metrics"))
        .await
        .expect("the reconciler process serves its metrics");
    let text = scraped.text().await.expect("metrics text");
    let passes: f64 = text
        .lines()
        .filter_map(|l| l.strip_prefix("bcm_reconciler_pass_seconds_count"))
        .filter_map(|l| l.rsplit(" ").next()?.parse::<f64>().ok())
        .sum();
    assert!(passes > 0.0, "no reconcile passes in its metrics:\n{text}");
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }

    for id in &ids {
        let node = env.node(id).await.expect("node");
        assert_eq!(node.role.as_deref(), Some("host"));
        let wfs = bcm_db::workflows::workflows_of_node(&env.db, &id.to_string())
            .await
            .expect("workflows");
        let profiles: Vec<_> = wfs
            .iter()
            .map(|w| (w.profile_id.as_str(), w.status.as_str()))
            .collect();
        assert_eq!(
            profiles,
            vec![
                ("metal-enroll", "succeeded"),
                ("metal-inspect", "succeeded"),
                ("metal-commission", "succeeded"),
                ("p", "succeeded"),
            ],
            "node {id}: exactly one workflow per state entry"
        );
    }

    // What makes "never twice" hold even if two reconcilers raced: the
    // unique index on (node, state, version) refuses a second workflow.
    let first = bcm_db::workflows::workflows_of_node(&env.db, &ids[0].to_string())
        .await
        .expect("workflows")
        .remove(0);
    let mut tx = env.db.begin().await.expect("tx");
    let err = bcm_db::workflows::workflow_insert_in_txn(
        &mut tx,
        &bcm_db::workflows::NewWorkflow {
            id: format!("{}-again", first.id),
            node_id: first.node_id.clone(),
            owner: first.owner.clone(),
            profile_id: first.profile_id.clone(),
            profile_version: first.profile_version,
            for_state: first.for_state.clone(),
            for_version: first.for_version,
            definition: serde_json::json!({}),
            actor: None,
            traceparent: None,
            steps: vec![],
        },
    )
    .await
    .expect_err("a second workflow for one node state entry");
    assert!(
        matches!(&err, bcm_db::DbError::Duplicate { constraint } if constraint == "workflows_once_per_entry"),
        "{err:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
