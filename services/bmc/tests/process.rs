//! The `bcm-bmc` binary as its own process, logging at `debug` (with
//! reqwest's and hyper's debug lines) into a file, drives a Redfish node
//! through `metal-enroll` and a wrong-password node into `failed`; no line
//! of its log carries either password.

mod peers;

use bcm_core::{NodeId, ProvisionState};
use bcm_testkit::{Options, TestEnv};
use peers::Sushy;
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_reach_the_bmc_service_log() {
    let sushy = Sushy::start(2).await;
    let mut site = bcm_sim::SimConfig::new("s1");
    site.bmc_service = true;
    let env = TestEnv::start_with(Options {
        site: Some(site),
        ..Options::with_site()
    })
    .await
    .expect("env");
    let mut bmc = peers::BmcProcess::start(&env, &[]);

    let wrong = "not-the-password-7f3a";
    let mut ids: Vec<NodeId> = vec![];
    for (i, password) in [(1, sushy.password.as_str()), (2, wrong)] {
        let (s, b) = env
            .post("/api/compute/metal/enroll", Some(&env.admin_token), &json!({"tenantId": "a", "poolId": "a-pool",
                "bmc": {"driver": "redfish", "address": sushy.system_address(i), "username": sushy.username, "password": password}}))
            .await
            .expect("enroll");
        assert_eq!(s, 200, "{b}");
        ids.push(b["nodeId"].as_str().expect("id").parse().expect("id"));
    }
    env.wait_state(&ids[0], ProvisionState::Inspecting, T)
        .await
        .expect("enrolled through the bmc process");
    let failed = env
        .wait_state(&ids[1], ProvisionState::Failed, T)
        .await
        .expect("wrong password fails enrolling");
    assert!(
        failed
            .last_error
            .unwrap_or_default()
            .contains("authentication failed"),
        "a clear lastError"
    );
    bmc.stop();

    let text = bmc.log();
    assert!(
        text.lines().count() > 10 && text.contains("bmc.verify"),
        "the service logged its work at debug:\n{}",
        text.lines().take(20).collect::<Vec<_>>().join("\n")
    );
    for secret in [sushy.password.as_str(), wrong] {
        assert!(
            !text.contains(secret),
            "a log line carries a password: {:?}",
            text.lines().find(|l| l.contains(secret))
        );
    }
}
