//! The attestation service over the real agent endpoints, Postgres and
//! JetStream: join tokens are one-time and expire, certificates chain to the
//! CA, and a result is kept only when its signature verifies against the
//! stored command row and a valid, unrevoked certificate of the node.

use base64::Engine as _;
use bcm_db::agents::TokenScope;
use bcm_testkit::TestEnv;
use chrono::{DateTime, Utc};
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{json, Value};

async fn token(env: &TestEnv, node: &str, purpose: &str, ttl_secs: i64) -> String {
    let mut tx = env.db.begin().await.expect("tx");
    let t = bcm_metal::identity::mint_join_token_in_txn(
        &mut tx,
        purpose,
        &TokenScope::Node(node.into()),
        Utc::now() + chrono::Duration::seconds(ttl_secs),
    )
    .await
    .expect("mint");
    tx.commit().await.expect("commit");
    t
}

async fn node(env: &TestEnv) -> String {
    let n = env.enroll("a", "a-pool").await.expect("enroll");
    n["nodeId"].as_str().expect("id").to_owned()
}

struct Joined {
    key: SigningKey,
    session: String,
    body: Value,
}

async fn join(env: &TestEnv, token: &str, role: &str) -> (u16, Option<Joined>, Value) {
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let csr = bcm_pki::csr_pem(&key, "agent").expect("csr");
    let (status, body) = env
        .post(
            "/api/agent/join",
            None,
            &json!({"token": token, "csr": csr, "role": role}),
        )
        .await
        .expect("post");
    let joined = (status == 200).then(|| Joined {
        key,
        session: body["sessionToken"].as_str().unwrap_or_default().to_owned(),
        body: body.clone(),
    });
    (status, joined, body)
}

async fn command(env: &TestEnv, node: &str, kind: &str, params: Value) -> String {
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
            kind: kind.into(),
            target: "ramdisk".into(),
            params,
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

async fn poll(env: &TestEnv, session: &str) -> Vec<Value> {
    let (status, body) = env
        .get("/api/agent/commands?waitMs=2000", Some(session))
        .await
        .expect("poll");
    assert_eq!(status, 200, "{body}");
    body.as_array().cloned().unwrap_or_default()
}

fn signed_result(key: &SigningKey, node: &str, cmd: &Value, output: Value) -> Value {
    let finished = Utc::now();
    let issued: DateTime<Utc> = cmd["issuedAt"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("issuedAt");
    let input = bcm_pki::signing_input(&bcm_pki::SignedFacts {
        command_id: cmd["commandId"].as_str().expect("id"),
        node_id: node,
        kind: cmd["kind"].as_str().expect("kind"),
        params: &cmd["params"],
        issued_at: issued,
        ok: true,
        output: &output,
        error: None,
        finished_at: finished,
    });
    json!({
        "commandId": cmd["commandId"],
        "ok": true,
        "output": output,
        "finishedAt": finished,
        "signature": base64::engine::general_purpose::STANDARD.encode(key.sign(&input).to_bytes()),
    })
}

/// A `disk.wipe` output as the contract has it, with one disk.
fn wipe_report(outcome: &str) -> Value {
    json!({"disks": [{
        "name": "vda", "serial": "S1", "model": "QEMU HARDDISK", "sizeBytes": 1_073_741_824u64,
        "transport": "virtio", "method": "quick",
        "wipedRegions": [{"offset": 0, "len": 67_108_864u64}],
        "verifiedRegions": [{"name": "head", "offset": 0, "len": 67_108_864u64, "ok": true}],
        "outcome": outcome, "millis": 12
    }]})
}

#[tokio::test]
async fn join_tokens_are_one_time_and_expire_and_certificates_chain_to_the_ca() {
    let env = TestEnv::start().await.expect("env");
    let n = node(&env).await;

    let t = token(&env, &n, "discovery", 600).await;
    // A CSR that is not one spends nothing.
    let (status, _, body) = {
        let (s, b) = env
            .post(
                "/api/agent/join",
                None,
                &json!({"token": t, "csr": "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", "role": "ramdisk"}),
            )
            .await
            .expect("post");
        (s, (), b)
    };
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("INVALID_ARGUMENT")),
        "{body}"
    );
    // Nor does the wrong role for the token's purpose.
    let (status, _, body) = join(&env, &t, "node").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("FORBIDDEN")),
        "{body}"
    );

    let (status, joined, body) = join(&env, &t, "ramdisk").await;
    assert_eq!(status, 200, "{body}");
    let joined = joined.expect("joined");
    assert_eq!(joined.body["nodeId"], json!(n));
    // The certificate names the node and the purpose, holds the CSR's key,
    // and chains to the CA the service handed out.
    let ca_pem = joined.body["caCertificate"].as_str().expect("ca");
    let cert_pem = joined.body["certificate"].as_str().expect("cert");
    let cert_serial = joined.body["certSerial"].as_str().expect("serial");
    let certs = bcm_db::agents::certs_of_node(&env.db, &n)
        .await
        .expect("certs");
    assert_eq!(certs.len(), 1);
    assert_eq!(certs[0].serial, cert_serial);
    assert_eq!(certs[0].cert_pem, cert_pem);
    assert_eq!(
        certs[0].public_key,
        joined.key.verifying_key().to_bytes().to_vec()
    );
    assert!(
        certs[0].not_after <= Utc::now() + chrono::Duration::hours(13),
        "short-lived"
    );
    let checked =
        bcm_pki::ca::check_against(ca_pem, cert_pem, Utc::now()).expect("chains to the CA");
    assert_eq!(
        (checked.node_id.as_str(), checked.purpose.as_str()),
        (n.as_str(), "discovery")
    );

    // Reused: refused.
    let (status, _, body) = join(&env, &t, "ramdisk").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (401, Some("UNAUTHENTICATED")),
        "{body}"
    );
    // Expired: refused.
    let old = token(&env, &n, "discovery", -1).await;
    let (status, _, body) = join(&env, &old, "ramdisk").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (401, Some("UNAUTHENTICATED")),
        "{body}"
    );
    // Unknown: refused.
    let (status, _, _) = join(&env, "bcmj_nope", "ramdisk").await;
    assert_eq!(status, 401);
    assert_eq!(
        bcm_db::agents::certs_of_node(&env.db, &n)
            .await
            .expect("certs")
            .len(),
        1,
        "refused joins issue nothing"
    );
    env.stop();
}

#[tokio::test]
async fn only_results_signed_for_the_stored_row_by_a_live_certificate_are_kept() {
    let env = TestEnv::start().await.expect("env");
    let n = node(&env).await;
    let t1 = token(&env, &n, "discovery", 600).await;
    let (_, first, _) = join(&env, &t1, "ramdisk").await;
    let first = first.expect("first join");

    // A genuine signature over the row as stored: kept, attested.
    let c1 = command(
        &env,
        &n,
        "disk.wipe",
        json!({"mode": "quick", "verify": true}),
    )
    .await;
    let polled = poll(&env, &first.session).await;
    assert_eq!(polled.len(), 1);
    let out = wipe_report("verified");
    let good = signed_result(&first.key, &n, &polled[0], out.clone());
    let (status, body) = env
        .post("/api/agent/results", Some(&first.session), &good)
        .await
        .expect("post");
    assert_eq!(status, 204, "{body}");
    let row = bcm_db::commands::command_fetch(&env.db, &c1)
        .await
        .expect("row");
    assert_eq!(row.status.as_str(), "succeeded");
    assert_eq!(
        row.attested_by.as_deref(),
        first.body["certSerial"].as_str()
    );
    // Posting it again changes nothing.
    let (status, _) = env
        .post("/api/agent/results", Some(&first.session), &good)
        .await
        .expect("post");
    assert_eq!(status, 204);

    // A forged signature (another key): refused, the row stays unanswered.
    let c2 = command(
        &env,
        &n,
        "disk.wipe",
        json!({"mode": "quick", "verify": true}),
    )
    .await;
    let polled = poll(&env, &first.session).await;
    let rogue = SigningKey::generate(&mut rand::rngs::OsRng);
    let forged = signed_result(&rogue, &n, &polled[0], out.clone());
    let (status, body) = env
        .post("/api/agent/results", Some(&first.session), &forged)
        .await
        .expect("post");
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("FORBIDDEN")),
        "{body}"
    );
    let row = bcm_db::commands::command_fetch(&env.db, &c2)
        .await
        .expect("row");
    assert_eq!(
        (row.status.as_str(), row.attested_by.as_deref()),
        ("sent", None)
    );

    // A genuine signature made for another command row (c1's) posted as c2's.
    let mut replayed = good.clone();
    replayed["commandId"] = json!(c2);
    let (status, _) = env
        .post("/api/agent/results", Some(&first.session), &replayed)
        .await
        .expect("post");
    assert_eq!(status, 403);
    // Signed over other parameters than the stored ones.
    let mut lied = polled[0].clone();
    lied["params"] = json!({"mode": "secure-erase", "verify": true});
    let lying = signed_result(&first.key, &n, &lied, out.clone());
    let (status, _) = env
        .post("/api/agent/results", Some(&first.session), &lying)
        .await
        .expect("post");
    assert_eq!(status, 403);
    let row = bcm_db::commands::command_fetch(&env.db, &c2)
        .await
        .expect("row");
    assert_eq!(row.status.as_str(), "sent", "nothing was kept");

    // A second agent session for the node, then the first certificate is
    // revoked: a result signed with the first key is refused even through
    // the live session; one signed with the second key is kept.
    let t2 = token(&env, &n, "discovery", 600).await;
    let (_, second, _) = join(&env, &t2, "ramdisk").await;
    let second = second.expect("second join");
    let mut tx = env.db.begin().await.expect("tx");
    assert!(bcm_db::agents::cert_revoke_in_txn(
        &mut tx,
        first.body["certSerial"].as_str().expect("serial")
    )
    .await
    .expect("revoke"));
    tx.commit().await.expect("commit");
    let by_revoked = signed_result(&first.key, &n, &polled[0], out.clone());
    let (status, body) = env
        .post("/api/agent/results", Some(&second.session), &by_revoked)
        .await
        .expect("post");
    assert_eq!(status, 403, "{body}");
    let by_live = signed_result(&second.key, &n, &polled[0], out.clone());
    let (status, body) = env
        .post("/api/agent/results", Some(&second.session), &by_live)
        .await
        .expect("post");
    assert_eq!(status, 204, "{body}");
    let row = bcm_db::commands::command_fetch(&env.db, &c2)
        .await
        .expect("row");
    assert_eq!(
        row.attested_by.as_deref(),
        second.body["certSerial"].as_str()
    );

    // Another node's session cannot answer this node's command.
    let other = node(&env).await;
    let t3 = token(&env, &other, "discovery", 600).await;
    let (_, intruder, _) = join(&env, &t3, "ramdisk").await;
    let intruder = intruder.expect("join");
    let c3 = command(&env, &n, "inventory", json!({})).await;
    let fake = json!({"commandId": c3, "ok": true, "output": {}, "finishedAt": Utc::now()});
    let (status, _) = env
        .post("/api/agent/results", Some(&intruder.session), &fake)
        .await
        .expect("post");
    assert_eq!(status, 404);
    env.stop();
}

#[tokio::test]
async fn without_the_attestation_service_agents_are_told_to_retry() {
    let env = TestEnv::start_with(bcm_testkit::Options {
        attestation: false,
        agents: bcm_testkit::AgentProtocolConfig {
            attest_retry_ms: 300,
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .expect("env");
    let n = node(&env).await;
    let t = token(&env, &n, "discovery", 600).await;
    let (status, _, body) = join(&env, &t, "ramdisk").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("UNAVAILABLE")),
        "{body}"
    );
    env.stop();
}

/// A machine runs one agent at a time: after it re-joins (a reboot), a poll
/// still open from the earlier agent (a half-open connection nobody reads)
/// must not take the command the new agent waits for. Found by the QEMU
/// end-to-end run, where such a poll swallowed a `deploy.image`.
#[tokio::test]
async fn only_the_newest_session_of_a_node_takes_its_commands() {
    let env = TestEnv::start().await.expect("env");
    let n = node(&env).await;
    let (_, first, _) = join(&env, &token(&env, &n, "discovery", 600).await, "ramdisk").await;
    let first = first.expect("first join");
    // The earlier agent's poll is waiting when the machine reboots.
    let stale = env.get("/api/agent/commands?waitMs=6000", Some(&first.session));
    let reboot = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let (_, second, _) = join(&env, &token(&env, &n, "discovery", 600).await, "ramdisk").await;
        let id = command(&env, &n, "deploy.image", json!({})).await;
        (second.expect("second join"), id)
    };
    let (stale, (second, id)) = tokio::join!(stale, reboot);
    let (status, taken_by_stale) = stale.expect("stale poll");
    assert_eq!(status, 200);
    assert_eq!(taken_by_stale, json!([]), "the stale poll took nothing");
    let got = poll(&env, &second.session).await;
    assert_eq!(got.len(), 1, "the new agent gets the command");
    assert_eq!(got[0]["commandId"], json!(id));
    env.stop();
}

/// A poll waits for its own node's command: the command written while it
/// waits is handed at once (woken per node), not when the wait runs out
/// (30 s here, so a lost wake-up fails the bound below), and another
/// node's poll keeps waiting.
#[tokio::test]
async fn a_waiting_poll_is_woken_by_a_command_for_its_node() {
    let env = TestEnv::start().await.expect("env");
    let (a, b) = (node(&env).await, node(&env).await);
    let (_, ja, _) = join(&env, &token(&env, &a, "discovery", 600).await, "ramdisk").await;
    let (_, jb, _) = join(&env, &token(&env, &b, "discovery", 600).await, "ramdisk").await;
    let (ja, jb) = (ja.expect("join a"), jb.expect("join b"));
    let poll_a = env.get("/api/agent/commands?waitMs=30000", Some(&ja.session));
    let mut poll_b = Box::pin(env.get("/api/agent/commands?waitMs=30000", Some(&jb.session)));
    let write = async {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        command(&env, &a, "inventory", json!({})).await
    };
    let (polled, id) = tokio::time::timeout(std::time::Duration::from_secs(15), async {
        tokio::join!(poll_a, write)
    })
    .await
    .expect("the poll is woken by its node's command, not by the end of its wait");
    let (status, got) = polled.expect("poll a");
    assert_eq!(status, 200, "{got}");
    assert_eq!(got[0]["commandId"], json!(id), "{got}");
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(500), &mut poll_b)
            .await
            .is_err(),
        "another node's poll keeps waiting"
    );
    env.stop();
}

#[tokio::test]
async fn a_signed_result_holding_nul_characters_is_refused_as_sent_and_changes_nothing() {
    let env = TestEnv::start().await.expect("env");
    let n = node(&env).await;
    let t = token(&env, &n, "discovery", 600).await;
    let (_, joined, _) = join(&env, &t, "ramdisk").await;
    let joined = joined.expect("join");
    let c = command(&env, &n, "inventory", json!({})).await;
    let polled = poll(&env, &joined.session).await;
    assert_eq!(polled.len(), 1);
    // Signed as it is: the control plane cannot drop the NULs without
    // breaking the signature, and Postgres cannot store them.
    let padded = signed_result(
        &joined.key,
        &n,
        &polled[0],
        json!({"system": {"serial": "S1\u{0}\u{0}"}, "cpus": 1, "memoryMiB": 1, "disks": [], "nics": []}),
    );
    let (status, body) = env
        .post("/api/agent/results", Some(&joined.session), &padded)
        .await
        .expect("post");
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "INVALID_ARGUMENT", "{body}");
    let row = bcm_db::commands::command_fetch(&env.db, &c)
        .await
        .expect("row");
    assert_eq!(
        row.status.as_str(),
        "sent",
        "the command still waits for a result"
    );
    assert_eq!(row.result, None);
}

/// A signed result whose output is not its command kind's (an unknown
/// outcome, a field missing, another kind's output) is refused and stored
/// nowhere, whoever signed it: the engine never reads a default.
#[tokio::test]
async fn a_result_that_breaks_its_kinds_contract_is_refused_and_changes_nothing() {
    let env = TestEnv::start().await.expect("env");
    let n = node(&env).await;
    let t = token(&env, &n, "discovery", 600).await;
    let (_, joined, _) = join(&env, &t, "ramdisk").await;
    let joined = joined.expect("join");
    let c = command(
        &env,
        &n,
        "disk.wipe",
        json!({"mode": "quick", "verify": true}),
    )
    .await;
    let polled = poll(&env, &joined.session).await;
    assert_eq!(polled.len(), 1);
    let mut missing = wipe_report("verified");
    missing["disks"][0]
        .as_object_mut()
        .expect("disk")
        .remove("serial");
    for bad in [
        wipe_report("probably"),
        missing,
        json!({"disks": "all of them"}),
        json!({"system": {}, "cpus": 1, "memoryMiB": 1, "disks": [], "nics": []}),
        json!({"disks": [], "extra": true}),
    ] {
        let signed = signed_result(&joined.key, &n, &polled[0], bad.clone());
        let (status, body) = env
            .post("/api/agent/results", Some(&joined.session), &signed)
            .await
            .expect("post");
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("INVALID_ARGUMENT")),
            "{bad}: {body}"
        );
        let row = bcm_db::commands::command_fetch(&env.db, &c)
            .await
            .expect("row");
        assert_eq!(
            row.status.as_str(),
            "sent",
            "{bad}: the command still waits"
        );
        assert_eq!(row.result, None);
    }
    // The agent answers only agent commands: a bmc command of its own node
    // is not its to answer.
    let site_cmd = command(
        &env,
        &n,
        "bmc.powerStatus",
        json!({"bmc": {"driver": "sim", "address": "sim://x"}}),
    )
    .await;
    let fake = json!({"commandId": site_cmd, "ok": true, "output": {"power": "on"}, "finishedAt": Utc::now()});
    let (status, body) = env
        .post("/api/agent/results", Some(&joined.session), &fake)
        .await
        .expect("post");
    assert_eq!(status, 400, "{body}");
    let row = bcm_db::commands::command_fetch(&env.db, &site_cmd)
        .await
        .expect("row");
    assert_eq!(row.result, None);
    // The honest report is taken.
    let good = signed_result(&joined.key, &n, &polled[0], wipe_report("verified"));
    let (status, body) = env
        .post("/api/agent/results", Some(&joined.session), &good)
        .await
        .expect("post");
    assert_eq!(status, 204, "{body}");
    env.stop();
}

/// Joins with a given key: `(status, body)`.
async fn join_with(env: &TestEnv, token: &str, csr: &str) -> (u16, Value) {
    env.post(
        "/api/agent/join",
        None,
        &json!({"token": token, "csr": csr, "role": "ramdisk"}),
    )
    .await
    .expect("post")
}

/// The API died after the join committed and before its answer reached
/// the agent: the agent's retry with the same token and key gets the same
/// identity back, never a refusal and never a second certificate; anyone
/// else holding the spent token is still refused.
#[tokio::test]
async fn a_join_whose_answer_was_lost_is_retried_into_the_same_identity() {
    let env = TestEnv::start().await.expect("env");
    let n = node(&env).await;
    let t = token(&env, &n, "discovery", 600).await;
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let csr = bcm_pki::csr_pem(&key, "agent").expect("csr");

    let (status, lost) = join_with(&env, &t, &csr).await;
    assert_eq!(status, 200, "{lost}");
    let (status, again) = join_with(&env, &t, &csr).await;
    assert_eq!(status, 200, "the retried join is answered: {again}");
    for field in ["nodeId", "certSerial", "certificate", "caCertificate"] {
        assert_eq!(again[field], lost[field], "{field} is the same");
    }
    // Both answers carry one session token: a join processed twice with
    // both answers delivered (an agent that gave up on a slow first request
    // and retried, the first processed after the retry) never ends the
    // session whichever answer the agent kept.
    assert_eq!(again["sessionToken"], lost["sessionToken"]);
    let certs = bcm_db::agents::certs_of_node(&env.db, &n)
        .await
        .expect("certs");
    assert_eq!(certs.len(), 1, "one identity");
    let session = lost["sessionToken"].as_str().expect("session");
    assert!(poll(&env, session).await.is_empty());
    let (status, third) = join_with(&env, &t, &csr).await;
    assert_eq!(status, 200, "{third}");
    assert_eq!(third["sessionToken"], lost["sessionToken"]);
    assert!(
        poll(&env, session).await.is_empty(),
        "the first answer's session still polls"
    );

    // Another key with the spent token: refused, nothing issued.
    let other = SigningKey::generate(&mut rand::rngs::OsRng);
    let (status, body) =
        join_with(&env, &t, &bcm_pki::csr_pem(&other, "agent").expect("csr")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (401, Some("UNAUTHENTICATED")),
        "{body}"
    );
    assert_eq!(
        bcm_db::agents::certs_of_node(&env.db, &n)
            .await
            .expect("certs")
            .len(),
        1
    );
    env.stop();
}

/// A join retried after the window is refused as any spent token is.
#[tokio::test]
async fn a_join_retried_after_the_window_is_refused() {
    let env = TestEnv::start_with(bcm_testkit::Options {
        attestation: false,
        ..Default::default()
    })
    .await
    .expect("env");
    let mut cfg = bcm_attestation::AttestationConfig::ephemeral();
    cfg.join_retry_window_secs = 0;
    env.spawn_attestation(cfg).await.expect("attestation");
    let n = node(&env).await;
    let t = token(&env, &n, "discovery", 600).await;
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let csr = bcm_pki::csr_pem(&key, "agent").expect("csr");
    assert_eq!(join_with(&env, &t, &csr).await.0, 200);
    let (status, body) = join_with(&env, &t, &csr).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (401, Some("UNAUTHENTICATED")),
        "{body}"
    );
    env.stop();
}

/// A poll's answer was lost (the API died writing it, the connection
/// dropped): the command it handed out is offered again once its lease runs
/// out, and never again once its result is in.
#[tokio::test]
async fn a_command_whose_poll_answer_was_lost_is_offered_again() {
    let env = TestEnv::start_with(bcm_testkit::Options {
        agents: bcm_testkit::AgentProtocolConfig {
            command_lease_ms: 1000,
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .expect("env");
    let n = node(&env).await;
    let (_, joined, _) = join(&env, &token(&env, &n, "discovery", 600).await, "ramdisk").await;
    let joined = joined.expect("joined");
    let id = command(&env, &n, "disk.wipe", json!({"mode": "quick"})).await;

    let lost = poll(&env, &joined.session).await;
    assert_eq!(lost.len(), 1);
    // Leased: not handed out twice at once.
    let (_, now) = env
        .get("/api/agent/commands", Some(&joined.session))
        .await
        .expect("poll");
    assert_eq!(now, json!([]), "leased to the poll that took it");
    // The lease runs out: offered again, the same command.
    let again = poll(&env, &joined.session).await;
    assert_eq!(again.len(), 1, "offered again");
    assert_eq!(again[0]["commandId"], json!(id));
    assert_eq!(
        again[0], lost[0],
        "the same command, as it was first offered"
    );

    let r = signed_result(&joined.key, &n, &again[0], wipe_report("verified"));
    let (status, body) = env
        .post("/api/agent/results", Some(&joined.session), &r)
        .await
        .expect("post");
    assert_eq!(status, 204, "{body}");
    // Answered: never offered again, however long the agent waits.
    let (_, after) = env
        .get("/api/agent/commands?waitMs=2500", Some(&joined.session))
        .await
        .expect("poll");
    assert_eq!(after, json!([]));
    // And the result posted again is accepted once.
    let (status, _) = env
        .post("/api/agent/results", Some(&joined.session), &r)
        .await
        .expect("post");
    assert_eq!(status, 204);
    let row = bcm_db::commands::command_fetch(&env.db, &id)
        .await
        .expect("row");
    assert!(row.status.is_done());
    env.stop();
}

/// A result that reaches the API while the attestation service (or the bus
/// it is reached over) is away is held and forwarded again until the
/// service answers, instead of being refused with 503.
#[tokio::test]
async fn a_result_posted_while_the_attestation_service_is_away_is_recorded_when_it_returns() {
    let env = TestEnv::start_with(bcm_testkit::Options {
        attestation: false,
        ..Default::default()
    })
    .await
    .expect("env");
    // One CA on disk, so the service can come back with it.
    let dir = std::env::temp_dir().join(format!("bcm-ca-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut cfg = bcm_attestation::AttestationConfig::ephemeral();
    cfg.ca_cert_file = Some(dir.join("ca.pem"));
    cfg.ca_key_file = Some(dir.join("ca.key"));
    let first = env
        .spawn_attestation(cfg.clone())
        .await
        .expect("attestation");

    let n = node(&env).await;
    let (_, joined, body) = join(&env, &token(&env, &n, "discovery", 600).await, "ramdisk").await;
    let joined = joined.unwrap_or_else(|| panic!("joined: {body}"));
    let id = command(&env, &n, "disk.wipe", json!({"mode": "quick"})).await;
    let cmd = poll(&env, &joined.session).await.pop().expect("command");

    first.cancel();
    bcm_testkit::eventually(std::time::Duration::from_secs(10), || async {
        let asked = env
            .state
            .inner
            .bus
            .client()
            .request(env.subjects().attest("result"), "{}".into())
            .await;
        Ok(asked.is_err().then_some(()))
    })
    .await
    .expect("the attestation service is gone");

    let r = signed_result(&joined.key, &n, &cmd, wipe_report("verified"));
    let posted = env.post("/api/agent/results", Some(&joined.session), &r);
    let back = async {
        // The post is being held by the API meanwhile.
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        env.spawn_attestation(cfg.clone()).await.expect("back")
    };
    let (posted, _) = tokio::join!(posted, back);
    let (status, body) = posted.expect("post");
    assert_eq!(status, 204, "held until the service answered: {body}");
    let row = bcm_db::commands::command_fetch(&env.db, &id)
        .await
        .expect("row");
    assert!(row.status.is_done());
    assert_eq!(
        row.attested_by.as_deref(),
        joined.body["certSerial"].as_str()
    );
    let _ = std::fs::remove_dir_all(&dir);
    env.stop();
}

/// The service works on as many asks at once as its pool has connections.
/// An ask that could not start in time to be answered within the API's
/// wait (`attest::ASK_TIMEOUT`) is dropped unanswered, since its asker asks
/// again, rather than worked on for nobody; once turns free up, asks are
/// answered at once.
#[tokio::test]
async fn an_ask_that_cannot_start_within_its_askers_wait_is_dropped_and_later_ones_are_answered() {
    let env = TestEnv::start_with(bcm_testkit::Options {
        attestation: false,
        ..Default::default()
    })
    .await
    .expect("env");
    let db = bcm_db::Db::connect(&env.database_url, 1).await.expect("db");
    let held = db.hold_connection().await.expect("the only connection");
    let bus = env.state.inner.bus.clone();
    bcm_attestation::start(
        db,
        bus.clone(),
        bcm_attestation::AttestationConfig::ephemeral(),
        env.child_token(),
    )
    .await
    .expect("start");
    let subject = bus.subjects().attest("join");
    let ask = |payload: Vec<u8>, wait_secs: u64| {
        let (client, subject) = (bus.client().clone(), subject.clone());
        async move {
            tokio::time::timeout(
                std::time::Duration::from_secs(wait_secs),
                client.request(subject, payload.into()),
            )
            .await
        }
    };
    // The only turn: a join that waits for the held connection.
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let join = serde_json::to_vec(&json!({
        "tokenHash": "0".repeat(64),
        "sessionHash": "1".repeat(64),
        "csr": bcm_pki::csr_pem(&key, "agent").expect("csr"),
        "role": "ramdisk",
    }))
    .expect("json");
    let first = tokio::spawn(ask(join, 30));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // Needs no database, but waits for a turn past its asker's wait.
    let second = ask(b"not json".to_vec(), 8).await;
    assert!(
        second.is_err(),
        "an ask that waited its asker's whole wait was answered: {second:?}"
    );
    drop(held);
    let third = ask(b"not json".to_vec(), 5)
        .await
        .expect("answered in time")
        .expect("answered");
    assert!(
        String::from_utf8_lossy(&third.payload).contains("INVALID_ARGUMENT"),
        "{:?}",
        third.payload
    );
    first.abort();
    env.stop();
}
