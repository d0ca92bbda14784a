//! API tokens as principals (issue 18, finding 7): named, scoped, hashed
//! at rest, listed without their secret, and revocable with effect on the
//! very next request. Only the admin lists or revokes; a malformed or
//! unknown id names no token and changes nothing.

use bcm_testkit::{Options, TestEnv};
use serde_json::Value;

async fn delete(env: &TestEnv, path: &str, token: &str) -> (u16, Value) {
    let res = env
        .http
        .delete(format!("{}{path}", env.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("delete");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// Enrolls the simulated machine `sim://<name>` into `a-pool` as `token`.
async fn enroll_as(env: &TestEnv, token: &str, name: &str) -> bcm_core::NodeId {
    let (status, node) = env
        .post(
            "/api/compute/metal/enroll",
            Some(token),
            &serde_json::json!({"tenantId": "a", "poolId": "a-pool",
                "hardwareProfile": "sim", "bmc": {"driver": "sim", "address": format!("sim://{name}"), "username": "admin", "password": "pw"}}),
        )
        .await
        .expect("enroll");
    assert_eq!(status, 200, "{node}");
    node["nodeId"]
        .as_str()
        .and_then(|i| i.parse().ok())
        .expect("id")
}

#[tokio::test]
async fn a_revoked_token_is_refused_on_its_next_request() {
    let env = TestEnv::start_with(Options::default()).await.expect("env");
    let reader = env
        .token("team-a-reader", &[("compute:nodes:read", "tenant", "a")])
        .await
        .expect("token");
    let nodes = "/api/compute/metal/nodes?tenantId=a";
    assert_eq!(env.get(nodes, Some(&reader)).await.expect("get").0, 200);

    // Listed by name and grants; neither the secret nor its hash shows.
    let (status, list) = env
        .get("/api/compute/admin/tokens", Some(&env.admin_token))
        .await
        .expect("list");
    assert_eq!(status, 200, "{list}");
    let text = list.to_string();
    assert!(!text.contains(&reader), "the secret is listed: {text}");
    assert!(
        !text.contains("tokenHash") && !text.contains("token_hash"),
        "{text}"
    );
    let items = list["items"].as_array().expect("items");
    let mine = items
        .iter()
        .find(|t| t["principal"] == "team-a-reader")
        .expect("the token is listed");
    let id = mine["id"].as_str().expect("id").to_owned();
    assert!(mine["revokedAt"].is_null());
    let hash = bcm_db::tokens::api_tokens_list(&env.db)
        .await
        .expect("rows");
    assert!(hash.iter().any(|t| t.id == id));

    // Only the admin lists or revokes.
    assert_eq!(
        env.get("/api/compute/admin/tokens", Some(&reader))
            .await
            .expect("get")
            .0,
        403
    );
    let (status, _) = delete(&env, &format!("/api/compute/admin/tokens/{id}"), &reader).await;
    assert_eq!(status, 403);
    assert_eq!(env.get(nodes, Some(&reader)).await.expect("get").0, 200);

    // Bad ids change nothing.
    let (status, body) = delete(
        &env,
        "/api/compute/admin/tokens/tok_nosuch",
        &env.admin_token,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("NOT_FOUND")),
        "{body}"
    );
    for bad in ["x".repeat(200), "tok_%00%01".to_owned(), "%20".to_owned()] {
        let (status, body) = delete(
            &env,
            &format!("/api/compute/admin/tokens/{bad}"),
            &env.admin_token,
        )
        .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (404, Some("NOT_FOUND")),
            "{bad}: {body}"
        );
    }
    assert_eq!(env.get(nodes, Some(&reader)).await.expect("get").0, 200);

    // Revoked: the next request is refused.
    let (status, revoked) = delete(
        &env,
        &format!("/api/compute/admin/tokens/{id}"),
        &env.admin_token,
    )
    .await;
    assert_eq!(status, 200, "{revoked}");
    let at = revoked["revokedAt"].as_str().expect("revokedAt").to_owned();
    let (status, body) = env.get(nodes, Some(&reader)).await.expect("get");
    assert_eq!(
        (status, body["code"].as_str()),
        (401, Some("UNAUTHENTICATED")),
        "{body}"
    );
    // Revoking again keeps the first time.
    let (status, again) = delete(
        &env,
        &format!("/api/compute/admin/tokens/{id}"),
        &env.admin_token,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(again["revokedAt"].as_str(), Some(at.as_str()));
    env.stop();
}

#[tokio::test]
async fn a_verb_names_its_principal_on_its_event() {
    let env = TestEnv::start_with(Options {
        engine: false,
        ..Options::default()
    })
    .await
    .expect("env");
    let tenant = bcm_testkit::tenant_a();
    let reader = env
        .events_consumer(
            "actors",
            &env.subjects().provision_events_of_tenant(&tenant),
        )
        .await
        .expect("consumer");
    let operator = env
        .token(
            "team-a-operator",
            &[
                ("compute:pools:enroll", "tenant", "a"),
                ("compute:nodes:provision", "tenant", "a"),
            ],
        )
        .await
        .expect("token");
    let id = enroll_as(&env, &operator, "actor-1").await;
    // The admin's verb on the same node: `abort` from `enrolling`.
    env.verb_ok("abort", &id, serde_json::json!({"reason": "test"}))
        .await;
    let events = reader
        .read(2, std::time::Duration::from_secs(20))
        .await
        .expect("events");
    let actor = |mv: &str| {
        events
            .iter()
            .find(|e| e.event.data["move"] == mv)
            .map(|e| e.event.data["actor"].clone())
            .unwrap_or_else(|| panic!("no {mv} event in {events:?}"))
    };
    assert_eq!(actor("enroll"), "team-a-operator");
    assert_eq!(actor("abort"), "admin");
    env.stop();
}

/// Every command a verb causes names its principal: those of the workflow
/// its state runs (and the states the reconciler chains after it), and a
/// one-leaf BMC command (`power`); the control plane's own power reads name
/// nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verbs_commands_name_its_principal() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let operator = env
        .token(
            "team-a-operator",
            &[
                ("compute:pools:enroll", "tenant", "a"),
                ("compute:nodes:provision", "tenant", "a"),
                ("compute:nodes:power", "tenant", "a"),
                ("compute:nodes:read", "tenant", "a"),
            ],
        )
        .await
        .expect("token");
    let id = enroll_as(&env, &operator, "actor-cmds").await;
    env.wait_state(
        &id,
        bcm_core::ProvisionState::Ready,
        std::time::Duration::from_secs(120),
    )
    .await
    .expect("ready");
    let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let kinds: std::collections::BTreeSet<&str> =
        commands.iter().map(|c| c.kind.as_str()).collect();
    // Enrollment's, inspection's and commissioning's: BMC, boot and agent.
    for kind in ["bmc.verify", "site.bootEntry.set", "inventory", "disk.wipe"] {
        assert!(kinds.contains(kind), "no {kind} in {kinds:?}");
    }
    for c in &commands {
        // The reconciler's power reads are the control plane's own.
        let want = (c.kind != "bmc.powerStatus").then_some("team-a-operator");
        assert_eq!(c.actor.as_deref(), want, "{} {}", c.kind, c.id);
    }
    // Its power verb, by the admin this time.
    let (status, body) = env
        .verb("power", &id, serde_json::json!({"action": "off"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let power = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands")
        .into_iter()
        .filter(|c| c.kind == "bmc.power")
        .max_by_key(|c| c.created_at)
        .expect("a power command");
    assert_eq!(power.actor.as_deref(), Some("admin"));
    env.stop();
}
