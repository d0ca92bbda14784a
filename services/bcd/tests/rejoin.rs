//! The installed OS's agent keeps its identity: the real `bcd node` joins
//! once with a one-time token, keeps its key and certificate on disk (root
//! only), and after a restart rejoins with them and no token (the same
//! node, the same certificate); it renews its certificate before it
//! expires, and rejoins with the renewed one. At the API, a rejoin whose
//! signature does not verify, of an unknown or revoked certificate, older
//! than one before or outside the clock window is refused, garbage is
//! INVALID_ARGUMENT, and the same signed request asked again gets the same
//! answer. Real API, attestation, Postgres and JetStream.

mod support;

use std::os::unix::fs::PermissionsExt as _;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use bcm_contracts::agent::RejoinRequest;
use bcm_testkit::{Options, TestEnv};
use ed25519_dalek::{Signer as _, SigningKey};
use serde_json::{json, Value};
use support::next_line;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// Renewed at two thirds of its life: after 20 s.
const TTL: u64 = 30;

fn bcd_node(
    env: &TestEnv,
    dir: &std::path::Path,
    token: Option<&str>,
) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_bcd"));
    cmd.args(["node", "--api", &env.base, "--env-file", "/nonexistent"])
        .arg("--state-dir")
        .arg(dir);
    if let Some(t) = token {
        cmd.args(["--token", t]);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("bcd node");
    let stdout = child.stdout.take().expect("stdout");
    (child, BufReader::new(stdout).lines())
}

fn kept(dir: &std::path::Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("identity.json")).expect("identity kept"))
        .expect("json")
}

/// A rejoin signed with the kept key.
fn signed(identity: &Value, signed_at: chrono::DateTime<chrono::Utc>) -> Value {
    let key = hex::decode(identity["key"].as_str().expect("key")).expect("hex");
    let key = SigningKey::from_bytes(&<[u8; 32]>::try_from(key.as_slice()).expect("32 bytes"));
    let node = identity["joined"]["nodeId"].as_str().expect("node");
    let serial = identity["joined"]["certSerial"].as_str().expect("serial");
    let at = bcm_pki::format_ts(signed_at);
    let input = RejoinRequest::signing_input(node, serial, &at, None);
    json!({
        "nodeId": node,
        "certSerial": serial,
        "signedAt": at,
        "signature": base64::engine::general_purpose::STANDARD.encode(key.sign(&input).to_bytes()),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bcd_node_rejoins_with_its_kept_identity_and_renews_it() {
    let env = TestEnv::start_with(Options {
        node_cert_ttl_secs: Some(TTL),
        ..Options::with_site()
    })
    .await
    .expect("env");
    let dir = std::env::temp_dir().join(format!("bcd-rejoin-{}", rand::random::<u64>()));
    let token = env.pool_join_token("a", "a-pool").await.expect("token");

    // Joined once with the token; the identity is kept, root only.
    let (mut first, mut lines) = bcd_node(&env, &dir, Some(&token));
    let line = next_line(&mut lines, Duration::from_secs(30)).await;
    let node = line
        .strip_prefix("joined as node ")
        .map(str::trim)
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    let identity = kept(&dir);
    let serial = identity["joined"]["certSerial"]
        .as_str()
        .expect("serial")
        .to_owned();
    assert_eq!(identity["joined"]["nodeId"], node.as_str());
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("identity.json")), 0o600);
    let _ = first.kill().await;

    // Restarted (a reboot), no token: the same node and certificate.
    let (mut second, mut lines) = bcd_node(&env, &dir, None);
    let line = next_line(&mut lines, Duration::from_secs(30)).await;
    assert_eq!(
        line,
        format!("rejoined as node {node} with its identity (certificate {serial})")
    );
    // Heard in its role (its heartbeat's session is the rejoin's).
    assert_eq!(
        bcm_db::agents::certs_live_count(&env.db, &node)
            .await
            .expect("certs"),
        1,
        "a rejoin issues no certificate"
    );

    // Renewed before it expires, and kept.
    let line = next_line(&mut lines, Duration::from_secs(TTL * 2)).await;
    let renewed = line
        .strip_prefix("renewed certificate ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    assert_ne!(renewed, serial);
    let identity = kept(&dir);
    assert_eq!(identity["joined"]["certSerial"], renewed.as_str());
    let _ = second.kill().await;
    let (mut third, mut lines) = bcd_node(&env, &dir, None);
    let line = next_line(&mut lines, Duration::from_secs(30)).await;
    assert_eq!(
        line,
        format!("rejoined as node {node} with its identity (certificate {renewed})")
    );
    let _ = third.kill().await;

    // The protocol, as a client could abuse it.
    let post = |body: Value| {
        let env = &env;
        async move {
            env.post("/api/agent/rejoin", None, &body)
                .await
                .expect("post")
        }
    };
    let now = chrono::Utc::now();
    let fresh = signed(&identity, now);
    let (s, first_answer) = post(fresh.clone()).await;
    assert_eq!(s, 200, "{first_answer}");
    let (s, again) = post(fresh.clone()).await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(
        (&again["sessionToken"], &again["certSerial"]),
        (&first_answer["sessionToken"], &first_answer["certSerial"]),
        "the same signed request gets the same answer"
    );
    let (s, b) = post(signed(&identity, now - chrono::Duration::seconds(5))).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (403, Some("FORBIDDEN")),
        "an older signature: {b}"
    );
    let (s, b) = post(signed(&identity, now + chrono::Duration::seconds(3600))).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (403, Some("FORBIDDEN")),
        "outside the clock window: {b}"
    );
    let mut forged = signed(&identity, chrono::Utc::now());
    forged["signature"] = json!(base64::engine::general_purpose::STANDARD.encode([7u8; 64]));
    let (s, b) = post(forged).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (401, Some("UNAUTHENTICATED")),
        "{b}"
    );
    let mut unknown = signed(&identity, chrono::Utc::now());
    unknown["certSerial"] = json!("00ff");
    let (s, _) = post(unknown).await;
    assert_eq!(s, 401);
    for garbage in [
        json!({}),
        json!({"nodeId": "node_x", "certSerial": "00", "signedAt": "2026-01-01T00:00:00Z", "signature": "x"}),
        {
            let mut g = signed(&identity, chrono::Utc::now());
            g["signedAt"] = json!("yesterday at noon, roughly");
            g
        },
        {
            let mut g = signed(&identity, chrono::Utc::now());
            g["certSerial"] = json!("NOT HEX");
            g
        },
        {
            let mut g = signed(&identity, chrono::Utc::now());
            g["csr"] = json!("not a csr");
            g
        },
        {
            let mut g = signed(&identity, chrono::Utc::now());
            g["token"] = json!("extra");
            g
        },
    ] {
        let (s, b) = post(garbage.clone()).await;
        assert_eq!(
            (s, b["code"].as_str()),
            (400, Some("INVALID_ARGUMENT")),
            "{garbage}: {b}"
        );
    }

    // Revoked (the node's identities ended): refused, and bcd, with no
    // token, stops saying so.
    let mut tx = env.db.begin().await.expect("tx");
    bcm_db::agents::certs_revoke_in_txn(&mut tx, &node)
        .await
        .expect("revoke");
    tx.commit().await.expect("commit");
    let (s, _) = post(signed(&identity, chrono::Utc::now())).await;
    assert_eq!(s, 401);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bcd"))
        .args(["node", "--api", &env.base, "--env-file", "/nonexistent"])
        .arg("--state-dir")
        .arg(&dir)
        .output()
        .await
        .expect("bcd node");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no identity in force is kept and no join token"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
