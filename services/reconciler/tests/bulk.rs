//! `metal.bulk` under the destructive-batch quorum, driven by the real
//! API, engine, reconciler (the bulk runner) and a simulated site that
//! verifies every destructive command's authority against its own anchor.

use bcm_contracts::batch::BatchHeader;
use bcm_core::{NodeId, ProvisionState};
use bcm_testkit::{tenant_a, Options, TestEnv};
use serde_json::{json, Value};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

fn header(batch: &Value) -> BatchHeader {
    serde_json::from_value(batch["header"].clone()).expect("a batch header")
}

/// Approver `n`'s (1-based) signature over the batch.
fn signature(env: &TestEnv, n: usize, batch: &Value) -> String {
    bcm_quorum::sign(&env.quorum.approvers[n - 1], &header(batch))
}

async fn approve(env: &TestEnv, token: &str, n: usize, batch: &Value) -> (u16, Value) {
    let id = batch["header"]["batchId"].as_str().expect("id");
    env.post(
        &format!("/api/compute/metal/batches/{id}/approve"),
        Some(token),
        &json!({"approverId": format!("approver-{n}"), "signature": signature(env, n, batch),
                "digest": batch["digest"]}),
    )
    .await
    .expect("approve")
}

async fn batch(env: &TestEnv, id: &str) -> Value {
    let (s, b) = env
        .get(
            &format!("/api/compute/metal/batches/{id}"),
            Some(&env.admin_token),
        )
        .await
        .expect("get");
    assert_eq!(s, 200, "{b}");
    b
}

async fn ready_sims(env: &TestEnv, prefix: &str, n: usize) -> Vec<NodeId> {
    let ids = env.enroll_sims(prefix, n).await;
    for id in &ids {
        env.wait_state(id, ProvisionState::Ready, T)
            .await
            .expect("ready");
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_undeploy_signed_by_two_of_three_releases_every_admitted_node_in_waves() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let tokens = env.register_approvers().await.expect("approvers");
    // Waves of at most 3 nodes.
    let (s, b) = env
        .put(
            "/api/compute/admin/pools/a-pool",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "gpu-redfish",
                    "quorum": {"required": 2, "autoApproveSingle": true, "bulkConcurrency": 3}}),
        )
        .await
        .expect("pool");
    assert_eq!(s, 204, "{b}");
    let ids = ready_sims(&env, "bulk", 10).await;
    let (deployed, idle) = ids.split_at(8);
    for id in deployed {
        env.verb_ok(
            "deploy",
            id,
            json!({"profileId": "ubuntu-24.04", "profileVersion": 1}),
        )
        .await;
    }
    for id in deployed {
        env.wait_state(id, ProvisionState::Deployed, T)
            .await
            .expect("deployed");
    }
    let events = env
        .events_consumer("bulk-events", &env.subjects().event(&tenant_a(), "bulk.>"))
        .await
        .expect("consumer");
    let provision = env
        .events_consumer(
            "bulk-provision",
            &env.subjects()
                .event(&tenant_a(), "node.provision.releasing"),
        )
        .await
        .expect("consumer");

    // Two nodes in `ready` and one that does not exist are refused, each
    // with its code; the others are admitted into one batch.
    let unknown = NodeId::generate();
    let mut node_ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
    node_ids.push(unknown.to_string());
    let (s, bulk) = env
        .post(
            "/api/compute/metal/bulk",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "poolId": "a-pool", "verb": "undeploy", "wipe": "quick",
                    "nodeIds": node_ids, "reason": "rack 7 goes back to the pool"}),
        )
        .await
        .expect("bulk");
    assert_eq!(s, 200, "{bulk}");
    let refused: Vec<(String, String)> = bulk["refused"]
        .as_array()
        .expect("refused")
        .iter()
        .map(|r| {
            (
                r["nodeId"].as_str().unwrap_or_default().to_owned(),
                r["code"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let mut want: Vec<(String, String)> = idle
        .iter()
        .map(|i| (i.to_string(), "INVALID_STATE".to_owned()))
        .collect();
    want.push((unknown.to_string(), "NOT_FOUND".to_owned()));
    assert_eq!(refused, want);
    let b = &bulk["batch"];
    assert_eq!(b["state"], "awaiting-approval");
    assert_eq!(b["header"]["leafCount"], 8);
    assert_eq!(b["counts"]["queued"], 8);
    assert_eq!(b["errors"]["INVALID_STATE"], 2);
    assert_eq!(b["errors"]["NOT_FOUND"], 1);
    let id = b["header"]["batchId"].as_str().expect("id").to_owned();
    // The digest is the header's, as anyone can rebuild it.
    assert_eq!(
        b["digest"].as_str(),
        Some(hex::encode(bcm_quorum::digest(&header(b))).as_str())
    );
    // And the root is the leaves', listed by the API in order.
    let (_, leaves) = env
        .get(
            &format!("/api/compute/metal/batches/{id}/nodes"),
            Some(&env.admin_token),
        )
        .await
        .expect("leaves");
    let admitted: Vec<String> = leaves
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["leafIndex"].is_number())
        .map(|n| n["nodeId"].as_str().unwrap_or_default().to_owned())
        .collect();
    let rebuilt = bcm_quorum::build(
        &admitted,
        bcm_core::batch::Operation::Undeploy,
        Some(bcm_core::WipeMode::Quick),
    )
    .expect("leaves");
    assert_eq!(b["header"]["root"].as_str(), Some(rebuilt.root.as_str()));

    // One approval is not a quorum: nothing starts.
    let (s, one) = approve(&env, &tokens[0], 1, b).await;
    assert_eq!(s, 200, "{one}");
    assert_eq!(one["state"], "awaiting-approval");
    for n in deployed {
        assert_eq!(
            env.node(n).await.expect("node").provision_state,
            ProvisionState::Deployed
        );
    }
    let (s, two) = approve(&env, &tokens[2], 3, b).await;
    assert_eq!(s, 200, "{two}");
    assert_eq!(two["state"], "approved");

    // Waves: never more than three started at once, until all are ready.
    let most_started = std::sync::atomic::AtomicU64::new(0);
    let done = bcm_testkit::eventually(T * 2, || async {
        let now = batch(&env, &id).await;
        most_started.fetch_max(
            now["counts"]["started"].as_u64().unwrap_or(0),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok((now["state"] == "finished").then_some(now))
    })
    .await
    .expect("the bulk finished");
    let most_started = most_started.into_inner();
    assert!(
        most_started <= 3,
        "a wave started {most_started} nodes at once"
    );
    assert_eq!(done["counts"]["succeeded"], 8, "{done}");
    assert_eq!(done["counts"]["refused"], 3);
    for n in deployed {
        let node = env.node(n).await.expect("node");
        assert_eq!(node.provision_state, ProvisionState::Ready);
        assert_eq!(node.batch_id.as_deref(), Some(id.as_str()));
    }

    // bulk.created, bulk.approved, progress, bulk.finished; every node's
    // events name the batch.
    let seen = events.drain(Duration::from_secs(2)).await.expect("events");
    let types: Vec<&str> = seen.iter().map(|e| e.event.ty.as_str()).collect();
    assert_eq!(types.first(), Some(&"bulk.created"), "{types:?}");
    assert!(types.contains(&"bulk.approved"), "{types:?}");
    assert!(types.contains(&"bulk.progress"), "{types:?}");
    assert_eq!(types.last(), Some(&"bulk.finished"), "{types:?}");
    assert!(seen
        .iter()
        .all(|e| e.event.batchid.as_deref() == Some(id.as_str())));
    let releasing = provision.read(8, T).await.expect("releasing events");
    assert!(releasing
        .iter()
        .all(|e| e.event.batchid.as_deref() == Some(id.as_str())));
    // Every destructive command of the release was sent under the batch.
    for n in deployed {
        let cmds = bcm_db::commands::commands_of_node(&env.db, &n.to_string())
            .await
            .expect("commands");
        let wipes: Vec<_> = cmds.iter().filter(|c| c.kind == "disk.wipe").collect();
        assert!(wipes
            .iter()
            .any(|c| c.batch_id.as_deref() == Some(id.as_str())));
    }
}

#[tokio::test]
async fn approvals_are_refused_for_every_bad_signature_and_bad_requests_change_nothing() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let tokens = env.register_approvers().await.expect("approvers");
    let (s, b) = env
        .put(
            "/api/compute/admin/pools/a-pool",
            Some(&env.admin_token),
            // Fewer than the sites' anchor asks (2): the anchor is the floor.
            &json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "gpu-redfish",
                    "quorum": {"required": 1}}),
        )
        .await
        .expect("pool");
    assert_eq!(s, 204, "{b}");
    let ids = ready_sims(&env, "sig", 2).await;
    // approver-3 may also request (a provision grant on the tenant).
    let requester = env
        .token("approver-3", &[("compute:nodes:provision", "tenant", "a")])
        .await
        .expect("token");
    let body = |ids: Value| {
        json!({"tenantId": "a", "poolId": "a-pool", "verb": "inspect", "nodeIds": ids,
               "reason": "re-inspect after the BIOS update"})
    };
    let ids_json = json!(ids.iter().map(ToString::to_string).collect::<Vec<_>>());

    // Garbage requests: 400, nothing written.
    for bad in [
        body(json!([])),
        body(json!(["node_nope"])),
        body(json!(vec![ids[0].to_string(); 10_001])),
        json!({"tenantId": "a", "poolId": "a-pool", "verb": "inspect", "nodeIds": ids_json, "reason": "x\u{0}"}),
        json!({"tenantId": "a", "poolId": "a-pool", "verb": "deploy", "nodeIds": ids_json, "reason": "r"}),
        json!({"tenantId": "a", "poolId": "a-pool", "verb": "inspect", "nodeIds": ids_json, "reason": "r", "expiresInSecs": 5}),
        json!({"tenantId": "a", "poolId": "a-pool", "verb": "inspect", "nodeIds": ids_json, "reason": "r", "extra": 1}),
    ] {
        let (s, b) = env
            .post("/api/compute/metal/bulk", Some(&requester), &bad)
            .await
            .expect("post");
        assert_eq!(
            (s, b["code"].as_str()),
            (400, Some("INVALID_ARGUMENT")),
            "{bad:.200} → {b}"
        );
    }
    // A node named twice is a conflict; a wipe on another verb than
    // undeploy is a request this verb cannot serve.
    let (s, b) = env
        .post(
            "/api/compute/metal/bulk",
            Some(&requester),
            &body(json!([ids[0].to_string(), ids[0].to_string()])),
        )
        .await
        .expect("post");
    assert_eq!((s, b["code"].as_str()), (409, Some("CONFLICT")), "{b}");
    let (s, b) = env
        .post(
            "/api/compute/metal/bulk",
            Some(&requester),
            &json!({"tenantId": "a", "poolId": "a-pool", "verb": "inspect", "nodeIds": ids_json, "reason": "r", "wipe": "quick"}),
        )
        .await
        .expect("post");
    assert_eq!(
        (s, b["code"].as_str()),
        (422, Some("INVALID_CONFIG")),
        "{b}"
    );
    let (s, _) = env
        .post(
            "/api/compute/metal/bulk",
            Some(&requester),
            &json!({"tenantId": "b", "poolId": "b-pool", "verb": "inspect", "nodeIds": ids_json, "reason": "r"}),
        )
        .await
        .expect("post");
    assert_eq!(s, 404, "another tenant's pool is not there for this token");
    let (s, list) = env
        .get("/api/compute/metal/batches", Some(&env.admin_token))
        .await
        .expect("list");
    assert_eq!((s, list.as_array().map(Vec::len)), (200, Some(0)));

    let (s, bulk) = env
        .post(
            "/api/compute/metal/bulk",
            Some(&requester),
            &body(ids_json.clone()),
        )
        .await
        .expect("bulk");
    assert_eq!(s, 200, "{bulk}");
    let b = bulk["batch"].clone();
    assert_eq!(
        b["quorumRequired"], 2,
        "a pool asking fewer approvers than the edges' anchor gets the anchor's count: {b}"
    );
    let id = b["header"]["batchId"].as_str().expect("id").to_owned();
    let path = format!("/api/compute/metal/batches/{id}/approve");
    let post = |token: &str, body: Value| {
        let (path, token) = (path.clone(), token.to_owned());
        let env = &env;
        async move { env.post(&path, Some(&token), &body).await.expect("post") }
    };
    let code = |r: &(u16, Value)| (r.0, r.1["code"].as_str().map(str::to_owned));
    // An approver id nobody registered: its key is unknown.
    let r = post(
        &tokens[0],
        json!({"approverId": "mallory", "signature": signature(&env, 1, &b)}),
    )
    .await;
    assert_eq!(code(&r), (403, Some("FORBIDDEN".into())), "{}", r.1);
    // Signing as another approver.
    let r = post(
        &tokens[0],
        json!({"approverId": "approver-2", "signature": signature(&env, 2, &b)}),
    )
    .await;
    assert_eq!(code(&r), (403, Some("FORBIDDEN".into())), "{}", r.1);
    // A signature by another key.
    let r = post(
        &tokens[0],
        json!({"approverId": "approver-1", "signature": signature(&env, 2, &b)}),
    )
    .await;
    assert_eq!(code(&r), (403, Some("FORBIDDEN".into())), "{}", r.1);
    assert!(
        r.1["message"]
            .as_str()
            .unwrap_or_default()
            .contains("digest"),
        "{}",
        r.1
    );
    // Over another batch's digest (another reason).
    let mut other = header(&b);
    other.reason_sha256 = bcm_quorum::reason_sha256("something else");
    let r = post(
        &tokens[0],
        json!({"approverId": "approver-1",
        "signature": bcm_quorum::sign(&env.quorum.approvers[0], &other)}),
    )
    .await;
    assert_eq!(code(&r), (403, Some("FORBIDDEN".into())), "{}", r.1);
    // The digest the approver says it checked is not the batch's.
    let r = post(
        &tokens[0],
        json!({"approverId": "approver-1", "signature": signature(&env, 1, &b),
        "digest": "00".repeat(32)}),
    )
    .await;
    assert_eq!(code(&r), (400, Some("INVALID_ARGUMENT".into())), "{}", r.1);
    // Garbage signature.
    let r = post(
        &tokens[0],
        json!({"approverId": "approver-1", "signature": "%%%"}),
    )
    .await;
    assert_eq!(code(&r), (403, Some("FORBIDDEN".into())), "{}", r.1);
    // The requester may not approve its own batch (the default policy).
    let r = post(
        &tokens[2],
        json!({"approverId": "approver-3", "signature": signature(&env, 3, &b)}),
    )
    .await;
    assert_eq!(code(&r), (403, Some("FORBIDDEN".into())), "{}", r.1);
    assert!(
        r.1["message"]
            .as_str()
            .unwrap_or_default()
            .contains("requested"),
        "{}",
        r.1
    );
    // A good one, then the same approver again.
    let r = approve(&env, &tokens[0], 1, &b).await;
    assert_eq!(r.0, 200, "{}", r.1);
    let r = approve(&env, &tokens[0], 1, &b).await;
    assert_eq!(code(&r), (409, Some("CONFLICT".into())), "{}", r.1);
    let now = batch(&env, &id).await;
    assert_eq!(now["state"], "awaiting-approval");
    assert_eq!(now["approvals"].as_array().map(Vec::len), Some(1));
    // A rejection ends it; nothing of it runs, and no approval counts after.
    let (s, rej) = env
        .post(
            &format!("/api/compute/metal/batches/{id}/reject"),
            Some(&tokens[1]),
            &json!({"approverId": "approver-2", "reason": "not during the freeze"}),
        )
        .await
        .expect("reject");
    assert_eq!(s, 200, "{rej}");
    assert_eq!(rej["state"], "rejected");
    assert_eq!(rej["counts"]["cancelled"], 2);
    let r = approve(&env, &tokens[1], 2, &b).await;
    assert_eq!(code(&r), (409, Some("INVALID_STATE".into())), "{}", r.1);
    for n in &ids {
        assert_eq!(
            env.node(n).await.expect("node").provision_state,
            ProvisionState::Ready
        );
    }
    let (s, _) = env
        .get(
            "/api/compute/metal/batches/bat_nope",
            Some(&env.admin_token),
        )
        .await
        .expect("get");
    assert_eq!(s, 404);
}

#[tokio::test]
async fn a_pool_without_auto_approval_holds_single_verbs_and_power_until_approvers_sign() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let tokens = env.register_approvers().await.expect("approvers");
    let (s, b) = env
        .put(
            "/api/compute/admin/pools/a-pool",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "gpu-redfish",
                    "quorum": {"required": 2, "autoApproveSingle": false}}),
        )
        .await
        .expect("pool");
    assert_eq!(s, 204, "{b}");
    let id = env.enroll_sim("held").await;
    // Verifying and out-of-band inspection read only; booting the ramdisk
    // is the first destructive step, and it waits for the approvers.
    env.wait_state(&id, ProvisionState::Inspecting, T)
        .await
        .expect("inspecting");
    let node = env.node(&id).await.expect("node");
    let enroll_batch = node.batch_id.clone().expect("the enroll batch");
    let b = batch(&env, &enroll_batch).await;
    assert_eq!(b["state"], "awaiting-approval");
    assert_eq!(b["header"]["operation"], "enroll");
    let destructive = |cmds: &[bcm_db::commands::CommandRow]| {
        cmds.iter()
            .filter(|c| bcm_contracts::CommandKind::parse(&c.kind).is_ok_and(|k| k.destructive()))
            .count()
    };
    let cmds = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    assert_eq!(destructive(&cmds), 0, "nothing destructive was sent");
    assert_eq!(approve(&env, &tokens[0], 1, &b).await.0, 200);
    assert_eq!(approve(&env, &tokens[1], 2, &b).await.0, 200);
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("approved: the chain goes on to ready");

    // metal.power: a one-leaf batch; the command is held until signed.
    let before = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands")
        .len();
    env.verb_ok("power", &id, json!({"action": "off"})).await;
    let (_, list) = env
        .get(
            &format!("/api/compute/metal/batches?nodeId={id}"),
            Some(&env.admin_token),
        )
        .await
        .expect("list");
    let power = list
        .as_array()
        .expect("batches")
        .iter()
        .find(|b| b["header"]["operation"] == "power-off")
        .cloned()
        .expect("a power batch");
    assert_eq!(power["state"], "awaiting-approval");
    assert_eq!(power["header"]["leafCount"], 1);
    let held = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    assert_eq!(held.len(), before + 1);
    let cmd = held.last().expect("the power command").clone();
    assert_eq!(
        (cmd.kind.as_str(), cmd.batch_id.as_deref()),
        ("bmc.power", None)
    );
    assert_eq!(env.executions.count(&cmd.id), 0, "not sent");
    assert_eq!(approve(&env, &tokens[0], 1, &power).await.0, 200);
    assert_eq!(env.executions.count(&cmd.id), 0, "one approval is not two");
    assert_eq!(approve(&env, &tokens[2], 3, &power).await.0, 200);
    let ran = bcm_testkit::eventually(T, || async {
        let c = bcm_db::commands::command_fetch(&env.db, &cmd.id).await?;
        Ok((c.status.as_str() == "succeeded").then_some(c))
    })
    .await
    .expect("the released power command ran");
    assert_eq!(ran.batch_id.as_deref(), power["header"]["batchId"].as_str());
    assert_eq!(env.executions.count(&cmd.id), 1);

    // A verb's batch whose chain runs is not cancelled (abort stops it).
    let (s, b) = env
        .post(
            &format!("/api/compute/metal/batches/{enroll_batch}/cancel"),
            Some(&env.admin_token),
            &json!({}),
        )
        .await
        .expect("cancel");
    assert_eq!((s, b["code"].as_str()), (409, Some("INVALID_STATE")), "{b}");

    // A power command whose batch is rejected goes out without authority:
    // the site refuses it unrun and the command ends failed, not waiting.
    env.verb_ok("power", &id, json!({"action": "on"})).await;
    let (_, list) = env
        .get(
            &format!("/api/compute/metal/batches?nodeId={id}"),
            Some(&env.admin_token),
        )
        .await
        .expect("list");
    let held_batch = list
        .as_array()
        .expect("batches")
        .iter()
        .find(|b| b["header"]["operation"] == "power-on" && b["state"] == "awaiting-approval")
        .cloned()
        .expect("the second power batch");
    let held = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands")
        .last()
        .cloned()
        .expect("the held command");
    let (s, b) = env
        .post(
            &format!(
                "/api/compute/metal/batches/{}/reject",
                held_batch["header"]["batchId"].as_str().expect("id")
            ),
            Some(&tokens[1]),
            &json!({"approverId": "approver-2", "reason": "not now"}),
        )
        .await
        .expect("reject");
    assert_eq!(s, 200, "{b}");
    let failed = bcm_testkit::eventually(T, || async {
        let c = bcm_db::commands::command_fetch(&env.db, &held.id).await?;
        Ok((c.status.as_str() == "failed").then_some(c))
    })
    .await
    .expect("the refused command ended");
    assert!(
        failed
            .result
            .map(|r| r.to_string())
            .unwrap_or_default()
            .contains("FORBIDDEN"),
        "refused by the site"
    );
    assert_eq!(env.executions.count(&held.id), 0, "never ran");
}
