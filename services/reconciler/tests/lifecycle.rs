//! Whole chains with no caller, driven by the real engine and reconciler
//! against a simulated site, real Postgres and JetStream.

use bcm_core::{NodeId, ProvisionState};
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

async fn enroll(env: &TestEnv, name: &str) -> NodeId {
    let (s, b) = env
        .post(
            "/api/compute/metal/enroll",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "poolId": "a-pool",
                "bmc": {"driver": "sim", "address": format!("sim://{name}"), "username": "admin", "password": "pw"}}),
        )
        .await
        .expect("post");
    assert_eq!(s, 200, "{b}");
    b["nodeId"].as_str().expect("id").parse().expect("node id")
}

async fn verb(
    env: &TestEnv,
    verb: &str,
    node: &NodeId,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut body = json!({"tenantId": "a", "nodeId": node.to_string()});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let (s, b) = env
        .post(
            &format!("/api/compute/metal/{verb}"),
            Some(&env.admin_token),
            &body,
        )
        .await
        .expect("post");
    assert_eq!(s, 200, "{verb}: {b}");
    b
}

#[tokio::test]
async fn enroll_reaches_ready_then_deploy_release_rescue_and_retire() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = enroll(&env, "m1").await;
    let ready = env
        .wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("enroll → ready");
    assert_eq!(
        ready.macs.len(),
        1,
        "out-of-band inspection stored the PXE MAC"
    );
    assert!(!ready.maintenance);
    let inventory = bcm_db::agents::node_fact_fetch(&env.db, &id.to_string(), "inventory")
        .await
        .expect("fact");
    assert_eq!(
        inventory.and_then(|i| i["cpus"].as_u64()),
        Some(64),
        "the ramdisk reported inventory"
    );

    verb(
        &env,
        "deploy",
        &id,
        json!({"profileId": "ubuntu-24.04", "profileVersion": 1}),
    )
    .await;
    let deployed = env
        .wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("deploy → deployed");
    assert_eq!(deployed.role.as_deref(), Some("host"));

    verb(&env, "rescue", &id, json!({})).await;
    let rescued = env
        .wait_state(&id, ProvisionState::Rescue, T)
        .await
        .expect("rescue");
    bcm_testkit::eventually(T, || async {
        let n = env.node(&rescued.id).await?;
        let wf = match n.workflow_id {
            Some(w) => {
                bcm_db::workflows::workflow_fetch(&env.db, &w.to_string())
                    .await?
                    .status
            }
            None => String::new(),
        };
        Ok((wf == "succeeded").then_some(()))
    })
    .await
    .expect("the rescue ramdisk is up");
    verb(&env, "unrescue", &id, json!({})).await;
    let again = verb(&env, "unrescue", &id, json!({})).await;
    assert_eq!(
        again["provisionState"], "rescue",
        "a second unrescue returns the node unchanged"
    );
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("unrescue → deployed");

    for wipe in ["quick", "secure-erase", "crypto-erase"] {
        verb(&env, "undeploy", &id, json!({"wipe": wipe})).await;
        env.wait_state(&id, ProvisionState::Ready, T)
            .await
            .unwrap_or_else(|e| panic!("undeploy {wipe}: {e}"));
        if wipe != "crypto-erase" {
            verb(
                &env,
                "deploy",
                &id,
                json!({"profileId": "ubuntu-24.04", "profileVersion": 1}),
            )
            .await;
            env.wait_state(&id, ProvisionState::Deployed, T)
                .await
                .expect("deployed");
        }
    }

    verb(&env, "provide", &id, json!({})).await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("provide → ready");
    verb(&env, "manage", &id, json!({})).await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("manage → ready");

    verb(&env, "retire", &id, json!({})).await;
    let retired = env
        .wait_state(&id, ProvisionState::Retired, T)
        .await
        .expect("retire → retired");
    assert!(retired.bmc_secret_id.is_none(), "BMC credentials forgotten");
    assert_eq!(
        bcm_db::agents::certs_live_count(&env.db, &id.to_string())
            .await
            .expect("certs"),
        0,
        "certs revoked"
    );
    let (s, b) = env
        .post(
            "/api/compute/metal/recover",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "nodeId": id.to_string()}),
        )
        .await
        .expect("post");
    assert_eq!((s, b["code"].as_str()), (409, Some("INVALID_STATE")));
}
