//! Whole chains with no caller, driven by the real engine and reconciler
//! against a simulated site, real Postgres and JetStream.

use bcm_core::ProvisionState;
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

#[tokio::test]
async fn enroll_reaches_ready_then_deploy_release_rescue_and_retire() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.enroll_sim("m1").await;
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

    env.verb_ok(
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

    env.verb_ok("rescue", &id, json!({})).await;
    let rescued = env
        .wait_state(&id, ProvisionState::Rescue, T)
        .await
        .expect("rescue");
    bcm_testkit::eventually(T, || async {
        let n = env.node(&rescued.id).await?;
        let wf = match n.workflow_id {
            Some(w) => Some(
                bcm_db::workflows::workflow_fetch(&env.db, &w.to_string())
                    .await?
                    .status,
            ),
            None => None,
        };
        Ok((wf == Some(bcm_core::workflow::WorkflowPhase::Succeeded)).then_some(()))
    })
    .await
    .expect("the rescue ramdisk is up");
    env.verb_ok("unrescue", &id, json!({})).await;
    let again = env.verb_ok("unrescue", &id, json!({})).await;
    assert_eq!(
        again["provisionState"], "rescue",
        "a second unrescue returns the node unchanged"
    );
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("unrescue → deployed");

    for wipe in ["quick", "secure-erase", "crypto-erase"] {
        env.verb_ok("undeploy", &id, json!({"wipe": wipe})).await;
        env.wait_state(&id, ProvisionState::Ready, T)
            .await
            .unwrap_or_else(|e| panic!("undeploy {wipe}: {e}"));
        if wipe != "crypto-erase" {
            env.verb_ok(
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

    env.verb_ok("provide", &id, json!({})).await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("provide → ready");
    env.verb_ok("manage", &id, json!({})).await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("manage → ready");
    let inspected = env.verb_ok("inspect", &id, json!({})).await;
    assert_eq!(inspected["provisionState"], "inspecting");
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("inspect → commissioning → ready");
    let wfs = bcm_db::workflows::workflows_of_node(&env.db, &id.to_string())
        .await
        .expect("workflows");
    let last: Vec<_> = wfs
        .iter()
        .rev()
        .take(2)
        .map(|w| w.profile_id.as_str())
        .collect();
    assert_eq!(
        last,
        vec!["metal-commission", "metal-inspect"],
        "inspect runs the rest of the chain"
    );

    env.verb_ok("retire", &id, json!({})).await;
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

#[tokio::test]
async fn finished_one_leaf_commands_are_pruned_and_workflow_commands_kept() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.enroll_sim("prune").await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");
    let node = id.to_string();
    let ids = |cmds: Vec<bcm_db::commands::CommandRow>| -> Vec<String> {
        cmds.into_iter().map(|c| c.id).collect()
    };
    let workflow_commands = ids(bcm_db::commands::commands_of_node(&env.db, &node)
        .await
        .expect("commands"));
    env.verb_ok("power", &id, json!({"action": "on"})).await;
    let leaf = bcm_testkit::eventually(T, || async {
        let cmds = bcm_db::commands::commands_of_node(&env.db, &node).await?;
        Ok(cmds.into_iter().find(|c| {
            // The power sync's reads are leaves too: the verb's command.
            !workflow_commands.contains(&c.id)
                && c.kind == "bmc.power"
                && c.status.as_str() == "succeeded"
        }))
    })
    .await
    .expect("the metal.power command finished");
    assert_eq!(leaf.kind, "bmc.power");

    let kept = bcm_db::commands::commands_prune_leaves(&env.db, Duration::from_secs(7 * 24 * 3600))
        .await
        .expect("prune");
    assert_eq!(kept, 0, "nothing is a week old");
    // Zero retention prunes whatever has finished outside workflows.
    let pruned = bcm_db::commands::commands_prune_leaves(&env.db, Duration::ZERO)
        .await
        .expect("prune");
    // (a power-sync read may have finished too by now)
    assert!(pruned >= 1, "the metal.power command");
    let after = ids(bcm_db::commands::commands_of_node(&env.db, &node)
        .await
        .expect("commands"));
    assert!(!after.contains(&leaf.id), "the leaf command is gone");
    assert!(
        workflow_commands.iter().all(|c| after.contains(c)),
        "every workflow command stays"
    );
}

#[tokio::test]
async fn commissioning_wipes_as_the_pools_policy_says() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let (s, b) = env
        .put(
            "/api/compute/admin/pools/a-pool",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "gpu-redfish",
                    "commissionWipe": "secure-erase"}),
        )
        .await
        .expect("pool");
    assert_eq!(s, 204, "{b}");
    let id = env.enroll_sim("cw").await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("enroll → ready");
    let wipes: Vec<String> = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands")
        .into_iter()
        .filter(|c| c.kind == "disk.wipe")
        .map(|c| c.params["mode"].as_str().unwrap_or("?").to_owned())
        .collect();
    assert_eq!(
        wipes,
        ["secure-erase"],
        "commissioning's one wipe is the pool's"
    );
}
