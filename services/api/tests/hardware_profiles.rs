//! Hardware profiles as data: the configured ones are readable; a node's
//! effective profile is its override, else its pool's, else the default,
//! and its BMC driver is what that profile binds; each BMC command carries
//! the driver of its concern (power or management); a profile nobody
//! configured, a driver that contradicts the profile, or a profile that
//! cannot serve enrollment is `INVALID_CONFIG` before anything is written;
//! and a driver the site does not host fails the step with
//! `unsupported-driver`, which the node's `lastError` says.

use bcm_core::hardware::{BootDriver, Drivers, HardwareProfile};
use bcm_core::{BmcDriver, NodeId, ProvisionState};
use bcm_testkit::{Options, TestEnv};
use serde_json::{json, Value};
use std::time::Duration;

fn profiles() -> std::collections::BTreeMap<String, HardwareProfile> {
    let mut m = std::collections::BTreeMap::new();
    m.insert(
        "split".to_owned(),
        HardwareProfile {
            description: "power over IPMI, the rest over Redfish".into(),
            drivers: Drivers {
                power: BmcDriver::Ipmi,
                ..Drivers::of_bmc(BmcDriver::Redfish)
            },
        },
    );
    m.insert(
        "no-pxe".to_owned(),
        HardwareProfile {
            description: "cannot network-boot".into(),
            drivers: Drivers {
                boot: BootDriver::None,
                ..Drivers::of_bmc(BmcDriver::Redfish)
            },
        },
    );
    m.insert(
        "acme".to_owned(),
        HardwareProfile {
            description: "a driver hosted as a plugin that no build of ours knows".into(),
            drivers: Drivers::of_bmc(BmcDriver::parse("plugin:acme").expect("plugin")),
        },
    );
    m
}

async fn enroll(env: &TestEnv, extra: Value, bmc: Value) -> (u16, Value) {
    let mut body = json!({"tenantId": "a", "poolId": "a-pool"});
    let mut b = json!({"address": format!("https://bmc-{}.test", ulid::Ulid::new().to_string().to_lowercase()),
                       "username": "u", "password": "p"});
    if let (Some(b), Some(e)) = (b.as_object_mut(), bmc.as_object()) {
        b.extend(e.clone());
    }
    body["bmc"] = b;
    if let (Some(o), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    env.post("/api/compute/metal/enroll", Some(&env.admin_token), &body)
        .await
        .expect("enroll")
}

async fn node_count(env: &TestEnv) -> usize {
    let (s, b) = env
        .get(
            "/api/compute/metal/nodes?tenantId=a",
            Some(&env.admin_token),
        )
        .await
        .expect("list");
    assert_eq!(s, 200, "{b}");
    b["nodes"].as_array().map(Vec::len).unwrap_or_default()
}

#[tokio::test]
async fn the_effective_profile_picks_each_concerns_driver_and_bad_profiles_write_nothing() {
    let mut opts = Options::api_only();
    opts.hardware_profiles = profiles();
    let env = TestEnv::start_with(opts).await.expect("env");

    let (s, list) = env
        .get("/api/compute/hardwareProfiles", Some(&env.admin_token))
        .await
        .expect("list");
    assert_eq!(s, 200, "{list}");
    let names: Vec<&str> = list
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for n in [
        "acme",
        "gpu-redfish",
        "ipmi",
        "no-pxe",
        "redfish",
        "sim",
        "split",
    ] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
    let split = list
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == "split"))
        .expect("split");
    assert_eq!(split["drivers"]["power"], "ipmi");
    assert_eq!(split["drivers"]["management"], "redfish");
    let (s, _) = env
        .get("/api/compute/hardwareProfiles", None)
        .await
        .expect("anonymous");
    assert_eq!(s, 401);

    // The pool's profile (gpu-redfish) gives the BMC driver when the
    // enroll names none; an override replaces it.
    let (s, pooled) = enroll(&env, json!({}), json!({})).await;
    assert_eq!(s, 200, "{pooled}");
    assert_eq!(pooled["bmc"]["driver"], "redfish");
    let (s, ipmi) = enroll(
        &env,
        json!({"hardwareProfile": "ipmi"}),
        json!({"address": "10.0.0.9:623"}),
    )
    .await;
    assert_eq!(s, 200, "{ipmi}");
    assert_eq!(ipmi["bmc"]["driver"], "ipmi");
    let id: NodeId = ipmi["nodeId"].as_str().expect("id").parse().expect("id");
    let node = env.node(&id).await.expect("node");
    assert_eq!(node.hardware_profile, "ipmi");
    assert_eq!(node.drivers, Some(Drivers::of_bmc(BmcDriver::Ipmi)));

    // A driver only a plugin knows enrolls like a built-in one; its
    // address is the plugin's to read.
    let (s, acme) = enroll(
        &env,
        json!({"hardwareProfile": "acme"}),
        json!({"address": "acme-bmc-1"}),
    )
    .await;
    assert_eq!(s, 200, "{acme}");
    assert_eq!(acme["bmc"]["driver"], "plugin:acme");
    let (s, bad) = enroll(
        &env,
        json!({"hardwareProfile": "acme"}),
        json!({"address": "acme bmc 1"}),
    )
    .await;
    assert_eq!(
        (s, bad["code"].as_str()),
        (422, Some("INVALID_CONFIG")),
        "{bad}"
    );

    // Refused before anything is written: a profile nobody configured, a
    // driver that contradicts the profile, a profile that cannot boot the
    // ramdisk enrollment needs.
    let before = node_count(&env).await;
    for (extra, bmc, says) in [
        (
            json!({"hardwareProfile": "nope"}),
            json!({}),
            "hardware profile \"nope\" is not configured",
        ),
        (
            json!({}),
            json!({"driver": "ipmi", "address": "10.0.0.8:623"}),
            "contradicts hardware profile gpu-redfish",
        ),
        (
            json!({"hardwareProfile": "no-pxe"}),
            json!({}),
            "binds no boot driver",
        ),
    ] {
        let (s, e) = enroll(&env, extra.clone(), bmc).await;
        assert_eq!(
            (s, e["code"].as_str()),
            (422, Some("INVALID_CONFIG")),
            "{extra}: {e}"
        );
        assert!(
            e["message"].as_str().is_some_and(|m| m.contains(says)),
            "{e}"
        );
    }
    let (s, e) = enroll(&env, json!({"hardwareProfile": "Not A Name"}), json!({})).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (400, Some("INVALID_ARGUMENT")),
        "{e}"
    );
    assert_eq!(node_count(&env).await, before, "nothing was written");

    // Each command carries its concern's driver: power over IPMI, the
    // password (management) over Redfish.
    let (s, split) = enroll(&env, json!({"hardwareProfile": "split"}), json!({})).await;
    assert_eq!(s, 200, "{split}");
    assert_eq!(split["bmc"]["driver"], "redfish", "the management driver");
    let id: NodeId = split["nodeId"].as_str().expect("id").parse().expect("id");
    env.force_state(&id, ProvisionState::Ready, None)
        .await
        .expect("ready");
    env.verb_ok("power", &id, json!({"action": "on"})).await;
    env.verb_ok("rotateCredentials", &id, json!({})).await;
    let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let driver_of = |kind: &str| {
        commands
            .iter()
            .find(|c| c.kind == kind)
            .map(|c| c.params["bmc"]["driver"].clone())
            .unwrap_or_else(|| panic!("no {kind} command"))
    };
    assert_eq!(driver_of("bmc.power"), "ipmi");
    assert_eq!(driver_of("bmc.rotateCredentials"), "redfish");

    // A pool may only name a configured profile.
    let (s, e) = env
        .put(
            "/api/compute/admin/pools/a-pool",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "nope"}),
        )
        .await
        .expect("put");
    assert_eq!(
        (s, e["code"].as_str()),
        (422, Some("INVALID_CONFIG")),
        "{e}"
    );
    let (_, pool) = env
        .get("/api/compute/admin/pools/a-pool", Some(&env.admin_token))
        .await
        .expect("get");
    assert_eq!(pool["hardwareProfile"], "gpu-redfish");
}

#[tokio::test]
async fn a_driver_the_site_does_not_host_fails_enrollment_with_unsupported_driver() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    // The simulated site hosts the sim BMC driver only; the pool's profile
    // binds Redfish.
    let (s, n) = enroll(&env, json!({}), json!({})).await;
    assert_eq!(s, 200, "{n}");
    let id: NodeId = n["nodeId"].as_str().expect("id").parse().expect("id");
    let node = env
        .wait_state(&id, ProvisionState::Failed, Duration::from_secs(60))
        .await
        .expect("failed");
    assert_eq!(node.failed_from, Some(ProvisionState::Enrolling));
    let last = node.last_error.unwrap_or_default();
    assert!(last.contains("unsupported-driver: redfish"), "{last}");
    // Its neighbour, enrolled with the sim profile, is served.
    let sim = env.enroll_sim("neighbour").await;
    env.wait_state(&sim, ProvisionState::Ready, Duration::from_secs(60))
        .await
        .expect("ready");
}
