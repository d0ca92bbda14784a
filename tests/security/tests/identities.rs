//! Bound agent identities (issue 18, finding 4): a certificate names the
//! node, the purpose it was issued for and the node's identity epoch; a
//! command is handed to, and a result kept from, only an identity of the
//! purpose the command is for; release, undeploy and retire end every
//! identity in a new epoch (the ramdisk's ends with any transition), and
//! every result — signed or not — is checked against revocation; a
//! heartbeat is never taken for a join.

use base64::Engine as _;
use bcm_db::agents::TokenScope;
use bcm_testkit::TestEnv;
use chrono::{DateTime, Utc};
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{json, Value};

async fn token(env: &TestEnv, node: &str, purpose: &str) -> String {
    let mut tx = env.db.begin().await.expect("tx");
    let t = bcm_metal::identity::mint_join_token_in_txn(
        &mut tx,
        purpose,
        &TokenScope::Node(node.into()),
        Utc::now() + chrono::Duration::minutes(10),
    )
    .await
    .expect("mint");
    tx.commit().await.expect("commit");
    t
}

struct Agent {
    key: SigningKey,
    session: String,
    serial: String,
    certificate: String,
    ca: String,
}

async fn join(env: &TestEnv, node: &str, purpose: &str, role: &str) -> Agent {
    let token = token(env, node, purpose).await;
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let csr = bcm_pki::csr_pem(&key, "agent").expect("csr");
    let (status, body) = env
        .post(
            "/api/agent/join",
            None,
            &json!({"token": token, "csr": csr, "role": role}),
        )
        .await
        .expect("join");
    assert_eq!(status, 200, "join as {purpose}: {body}");
    let text = |k: &str| body[k].as_str().expect(k).to_owned();
    Agent {
        key,
        session: text("sessionToken"),
        serial: text("certSerial"),
        certificate: text("certificate"),
        ca: text("caCertificate"),
    }
}

async fn wipe_command(env: &TestEnv, node: &str) -> String {
    let id = format!("cmd_{}", ulid::Ulid::new().to_string().to_lowercase());
    let mut tx = env.db.begin().await.expect("tx");
    bcm_db::commands::command_insert_in_txn(
        &mut tx,
        &bcm_db::commands::NewCommand {
            id: id.clone(),
            idempotency_key: id.clone(),
            workflow_id: None,
            step_idx: None,
            attempt: 1,
            node_id: Some(node.into()),
            site_id: Some("s1".into()),
            kind: "disk.wipe".into(),
            target: "ramdisk".into(),
            params: json!({"mode": "quick"}),
            actor: None,
            traceparent: None,
            batch_id: None,
        },
    )
    .await
    .expect("insert");
    tx.commit().await.expect("commit");
    id
}

async fn poll(env: &TestEnv, agent: &Agent) -> (u16, Vec<Value>) {
    let (status, body) = env
        .get("/api/agent/commands?waitMs=300", Some(&agent.session))
        .await
        .expect("poll");
    (status, body.as_array().cloned().unwrap_or_default())
}

/// A verified quick wipe of one disk, signed by `key` over the command as
/// stored (`issued_at` is its `issuedAt`).
fn signed_wipe(key: &SigningKey, node: &str, id: &str, issued_at: DateTime<Utc>) -> Value {
    let output = json!({"disks": [{
        "name": "vda", "serial": "S1", "model": "QEMU HARDDISK", "sizeBytes": 1_073_741_824u64,
        "transport": "virtio", "method": "quick",
        "wipedRegions": [{"offset": 0, "len": 4096}],
        "verifiedRegions": [{"name": "head", "offset": 0, "len": 4096, "ok": true}],
        "outcome": "verified", "millis": 3
    }]});
    let finished = Utc::now();
    let input = bcm_pki::signing_input(&bcm_pki::SignedFacts {
        command_id: id,
        node_id: node,
        kind: "disk.wipe",
        params: &json!({"mode": "quick"}),
        issued_at,
        ok: true,
        output: &output,
        error: None,
        finished_at: finished,
    });
    json!({
        "commandId": id, "ok": true, "output": output, "finishedAt": finished,
        "signature": base64::engine::general_purpose::STANDARD.encode(key.sign(&input).to_bytes()),
    })
}

async fn post_result(env: &TestEnv, agent: &Agent, result: &Value) -> (u16, Value) {
    env.post("/api/agent/results", Some(&agent.session), result)
        .await
        .expect("post result")
}

async fn command(env: &TestEnv, id: &str) -> bcm_db::commands::CommandRow {
    let mut tx = env.db.begin().await.expect("tx");
    let c = bcm_db::commands::command_fetch_in_txn(&mut tx, id)
        .await
        .expect("command");
    tx.rollback().await.expect("rollback");
    c
}

async fn heartbeat(env: &TestEnv, agent: &Agent, role: &str) -> u16 {
    heartbeat_answer(env, agent, role).await.0
}

/// A heartbeat's status and the cadence its answer asks for.
async fn heartbeat_answer(env: &TestEnv, agent: &Agent, role: &str) -> (u16, Option<u64>) {
    let (status, body) = env
        .post(
            "/api/agent/heartbeat",
            Some(&agent.session),
            &json!({ "role": role }),
        )
        .await
        .expect("heartbeat");
    (status, body["nextHeartbeatSecs"].as_u64())
}

/// A node enrolled in tenant `a`'s pool, by id.
async fn enrolled(env: &TestEnv) -> String {
    env.enroll("a", "a-pool").await.expect("enroll")["nodeId"]
        .as_str()
        .expect("id")
        .to_owned()
}

fn epoch_of(agent: &Agent) -> u32 {
    bcm_pki::ca::check_against(&agent.ca, &agent.certificate, Utc::now())
        .expect("the certificate chains to the CA")
        .epoch
}

#[tokio::test]
async fn an_installed_os_identity_gets_no_ramdisk_command_and_its_result_is_refused() {
    let env = TestEnv::start().await.expect("env");
    let node = enrolled(&env).await;
    let os = join(&env, &node, "provisioned", "node").await;
    let checked =
        bcm_pki::ca::check_against(&os.ca, &os.certificate, Utc::now()).expect("chains to the CA");
    assert_eq!(
        (
            checked.node_id.as_str(),
            checked.purpose.as_str(),
            checked.epoch
        ),
        (node.as_str(), "provisioned", 0),
        "the certificate names node, purpose and epoch"
    );
    let id = wipe_command(&env, &node).await;
    let issued = command(&env, &id).await.created_at;

    // The installed OS is handed nothing, and its answer — signed with its
    // own certificate's key — is refused and changes nothing.
    assert_eq!(poll(&env, &os).await, (200, vec![]));
    let (status, body) = post_result(&env, &os, &signed_wipe(&os.key, &node, &id, issued)).await;
    assert_eq!(status, 403, "{body}");
    let row = command(&env, &id).await;
    assert!(row.result.is_none() && row.attested_by.is_none(), "{row:?}");

    // The ramdisk's identity gets it, and its answer is kept.
    let ramdisk = join(&env, &node, "discovery", "ramdisk").await;
    let (status, got) = poll(&env, &ramdisk).await;
    assert_eq!(status, 200);
    assert_eq!(got.len(), 1, "{got:?}");
    let (status, body) = post_result(
        &env,
        &ramdisk,
        &signed_wipe(&ramdisk.key, &node, &id, issued),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(
        command(&env, &id).await.attested_by.as_deref(),
        Some(ramdisk.serial.as_str())
    );
    env.stop();
}

#[tokio::test]
async fn undeploy_ends_every_identity_and_a_revoked_certificates_result_is_refused() {
    let env = TestEnv::start().await.expect("env");
    let node = enrolled(&env).await;
    let node_id: bcm_core::NodeId = node.parse().expect("node id");
    env.force_state(&node_id, bcm_core::ProvisionState::Deployed, None)
        .await
        .expect("deployed");
    let os = join(&env, &node, "provisioned", "node").await;
    // A ramdisk identity left over, holding a command it has not answered.
    let old_ramdisk = join(&env, &node, "discovery", "ramdisk").await;
    let id = wipe_command(&env, &node).await;
    let issued = command(&env, &id).await.created_at;
    assert_eq!(poll(&env, &old_ramdisk).await.1.len(), 1);
    assert_eq!(heartbeat(&env, &os, "node").await, 200);

    env.verb_ok("undeploy", &node_id, json!({})).await;

    // Every identity of the node is over, on its next request.
    assert_eq!(heartbeat(&env, &os, "node").await, 401, "the OS's session");
    let late = signed_wipe(&old_ramdisk.key, &node, &id, issued);
    assert_eq!(post_result(&env, &old_ramdisk, &late).await.0, 401);
    for cert in bcm_db::agents::certs_of_node(&env.db, &node)
        .await
        .expect("certs")
    {
        assert!(cert.revoked_at.is_some(), "{} is not revoked", cert.serial);
    }

    // The release's ramdisk joins in the new epoch. The old ramdisk's key,
    // replayed through the new session, is refused: its certificate is
    // revoked and of an ended epoch.
    let ramdisk = join(&env, &node, "discovery", "ramdisk").await;
    assert_eq!(epoch_of(&ramdisk), 1);
    let (status, body) = post_result(&env, &ramdisk, &late).await;
    assert_eq!(status, 403, "{body}");
    assert!(command(&env, &id).await.result.is_none());
    // Its own answer is kept.
    let own = signed_wipe(&ramdisk.key, &node, &id, issued);
    assert_eq!(post_result(&env, &ramdisk, &own).await.0, 204);
    assert_eq!(
        command(&env, &id).await.attested_by.as_deref(),
        Some(ramdisk.serial.as_str())
    );
    env.stop();
}

#[tokio::test]
async fn a_heartbeat_is_never_taken_for_a_join() {
    // The fleet's cadences (the test kit's idle one is a lab's).
    let env = TestEnv::start_with(bcm_testkit::Options {
        agents: bcm_testkit::AgentProtocolConfig::default(),
        ..Default::default()
    })
    .await
    .expect("env");
    let node = enrolled(&env).await;
    let os = join(&env, &node, "provisioned", "node").await;
    // With no workflow running, a heartbeat keeps the session alive and
    // records nothing: there is no step to wake.
    assert!(
        !bcm_db::workflows::workflow_running_for_node(&env.db, &node)
            .await
            .expect("running?"),
        "the enrolled node's workflow is still running"
    );
    let (status, every) = heartbeat_answer(&env, &os, "node").await;
    assert_eq!(status, 200);
    assert!(
        every.is_some_and(|s| (54..=66).contains(&s)),
        "an idle OS is asked to beat about once a minute, not {every:?}"
    );
    let beat = bcm_db::agents::node_fact_fetch(&env.db, &node, "heartbeat:provisioned")
        .await
        .expect("fact");
    assert_eq!(beat, None, "an idle node's heartbeat wrote a fact");
    // A step that starts waiting for the OS's join after it joined (a new
    // deploy, say) must not take this OS's heartbeats for a join. The join
    // was stamped with its transaction's start, before its answer came.
    let mut tx = env.db.begin().await.expect("tx");
    bcm_db::workflows::workflow_insert_in_txn(
        &mut tx,
        &bcm_db::workflows::NewWorkflow {
            id: format!("wf_{}", ulid::Ulid::new().to_string().to_lowercase()),
            node_id: node.clone(),
            owner: "a".into(),
            profile_id: "deploy".into(),
            profile_version: 1,
            for_state: "deploying".into(),
            for_version: 1_000,
            definition: json!({}),
            steps: vec![],
            actor: None,
            traceparent: None,
        },
    )
    .await
    .expect("workflow");
    tx.commit().await.expect("commit");
    let step_started = Utc::now();
    assert_eq!(
        heartbeat_answer(&env, &os, "node").await,
        (200, Some(10)),
        "a node at work is asked to beat often"
    );
    let mut tx = env.db.begin().await.expect("tx");
    let joined =
        bcm_db::agents::node_fact_since_in_txn(&mut tx, &node, "agent:provisioned", step_started)
            .await
            .expect("fact");
    tx.rollback().await.expect("rollback");
    assert_eq!(joined, None, "a heartbeat was recorded as a join");
    let beat = bcm_db::agents::node_fact_fetch(&env.db, &node, "heartbeat:provisioned")
        .await
        .expect("fact");
    assert_eq!(beat.map(|b| b["event"].clone()), Some(json!("heartbeat")));
    env.stop();
}

/// An API whose idle installed OSes beat every 2 s at the least, within
/// `per_sec` heartbeats a second for the whole idle fleet, counted every
/// second; no reconciler or engine moves the nodes set up in it.
async fn fleet_env(per_sec: u32) -> TestEnv {
    TestEnv::start_with(bcm_testkit::Options {
        agents: bcm_testkit::AgentProtocolConfig {
            idle_heartbeat_secs: 2,
            max_idle_heartbeats_per_sec: per_sec,
            idle_fleet_refresh_secs: 1,
            ..Default::default()
        },
        reconcilers: 0,
        engine: false,
        ..Default::default()
    })
    .await
    .expect("env")
}

/// `n` nodes of tenant `a`'s pool put in `deployed`, by id.
async fn deployed_fleet(env: &TestEnv, n: usize) -> Vec<String> {
    let mut nodes = vec![];
    for _ in 0..n {
        let node = enrolled(env).await;
        let id: bcm_core::NodeId = node.parse().expect("node id");
        env.force_state(&id, bcm_core::ProvisionState::Deployed, None)
            .await
            .expect("deployed");
        nodes.push(node);
    }
    nodes
}

#[tokio::test]
async fn a_large_idle_fleet_is_asked_to_beat_slower_and_a_busy_node_still_every_ten_seconds() {
    // A budget of one idle heartbeat a second over a 2 s floor: 20 idle
    // installed OSes are each asked every 20 s (± a tenth).
    let env = fleet_env(1).await;
    let nodes = deployed_fleet(&env, 20).await;
    // An agentless pool's deployed machines send no heartbeats: they are
    // not counted (else 30 would be asked every 27-33 s).
    for i in 0..10 {
        let id = env
            .enroll_sim_in(&format!("agentless-{i}"), "a-agentless")
            .await;
        env.force_state(&id, bcm_core::ProvisionState::Deployed, None)
            .await
            .expect("deployed");
    }
    let os = join(&env, &nodes[0], "provisioned", "node").await;
    assert!(
        !bcm_db::workflows::workflow_running_for_node(&env.db, &nodes[0])
            .await
            .expect("running?"),
        "the node runs a workflow: it would beat busy"
    );
    // The replica counts the fleet every second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let every = loop {
        let (status, every) = heartbeat_answer(&env, &os, "node").await;
        assert_eq!(status, 200);
        // The count may first be taken part way through the set-up.
        if every.is_some_and(|s| (18..=22).contains(&s)) || std::time::Instant::now() > deadline {
            break every;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        every.is_some_and(|s| (18..=22).contains(&s)),
        "20 idle OSes at 1 a second are asked every 18-22 s, not {every:?}"
    );
    // Half the fleet leaves `deployed`: the cadence follows it down.
    for node in &nodes[10..] {
        let id: bcm_core::NodeId = node.parse().expect("node id");
        env.force_state(&id, bcm_core::ProvisionState::Ready, None)
            .await
            .expect("ready");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let every = loop {
        let (_, every) = heartbeat_answer(&env, &os, "node").await;
        if every.is_some_and(|s| s <= 11) || std::time::Instant::now() > deadline {
            break every;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        every.is_some_and(|s| (9..=11).contains(&s)),
        "10 idle OSes at 1 a second are asked every 9-11 s, not {every:?}"
    );
    env.stop();
}

#[tokio::test]
async fn with_no_idle_budget_the_cadence_stays_fixed_however_large_the_fleet() {
    let env = fleet_env(0).await;
    let nodes = deployed_fleet(&env, 20).await;
    let os = join(&env, &nodes[0], "provisioned", "node").await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    for _ in 0..5 {
        assert_eq!(heartbeat_answer(&env, &os, "node").await, (200, Some(2)));
    }
    env.stop();
}
