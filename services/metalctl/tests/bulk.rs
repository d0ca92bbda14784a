//! `metalctl bulk` and `metalctl batch` against the real control plane
//! and a simulated site: submit, two approvers sign with their key files
//! (metalctl checks the root and the digest before it signs), watch to
//! the end.

use bcm_core::ProvisionState;
use bcm_testkit::{Options, TestEnv};
use std::process::Command;
use std::time::Duration;

fn metalctl(env: &TestEnv, token: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metalctl"));
    c.args(["--api", &env.base, "--token", token, "--tenant", "a"]);
    c
}

fn run(c: &mut Command) -> (bool, String, String) {
    let out = c.output().expect("metalctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_is_submitted_signed_by_two_approvers_and_watched_to_its_end() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let tokens = env.register_approvers().await.expect("approvers");
    let (s, b) = env
        .put(
            "/api/compute/admin/pools/a-pool",
            Some(&env.admin_token),
            &serde_json::json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "gpu-redfish",
                    "quorum": {"required": 2}}),
        )
        .await
        .expect("pool");
    assert_eq!(s, 204, "{b}");
    let ids = env.enroll_sims("cli", 3).await;
    for id in &ids {
        env.wait_state(id, ProvisionState::Ready, Duration::from_secs(90))
            .await
            .expect("ready");
    }
    let dir = std::env::temp_dir().join(format!("metalctl-bulk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let nodes = dir.join("nodes.txt");
    let mut list = String::from("# rack 7\n");
    for id in &ids {
        list.push_str(&format!("{id}\n"));
    }
    list.push_str("node_nope_not_an_id\n");
    std::fs::write(&nodes, &list).expect("nodes");
    // A line that is no node id: refused before anything is written.
    let (ok, _, err) = run(metalctl(&env, &env.admin_token)
        .args(["bulk", "inspect", "--pool", "a-pool", "--nodes-from"])
        .arg(&nodes)
        .args(["--reason", "re-inspect rack 7"]));
    assert!(!ok);
    assert!(err.contains("INVALID_ARGUMENT"), "{err}");
    std::fs::write(&nodes, list.replace("node_nope_not_an_id\n", "")).expect("nodes");

    let (ok, out, err) = run(metalctl(&env, &env.admin_token)
        .args(["bulk", "inspect", "--pool", "a-pool", "--nodes-from"])
        .arg(&nodes)
        .args(["--reason", "re-inspect rack 7"]));
    assert!(ok, "{err}");
    assert!(
        out.contains("Approvers sign (ed25519) these bytes"),
        "{out}"
    );
    assert!(out.contains("bcm-batch-approval-v1"), "{out}");
    let (ok, json_out, err) =
        run(metalctl(&env, &env.admin_token).args(["-o", "json", "batch", "list"]));
    assert!(ok, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&json_out).expect("json");
    let id = listed[0]["header"]["batchId"]
        .as_str()
        .expect("a batch")
        .to_owned();
    assert!(out.contains(&id), "{out}");

    // An approver holding a list without one of the batch's nodes refuses.
    let short = dir.join("short.txt");
    std::fs::write(&short, format!("{}\n{}\n", ids[0], ids[1])).expect("short");
    let key1 = dir.join("approver-1.key");
    std::fs::write(&key1, hex::encode(env.quorum.approvers[0].to_bytes())).expect("key");
    let (ok, _, err) = run(metalctl(&env, &tokens[0])
        .args(["batch", "approve", &id, "--approver", "approver-1", "--key"])
        .arg(&key1)
        .arg("--nodes-from")
        .arg(&short));
    assert!(!ok);
    assert!(err.contains("not signing"), "{err}");
    for (n, token) in [(1usize, &tokens[0]), (2, &tokens[1])] {
        let key = dir.join(format!("approver-{n}.key"));
        std::fs::write(&key, hex::encode(env.quorum.approvers[n - 1].to_bytes())).expect("key");
        let (ok, out, err) = run(metalctl(&env, token)
            .args([
                "batch",
                "approve",
                &id,
                "--approver",
                &format!("approver-{n}"),
                "--key",
            ])
            .arg(&key)
            .arg("--nodes-from")
            .arg(&nodes));
        assert!(ok, "approver-{n}: {err}");
        assert!(err.contains("signing batch"), "{err}");
        assert!(out.contains("APPROVALS"), "{out}");
    }
    let (ok, out, err) = run(metalctl(&env, &env.admin_token).args([
        "-o",
        "json",
        "bulk",
        "watch",
        &id,
        "--every-ms",
        "200",
    ]));
    assert!(ok, "{err}");
    let done: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(done["state"], "finished", "{done}");
    assert_eq!(done["counts"]["succeeded"], 3, "{done}");
    let (ok, out, _) = run(metalctl(&env, &env.admin_token).args(["batch", "show", &id]));
    assert!(ok);
    assert!(out.contains("succeeded 3"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
