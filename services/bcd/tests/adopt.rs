//! The adopt path with the real `bcd node`: a pool's one-time `node` token
//! (minted through the API) lets a machine with its own OS join; it becomes
//! a node in `adopting`, the reconciler's acceptance checks move it to
//! `adopted`, the token cannot be used twice, and BMC verbs on a node
//! without a BMC are INVALID_CONFIG.

use std::process::Stdio;
use std::time::Duration;

use bcm_core::ProvisionState;
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

/// A fresh state directory for one `bcd node` (never the host's
/// `/var/lib/bcd`).
fn state_dir(what: &str) -> String {
    let d = std::env::temp_dir().join(format!("bcd-node-{what}-{}", rand::random::<u64>()));
    d.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bcd_node_with_a_pool_token_is_adopted() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let token = env.pool_join_token("a", "a-pool").await.expect("token");
    // Another tenant's pool is not found.
    let (status, _) = env
        .post(
            "/api/compute/metal/joinTokens",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "poolId": "b-pool"}),
        )
        .await
        .expect("post");
    assert_eq!(status, 404);

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_bcd"))
        .args([
            "node",
            "--api",
            &env.base,
            "--token",
            &token,
            "--hostname",
            "db-7",
            "--state-dir",
            &state_dir("first"),
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("bcd node");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("joined in time")
        .expect("read")
        .expect("a line");
    let node: bcm_core::NodeId = line
        .strip_prefix("joined as node ")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let adopted = env
        .wait_state(&node, ProvisionState::Adopted, Duration::from_secs(30))
        .await
        .expect("adopted");
    assert_eq!(adopted.pool_id.as_str(), "a-pool");
    assert_eq!(adopted.bmc_driver, bcm_core::BmcDriver::None);
    assert_eq!(
        bcm_db::agents::certs_live_count(&env.db, &node.to_string())
            .await
            .expect("certs"),
        1
    );
    let fact = bcm_db::agents::node_fact_fetch(&env.db, &node.to_string(), "agent:node")
        .await
        .expect("fact")
        .expect("agent fact");
    assert_eq!(fact["hostname"], json!("db-7"));
    // The machine said what it is at join (for the pool's acceptance).
    let inventory = bcm_db::agents::node_fact_fetch(&env.db, &node.to_string(), "inventory")
        .await
        .expect("fact")
        .expect("an inventory fact");
    assert!(
        inventory["cpus"].as_u64().is_some_and(|c| c >= 1),
        "{inventory}"
    );
    assert!(
        inventory["memoryMiB"].as_u64().is_some_and(|m| m >= 1),
        "{inventory}"
    );

    // The token was spent.
    let again = tokio::process::Command::new(env!("CARGO_BIN_EXE_bcd"))
        .args(["node", "--api", &env.base, "--token", &token])
        .args(["--state-dir", &state_dir("again")])
        .output()
        .await
        .expect("bcd node again");
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("unknown, used or expired join token"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // No BMC: power is INVALID_CONFIG and changes nothing.
    let (status, body) = env.verb("power", &node, json!({"action": "on"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("INVALID_CONFIG")),
        "{body}"
    );
    // Enrolling without a BMC is refused.
    let (status, _) = env
        .post(
            "/api/compute/metal/enroll",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "poolId": "a-pool",
                "bmc": {"driver": "none", "address": "x", "username": "u", "password": "p"}}),
        )
        .await
        .expect("post");
    assert_eq!(status, 400);
    let _ = child.kill().await;

    // The pool's acceptance checks: a machine below them is refused,
    // saying what it lacks; one that meets them is adopted.
    let adopt = |acceptance: serde_json::Value| {
        let env = &env;
        async move {
            let (s, b) = env
                .put(
                    "/api/compute/admin/pools/a-pool",
                    Some(&env.admin_token),
                    &json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "gpu-redfish",
                            "adoptAcceptance": acceptance}),
                )
                .await
                .expect("pool");
            assert_eq!(s, 204, "{b}");
            let token = env.pool_join_token("a", "a-pool").await.expect("token");
            let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_bcd"))
                .args(["node", "--api", &env.base, "--token", &token])
                .args(["--state-dir", &state_dir("acceptance")])
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("bcd node");
            let stdout = child.stdout.take().expect("stdout");
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .expect("joined in time")
                .expect("read")
                .expect("a line");
            let node: bcm_core::NodeId = line
                .strip_prefix("joined as node ")
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("{line}"));
            (node, child)
        }
    };
    let (small, _c1) = adopt(json!({"minMemoryMiB": 1u64 << 40, "minCpus": 1})).await;
    let failed = env
        .wait_state(&small, ProvisionState::Failed, Duration::from_secs(30))
        .await
        .expect("refused by acceptance");
    let why = failed.last_error.unwrap_or_default();
    assert!(
        why.starts_with("ACCEPTANCE:")
            && why.contains("MiB of memory, the pool needs 1099511627776"),
        "{why}"
    );
    assert!(!why.contains("CPUs"), "one CPU is enough: {why}");
    let (fits, _c2) = adopt(json!({"minCpus": 1, "minMemoryMiB": 1})).await;
    env.wait_state(&fits, ProvisionState::Adopted, Duration::from_secs(30))
        .await
        .expect("accepted");
    // Bounds of nothing are garbage.
    let (s, e) = env
        .put(
            "/api/compute/admin/pools/a-pool",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "gpu-redfish",
                    "adoptAcceptance": {"minCpus": 0}}),
        )
        .await
        .expect("pool");
    assert_eq!(
        (s, e["code"].as_str()),
        (400, Some("INVALID_ARGUMENT")),
        "{e}"
    );
    env.stop();
}
