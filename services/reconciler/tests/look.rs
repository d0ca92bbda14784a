//! The periodic look at every owned node: a node no wake-up reached is
//! passed over and moved on; a node whose workflow runs is settled at a
//! glance, without waiting for its row lock, however long another
//! transaction holds it.

use bcm_bus::subjects::shard_of;
use bcm_core::workflow::WorkflowPhase;
use bcm_core::ProvisionState;
use bcm_reconciler::shards::{look_at_owned, look_at_owned_in_pages, LookReport};
use bcm_testkit::{Options, TestEnv};
use std::time::Duration;

/// A site and the API, with no engine (a workflow stays running) and no
/// reconciler worker (no wake-up is acted on).
async fn without_workers() -> TestEnv {
    TestEnv::start_with(Options {
        engine: false,
        reconcilers: 0,
        ..Options::with_site()
    })
    .await
    .expect("env")
}

#[tokio::test]
async fn a_look_starts_what_no_wake_up_started_and_passes_a_running_workflow_without_its_lock() {
    // Only the looks below move the node.
    let env = without_workers().await;
    let bus = env.state.inner.bus.clone();
    let shards = bus.subjects().shards();
    let all: Vec<u32> = (0..shards).collect();
    let id = env.enroll_sim("looked-at").await;
    let before = env.node(&id).await.expect("node");
    assert_eq!(before.provision_state, ProvisionState::Enrolling);
    assert_eq!(before.workflow_id, None);

    // No workflow yet: not settled, so a locked pass starts it.
    let first = look_at_owned(&env.db, &bus, &all, shards, 2_000).await;
    assert_eq!(
        first,
        LookReport {
            looked_at: 1,
            passed: 1
        }
    );
    let started = env.node(&id).await.expect("node");
    let wf_id = started.workflow_id.expect("the look started a workflow");
    let wf = bcm_db::workflows::workflow_fetch(&env.db, &wf_id.to_string())
        .await
        .expect("workflow");
    assert_eq!(wf.profile_id, "metal-enroll");
    assert_eq!(wf.status, WorkflowPhase::Running);

    // A look over every shard but the node's own leaves it alone.
    let own = shard_of(&id, shards);
    let others: Vec<u32> = all.iter().copied().filter(|s| *s != own).collect();
    let elsewhere = look_at_owned(&env.db, &bus, &others, shards, 2_000).await;
    assert_eq!(elsewhere, LookReport::default());

    // Another transaction holds the node's row. The workflow runs, so the
    // look settles the node without asking for the lock: it does not wait
    // out the minute it would be allowed to.
    let mut holder = env.db.begin().await.expect("begin");
    bcm_db::nodes::node_fetch_for_update_in_txn(&mut holder, &id)
        .await
        .expect("lock");
    let second = tokio::time::timeout(
        Duration::from_secs(30),
        look_at_owned(&env.db, &bus, &all, shards, 60_000),
    )
    .await
    .expect("the look waited for a lock it does not need");
    assert_eq!(
        second,
        LookReport {
            looked_at: 1,
            passed: 0
        }
    );
    holder.rollback().await.expect("rollback");
    let after = env.node(&id).await.expect("node");
    assert_eq!(
        after.version, started.version,
        "a settled look wrote nothing"
    );
    assert_eq!(after.workflow_id, Some(wf_id));
    env.stop();
}

#[tokio::test]
async fn a_look_reads_every_page_of_nodes_and_settles_them_the_next_time() {
    let env = without_workers().await;
    let bus = env.state.inner.bus.clone();
    let shards = bus.subjects().shards();
    let all: Vec<u32> = (0..shards).collect();
    // Four nodes in pages of two: two full pages, then an empty one.
    let ids = env.enroll_sims("paged", 4).await;
    let first = look_at_owned_in_pages(&env.db, &bus, &all, shards, 2_000, 2).await;
    assert_eq!(
        first,
        LookReport {
            looked_at: 4,
            passed: 4
        }
    );
    for id in &ids {
        let n = env.node(id).await.expect("node");
        assert!(n.workflow_id.is_some(), "{id} was not passed");
    }
    // Their workflows run: the next look settles all four.
    let second = look_at_owned_in_pages(&env.db, &bus, &all, shards, 2_000, 2).await;
    assert_eq!(
        second,
        LookReport {
            looked_at: 4,
            passed: 0
        }
    );
    // A page of three: one full page, then a short one.
    let third = look_at_owned_in_pages(&env.db, &bus, &all, shards, 2_000, 3).await;
    assert_eq!(third.looked_at, 4);
    env.stop();
}
