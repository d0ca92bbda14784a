//! Dedicated-root leases in the simulated site: a deploy of a `dedicated`
//! profile opens a lease that goes `leased` → `bound` → `ending` → ended
//! with the node, each announced on the tenant's own subject; another
//! tenant sees neither the node, nor its lease, nor its events; a pool at
//! its maximum refuses the next lease, saying why, and the node does not
//! change; the release of a dedicated node is a full erase (`quick` is
//! refused), then resets the boot override and rotates the BMC password
//! (the tenant was root: it could reach the BMC from the host).

use bcm_core::ProvisionState;
use bcm_testkit::{tenant_a, Options, TestEnv};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

fn tenant_b() -> bcm_core::TenantId {
    "b".parse().expect("tenant b")
}

#[tokio::test]
async fn a_dedicated_lease_is_leased_bound_and_ending_seen_by_its_tenant_only() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let leases_a = env
        .events_consumer(
            "leases-a",
            &env.subjects().event(&tenant_a(), "node.tenant-root.>"),
        )
        .await
        .expect("consumer");
    let everything_b = env
        .events_consumer("all-b", &env.subjects().events_of_tenant(&tenant_b()))
        .await
        .expect("consumer");
    let id = env.enroll_sim("dedicated-1").await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");

    env.verb_ok(
        "deploy",
        &id,
        json!({"profileId": "dedicated-ubuntu", "profileVersion": 1}),
    )
    .await;
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("deployed");

    // The tenant was root: a quick release is refused and changes nothing.
    let before = env.node(&id).await.expect("node");
    let (s, b) = env.verb("undeploy", &id, json!({"wipe": "quick"})).await;
    assert_eq!(
        (s, b["code"].as_str()),
        (400, Some("INVALID_ARGUMENT")),
        "{b}"
    );
    assert!(
        b["message"].as_str().unwrap_or("").contains("full erase"),
        "{b}"
    );
    assert_eq!(env.node(&id).await.expect("node"), before, "unchanged");

    // No wipe named: the pool's (quick) becomes a secure erase.
    let rotations = env
        .events_consumer(
            "rotations",
            &env.subjects()
                .event(&tenant_a(), "node.credentials.rotation"),
        )
        .await
        .expect("consumer");
    let old_secret = before.bmc_secret_id.clone().expect("credentials on record");
    env.verb_ok("undeploy", &id, json!({})).await;
    let back = env
        .wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready again");
    let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let wipe = commands
        .iter()
        .rposition(|c| c.kind == "disk.wipe")
        .expect("the release's wipe");
    assert_eq!(commands[wipe].params["mode"], "secure-erase");
    // After the wipe: the firmware read (and compared), the boot override
    // reset to the disk, then the BMC password rotated to the teardown
    // password recorded at the verb.
    let after: Vec<&str> = commands[wipe + 1..]
        .iter()
        .map(|c| c.kind.as_str())
        .filter(|k| k.starts_with("bmc."))
        .collect();
    assert_eq!(
        after,
        [
            "bmc.power",
            "bmc.inspect",
            "bmc.bootDevice",
            "bmc.rotateCredentials"
        ],
        "{after:?}"
    );
    let reset = commands[wipe + 1..]
        .iter()
        .find(|c| c.kind == "bmc.bootDevice")
        .expect("reset-boot");
    assert_eq!(
        (&reset.params["device"], &reset.params["persistent"]),
        (&json!("disk"), &json!(true))
    );
    let new_secret = back.bmc_secret_id.clone().expect("credentials on record");
    assert_ne!(new_secret, old_secret, "the credentials on record are new");
    assert!(
        bcm_db::secrets::secret_fetch(&env.db, &old_secret)
            .await
            .is_err(),
        "the old credentials are forgotten"
    );
    let dump = bcm_testkit::dump_database(&env.database_url);
    assert!(
        !dump.contains("bmc-teardown-password"),
        "the teardown password is not kept once it is the node's"
    );
    let rotated = rotations.read(1, T).await.expect("rotation event");
    assert_eq!(rotated.len(), 1);
    assert_eq!(rotated[0].event.data["outcome"], "committed");
    assert!(rotated[0].event.data.get("password").is_none());

    let events = leases_a.read(3, T).await.expect("lease events");
    let states: Vec<&str> = events
        .iter()
        .map(|e| e.event.data["state"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(states, ["leased", "bound", "ending"], "in order");
    assert!(events
        .iter()
        .all(|e| e.event.data["nodeId"] == id.to_string()));
    let lease_id = events[0].event.data["leaseId"].clone();
    assert!(events.iter().all(|e| e.event.data["leaseId"] == lease_id));
    assert!(events
        .iter()
        .all(|e| e.event.data["deployProfile"] == "dedicated-ubuntu@1"));

    // The record: tenant, node, start, end, state.
    let (s, leases) = env
        .get(
            "/api/compute/metal/leases?tenantId=a",
            Some(&env.admin_token),
        )
        .await
        .expect("leases");
    assert_eq!(s, 200, "{leases}");
    let lease = &leases[0];
    assert_eq!(lease["leaseId"], lease_id);
    assert_eq!(lease["state"], "ended");
    assert_eq!(lease["nodeId"], id.to_string());
    for at in ["startedAt", "boundAt", "endingAt", "endedAt"] {
        assert!(lease[at].is_string(), "{at}: {lease}");
    }

    // Tenant b: not the node, not the lease, not one event.
    let b_reader = env
        .token("b-reader", &[("compute:nodes:read", "tenant", "b")])
        .await
        .expect("token");
    let (s, body) = env
        .get(&format!("/api/compute/metal/nodes/{id}"), Some(&b_reader))
        .await
        .expect("get");
    assert_eq!(s, 404, "{body}");
    let (s, body) = env
        .get("/api/compute/metal/leases?tenantId=a", Some(&b_reader))
        .await
        .expect("leases");
    // Not even whether tenant a exists.
    assert_eq!(
        (s, body["code"].as_str()),
        (404, Some("NOT_FOUND")),
        "{body}"
    );
    let (s, body) = env
        .get("/api/compute/metal/leases?tenantId=b", Some(&b_reader))
        .await
        .expect("leases");
    assert_eq!((s, body.as_array().map(Vec::len)), (200, Some(0)), "{body}");
    let seen = everything_b
        .drain(Duration::from_secs(1))
        .await
        .expect("drain");
    assert!(
        seen.iter()
            .all(|e| e.event.data["nodeId"] != id.to_string()),
        "tenant b saw: {seen:?}"
    );
}

#[tokio::test]
async fn a_pool_at_its_maximum_refuses_the_next_lease_saying_why() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let refused = env
        .events_consumer(
            "refused",
            &env.subjects()
                .event(&tenant_a(), "node.tenant-root.refused"),
        )
        .await
        .expect("consumer");
    let (s, b) = env
        .put(
            "/api/compute/admin/pools/a-pool",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "gpu-redfish",
                    "maxDedicatedLeases": 1}),
        )
        .await
        .expect("pool");
    assert_eq!(s, 204, "{b}");
    let (_, pool) = env
        .get("/api/compute/admin/pools/a-pool", Some(&env.admin_token))
        .await
        .expect("pool");
    assert_eq!(pool["maxDedicatedLeases"], 1, "{pool}");
    let first = env.enroll_sim("lease-first").await;
    let second = env.enroll_sim("lease-second").await;
    for id in [&first, &second] {
        env.wait_state(id, ProvisionState::Ready, T)
            .await
            .expect("ready");
    }
    env.verb_ok(
        "deploy",
        &first,
        json!({"profileId": "dedicated-ubuntu", "profileVersion": 1}),
    )
    .await;
    let before = env.node(&second).await.expect("node");
    let (s, b) = env
        .verb(
            "deploy",
            &second,
            json!({"profileId": "dedicated-ubuntu", "profileVersion": 1}),
        )
        .await;
    assert_eq!((s, b["code"].as_str()), (409, Some("CONFLICT")), "{b}");
    let message = b["message"].as_str().unwrap_or_default();
    assert!(message.contains("maxDedicatedLeases 1"), "{message}");
    assert_eq!(env.node(&second).await.expect("node"), before, "unchanged");

    let events = refused.read(1, T).await.expect("refused");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event.data["nodeId"], second.to_string());
    assert!(events[0].event.data["reason"]
        .as_str()
        .unwrap_or_default()
        .contains("maxDedicatedLeases 1"));
    let (_, leases) = env
        .get(
            "/api/compute/metal/leases?tenantId=a",
            Some(&env.admin_token),
        )
        .await
        .expect("leases");
    let states: Vec<(&str, &str)> = leases
        .as_array()
        .expect("list")
        .iter()
        .map(|l| {
            (
                l["nodeId"].as_str().unwrap_or_default(),
                l["state"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    let (f, s2) = (first.to_string(), second.to_string());
    assert!(states.contains(&(s2.as_str(), "refused")), "{states:?}");
    assert!(
        states
            .iter()
            .any(|(n, st)| *n == f && matches!(*st, "leased" | "bound")),
        "{states:?}"
    );
    // A host deploy asks for no lease: admitted.
    env.verb_ok(
        "deploy",
        &second,
        json!({"profileId": "ubuntu-24.04", "profileVersion": 1}),
    )
    .await;
    // A pool that admits none says so as configuration.
    let (s, b) = env
        .put(
            "/api/compute/admin/pools/a-pool",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "gpu-redfish",
                    "maxDedicatedLeases": 0}),
        )
        .await
        .expect("pool");
    assert_eq!(s, 204, "{b}");
    let third = env.enroll_sim("lease-third").await;
    env.wait_state(&third, ProvisionState::Ready, T)
        .await
        .expect("ready");
    let (s, b) = env
        .verb(
            "deploy",
            &third,
            json!({"profileId": "dedicated-ubuntu", "profileVersion": 1}),
        )
        .await;
    assert_eq!(
        (s, b["code"].as_str()),
        (422, Some("INVALID_CONFIG")),
        "{b}"
    );
}

/// A root tenant may have flashed the machine: the firmware the BMC reports
/// at the teardown is compared with what commissioning recorded, and a
/// change fails the release for an operator, naming it; the BMC password
/// is then not rotated (the release stopped before).
#[tokio::test]
async fn a_firmware_change_under_a_dedicated_lease_fails_its_teardown() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.enroll_sim("flashed").await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");
    let recorded = bcm_db::agents::node_fact_fetch(&env.db, &id.to_string(), "firmware")
        .await
        .expect("fact")
        .expect("commissioning recorded the firmware");
    assert_eq!(recorded["bios"], "SIM-BIOS-1.0", "{recorded}");
    env.verb_ok(
        "deploy",
        &id,
        json!({"profileId": "dedicated-ubuntu", "profileVersion": 1}),
    )
    .await;
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("deployed");
    env.faults
        .set("sim://flashed", bcm_sim::Fault::FirmwareChanged);
    let secret = env.node(&id).await.expect("node").bmc_secret_id;
    env.verb_ok("undeploy", &id, json!({"wipe": "crypto-erase"}))
        .await;
    let failed = env
        .wait_state(&id, ProvisionState::Failed, T)
        .await
        .expect("failed");
    let error = failed.last_error.unwrap_or_default();
    assert!(
        error.contains("FIRMWARE_CHANGED") && error.contains("bios SIM-BIOS-1.0 → SIM-BIOS-1.1"),
        "{error}"
    );
    assert_eq!(failed.bmc_secret_id, secret, "not rotated");
}
