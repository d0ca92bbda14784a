//! Bad input gets a clear `{code, message}` error with the right status and
//! changes nothing: no state change, no version bump, no outbox row.

use bcm_core::NodeId;
use bcm_testkit::TestEnv;
use serde_json::{json, Value};

async fn unchanged(env: &TestEnv, id: &NodeId, version: i64) {
    let n = env.node(id).await.expect("node");
    assert_eq!(n.version, version, "no version bump");
    assert_eq!(n.provision_state, bcm_core::ProvisionState::Ready);
}

fn assert_error(got: &(u16, Value), status: u16, code: &str) {
    assert_eq!(got.0, status, "{got:?}");
    assert_eq!(got.1["code"], code, "{got:?}");
    assert!(
        got.1["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{got:?}"
    );
}

#[tokio::test]
async fn bad_input_is_refused_clearly_and_changes_nothing() {
    let env = TestEnv::start().await.expect("env");
    let node = env.enroll("a", "a-pool").await.expect("enroll");
    let id: NodeId = node["nodeId"]
        .as_str()
        .expect("id")
        .parse()
        .expect("node id");
    let version = env
        .force_state(&id, bcm_core::ProvisionState::Ready, None)
        .await
        .expect("ready");
    let admin = env.admin_token.clone();
    let a_ro = env
        .token("a-reader", &[("compute:nodes:read", "tenant", "a")])
        .await
        .expect("token");
    let b_all = env
        .token(
            "b-operator",
            &[
                ("compute:nodes:provision", "tenant", "b"),
                ("compute:nodes:read", "tenant", "b"),
            ],
        )
        .await
        .expect("token");
    let outbox_before = bcm_db::outbox::outbox_backlog(&env.db)
        .await
        .expect("backlog");
    let nid = id.to_string();

    // Unknown field.
    let got = env.post("/api/compute/metal/deploy", Some(&admin),
        &json!({"tenantId": "a", "nodeId": nid, "profileId": "p", "profileVersion": 1, "force": true})).await.expect("post");
    assert_error(&got, 400, "INVALID_ARGUMENT");
    assert!(
        got.1["message"]
            .as_str()
            .is_some_and(|m| m.contains("unknown field")),
        "{got:?}"
    );

    // A 513-character reason (512 is fine but abort is illegal from ready).
    let got = env
        .post(
            "/api/compute/metal/abort",
            Some(&admin),
            &json!({"tenantId": "a", "nodeId": nid, "reason": "x".repeat(513)}),
        )
        .await
        .expect("post");
    assert_error(&got, 400, "INVALID_ARGUMENT");
    let got = env
        .post(
            "/api/compute/metal/abort",
            Some(&admin),
            &json!({"tenantId": "a", "nodeId": nid, "reason": "x".repeat(512)}),
        )
        .await
        .expect("post");
    assert_error(&got, 409, "INVALID_STATE");

    // A bad wipe mode.
    let got = env
        .post(
            "/api/compute/metal/undeploy",
            Some(&admin),
            &json!({"tenantId": "a", "nodeId": nid, "wipe": "shred"}),
        )
        .await
        .expect("post");
    assert_error(&got, 400, "INVALID_ARGUMENT");

    // A malformed node id, in a body and in a path.
    let got = env
        .post(
            "/api/compute/metal/provide",
            Some(&admin),
            &json!({"tenantId": "a", "nodeId": "node_../../etc"}),
        )
        .await
        .expect("post");
    assert_error(&got, 400, "INVALID_ARGUMENT");
    let got = env
        .get("/api/compute/metal/nodes/not-a-node", Some(&admin))
        .await
        .expect("get");
    assert_error(&got, 400, "INVALID_ARGUMENT");

    // Malformed JSON.
    let got = env
        .post_raw(
            "/api/compute/metal/provide",
            Some(&admin),
            "{\"tenantId\": ",
        )
        .await
        .expect("post");
    assert_error(&got, 400, "INVALID_ARGUMENT");

    // A NUL character, which Postgres cannot store: refused, nothing kept.
    let got = env
        .put(
            "/api/compute/admin/tenants/nul",
            Some(&admin),
            &json!({"name": "Acme\u{0} Corp"}),
        )
        .await
        .expect("put");
    assert_error(&got, 400, "INVALID_ARGUMENT");
    // No tenant `nul` exists: a pool of it refers to a missing row.
    let got = env
        .put(
            "/api/compute/admin/pools/nul-pool",
            Some(&admin),
            &json!({"tenantId": "nul", "siteId": "s1", "hardwareProfile": "gpu-redfish"}),
        )
        .await
        .expect("put");
    assert_error(&got, 404, "NOT_FOUND");

    // No token, a malformed header, an unknown token.
    let got = env
        .post(
            "/api/compute/metal/provide",
            None,
            &json!({"tenantId": "a", "nodeId": nid}),
        )
        .await
        .expect("post");
    assert_error(&got, 401, "UNAUTHENTICATED");
    let got = env
        .post(
            "/api/compute/metal/provide",
            Some("bcm_not-a-real-token"),
            &json!({"tenantId": "a", "nodeId": nid}),
        )
        .await
        .expect("post");
    assert_error(&got, 401, "UNAUTHENTICATED");

    // A token that sees the node but lacks the grant.
    let got = env
        .post(
            "/api/compute/metal/provide",
            Some(&a_ro),
            &json!({"tenantId": "a", "nodeId": nid}),
        )
        .await
        .expect("post");
    assert_error(&got, 403, "FORBIDDEN");
    let got = env
        .post(
            "/api/compute/metal/power",
            Some(&a_ro),
            &json!({"tenantId": "a", "nodeId": nid, "action": "on"}),
        )
        .await
        .expect("post");
    assert_error(&got, 403, "FORBIDDEN");

    // Tenant B's token does not learn that tenant A's node exists.
    let got = env
        .post(
            "/api/compute/metal/provide",
            Some(&b_all),
            &json!({"tenantId": "a", "nodeId": nid}),
        )
        .await
        .expect("post");
    assert_error(&got, 404, "NOT_FOUND");
    let got = env
        .post(
            "/api/compute/metal/provide",
            Some(&b_all),
            &json!({"tenantId": "b", "nodeId": nid}),
        )
        .await
        .expect("post");
    assert_error(&got, 404, "NOT_FOUND");
    let got = env
        .get(&format!("/api/compute/metal/nodes/{nid}"), Some(&b_all))
        .await
        .expect("get");
    assert_error(&got, 404, "NOT_FOUND");
    let got = env
        .get("/api/compute/metal/nodes?tenantId=a", Some(&b_all))
        .await
        .expect("list");
    assert_eq!(got.0, 200);
    assert_eq!(
        got.1["items"].as_array().map(Vec::len),
        Some(0),
        "B lists none of A's nodes"
    );

    // A node id that does not exist.
    let got = env
        .post(
            "/api/compute/metal/provide",
            Some(&admin),
            &json!({"tenantId": "a", "nodeId": NodeId::generate().to_string()}),
        )
        .await
        .expect("post");
    assert_error(&got, 404, "NOT_FOUND");

    // Bad list parameters.
    let got = env
        .get("/api/compute/metal/nodes?limit=0", Some(&admin))
        .await
        .expect("list");
    assert_error(&got, 400, "INVALID_ARGUMENT");
    let got = env
        .get("/api/compute/metal/nodes?state=flying", Some(&admin))
        .await
        .expect("list");
    assert_error(&got, 400, "INVALID_ARGUMENT");
    let got = env
        .get("/api/compute/metal/nodes?color=red", Some(&admin))
        .await
        .expect("list");
    assert_error(&got, 400, "INVALID_ARGUMENT");

    // Enroll into a pool of another tenant, and with a bad MAC.
    let got = env
        .post(
            "/api/compute/metal/enroll",
            Some(&admin),
            &json!({"tenantId": "a", "poolId": "b-pool",
        "bmc": {"driver": "redfish", "address": "https://x", "username": "u", "password": "p"}}),
        )
        .await
        .expect("post");
    assert_error(&got, 404, "NOT_FOUND");
    let got = env
        .post(
            "/api/compute/metal/enroll",
            Some(&admin),
            &json!({"tenantId": "a", "poolId": "a-pool", "macs": ["zz:00"],
        "bmc": {"driver": "redfish", "address": "https://y", "username": "u", "password": "p"}}),
        )
        .await
        .expect("post");
    assert_error(&got, 400, "INVALID_ARGUMENT");
    let got = env.post("/api/compute/metal/enroll", Some(&admin), &json!({"tenantId": "a", "poolId": "a-pool",
        "bmc": {"driver": "smoke-signals", "address": "https://y", "username": "u", "password": "p"}})).await.expect("post");
    assert_error(&got, 400, "INVALID_ARGUMENT");

    unchanged(&env, &id, version).await;
    let outbox_after = bcm_db::outbox::outbox_backlog(&env.db)
        .await
        .expect("backlog");
    assert!(
        outbox_after <= outbox_before,
        "no outbox row was added by refused requests"
    );
}
