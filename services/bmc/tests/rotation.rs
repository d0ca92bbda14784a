//! Two-phase BMC password rotation through the public API, against real
//! peers: the `bcm-bmc` process is killed (a test hook aborts it) between
//! phase 1 and phase 2 on an ipmi_sim node and restarted: the node ends with
//! exactly one password on record, and it is the one the BMC takes. On a
//! Redfish node (sushy-tools with an AccountService) a rotation commits, and
//! a password the BMC's own policy refuses rolls back, leaving the current
//! one. Bad requests change nothing.

mod peers;

use bcm_core::{NodeId, PowerState, ProvisionState};
use bcm_testkit::{eventually, Options, TestEnv};
use peers::{BmcProcess, IpmiSim, Sushy};
use secrecy::ExposeSecret as _;
use serde_json::{json, Value};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

trait SomeIf: Sized {
    fn into_some_if(self, f: impl FnOnce(&Self) -> bool) -> Option<Self> {
        f(&self).then_some(self)
    }
}
impl<T> SomeIf for T {}

/// The control plane (no reconciler: the node is put in `ready` by hand)
/// with a simulated site that leaves `bmc.*` to the real bmc service.
async fn env() -> TestEnv {
    let mut site = bcm_sim::SimConfig::new("s1");
    site.bmc_service = true;
    TestEnv::start_with(Options {
        site: Some(site),
        reconcilers: 0,
        ..Options::with_site()
    })
    .await
    .expect("env")
}

async fn enroll_ready(env: &TestEnv, bmc: Value) -> NodeId {
    let (s, b) = env
        .post(
            "/api/compute/metal/enroll",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "poolId": "a-pool", "hardwareProfile": bmc["driver"].clone(),
                "bmc": bmc, "macs": ["52:54:00:aa:00:01"]}),
        )
        .await
        .expect("enroll");
    assert_eq!(s, 200, "{b}");
    let id: NodeId = b["nodeId"].as_str().expect("id").parse().expect("id");
    env.force_state(&id, ProvisionState::Ready, None)
        .await
        .expect("ready");
    id
}

/// The password on record for the node, opened with the env's keys.
async fn recorded_password(env: &TestEnv, id: &NodeId) -> String {
    let node = env.node(id).await.expect("node");
    let row =
        bcm_db::secrets::secret_fetch(&env.db, node.bmc_secret_id.as_deref().expect("secret"))
            .await
            .expect("secret row");
    let sealer = bcm_seal::Sealer::new(&env.sealing_keys).expect("sealer");
    let creds = sealer
        .open_credentials(
            &bcm_seal::Sealed {
                key_id: row.key_id,
                nonce: row.nonce,
                ciphertext: row.ciphertext,
            },
            &id.to_string(),
        )
        .expect("open");
    assert_eq!(
        creds.username.expose_secret(),
        "admin",
        "the username stays"
    );
    creds.password.expose_secret().to_owned()
}

/// Waits until no rotation is pending; returns the node.
async fn rotation_ended(env: &TestEnv, id: &NodeId) -> bcm_db::nodes::Node {
    eventually(T, || async {
        Ok(env.node(id).await?.into_some_if(|n| {
            n.bmc_pending_secret_id.is_none() && n.bmc_rotation_command_id.is_none()
        }))
    })
    .await
    .expect("the rotation ended")
}

/// The `outcome` of every `node.credentials.rotation` event so far.
async fn rotation_outcomes(env: &TestEnv, durable: &str) -> Vec<(String, Option<String>)> {
    let ty = bcm_contracts::events::types::NODE_CREDENTIALS_ROTATION;
    let reader = env
        .events_consumer(durable, &env.subjects().event(&bcm_testkit::tenant_a(), ty))
        .await
        .expect("consumer");
    reader
        .drain(Duration::from_secs(2))
        .await
        .expect("events")
        .into_iter()
        .map(|e| {
            (
                e.event.data["outcome"].as_str().unwrap_or("").to_owned(),
                e.event.data["error"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_phases_ends_with_one_working_password() {
    let sim = IpmiSim::start().await;
    let env = env().await;
    let id = enroll_ready(
        &env,
        json!({"driver": "ipmi", "address": sim.address(), "username": "admin", "password": sim.password}),
    )
    .await;
    let mut bmc = BmcProcess::start(&env, &[(bcm_bmc::rotation::CRASH_AFTER_PHASE1_ENV, "1")]);

    let view = env.verb_ok("rotateCredentials", &id, json!({})).await;
    assert_eq!(view["bmc"]["rotationPending"], true, "{view}");
    assert_eq!(view["bmc"]["credentialsSet"], true);
    let status = bmc
        .exited(T)
        .await
        .expect("the test hook aborts the bmc service after phase 1");
    assert!(!status.success());
    assert!(
        bmc.log().contains("rotation phase 1 done"),
        "it died after phase 1: {}",
        bmc.log()
    );
    // Between the phases: the BMC has the new password, the record both.
    assert!(!sim.takes(&sim.password), "phase 1 reached the BMC");
    let mid = env.node(&id).await.expect("node");
    assert!(mid.bmc_pending_secret_id.is_some() && mid.bmc_secret_id.is_some());
    assert_eq!(
        bcm_db::secrets::secret_count(&env.db).await.expect("count"),
        2
    );
    // Meanwhile verbs that need the BMC wait, and a second rotation too.
    let (s, b) = env.verb("rotateCredentials", &id, json!({})).await;
    assert_eq!((s, b["code"].as_str()), (409, Some("CONFLICT")), "{b}");
    let (s, b) = env.verb("power", &id, json!({"action": "on"})).await;
    assert_eq!((s, b["code"].as_str()), (409, Some("CONFLICT")), "{b}");

    // Restarted without the hook: the redelivered command finds the BMC
    // already on the pending password and finishes phase 2.
    bmc.spawn(&[]);
    let node = rotation_ended(&env, &id).await;
    assert!(node.bmc_pending_secret_id.is_none());
    assert_eq!(
        bcm_db::secrets::secret_count(&env.db).await.expect("count"),
        1,
        "exactly one password on record"
    );
    let password = recorded_password(&env, &id).await;
    assert_ne!(password, sim.password);
    assert!(sim.takes(&password), "the recorded password logs in");
    let rows = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let rotation: Vec<_> = rows
        .iter()
        .filter(|c| c.kind == "bmc.rotateCredentials")
        .collect();
    assert_eq!(rotation.len(), 1, "one command, redelivered, not re-sent");
    let result = rotation[0].result.clone().expect("result");
    assert_eq!(result["output"]["recovered"], true, "{result}");
    assert_eq!(
        rotation_outcomes(&env, "rot1").await,
        vec![("started".to_owned(), None), ("committed".to_owned(), None)]
    );

    // The node works with it: a power verb through the bmc service.
    env.verb_ok("power", &id, json!({"action": "on"})).await;
    eventually(T, || async {
        Ok(env
            .node(&id)
            .await?
            .into_some_if(|n| n.power == PowerState::On))
    })
    .await
    .expect("powered on with the rotated password");

    // No password in the bmc log, a Postgres column or an API response.
    let log = bmc.log();
    let dump = std::process::Command::new(bcm_testkit::pg_dump())
        .arg(&env.database_url)
        .output()
        .expect("pg_dump");
    assert!(dump.status.success());
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    let (_, view) = env
        .get(
            &format!("/api/compute/metal/nodes/{id}"),
            Some(&env.admin_token),
        )
        .await
        .expect("get");
    for secret in [&password, &sim.password] {
        assert!(
            !log.contains(secret.as_str()),
            "the bmc log carries a password"
        );
        assert!(
            !dump.contains(secret.as_str()),
            "Postgres carries a password"
        );
        assert!(!view.to_string().contains(secret.as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_rotation_commits_and_a_refused_password_rolls_back() {
    let sushy = Sushy::start(1).await;
    let env = env().await;
    let id = enroll_ready(
        &env,
        json!({"driver": "redfish", "address": sushy.system_address(1), "username": "admin", "password": sushy.password}),
    )
    .await;
    let _bmc = BmcProcess::start(&env, &[]);

    // Bad input is refused and changes nothing.
    let before = env.node(&id).await.expect("node");
    for (body, code) in [
        (json!({"password": "short1A"}), "INVALID_ARGUMENT"),
        (
            json!({"password": "has space in it 1A"}),
            "INVALID_ARGUMENT",
        ),
        (json!({"password": 5}), "INVALID_ARGUMENT"),
    ] {
        let (s, b) = env.verb("rotateCredentials", &id, body).await;
        assert_eq!((s, b["code"].as_str()), (400, Some(code)), "{b}");
    }
    let enrolling = env
        .force_state(&id, ProvisionState::Enrolling, None)
        .await
        .expect("state");
    let (s, b) = env.verb("rotateCredentials", &id, json!({})).await;
    assert_eq!((s, b["code"].as_str()), (409, Some("INVALID_STATE")), "{b}");
    env.force_state(&id, ProvisionState::Ready, None)
        .await
        .expect("ready");
    assert!(enrolling > before.version);
    assert_eq!(
        env.node(&id).await.expect("node").bmc_secret_id,
        before.bmc_secret_id
    );

    // A rotation with a chosen password commits.
    let chosen = "Chosen-Pass-2026";
    env.verb_ok("rotateCredentials", &id, json!({"password": chosen}))
        .await;
    let node = rotation_ended(&env, &id).await;
    assert_ne!(node.bmc_secret_id, before.bmc_secret_id);
    assert!(sushy.takes(chosen).await);
    assert!(!sushy.takes(&sushy.password).await);
    assert_eq!(recorded_password(&env, &id).await, chosen);

    // One the BMC's policy refuses (it allows 8-32; ours 12-64): rolled
    // back, the current password stays on record and working.
    let too_long = "Abcdefghij-0123456789-Abcdefghij-0123";
    env.verb_ok("rotateCredentials", &id, json!({"password": too_long}))
        .await;
    let after = rotation_ended(&env, &id).await;
    assert_eq!(after.bmc_secret_id, node.bmc_secret_id, "unchanged");
    assert_eq!(
        bcm_db::secrets::secret_count(&env.db).await.expect("count"),
        1
    );
    assert!(sushy.takes(chosen).await);
    let outcomes = rotation_outcomes(&env, "rot2").await;
    let names: Vec<&str> = outcomes.iter().map(|(o, _)| o.as_str()).collect();
    assert_eq!(
        names,
        vec!["started", "committed", "started", "rolled-back"]
    );
    let why = outcomes[3].1.clone().unwrap_or_default();
    assert!(why.contains("8-32"), "the BMC's own message: {why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_bmc_leaves_the_rotation_unresolved_and_the_next_resumes_it() {
    let mut sushy = Sushy::start(1).await;
    let env = env().await;
    let id = enroll_ready(
        &env,
        json!({"driver": "redfish", "address": sushy.system_address(1), "username": "admin", "password": sushy.password}),
    )
    .await;
    let _bmc = BmcProcess::start(&env, &[]);

    sushy.stop();
    env.verb_ok(
        "rotateCredentials",
        &id,
        json!({"password": "First-Try-Pass-1"}),
    )
    .await;
    let unresolved = eventually(T, || async {
        Ok(env
            .node(&id)
            .await?
            .into_some_if(|n| n.bmc_rotation_command_id.is_none()))
    })
    .await
    .expect("the rotation ended");
    assert!(
        unresolved.bmc_pending_secret_id.is_some(),
        "both passwords stay on record"
    );
    let view = env
        .get(
            &format!("/api/compute/metal/nodes/{id}"),
            Some(&env.admin_token),
        )
        .await
        .expect("get")
        .1;
    assert_eq!(view["bmc"]["rotationPending"], true, "{view}");
    // A new password would orphan the pending one: refused.
    let (s, b) = env
        .verb(
            "rotateCredentials",
            &id,
            json!({"password": "Other-Pass-2026"}),
        )
        .await;
    assert_eq!((s, b["code"].as_str()), (409, Some("CONFLICT")), "{b}");

    sushy.restart().await;
    env.verb_ok("rotateCredentials", &id, json!({})).await;
    let node = rotation_ended(&env, &id).await;
    assert!(node.bmc_pending_secret_id.is_none());
    assert_eq!(recorded_password(&env, &id).await, "First-Try-Pass-1");
    assert!(sushy.takes("First-Try-Pass-1").await);
    assert_eq!(
        bcm_db::secrets::secret_count(&env.db).await.expect("count"),
        1
    );
    let outcomes = rotation_outcomes(&env, "rot3").await;
    let names: Vec<&str> = outcomes.iter().map(|(o, _)| o.as_str()).collect();
    assert_eq!(names, vec!["started", "unresolved", "started", "committed"]);
    assert!(
        outcomes[1]
            .1
            .as_deref()
            .is_some_and(|e| e.contains("unreachable")),
        "{outcomes:?}"
    );
}
