//! The periodic look at every owned node: a node no wake-up reached is
//! passed over and moved on; a node whose workflow runs is settled at a
//! glance, without waiting for its row lock, however long another
//! transaction holds it.

use bcm_core::workflow::WorkflowPhase;
use bcm_core::ProvisionState;
use bcm_reconciler::shards::{look_at_owned, LookReport};
use bcm_testkit::{Options, TestEnv};
use std::time::Duration;

#[tokio::test]
async fn a_look_starts_what_no_wake_up_started_and_passes_a_running_workflow_without_its_lock() {
    // No engine (the workflow stays running) and no reconciler worker (no
    // wake-up is acted on): only the looks below move the node.
    let env = TestEnv::start_with(Options {
        engine: false,
        reconcilers: 0,
        ..Options::with_site()
    })
    .await
    .expect("env");
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

    // A look at shards this worker does not own reads nothing of them.
    let none = look_at_owned(&env.db, &bus, &[], shards, 2_000).await;
    assert_eq!(none, LookReport::default());

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
async fn a_look_reads_past_a_page_of_nodes() {
    let env = TestEnv::start_with(Options {
        engine: false,
        reconcilers: 0,
        ..Options::with_site()
    })
    .await
    .expect("env");
    let ids = env.enroll_sims("paged", 5).await;
    let states = [ProvisionState::Enrolling];
    let mut seen = vec![];
    let mut after = None;
    loop {
        let page = bcm_db::nodes::node_glances_in_states(&env.db, &states, after.as_ref(), 2)
            .await
            .expect("page");
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        seen.extend(page.iter().map(|g| {
            assert_eq!(g.provision_state, ProvisionState::Enrolling);
            assert_eq!(g.workflow, None);
            g.id
        }));
    }
    // Every node once (the pages follow the database's order of ids).
    let mut want = ids.clone();
    want.sort_by_key(|i| i.to_string());
    seen.sort_by_key(|i| i.to_string());
    assert_eq!(seen, want);
    let other = bcm_db::nodes::node_glances_in_states(&env.db, &[ProvisionState::Ready], None, 10)
        .await
        .expect("ready");
    assert!(other.is_empty());
    env.stop();
}
