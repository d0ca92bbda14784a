//! `metalctl … --wait` waits until the node rests in a state (not a
//! transition), prints that node, and fails when the node failed.

use bcm_testkit::{Options, TestEnv};
use std::process::Command;

fn metalctl(env: &TestEnv) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metalctl"));
    c.args([
        "--api",
        &env.base,
        "--token",
        &env.admin_token,
        "--tenant",
        "a",
    ]);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verb_with_wait_returns_once_the_node_rests() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let out = metalctl(&env)
        .args([
            "-o",
            "json",
            "--wait",
            "enroll",
            "--pool",
            "a-pool",
            "--driver",
            "sim",
            "--hardware-profile",
            "sim",
        ])
        .args([
            "--address",
            "sim://waited",
            "--username",
            "u",
            "--password",
            "p",
        ])
        .output()
        .expect("metalctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let node: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one node, JSON");
    // Without --wait the answer is the node as enrolled (`enrolling`).
    assert_eq!(node["provisionState"], "ready", "{node}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is ready after"), "{stderr}");

    // A verb the state refuses fails before any wait, with its code.
    let id = node["nodeId"].as_str().expect("nodeId");
    let out = metalctl(&env)
        .args(["--wait", "unrescue", id])
        .output()
        .expect("metalctl");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("INVALID_STATE"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
