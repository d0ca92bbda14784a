//! Agentless pools (`agentMode: none`) in the simulated site: machines that
//! never run bcd go enroll → ready → deployed → released through their BMC
//! alone (out-of-band inspection recorded as the inventory, an installer
//! ISO as virtual media, a BMC drive erase), and the release publishes
//! `node.release.unverified` exactly when no attested erase happened, the
//! pool's policy deciding where the node goes. Verbs that need an agent are
//! refused with `INVALID_CONFIG`, changing nothing.

use bcm_core::ProvisionState;
use bcm_sim::Fault;
use bcm_testkit::{tenant_a, Options, TestEnv};
use serde_json::{json, Value};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

/// The kinds of every command the node was sent, in order.
async fn command_kinds(env: &TestEnv, id: &bcm_core::NodeId) -> Vec<String> {
    bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands")
        .into_iter()
        .map(|c| c.kind)
        .collect()
}

async fn deploy_and_release(env: &TestEnv, id: &bcm_core::NodeId) {
    env.verb_ok(
        "deploy",
        id,
        json!({"profileId": "talos-iso", "profileVersion": 1}),
    )
    .await;
    env.wait_state(id, ProvisionState::Deployed, T)
        .await
        .expect("deployed");
    env.verb_ok("undeploy", id, json!({"wipe": "secure-erase"}))
        .await;
}

#[tokio::test]
async fn an_agentless_node_goes_round_through_its_bmc_and_says_when_its_release_is_unattested() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let unverified = env
        .events_consumer(
            "unverified",
            &env.subjects().event(&tenant_a(), "node.release.unverified"),
        )
        .await
        .expect("consumer");

    // A BMC that erases: enroll → ready with no agent anywhere.
    let erases = env.enroll_sim_in("oob-erases", "a-agentless").await;
    env.wait_state(&erases, ProvisionState::Ready, T)
        .await
        .expect("ready");
    let kinds = command_kinds(&env, &erases).await;
    assert!(
        kinds
            .iter()
            .all(|k| k.starts_with("bmc.") || k.starts_with("metal.")),
        "no ramdisk, no boot entry, no agent command: {kinds:?}"
    );
    // The BMC's inventory is the node's recorded one.
    let oob = bcm_db::agents::node_fact_fetch(&env.db, &erases.to_string(), "inventory:oob")
        .await
        .expect("fact")
        .expect("the out-of-band inventory is recorded");
    assert_eq!(oob["drives"][0]["id"], "Disk.Bay.0", "{oob}");

    deploy_and_release(&env, &erases).await;
    env.wait_state(&erases, ProvisionState::Ready, T)
        .await
        .expect("an attested erase returns the node to ready");
    let commands = bcm_db::commands::commands_of_node(&env.db, &erases.to_string())
        .await
        .expect("commands");
    let media: Vec<&Value> = commands
        .iter()
        .filter(|c| c.kind == "bmc.virtualMedia")
        .map(|c| &c.params)
        .collect();
    assert_eq!(media[0]["action"], "insert", "{media:?}");
    assert_eq!(
        media[0]["image"], "http://images.invalid/talos-amd64.iso",
        "the profile's installer"
    );
    assert!(
        media[1..].iter().all(|m| m["action"] == "eject"),
        "{media:?}"
    );
    let cd = commands
        .iter()
        .find(|c| c.kind == "bmc.bootDevice" && c.params["device"] == "cd")
        .expect("a one-time CD boot");
    assert_eq!(cd.params["persistent"], false);
    let erase = commands
        .iter()
        .rfind(|c| c.kind == "bmc.diskErase")
        .expect("the release's BMC erase");
    assert_eq!(erase.params["mode"], "secure-erase");
    assert!(
        commands.iter().any(|c| c.kind == "bmc.powerStatus"),
        "the deploy waited for the installer to power the machine off"
    );

    // A BMC that offers no erase: the release is unattested, announced,
    // and the pool's policy (`ready`) returns the node.
    env.faults.set("sim://oob-no-erase", Fault::BmcNoErase);
    let bare = env.enroll_sim_in("oob-no-erase", "a-agentless").await;
    env.wait_state(&bare, ProvisionState::Ready, T)
        .await
        .expect("ready");
    deploy_and_release(&env, &bare).await;
    let back = env
        .wait_state(&bare, ProvisionState::Ready, T)
        .await
        .expect("ready by the pool's policy");
    assert_eq!(back.last_error, None);
    let events = unverified.read(1, T).await.expect("events");
    assert_eq!(events.len(), 1, "one announcement");
    let data = &events[0].event.data;
    assert_eq!(data["nodeId"], bare.to_string());
    assert_eq!(data["outcome"], "ready");
    assert_eq!(data["reason"], "the BMC offers no drive erase");
    assert_eq!(data["poolId"], "a-agentless");

    // The pool's policy turned to `failed`: the next unattested release
    // holds the node with UNVERIFIED_WIPE, and says so.
    let (s, b) = env
        .put(
            "/api/compute/admin/pools/a-agentless",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "sim",
                    "agentMode": "none", "unattestedRelease": "failed"}),
        )
        .await
        .expect("pool");
    assert_eq!(s, 204, "{b}");
    deploy_and_release(&env, &bare).await;
    let failed = env
        .wait_state(&bare, ProvisionState::Failed, T)
        .await
        .expect("failed by the pool's policy");
    let error = failed.last_error.unwrap_or_default();
    assert!(error.starts_with("UNVERIFIED_WIPE"), "{error}");
    let events = unverified.read(1, T).await.expect("events");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].event.data["outcome"], "failed");

    // Exactly when: the attested release published nothing.
    let rest = unverified
        .drain(Duration::from_secs(2))
        .await
        .expect("drain");
    assert!(
        rest.iter()
            .all(|e| e.event.data["nodeId"] != erases.to_string()),
        "{rest:?}"
    );
}

#[tokio::test]
async fn verbs_an_agentless_pool_cannot_serve_are_refused_and_change_nothing() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.enroll_sim_in("oob-refusals", "a-agentless").await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");

    // A disk image cannot be handed to a BMC as an installer.
    let before = env.node(&id).await.expect("node");
    let (s, b) = env
        .verb(
            "deploy",
            &id,
            json!({"profileId": "ubuntu-24.04", "profileVersion": 1}),
        )
        .await;
    assert_eq!(
        (s, b["code"].as_str()),
        (422, Some("INVALID_CONFIG")),
        "{b}"
    );
    assert!(
        b["message"]
            .as_str()
            .unwrap_or("")
            .contains("installer ISO"),
        "{b}"
    );
    assert_eq!(env.node(&id).await.expect("node"), before, "unchanged");

    // Nothing boots an agent: no rescue, no adoption.
    env.verb_ok(
        "deploy",
        &id,
        json!({"profileId": "talos-iso", "profileVersion": 1}),
    )
    .await;
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("deployed");
    let before = env.node(&id).await.expect("node");
    let (s, b) = env.verb("rescue", &id, json!({})).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (422, Some("INVALID_CONFIG")),
        "{b}"
    );
    assert!(
        b["message"].as_str().unwrap_or("").contains("agentless"),
        "{b}"
    );
    assert_eq!(env.node(&id).await.expect("node"), before, "unchanged");
    let (s, b) = env
        .post(
            "/api/compute/metal/joinTokens",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "poolId": "a-agentless"}),
        )
        .await
        .expect("join token");
    assert_eq!(
        (s, b["code"].as_str()),
        (422, Some("INVALID_CONFIG")),
        "{b}"
    );

    // An installer ISO is not for a pool whose machines run bcd.
    let agent = env.enroll_sim("bcd-machine").await;
    env.wait_state(&agent, ProvisionState::Ready, T)
        .await
        .expect("ready");
    let (s, b) = env
        .verb(
            "deploy",
            &agent,
            json!({"profileId": "talos-iso", "profileVersion": 1}),
        )
        .await;
    assert_eq!(
        (s, b["code"].as_str()),
        (422, Some("INVALID_CONFIG")),
        "{b}"
    );
}

#[tokio::test]
async fn an_agentless_retire_needs_the_bmcs_erase() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    env.faults.set("sim://oob-retire-bare", Fault::BmcNoErase);
    let bare = env.enroll_sim_in("oob-retire-bare", "a-agentless").await;
    let erases = env.enroll_sim_in("oob-retire", "a-agentless").await;
    for id in [&bare, &erases] {
        env.wait_state(id, ProvisionState::Ready, T)
            .await
            .expect("ready");
        env.verb_ok("retire", id, json!({})).await;
    }
    env.wait_state(&erases, ProvisionState::Retired, T)
        .await
        .expect("retired after the BMC's crypto-erase");
    let failed = env
        .wait_state(&bare, ProvisionState::Failed, T)
        .await
        .expect("no erase, no retire");
    let error = failed.last_error.unwrap_or_default();
    assert!(
        error.contains("UNVERIFIED_WIPE") && error.contains("offers no drive erase"),
        "{error}"
    );
}

/// A dedicated lease on an agentless pool is torn down through the BMC
/// too: its erase, the firmware compared, the boot override reset and the
/// BMC password rotated, the lease going leased → bound → ending.
#[tokio::test]
async fn an_agentless_dedicated_lease_is_torn_down_through_the_bmc() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let leases = env
        .events_consumer(
            "oob-leases",
            &env.subjects().event(&tenant_a(), "node.tenant-root.>"),
        )
        .await
        .expect("consumer");
    let id = env.enroll_sim_in("oob-dedicated", "a-agentless").await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");
    env.verb_ok(
        "deploy",
        &id,
        json!({"profileId": "talos-iso-dedicated", "profileVersion": 1}),
    )
    .await;
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("deployed");
    let before = env.node(&id).await.expect("node").bmc_secret_id;
    env.verb_ok("undeploy", &id, json!({})).await;
    let back = env
        .wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready: the BMC's erase attested it");
    assert_ne!(back.bmc_secret_id, before, "the BMC password was rotated");
    let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let erase = commands
        .iter()
        .rposition(|c| c.kind == "bmc.diskErase")
        .expect("the release's erase");
    assert_eq!(
        commands[erase].params["mode"], "secure-erase",
        "never quick"
    );
    let after: Vec<&str> = commands[erase + 1..]
        .iter()
        .map(|c| c.kind.as_str())
        .collect();
    assert_eq!(
        after,
        [
            "bmc.power",
            "bmc.inspect",
            "bmc.bootDevice",
            "bmc.rotateCredentials"
        ]
    );
    let states: Vec<String> = leases
        .read(3, T)
        .await
        .expect("lease events")
        .iter()
        .map(|e| {
            e.event.data["state"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(states, ["leased", "bound", "ending"]);
}
