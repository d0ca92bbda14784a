//! The record's queries against a real Postgres: each guarded update's
//! version check and lock wait, the not-found, duplicate and missing
//! reference paths as typed errors, results recorded once, and a stored
//! value this code cannot read reported as damage instead of a default.

mod support;

use bcm_core::workflow::{CommandStatus, StepStatus, WorkflowPhase};
use bcm_core::ProvisionState;
use bcm_db::commands::{NewCommand, NewResult, Touched};
use bcm_db::workflows::{NewStep, NewWorkflow};
use bcm_db::DbError;

fn workflow(node: &str, version: i64) -> NewWorkflow {
    NewWorkflow {
        id: format!("wf_{}", bcm_core::WorkflowId::generate()),
        node_id: node.to_owned(),
        owner: "metal".into(),
        profile_id: "metal-enroll".into(),
        profile_version: 1,
        for_state: ProvisionState::Enrolling.as_str().into(),
        for_version: version,
        definition: serde_json::json!({}),
        actor: None,
        traceparent: None,
        steps: vec![NewStep {
            name: "verify-bmc".into(),
            target: "site".into(),
            cleanup: false,
            definition: serde_json::json!({"name": "verify-bmc", "kind": "bmcVerify", "timeoutSecs": 120,
                "retry": {"maxAttempts": 5, "initialBackoffMs": 1000, "maxBackoffMs": 60000}}),
        }],
    }
}

fn command(node: &str, key: &str, kind: &str) -> NewCommand {
    NewCommand {
        id: bcm_core::CommandId::generate().to_string(),
        idempotency_key: key.to_owned(),
        workflow_id: None,
        step_idx: None,
        attempt: 1,
        node_id: Some(node.to_owned()),
        site_id: Some("s".into()),
        kind: kind.to_owned(),
        target: "site".into(),
        params: serde_json::json!({}),
        actor: None,
        traceparent: None,
        batch_id: None,
    }
}

#[tokio::test]
async fn the_guarded_update_takes_only_the_version_it_read() {
    let db = support::fresh_db("guard").await;
    let n = support::node(&db).await;
    let mut tx = db.begin().await.expect("tx");
    let read = bcm_db::nodes::node_fetch_for_update_in_txn(&mut tx, &n.id)
        .await
        .expect("read");
    assert_eq!(read.version, 1);
    let mut next = read.clone();
    next.provision_state = ProvisionState::Inspecting;
    assert_eq!(
        bcm_db::nodes::node_update_guarded_in_txn(&mut tx, &next)
            .await
            .expect("update"),
        2
    );
    // Written from the version read before: someone else's write is not lost.
    assert!(matches!(
        bcm_db::nodes::node_update_guarded_in_txn(&mut tx, &next).await,
        Err(DbError::Stale)
    ));
    tx.rollback().await.expect("rollback");
    // The projection moves with the row, and nothing of the rolled back
    // transaction stayed.
    let stored = bcm_db::nodes::node_fetch(&db, &n.id).await.expect("fetch");
    assert_eq!(
        (stored.version, stored.provision_state),
        (1, ProvisionState::Enrolling)
    );
}

#[tokio::test]
async fn a_read_brings_the_placement_the_node_and_the_fact_asked_for() {
    let db = support::fresh_db("read").await;
    let n = support::node(&db).await;
    let bare = bcm_db::nodes::node_read(&db, &n.id, "inventory")
        .await
        .expect("read");
    assert_eq!(bare.placement, (n.tenant_id.clone(), n.pool_id.clone()));
    assert_eq!((bare.node.id, bare.node.version), (n.id, 1));
    assert_eq!(bare.fact, None, "no inventory was reported yet");

    let mut tx = db.begin().await.expect("tx");
    let inventory = serde_json::json!({"cpus": 2});
    bcm_db::agents::node_fact_upsert_in_txn(&mut tx, &n.id.to_string(), "inventory", &inventory)
        .await
        .expect("fact");
    bcm_db::agents::node_fact_upsert_in_txn(
        &mut tx,
        &n.id.to_string(),
        "firmware",
        &serde_json::json!({"bmc": "1.0"}),
    )
    .await
    .expect("fact");
    tx.commit().await.expect("commit");
    let read = bcm_db::nodes::node_read(&db, &n.id, "inventory")
        .await
        .expect("read");
    assert_eq!(
        read.fact,
        Some(inventory),
        "the fact of the kind asked for, not another"
    );
    assert!(matches!(
        bcm_db::nodes::node_read(&db, &bcm_core::NodeId::generate(), "inventory").await,
        Err(DbError::NotFound)
    ));
}

#[tokio::test]
async fn the_read_pool_reads_and_refuses_every_write() {
    let (_, _, url) = support::fresh_database("readpool").await;
    let db = bcm_db::Db::connect(&url, 2).await.expect("connect");
    db.migrate().await.expect("migrate");
    let n = support::node(&db).await;
    let reads = bcm_db::Db::connect_read_only(&url, 2, std::time::Duration::ZERO)
        .await
        .expect("connect");
    let read = bcm_db::nodes::node_read(&reads, &n.id, "inventory")
        .await
        .expect("a read");
    assert_eq!(read.node.id, n.id);
    // A write sent to it by mistake is refused as a write in a read-only
    // transaction (SQLSTATE 25006), not for any other reason.
    let (t, s, p) = (n.tenant_id.clone(), n.site_id.clone(), n.pool_id.clone());
    let mut tx = reads.begin().await.expect("tx");
    let refused = bcm_db::nodes::node_insert_in_txn(&mut tx, &support::new_node(&t, &s, &p)).await;
    let code = match &refused {
        Err(DbError::Sqlx(e)) => e
            .as_database_error()
            .and_then(|d| d.code())
            .map(|c| c.into_owned()),
        _ => None,
    };
    assert_eq!(
        code.as_deref(),
        Some("25006"),
        "a read-only pool took a write, or refused it otherwise: {refused:?}"
    );
}

#[tokio::test]
async fn a_held_node_lock_makes_a_second_writer_give_up_stale_after_its_timeout() {
    let db = support::fresh_db("lock").await;
    let n = support::node(&db).await;
    let mut first = db.begin().await.expect("tx");
    bcm_db::nodes::node_fetch_for_update_in_txn(&mut first, &n.id)
        .await
        .expect("lock");
    let mut second = db.begin_with_lock_timeout(100).await.expect("tx");
    let started = std::time::Instant::now();
    let waited = bcm_db::nodes::node_fetch_for_update_in_txn(&mut second, &n.id).await;
    assert!(matches!(waited, Err(DbError::Stale)), "{waited:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    drop(second);
    first.commit().await.expect("commit");
}

/// A database that cannot be reached is told apart from a fault of the
/// operation: the engine counts no agent's silence across such an outage.
#[tokio::test]
async fn an_unreachable_database_is_an_outage_and_a_missing_row_is_not() {
    let db = support::fresh_db("outage").await;
    let missing = bcm_db::commands::command_fetch(&db, "cmd_none")
        .await
        .expect_err("no such command");
    assert!(!missing.unreachable(), "{missing}");
    db.close().await;
    let closed = bcm_db::commands::command_fetch(&db, "cmd_none")
        .await
        .expect_err("the pool is closed");
    assert!(closed.unreachable(), "{closed}");
}

#[tokio::test]
async fn missing_rows_are_not_found() {
    let db = support::fresh_db("missing").await;
    assert!(matches!(
        bcm_db::nodes::node_fetch(&db, &bcm_core::NodeId::generate()).await,
        Err(DbError::NotFound)
    ));
    assert!(matches!(
        bcm_db::tenancy::pool_fetch(&db, &"nope".parse().expect("pool")).await,
        Err(DbError::NotFound)
    ));
    assert!(matches!(
        bcm_db::commands::command_fetch(&db, "cmd_none").await,
        Err(DbError::NotFound)
    ));
    assert!(matches!(
        bcm_db::workflows::workflow_fetch(&db, "wf_none").await,
        Err(DbError::NotFound)
    ));
}

#[tokio::test]
async fn unique_and_foreign_keys_come_back_as_typed_errors() {
    let db = support::fresh_db("keys").await;
    let n = support::node(&db).await;
    let id = n.id.to_string();

    // The same node twice.
    let mut tx = db.begin().await.expect("tx");
    assert!(matches!(
        bcm_db::nodes::node_insert_in_txn(&mut tx, &n).await,
        Err(DbError::Duplicate { .. })
    ));
    drop(tx);

    // A node of a pool that does not exist.
    let (t, s, _) = support::tenancy(&db).await;
    let orphan = support::new_node(&t, &s, &"ghost".parse().expect("pool"));
    let mut tx = db.begin().await.expect("tx");
    assert!(matches!(
        bcm_db::nodes::node_insert_in_txn(&mut tx, &orphan).await,
        Err(DbError::MissingReference { .. })
    ));
    drop(tx);

    // A command's idempotency key is used once: a restarted engine cannot
    // record the same step's attempt twice.
    let mut tx = db.begin().await.expect("tx");
    bcm_db::commands::command_insert_in_txn(&mut tx, &command(&id, "wf/0/1", "bmc.verify"))
        .await
        .expect("first");
    assert!(matches!(
        bcm_db::commands::command_insert_in_txn(&mut tx, &command(&id, "wf/0/1", "bmc.verify"))
            .await,
        Err(DbError::Duplicate { .. })
    ));
    drop(tx);

    // One workflow per node state entry, whoever races.
    let mut tx = db.begin().await.expect("tx");
    bcm_db::workflows::workflow_insert_in_txn(&mut tx, &workflow(&id, 1))
        .await
        .expect("first");
    assert!(matches!(
        bcm_db::workflows::workflow_insert_in_txn(&mut tx, &workflow(&id, 1)).await,
        Err(DbError::Duplicate { .. })
    ));
    drop(tx);

    // A pool never changes tenant.
    let other: bcm_core::TenantId = "u".parse().expect("tenant");
    bcm_db::tenancy::tenant_upsert(&db, &other, "U")
        .await
        .expect("tenant");
    let mut pool = bcm_db::tenancy::pool_fetch(&db, &"p".parse().expect("pool"))
        .await
        .expect("pool");
    pool.tenant_id = other;
    assert!(matches!(
        bcm_db::tenancy::pool_upsert(&db, &pool).await,
        Err(DbError::Duplicate { .. })
    ));

    // A profile version is immutable: the same content again is a no-op,
    // other content is refused.
    let v1 = serde_json::json!({"id": "x", "version": 1});
    bcm_db::deploy_profiles::deploy_profile_insert(&db, "t", "x", 1, &v1, "test")
        .await
        .expect("stored");
    bcm_db::deploy_profiles::deploy_profile_insert(&db, "t", "x", 1, &v1, "test")
        .await
        .expect("no-op");
    assert!(matches!(
        bcm_db::deploy_profiles::deploy_profile_insert(
            &db,
            "t",
            "x",
            1,
            &serde_json::json!({"id": "x", "version": 1, "role": "dedicated"}),
            "test"
        )
        .await,
        Err(DbError::Duplicate { .. })
    ));
}

#[tokio::test]
async fn a_result_is_recorded_once_and_only_on_a_command_of_its_kind() {
    let db = support::fresh_db("results").await;
    let n = support::node(&db).await;
    let id = n.id.to_string();
    let c = command(&id, "leaf/1", "bmc.power");
    let mut tx = db.begin().await.expect("tx");
    bcm_db::commands::command_insert_in_txn(&mut tx, &c)
        .await
        .expect("insert");
    let result = |kind: &'static str| NewResult {
        command_id: &c.id,
        site_id: "s",
        kind,
        succeeded: true,
        result: serde_json::json!({"ok": true}),
    };
    // Another kind's result does not land on it.
    let done = bcm_db::commands::commands_complete_many_in_txn(&mut tx, &[result("bmc.verify")])
        .await
        .expect("complete");
    assert!(done.is_empty());
    // Nor another site's answer.
    let other_site = NewResult {
        site_id: "t",
        ..result("bmc.power")
    };
    let done = bcm_db::commands::commands_complete_many_in_txn(&mut tx, &[other_site])
        .await
        .expect("complete");
    assert!(done.is_empty());
    let done = bcm_db::commands::commands_complete_many_in_txn(&mut tx, &[result("bmc.power")])
        .await
        .expect("complete");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].1.kind, "bmc.power");
    // A redelivery changes nothing.
    let again = bcm_db::commands::commands_complete_many_in_txn(&mut tx, &[result("bmc.power")])
        .await
        .expect("again");
    assert!(again.is_empty());
    let kinds = bcm_db::commands::command_kinds_in_txn(&mut tx, &[c.id.clone(), "cmd_none".into()])
        .await
        .expect("kinds");
    assert_eq!(
        kinds,
        vec![(c.id.clone(), "bmc.power".to_owned(), Some("s".to_owned()))]
    );
    tx.commit().await.expect("commit");
    let row = bcm_db::commands::command_fetch(&db, &c.id)
        .await
        .expect("row");
    assert_eq!(row.status, CommandStatus::Succeeded);
}

/// Writes a workflow status this code does not know, as a newer version's
/// migration that relaxed the record's check might.
async fn status_from_a_newer_version(db: &bcm_db::Db, workflow_id: &str) {
    support::exec(
        db,
        "ALTER TABLE workflows DROP CONSTRAINT workflows_status_check",
    )
    .await;
    support::exec(
        db,
        &format!("UPDATE workflows SET status = 'finished' WHERE id = '{workflow_id}'"),
    )
    .await;
}

#[tokio::test]
async fn a_stored_status_this_code_does_not_know_is_damage_never_a_default() {
    let db = support::fresh_db("status").await;
    let n = support::node(&db).await;
    let wf = workflow(&n.id.to_string(), 1);
    let mut tx = db.begin().await.expect("tx");
    bcm_db::workflows::workflow_insert_in_txn(&mut tx, &wf)
        .await
        .expect("insert");
    tx.commit().await.expect("commit");
    let steps = bcm_db::workflows::steps_fetch(&db, &wf.id)
        .await
        .expect("steps");
    assert_eq!(steps[0].status, StepStatus::Pending);
    assert_eq!(
        bcm_db::workflows::workflow_fetch(&db, &wf.id)
            .await
            .expect("wf")
            .status,
        WorkflowPhase::Running
    );

    // A typo once read as `pending` and ran the step again.
    support::exec(
        &db,
        &format!(
            "UPDATE workflow_steps SET status = 'suceeded' WHERE workflow_id = '{}'",
            wf.id
        ),
    )
    .await;
    assert!(matches!(
        bcm_db::workflows::steps_fetch(&db, &wf.id).await,
        Err(DbError::Corrupt(_))
    ));
    // The record refuses an unknown workflow status itself; a newer
    // version's migration may relax that, and this code must still not
    // guess.
    status_from_a_newer_version(&db, &wf.id).await;
    assert!(matches!(
        bcm_db::workflows::workflow_fetch(&db, &wf.id).await,
        Err(DbError::Corrupt(_))
    ));
    let mut tx = db.begin().await.expect("tx");
    assert!(matches!(
        bcm_db::workflows::workflow_status_in_txn(&mut tx, &wf.id).await,
        Err(DbError::Corrupt(_))
    ));
}

/// The reconciler's periodic look reads nodes a page at a time: a node
/// whose workflow's status this code does not know is reported as damage,
/// on its own, beside the rest of the page, which reads as stored.
#[tokio::test]
async fn a_glance_reports_a_node_it_cannot_read_beside_the_rest_of_its_page() {
    let db = support::fresh_db("glance").await;
    let a = support::node(&db).await;
    let b = support::node(&db).await;
    let wf = workflow(&a.id.to_string(), 1);
    let mut tx = db.begin().await.expect("tx");
    bcm_db::workflows::workflow_insert_in_txn(&mut tx, &wf)
        .await
        .expect("insert");
    tx.commit().await.expect("commit");
    support::exec(
        &db,
        &format!(
            "UPDATE nodes SET workflow_id = '{}' WHERE id = '{}'",
            wf.id, a.id
        ),
    )
    .await;
    let states = [ProvisionState::Enrolling];
    let page = bcm_db::nodes::node_glances_in_states(&db, &states, None, 10)
        .await
        .expect("page");
    fn of<'p>(
        page: &'p bcm_db::nodes::GlancePage,
        id: &bcm_core::NodeId,
    ) -> &'p Result<bcm_db::nodes::NodeGlance, DbError> {
        page.iter()
            .find(|(i, _)| i == id)
            .map(|(_, g)| g)
            .expect("the node is on the page")
    }
    assert_eq!(page.len(), 2);
    let ga = of(&page, &a.id).as_ref().expect("a reads");
    assert_eq!(ga.facts.state, ProvisionState::Enrolling);
    let wa = ga.workflow.as_ref().expect("a's workflow");
    assert_eq!(
        (wa.profile_id.as_str(), wa.phase, wa.wipe_verified),
        ("metal-enroll", WorkflowPhase::Running, false)
    );
    assert_eq!(of(&page, &b.id).as_ref().expect("b reads").workflow, None);
    // A page of one, after the first id: the other node.
    let first = page[0].0;
    let rest = bcm_db::nodes::node_glances_in_states(&db, &states, Some(&first), 1)
        .await
        .expect("rest");
    assert_eq!(rest.len(), 1);
    assert_ne!(rest[0].0, first);
    // No node is ready.
    assert!(
        bcm_db::nodes::node_glances_in_states(&db, &[ProvisionState::Ready], None, 10)
            .await
            .expect("ready")
            .is_empty()
    );

    // A status a newer version wrote: a's row is damage, b's reads.
    status_from_a_newer_version(&db, &wf.id).await;
    let page = bcm_db::nodes::node_glances_in_states(&db, &states, None, 10)
        .await
        .expect("a page with a damaged row still reads");
    assert_eq!(page.len(), 2);
    assert!(matches!(of(&page, &a.id), Err(DbError::Corrupt(_))));
    assert!(of(&page, &b.id).is_ok());
}

#[tokio::test]
async fn the_workflow_step_claim_hands_a_due_step_to_one_transaction_at_a_time() {
    let db = support::fresh_db("claim").await;
    let n = support::node(&db).await;
    let wf = workflow(&n.id.to_string(), 1);
    let mut tx = db.begin().await.expect("tx");
    bcm_db::workflows::workflow_insert_in_txn(&mut tx, &wf)
        .await
        .expect("insert");
    tx.commit().await.expect("commit");
    let mut first = db.begin().await.expect("tx");
    let claimed = bcm_db::workflows::steps_claim_due_many_in_txn(&mut first, 10)
        .await
        .expect("claim");
    assert_eq!(claimed, vec![(wf.id.clone(), 0)]);
    let mut second = db.begin().await.expect("tx");
    let none = bcm_db::workflows::steps_claim_due_many_in_txn(&mut second, 10)
        .await
        .expect("claim");
    assert!(
        none.is_empty(),
        "a claimed step is skipped, not waited for: {none:?}"
    );
    drop(second);
    drop(first);
}

/// Every process of a control plane started at once seeds the same deploy
/// profile: each insert answers Ok, never "no row" (the statement whose
/// insert waited on a concurrent writer's row did not see that row in its
/// snapshot, and the service exited at start), and different content for
/// a stored version is still refused.
#[tokio::test]
async fn a_deploy_profile_seeded_by_many_writers_at_once_is_stored_once() {
    let db = support::fresh_db("seed_race").await;
    let (tenant, _, _) = support::tenancy(&db).await;
    let definition = serde_json::json!({"id": "os", "version": 1, "image": "x"});
    for round in 0..5 {
        let id = format!("os-{round}");
        let writers: Vec<_> = (0..8)
            .map(|_| {
                let (db, tenant, id, definition) = (
                    db.clone(),
                    tenant.to_string(),
                    id.clone(),
                    definition.clone(),
                );
                tokio::spawn(async move {
                    bcm_db::deploy_profiles::deploy_profile_insert(
                        &db,
                        &tenant,
                        &id,
                        1,
                        &definition,
                        "test",
                    )
                    .await
                })
            })
            .collect();
        for w in writers {
            w.await.expect("join").expect("every writer succeeds");
        }
    }
    let other = serde_json::json!({"id": "os", "version": 1, "image": "y"});
    assert!(matches!(
        bcm_db::deploy_profiles::deploy_profile_insert(
            &db,
            &tenant.to_string(),
            "os-0",
            1,
            &other,
            "test"
        )
        .await,
        Err(DbError::Duplicate { .. })
    ));
}

#[tokio::test]
async fn a_mac_belongs_to_one_live_node_of_a_site() {
    let db = support::fresh_db("macs").await;
    let (t, s, p) = support::tenancy(&db).await;
    let (a, b) = (support::new_node(&t, &s, &p), support::new_node(&t, &s, &p));
    let mut tx = db.begin().await.expect("tx");
    bcm_db::nodes::node_insert_in_txn(&mut tx, &a)
        .await
        .expect("a");
    bcm_db::nodes::node_insert_in_txn(&mut tx, &b)
        .await
        .expect("b");
    bcm_db::nodes::node_set_macs_in_txn(&mut tx, &a.id.to_string(), &["52:54:00:AA:BB:01".into()])
        .await
        .expect("a's MAC");
    tx.commit().await.expect("commit");

    // b asks whether its inspected MACs are free: a holds one, in any spelling.
    let mut tx = db.begin().await.expect("tx");
    let held = bcm_db::nodes::mac_holders_in_txn(
        &mut tx,
        s.as_str(),
        &b.id.to_string(),
        &["52-54-00-aa-bb-01".into(), "52:54:00:aa:bb:02".into()],
    )
    .await
    .expect("holders");
    assert_eq!(held, vec![("525400aabb01".to_owned(), a.id.to_string())]);
    // a's own MAC is not held against a.
    let own = bcm_db::nodes::mac_holders_in_txn(
        &mut tx,
        s.as_str(),
        &a.id.to_string(),
        &["52:54:00:aa:bb:01".into()],
    )
    .await
    .expect("holders");
    assert!(own.is_empty(), "{own:?}");
    // Writing it anyway is refused by the record itself.
    let err =
        bcm_db::nodes::node_set_macs_in_txn(&mut tx, &b.id.to_string(), &["525400aabb01".into()])
            .await
            .expect_err("a MAC is unique within a site");
    assert!(
        matches!(&err, DbError::Duplicate { constraint } if constraint == "node_macs_site_mac"),
        "{err:?}"
    );
    drop(tx);

    // Retired, a boots nothing and holds no MAC: the machine may come back.
    let mut tx = db.begin().await.expect("tx");
    let mut retired = bcm_db::nodes::node_fetch_for_update_in_txn(&mut tx, &a.id)
        .await
        .expect("a");
    retired.provision_state = ProvisionState::Retired;
    bcm_db::nodes::node_update_guarded_in_txn(&mut tx, &retired)
        .await
        .expect("retire");
    bcm_db::nodes::node_set_macs_in_txn(&mut tx, &b.id.to_string(), &["52:54:00:aa:bb:01".into()])
        .await
        .expect("b takes the MAC");
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn every_writing_transaction_advances_the_next_transaction_id() {
    let db = support::fresh_db("xid").await;
    support::exec(&db, "CREATE TABLE xid_probe (n int)").await;
    let before = bcm_db::admin::next_transaction_id(&db)
        .await
        .expect("next id");
    for n in 0..5 {
        support::exec(&db, &format!("INSERT INTO xid_probe VALUES ({n})")).await;
    }
    let after = bcm_db::admin::next_transaction_id(&db)
        .await
        .expect("next id");
    // Other tests on the same server may write meanwhile: at least ours.
    assert!(after - before >= 5, "{before} → {after}");
}

/// `alive_until` and the row version (`xmin`) of the session of `hash`.
async fn session_mark(db: &bcm_db::Db, hash: &[u8]) -> (String, String) {
    let mut tx = db.begin().await.expect("tx");
    let row = sqlx::query_as(
        "SELECT alive_until::text, xmin::text FROM agent_sessions WHERE token_hash = $1",
    )
    .bind(hash)
    .fetch_one(&mut *tx)
    .await
    .expect("session row");
    tx.rollback().await.expect("rollback");
    row
}

/// A node with a certificate in force and a session of token hash `hash`,
/// on a fresh database; returns the database and the node's id.
async fn live_session(tag: &str, hash: [u8; 32]) -> (bcm_db::Db, String) {
    let db = support::fresh_db(tag).await;
    let node_id = another_live_session(&db, &hash, "serial-1").await;
    (db, node_id)
}

/// A new node with a ramdisk (`discovery`) session of token hash `hash`
/// under a certificate of serial `serial`; the node's id.
async fn another_live_session(db: &bcm_db::Db, hash: &[u8], serial: &str) -> String {
    let node = support::node(db).await;
    let node_id = node.id.to_string();
    let now = chrono::Utc::now();
    let mut tx = db.begin().await.expect("tx");
    bcm_db::agents::cert_insert_in_txn(
        &mut tx,
        &bcm_db::agents::CertRow {
            serial: serial.into(),
            node_id: node_id.clone(),
            public_key: vec![1; 32],
            cert_pem: "pem".into(),
            not_before: now,
            not_after: now + chrono::Duration::hours(1),
            revoked_at: None,
            purpose: "discovery".into(),
            epoch: 0,
        },
    )
    .await
    .expect("cert");
    bcm_db::agents::session_insert_in_txn(
        &mut tx,
        hash,
        &node_id,
        serial,
        "discovery",
        now + chrono::Duration::hours(1),
    )
    .await
    .expect("session");
    tx.commit().await.expect("commit");
    node_id
}

#[tokio::test]
async fn a_session_touch_writes_only_when_it_moves_the_mark_beyond_its_slack_and_refuses_a_revoked_certificate(
) {
    let hash = [7u8; 32];
    let (db, node_id) = live_session("touch", hash).await;

    // A long poll's touch moves the mark 30 s ahead: written.
    let (at0, xmin0) = session_mark(&db, &hash).await;
    let live = bcm_db::agents::session_touch_live(&db, &hash, 30_000, 0)
        .await
        .expect("touch")
        .expect("a live session");
    assert_eq!(
        (
            live.node_id.as_str(),
            live.cert_serial.as_str(),
            live.purpose.as_str()
        ),
        (node_id.as_str(), "serial-1", "discovery")
    );
    assert!(!live.workflow_running);
    assert!(
        (29_000..=30_000).contains(&live.alive_left_ms),
        "{}",
        live.alive_left_ms
    );
    let (at1, xmin1) = session_mark(&db, &hash).await;
    assert!(at1 > at0 && xmin1 != xmin0, "{at0}/{xmin0} → {at1}/{xmin1}");

    // A result within that window (no wait) finds the session, and leaves
    // the row as it was.
    for _ in 0..3 {
        let live = bcm_db::agents::session_touch_live(&db, &hash, 0, 0)
            .await
            .expect("touch")
            .expect("a live session");
        assert!(live.alive_left_ms > 20_000, "{}", live.alive_left_ms);
    }
    assert_eq!(session_mark(&db, &hash).await, (at1.clone(), xmin1.clone()));

    // A poll just after, with slack: the mark holds to within it, so it
    // stays, and the poll is told how long it holds.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let live = bcm_db::agents::session_touch_live(&db, &hash, 30_000, 2_000)
        .await
        .expect("touch")
        .expect("a live session");
    assert!(live.alive_left_ms < 30_000, "{}", live.alive_left_ms);
    assert_eq!(session_mark(&db, &hash).await, (at1.clone(), xmin1.clone()));
    // Without slack the same poll moves it.
    assert!(bcm_db::agents::session_touch_live(&db, &hash, 30_000, 0)
        .await
        .expect("touch")
        .is_some());
    let (at2, _) = session_mark(&db, &hash).await;
    assert!(at2 > at1, "{at1} → {at2}");

    // A longer wait than the mark holds moves it, slack or not.
    assert!(
        bcm_db::agents::session_touch_live(&db, &hash, 60_000, 2_000)
            .await
            .expect("touch")
            .is_some()
    );
    let (at3, _) = session_mark(&db, &hash).await;
    assert!(at3 > at2, "{at2} → {at3}");

    // Unknown, and revoked: no session, nothing written.
    assert!(bcm_db::agents::session_touch_live(&db, &[8u8; 32], 0, 0)
        .await
        .expect("touch")
        .is_none());
    // (Revoked behind the record's back: `cert_revoke_in_txn` would end
    // the session too.)
    support::exec(
        &db,
        "UPDATE node_certs SET revoked_at = now() WHERE serial = 'serial-1'",
    )
    .await;
    let before = session_mark(&db, &hash).await;
    assert!(bcm_db::agents::session_touch_live(&db, &hash, 90_000, 0)
        .await
        .expect("touch")
        .is_none());
    assert_eq!(session_mark(&db, &hash).await, before);
}

#[tokio::test]
async fn a_touch_that_moves_the_mark_refuses_a_session_ended_while_it_waited() {
    let hash = [9u8; 32];
    let (db, _) = live_session("touch_race", hash).await;
    // Another transaction ends the session and holds its row until it
    // commits; the touch, which must move the mark, waits for that row.
    let mut ender = db.begin().await.expect("tx");
    sqlx::query("DELETE FROM agent_sessions WHERE token_hash = $1")
        .bind(&hash[..])
        .execute(&mut *ender)
        .await
        .expect("delete");
    let toucher = db.clone();
    let touch = tokio::spawn(async move {
        bcm_db::agents::session_touch_live(&toucher, &hash, 30_000, 0).await
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !touch.is_finished(),
        "the touch waits for the session's row"
    );
    ender.commit().await.expect("commit");
    let got = touch.await.expect("join").expect("touch");
    assert!(got.is_none(), "a session ended meanwhile answered: {got:?}");
}

/// Records a pending agent command of `kind` for `node`; returns its id.
async fn agent_command(db: &bcm_db::Db, node: &str, kind: &str) -> String {
    let mut c = command(
        node,
        &format!("key-{}", bcm_core::CommandId::generate()),
        kind,
    );
    c.target = "ramdisk".into();
    let mut tx = db.begin().await.expect("tx");
    bcm_db::commands::command_insert_in_txn(&mut tx, &c)
        .await
        .expect("command");
    tx.commit().await.expect("commit");
    c.id
}

async fn status_of(db: &bcm_db::Db, id: &str) -> CommandStatus {
    bcm_db::commands::command_fetch(db, id)
        .await
        .expect("command")
        .status
}

/// One poll's first look, asked alone.
async fn first_look(
    db: &bcm_db::Db,
    hash: &[u8],
    slack_ms: u64,
    runs: &[(&str, &str)],
) -> Option<(
    bcm_db::agents::LiveSession,
    Vec<bcm_db::commands::CommandRow>,
)> {
    let ask = bcm_db::agents::TouchAsk {
        hash,
        alive_for_ms: 30_000,
        slack_ms,
        takes_commands: true,
    };
    let found = bcm_db::commands::sessions_touch_and_take(db, &[ask], runs, 16, 60_000, true)
        .await
        .expect("poll");
    match found.as_slice() {
        [Touched::Heard(live, taken)] => Some((live.clone(), taken.clone())),
        [Touched::Unknown] => None,
        other => panic!("one answer per ask, never busy when waiting: {other:?}"),
    }
}

#[tokio::test]
async fn a_polls_first_look_touches_its_session_and_takes_what_its_purpose_runs_in_one_statement() {
    let hash = [11u8; 32];
    let (db, node_id) = live_session("poll_take", hash).await;
    let runs = [("discovery", "inventory"), ("node", "osExec")];
    let inventory = agent_command(&db, &node_id, "inventory").await;
    let os_exec = agent_command(&db, &node_id, "osExec").await;

    // An unknown session: nothing, and nothing taken.
    let none = first_look(&db, &[1u8; 32], 0, &runs).await;
    assert!(none.is_none());
    assert_eq!(status_of(&db, &inventory).await, CommandStatus::Pending);

    // The session: touched (its mark moved 30 s ahead) and handed the
    // command its purpose runs, now sent; the other kind stays pending.
    let (_, xmin0) = session_mark(&db, &hash).await;
    let (live, taken) = first_look(&db, &hash, 0, &runs)
        .await
        .expect("a live session");
    assert_eq!(
        (
            live.node_id.as_str(),
            live.cert_serial.as_str(),
            live.purpose.as_str()
        ),
        (node_id.as_str(), "serial-1", "discovery")
    );
    assert!(
        (29_000..=30_000).contains(&live.alive_left_ms),
        "{}",
        live.alive_left_ms
    );
    let (_, xmin1) = session_mark(&db, &hash).await;
    assert_ne!(xmin0, xmin1, "the mark moved");
    assert_eq!(
        taken.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        vec![inventory.as_str()]
    );
    assert_eq!(status_of(&db, &inventory).await, CommandStatus::Sent);
    assert_eq!(status_of(&db, &os_exec).await, CommandStatus::Pending);

    // Again at once: leased, so not handed again; the mark holds within
    // the slack, so the row is left as it was.
    let (_, taken) = first_look(&db, &hash, 2_000, &runs)
        .await
        .expect("a live session");
    assert!(taken.is_empty(), "{taken:?}");
    assert_eq!(session_mark(&db, &hash).await.1, xmin1);

    // A newer session of the same purpose: the older one is still heard
    // but takes nothing.
    let second = agent_command(&db, &node_id, "inventory").await;
    let mut tx = db.begin().await.expect("tx");
    bcm_db::agents::session_insert_in_txn(
        &mut tx,
        &[12u8; 32],
        &node_id,
        "serial-1",
        "discovery",
        chrono::Utc::now() + chrono::Duration::hours(1),
    )
    .await
    .expect("session");
    tx.commit().await.expect("commit");
    let (_, taken) = first_look(&db, &hash, 0, &runs)
        .await
        .expect("the older session is heard");
    assert!(taken.is_empty(), "an older session took {taken:?}");
    assert_eq!(status_of(&db, &second).await, CommandStatus::Pending);

    // Revoked: no session, nothing taken.
    support::exec(
        &db,
        "UPDATE node_certs SET revoked_at = now() WHERE serial = 'serial-1'",
    )
    .await;
    assert!(first_look(&db, &[12u8; 32], 0, &runs).await.is_none());
    assert_eq!(status_of(&db, &second).await, CommandStatus::Pending);
}

#[tokio::test]
async fn touches_gathered_are_each_answered_in_order_and_a_command_goes_to_one_poll() {
    let (a, b) = ([21u8; 32], [22u8; 32]);
    let (db, node_a) = live_session("polls_together", a).await;
    let node_b = another_live_session(&db, &b, "serial-2").await;
    let runs = [("discovery", "inventory")];
    let for_a: Vec<String> = vec![
        agent_command(&db, &node_a, "inventory").await,
        agent_command(&db, &node_a, "inventory").await,
    ];
    let for_b = agent_command(&db, &node_b, "inventory").await;
    let (_, b_mark) = session_mark(&db, &b).await;

    // a polls twice (a poll and its retry), an unknown session polls, and
    // b only touches its session (a heartbeat).
    let ask = |hash, takes_commands| bcm_db::agents::TouchAsk {
        hash,
        alive_for_ms: 30_000,
        slack_ms: 0,
        takes_commands,
    };
    let unknown = [23u8; 32];
    let asks = [
        ask(&a[..], true),
        ask(&unknown[..], true),
        ask(&b[..], false),
        ask(&a[..], true),
    ];
    let found = bcm_db::commands::sessions_touch_and_take(&db, &asks, &runs, 16, 60_000, false)
        .await
        .expect("polls");
    assert_eq!(found.len(), asks.len(), "one answer per ask");
    assert_eq!(found[1], Touched::Unknown, "the unknown session");
    let Touched::Heard(b_live, b_taken) = &found[2] else {
        panic!("b not heard: {:?}", found[2]);
    };
    assert_eq!(
        (b_live.node_id.as_str(), b_live.cert_serial.as_str()),
        (node_b.as_str(), "serial-2")
    );
    assert!(b_taken.is_empty(), "a touch takes nothing: {b_taken:?}");
    assert_eq!(status_of(&db, &for_b).await, CommandStatus::Pending);
    assert_ne!(session_mark(&db, &b).await.1, b_mark, "b's mark moved");
    // Both of a's polls are heard; its commands go to one or the other,
    // each exactly once.
    let mut a_taken: Vec<String> = vec![];
    for i in [0, 3] {
        let Touched::Heard(live, taken) = &found[i] else {
            panic!("a not heard: {:?}", found[i]);
        };
        assert_eq!(live.node_id, node_a);
        assert!((29_000..=30_000).contains(&live.alive_left_ms));
        a_taken.extend(taken.iter().map(|c| c.id.clone()));
    }
    a_taken.sort();
    let mut want = for_a.clone();
    want.sort();
    assert_eq!(a_taken, want, "each of a's commands handed once");
    for id in &for_a {
        assert_eq!(status_of(&db, id).await, CommandStatus::Sent);
    }

    // While another transaction holds b's session, a statement that does
    // not wait passes b over (busy) and answers a at once; one that waits
    // answers b when that transaction ends.
    let mut holder = db.begin().await.expect("tx");
    sqlx::query("SELECT 1 FROM agent_sessions WHERE token_hash = $1 FOR UPDATE")
        .bind(&b[..])
        .execute(&mut *holder)
        .await
        .expect("hold b");
    let moving = |hash| bcm_db::agents::TouchAsk {
        hash,
        alive_for_ms: 90_000,
        slack_ms: 0,
        takes_commands: true,
    };
    let found = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        bcm_db::commands::sessions_touch_and_take(
            &db,
            &[moving(&b[..]), moving(&a[..])],
            &runs,
            16,
            60_000,
            false,
        ),
    )
    .await
    .expect("never waits for b's lock")
    .expect("touches");
    assert_eq!(found[0], Touched::Busy);
    assert!(matches!(found[1], Touched::Heard(..)), "{:?}", found[1]);
    assert_eq!(
        status_of(&db, &for_b).await,
        CommandStatus::Pending,
        "busy takes nothing"
    );
    let waiting = {
        let db = db.clone();
        tokio::spawn(async move {
            let ask = bcm_db::agents::TouchAsk {
                hash: &b[..],
                alive_for_ms: 90_000,
                slack_ms: 0,
                takes_commands: true,
            };
            bcm_db::commands::sessions_touch_and_take(&db, &[ask], &runs, 16, 60_000, true).await
        })
    };
    // It waits for b's lock (a backend of this database waiting on a lock;
    // a transaction each look, as the activity view is read once in one).
    let mut lock_waits = 0i64;
    for _ in 0..100 {
        let mut tx = db.begin().await.expect("tx");
        lock_waits = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut *tx)
        .await
        .expect("pg_stat_activity");
        tx.rollback().await.expect("rollback");
        if lock_waits > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(lock_waits, 1, "waits for b's lock");
    assert!(!waiting.is_finished());
    holder.commit().await.expect("release b");
    let found = waiting.await.expect("task").expect("touch");
    let [Touched::Heard(_, b_taken)] = found.as_slice() else {
        panic!("b not heard: {found:?}");
    };
    assert_eq!(
        b_taken.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        vec![for_b.as_str()]
    );

    // No asks: no statement's worth of answers.
    assert!(
        bcm_db::commands::sessions_touch_and_take(&db, &[], &runs, 16, 60_000, false)
            .await
            .expect("none")
            .is_empty()
    );
}

/// The listener's `LISTEN` backend, as Postgres sees it: whether it holds
/// a snapshot (`backend_xmin`) and whether it waits to write to its client.
async fn outbox_listen_backend(db: &bcm_db::Db) -> Option<(bool, bool)> {
    // A transaction of its own: the activity view is read once per
    // transaction.
    let mut tx = db.begin().await.expect("tx");
    let row = sqlx::query_as(
        "SELECT backend_xmin IS NOT NULL, wait_event IS NOT DISTINCT FROM 'ClientWrite' \
         FROM pg_stat_activity WHERE datname = current_database() AND query = $1",
    )
    .bind(format!("LISTEN \"{}\"", bcm_db::outbox::NOTIFY_CHANNEL))
    .fetch_optional(&mut *tx)
    .await
    .expect("pg_stat_activity");
    tx.rollback().await.expect("rollback");
    row
}

#[tokio::test]
async fn a_busy_relay_s_listener_never_holds_back_vacuum() {
    let db = support::fresh_db("listener").await;
    let mut listener = bcm_db::outbox::outbox_listener(&db).await;
    // Listening wakes it once: consumed here, so the wait below is woken
    // by what arrives later.
    listener.notified().await;
    // A relay busy publishing does not wait on its listener while commits
    // announce megabytes of notifications: more than the socket holds.
    support::exec(
        &db,
        &format!(
            "SELECT pg_notify('{}', g::text) FROM generate_series(1, 750000) g",
            bcm_db::outbox::NOTIFY_CHANNEL
        ),
    )
    .await;
    // Read as they arrive, they leave the backend idle with no snapshot
    // (for a second on end, so that the look is not the moment before it
    // fills the socket). Unread, it would wait on the full socket inside a
    // transaction for as long as nobody reads, its snapshot holding every
    // vacuum back.
    let (mut backend, mut idle_looks) = (None, 0);
    for _ in 0..300 {
        backend = outbox_listen_backend(&db).await;
        idle_looks = if backend == Some((false, false)) {
            idle_looks + 1
        } else {
            0
        };
        if idle_looks == 10 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        (backend, idle_looks),
        (Some((false, false)), 10),
        "(holds a snapshot, waits to write to its client), idle looks in a row"
    );
    // What arrived while the relay was busy wakes its next wait at once.
    tokio::time::timeout(std::time::Duration::from_secs(5), listener.notified())
        .await
        .expect("a wake-up kept for the next wait");
}

/// What a channel's reader heard, in order.
type HeardLog = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

async fn heard_so_far(log: &HeardLog, want: usize) -> Vec<String> {
    for _ in 0..300 {
        let now = log.lock().expect("log").clone();
        if now.len() >= want {
            return now;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    log.lock().expect("log").clone()
}

#[tokio::test]
async fn a_channel_reader_hears_payloads_and_listens_again_after_its_connection_is_killed() {
    use bcm_db::listen::Heard;
    let db = support::fresh_db("chanreader").await;
    let log: HeardLog = Default::default();
    let kept = log.clone();
    let _reader = bcm_db::listen::read_channel(&db, "bcm_test_channel", move |h| {
        kept.lock().expect("log").push(match h {
            Heard::Notification(p) => format!("n:{p}"),
            Heard::Resumed => "resumed".to_owned(),
        })
    })
    .await;
    // Listening when it returns: a notification sent now is heard.
    support::exec(&db, "SELECT pg_notify('bcm_test_channel', 'node-1')").await;
    assert_eq!(heard_so_far(&log, 2).await, ["resumed", "n:node-1"]);

    // The listening connection dies: the reader listens again and says so
    // (what was sent meanwhile was missed), then hears what follows.
    support::exec(
        &db,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND query = 'LISTEN \"bcm_test_channel\"'",
    )
    .await;
    let mut heard = heard_so_far(&log, 3).await;
    assert_eq!(
        heard.get(2).map(String::as_str),
        Some("resumed"),
        "{heard:?}"
    );
    // Once it listens again, a notification reaches it.
    for _ in 0..100 {
        support::exec(&db, "SELECT pg_notify('bcm_test_channel', 'node-2')").await;
        heard = log.lock().expect("log").clone();
        if heard.iter().any(|h| h == "n:node-2") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(heard.iter().any(|h| h == "n:node-2"), "{heard:?}");
}

/// A running OS's heartbeat is one statement: its fact merged into what
/// the node's agent reported (earlier keys kept), and the node's steps
/// that wait for the agent made due at once; a workflow an engine holds
/// is skipped, never waited for, and its fact is still recorded.
#[tokio::test]
async fn a_heartbeat_records_its_fact_and_nudges_the_steps_waiting_for_the_agent_in_one_statement()
{
    let db = support::fresh_db("heartbeat").await;
    let n = support::node(&db).await;
    let node = n.id.to_string();
    let mut wf = workflow(&node, 1);
    wf.steps = vec![NewStep {
        name: "wait-os-back".into(),
        target: "node".into(),
        cleanup: false,
        definition: serde_json::json!({"name": "wait-os-back", "kind": "waitOsBack", "timeoutSecs": 600}),
    }];
    let mut tx = db.begin().await.expect("tx");
    bcm_db::workflows::workflow_insert_in_txn(&mut tx, &wf)
        .await
        .expect("insert");
    tx.commit().await.expect("commit");
    // The step runs, next looked at in an hour.
    let later = || async {
        let mut tx = db.begin().await.expect("tx");
        sqlx::query(
            "UPDATE workflow_steps SET status = 'running', due_at = now() + interval '1 hour' WHERE workflow_id = $1",
        )
        .bind(&wf.id)
        .execute(&mut *tx)
        .await
        .expect("running");
        tx.commit().await.expect("commit");
    };
    let due_within_a_minute = || async {
        let mut tx = db.begin().await.expect("tx");
        let due = sqlx::query_scalar::<_, bool>(
            "SELECT due_at < now() + interval '1 minute' FROM workflow_steps WHERE workflow_id = $1",
        )
        .bind(&wf.id)
        .fetch_one(&mut *tx)
        .await
        .expect("step");
        tx.rollback().await.expect("rollback");
        due
    };
    later().await;
    let kind = "heartbeat:provisioned";
    bcm_db::agents::heartbeat_record(
        &db,
        &node,
        kind,
        &serde_json::json!({"role": "node", "seen": 1}),
    )
    .await
    .expect("first beat");
    assert!(
        due_within_a_minute().await,
        "the waiting step was not nudged"
    );
    bcm_db::agents::heartbeat_record(&db, &node, kind, &serde_json::json!({"event": "heartbeat"}))
        .await
        .expect("second beat");
    assert_eq!(
        bcm_db::agents::node_fact_fetch(&db, &node, kind)
            .await
            .expect("fact"),
        Some(serde_json::json!({"role": "node", "seen": 1, "event": "heartbeat"})),
        "merged, earlier keys kept"
    );
    // An engine holds the workflow: the beat neither waits nor nudges.
    later().await;
    let mut engine = db.begin().await.expect("tx");
    sqlx::query("SELECT id FROM workflows WHERE id = $1 FOR UPDATE")
        .bind(&wf.id)
        .execute(&mut *engine)
        .await
        .expect("hold");
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        bcm_db::agents::heartbeat_record(&db, &node, kind, &serde_json::json!({"seen": 2})),
    )
    .await
    .expect("a held workflow is skipped, not waited for")
    .expect("third beat");
    drop(engine);
    assert!(
        !due_within_a_minute().await,
        "a held workflow's step was nudged"
    );
    assert_eq!(
        bcm_db::agents::node_fact_fetch(&db, &node, kind)
            .await
            .expect("fact"),
        Some(serde_json::json!({"role": "node", "seen": 2, "event": "heartbeat"}))
    );
}

#[tokio::test]
async fn the_relays_read_leaves_out_what_is_in_flight_and_marks_only_what_was_acknowledged() {
    let db = support::fresh_db("relay_read").await;
    let mut tx = db.begin().await.expect("tx");
    let msgs: Vec<bcm_db::outbox::NewOutboxMessage> = (0..5)
        .map(|i| bcm_db::outbox::NewOutboxMessage {
            id: format!("ev-{i}"),
            subject: "t.events".into(),
            payload: serde_json::json!({ "i": i }),
            headers: Default::default(),
            node_id: None,
        })
        .collect();
    // The db crate's own insert, which services reach only through
    // bcm_metal's stamping write.
    #[allow(clippy::disallowed_methods)]
    let inserted = bcm_db::outbox::outbox_insert_in_txn(&mut tx, &msgs).await;
    inserted.expect("insert");
    tx.commit().await.expect("commit");
    let mut lease = bcm_db::outbox::RelayLease::try_acquire(&db)
        .await
        .expect("lease")
        .expect("no other relay");
    let ids = |rows: &[bcm_db::outbox::OutboxMessage]| -> Vec<String> {
        rows.iter().map(|r| r.id.clone()).collect()
    };
    let seqs = |rows: &[bcm_db::outbox::OutboxMessage]| -> Vec<i64> {
        rows.iter().map(|r| r.seq).collect()
    };

    let first = lease.mark_and_fetch(&[], &[], 2).await.expect("read");
    assert_eq!(ids(&first), ["ev-0", "ev-1"]);
    // The first batch in flight: the next read passes over it, marks nothing.
    let second = lease
        .mark_and_fetch(&[], &seqs(&first), 2)
        .await
        .expect("read");
    assert_eq!(ids(&second), ["ev-2", "ev-3"]);
    assert_eq!(
        bcm_db::outbox::outbox_backlog(&db).await.expect("backlog"),
        5
    );
    // The first acknowledged, the second in flight.
    let third = lease
        .mark_and_fetch(&seqs(&first), &seqs(&second), 10)
        .await
        .expect("read");
    assert_eq!(
        ids(&third),
        ["ev-4"],
        "neither the marked batch nor the one in flight"
    );
    assert_eq!(
        bcm_db::outbox::outbox_backlog(&db).await.expect("backlog"),
        3,
        "only the acknowledged batch is marked"
    );
    let none = lease
        .mark_and_fetch(&seqs(&second), &seqs(&third), 10)
        .await
        .expect("read");
    assert!(none.is_empty(), "{:?}", ids(&none));
    assert_eq!(
        bcm_db::outbox::outbox_backlog(&db).await.expect("backlog"),
        1
    );
    // A relay that stopped here (the last batch published, not marked)
    // reads it again from the start.
    let again = lease.mark_and_fetch(&[], &[], 10).await.expect("read");
    assert_eq!(ids(&again), ["ev-4"]);
}
