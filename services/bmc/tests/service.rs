//! The bmc service in the control plane, against sushy-emulator with auth
//! on: three fake systems enrolled through the public API finish
//! `metal-enroll` with the MACs of their `EthernetInterfaces`; `metal.power`
//! on/off/cycle lands on the emulator and in the node's `power`; a
//! redelivered command does not act twice; no plaintext credential shows in
//! an API response, a NATS message or a Postgres column.

mod peers;

use bcm_core::{NodeId, PowerState, ProvisionState};
use bcm_testkit::{eventually, Options, TestEnv};
use peers::{sushy_mac, IpmiSim, Sushy};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

/// The control plane with a simulated site that leaves `bmc.*` to the real
/// bmc service, and `reconcilers` in-process reconcilers.
async fn env_with_bmc_service(reconcilers: usize) -> TestEnv {
    let mut site = bcm_sim::SimConfig::new("s1");
    site.bmc_service = true;
    TestEnv::start_with(Options {
        site: Some(site),
        reconcilers,
        ..Options::with_site()
    })
    .await
    .expect("env")
}

async fn start(env: &TestEnv) -> std::sync::Arc<bcm_bmc::service::Ctx> {
    let cfg = bcm_bmc::BmcConfig {
        site: "s1".into(),
        bus: env.bus_config.clone(),
        sealing_keys: env.sealing_keys.clone(),
        concurrency: 16,
        power_timeout_secs: 40,
        graceful_timeout_secs: 15,
        tls_ca_file: None,
        tls_insecure: false,
        ipmitool: "ipmitool".into(),
        // IPMI through the plugin this package builds.
        plugins: [(
            "ipmi".to_owned(),
            std::path::PathBuf::from(env!("CARGO_BIN_EXE_bcx-ipmi")),
        )]
        .into_iter()
        .collect(),
        telemetry: Default::default(),
        quorum_anchor_file: Some(env.anchor_file()),
    };
    let (ctx, _task) = bcm_bmc::start(&cfg, cfg.drivers().expect("drivers"), env.child_token())
        .await
        .expect("bmc service");
    ctx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_nodes_enroll_power_and_never_leak_credentials() {
    let sushy = Sushy::start(3).await;
    let env = env_with_bmc_service(1).await;
    let wire = peers::record_all_messages(&env).await;
    let bmc = start(&env).await;

    let mut ids: Vec<NodeId> = vec![];
    for i in 1..=3 {
        let (s, b) = env
            .post(
                "/api/compute/metal/enroll",
                Some(&env.admin_token),
                &json!({"tenantId": "a", "poolId": "a-pool", "bmc": {"driver": "redfish",
                    "address": sushy.system_address(i), "username": sushy.username, "password": sushy.password}}),
            )
            .await
            .expect("enroll");
        assert_eq!(s, 200, "{b}");
        assert!(!b.to_string().contains(&sushy.password), "{b}");
        ids.push(b["nodeId"].as_str().expect("id").parse().expect("id"));
    }
    // metal-enroll ends with the emulator's MACs; the chain then goes on to
    // inspecting (whose PXE boot this emulator cannot do).
    for (i, id) in ids.iter().enumerate() {
        let n = env
            .wait_state(id, ProvisionState::Inspecting, T)
            .await
            .expect("enroll finished");
        assert_eq!(n.macs, vec![sushy_mac(i + 1)], "node {id}");
    }

    // Out of inspecting (abort runs its cleanup: power off), then the power
    // axis through the API.
    let id = ids[0];
    env.verb_ok("abort", &id, json!({})).await;
    env.wait_state(&id, ProvisionState::Failed, T)
        .await
        .expect("failed");
    for (action, want) in [
        ("on", PowerState::On),
        ("off", PowerState::Off),
        ("cycle", PowerState::On),
    ] {
        let (s, b) = env.verb("power", &id, json!({"action": action})).await;
        assert_eq!(s, 200, "{b}");
        eventually(T, || async {
            Ok((env.node(&id).await?.power == want).then_some(()))
        })
        .await
        .unwrap_or_else(|e| panic!("power {action}: {e}"));
        let d = sushy.driver(1);
        assert_eq!(
            d.power_state().await.expect("read"),
            want,
            "the emulator agrees"
        );
        d.close().await;
    }

    // A command re-sent with the same command id (as after a crash between
    // publish and ack) is answered from the stored result, not re-executed.
    let resets = sushy.resets(1);
    let executed = bmc.executed.load(std::sync::atomic::Ordering::Relaxed);
    let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let last_power = commands
        .iter()
        .rev()
        .find(|c| c.kind == "bmc.power")
        .expect("a power command");
    let envelope = bcm_contracts::CommandEnvelope {
        command_id: last_power.id.clone(),
        site_id: "s1".parse().expect("site"),
        node_id: Some(id),
        command: bcm_contracts::Command::from_parts("bmc.power", last_power.params.clone())
            .expect("the stored command decodes"),
        issued_at: chrono::Utc::now(),
        deadline: None,
        authority: None,
    };
    let bus = &env.state.inner.bus;
    let event = bcm_contracts::CloudEvent::new(
        "again".into(),
        bcm_contracts::events::types::command(bcm_contracts::CommandKind::BmcPower),
        Some(id.to_string()),
        None,
        envelope,
    );
    bus.publish_durable(
        &bus.subjects()
            .command(&"s1".parse().expect("site"), "bmc.power"),
        "redelivered-copy",
        &[],
        serde_json::to_vec(&event).expect("json").into(),
    )
    .await
    .expect("publish");
    // The service handled the copy once it acked it: nothing pending and
    // nothing awaiting an ack on its consumer.
    eventually(T, || async {
        let mut consumer: async_nats::jetstream::consumer::PullConsumer = bus
            .jetstream()
            .get_consumer_from_stream(
                "bmc-s1",
                &bus.subjects()
                    .stream(bcm_bus::subjects::StreamKind::Commands),
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let info = consumer.info().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok((info.delivered.stream_sequence > 0
            && info.num_pending == 0
            && info.num_ack_pending == 0)
            .then_some(()))
    })
    .await
    .expect("the copy was handled and acked");
    assert_eq!(sushy.resets(1), resets, "no second reset");
    assert_eq!(
        bmc.executed.load(std::sync::atomic::Ordering::Relaxed),
        executed,
        "nothing executed again"
    );

    // A power command the service had begun when it died (recorded as
    // begun, no result published) is answered as interrupted, retryably,
    // and not run again: the engine decides what to do, the BMC is not
    // reset a second time behind its back.
    let site: bcm_core::SiteId = "s1".parse().expect("site");
    let interrupted = bcm_core::CommandId::generate().to_string();
    let mut cycle = last_power.params.clone();
    cycle["action"] = json!("cycle");
    let runs = bcm_bus::kv::Bucket::open_expiring(
        bus,
        &bus.subjects().kv_bucket("bmc_runs", &site),
        bcm_bus::streams::COMMAND_RETENTION,
    )
    .await
    .expect("the run bucket");
    assert!(runs
        .create(
            &bcm_bus::kv::key_token(&interrupted),
            &json!({"run": "started"})
        )
        .await
        .expect("begun"));
    let envelope = bcm_contracts::CommandEnvelope {
        command_id: interrupted.clone(),
        site_id: site.clone(),
        node_id: Some(id),
        command: bcm_contracts::Command::from_parts("bmc.power", cycle).expect("a power command"),
        issued_at: chrono::Utc::now(),
        deadline: None,
        authority: None,
    };
    let event = bcm_contracts::CloudEvent::new(
        "interrupted".into(),
        bcm_contracts::events::types::command(bcm_contracts::CommandKind::BmcPower),
        Some(id.to_string()),
        None,
        envelope,
    );
    bus.publish_durable(
        &bus.subjects().command(&site, "bmc.power"),
        &interrupted,
        &[],
        serde_json::to_vec(&event).expect("json").into(),
    )
    .await
    .expect("publish");
    let answer = eventually(T, || async {
        let stream = bus
            .jetstream()
            .get_stream(
                bus.subjects()
                    .stream(bcm_bus::subjects::StreamKind::Results),
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(stream
            .get_last_raw_message_by_subject(&bus.subjects().result(&site, &interrupted))
            .await
            .ok()
            .and_then(|m| serde_json::from_slice::<serde_json::Value>(&m.payload).ok()))
    })
    .await
    .expect("answered");
    assert_eq!(answer["data"]["ok"], false, "{answer}");
    assert_eq!(answer["data"]["retryable"], true, "{answer}");
    assert!(
        answer["data"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("not run again")),
        "{answer}"
    );
    assert_eq!(
        sushy.resets(1),
        resets,
        "the interrupted cycle was not run again"
    );
    assert_eq!(
        bmc.executed.load(std::sync::atomic::Ordering::Relaxed),
        executed,
        "nothing executed"
    );

    // No plaintext credential in any NATS message body or Postgres column.
    let wire = wire.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        wire.len() > 100,
        "the recorder saw the traffic: {}",
        wire.len()
    );
    assert!(
        wire.iter().all(|b| !b.contains(&sushy.password)),
        "a NATS message carries the password"
    );
    assert!(!bcm_testkit::dump_database(&env.database_url).contains(&sushy.password));
    for id in &ids {
        let (s, b) = env
            .get(
                &format!("/api/compute/metal/nodes/{id}"),
                Some(&env.admin_token),
            )
            .await
            .expect("get");
        assert_eq!(s, 200, "{b}");
        assert!(!b.to_string().contains(&sushy.password));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmi_nodes_enroll_with_their_given_macs_and_a_wrong_password_fails_enrolling() {
    let sim = IpmiSim::start().await;
    let env = env_with_bmc_service(1).await;
    let _bmc = start(&env).await;
    let enroll = |password: &str, mac: &str| {
        json!({"tenantId": "a", "poolId": "a-pool", "macs": [mac],
            "hardwareProfile": "ipmi", "bmc": {"driver": "ipmi", "address": sim.address(), "username": sim.username, "password": password}})
    };
    let (s, b) = env
        .post(
            "/api/compute/metal/enroll",
            Some(&env.admin_token),
            &enroll(&sim.password, "52:54:00:aa:00:01"),
        )
        .await
        .expect("enroll");
    assert_eq!(s, 200, "{b}");
    let good: NodeId = b["nodeId"].as_str().expect("id").parse().expect("id");
    let n = env
        .wait_state(&good, ProvisionState::Inspecting, T)
        .await
        .expect("enroll finished over IPMI");
    assert_eq!(
        n.macs,
        vec!["52:54:00:aa:00:01".to_owned()],
        "IPMI sees no NICs: the given MACs stand"
    );

    // A wrong password, on a BMC of its own.
    let other = IpmiSim::start().await;
    let (s, b) = env
        .post("/api/compute/metal/enroll", Some(&env.admin_token), &json!({"tenantId": "a", "poolId": "a-pool",
            "macs": ["52:54:00:aa:00:02"],
            "hardwareProfile": "ipmi", "bmc": {"driver": "ipmi", "address": other.address(), "username": other.username, "password": "wrong-password"}}))
        .await
        .expect("enroll");
    assert_eq!(s, 200, "{b}");
    let bad: NodeId = b["nodeId"].as_str().expect("id").parse().expect("id");
    let n = env
        .wait_state(&bad, ProvisionState::Failed, T)
        .await
        .expect("failed");
    assert_eq!(n.failed_from, Some(ProvisionState::Enrolling));
    let err = n.last_error.unwrap_or_default();
    assert!(
        err.contains("authentication failed") && err.contains(&other.address()),
        "{err}"
    );
    assert!(!err.contains("wrong-password"), "{err}");
    assert!(
        other.events().is_empty(),
        "nothing happened to that chassis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_power_sync_finds_drift_and_publishes_it() {
    let sushy = Sushy::start(1).await;
    let env = env_with_bmc_service(0).await;
    env.spawn_reconciler_with(bcm_testkit::ReconcilerConfig {
        metal_poll_ms: 2000,
        lease_ttl_ms: 3000,
        power_sync_secs: 1,
        ..Default::default()
    });
    let _bmc = start(&env).await;
    let reader = env
        .events_consumer("power", &env.subjects().events_all())
        .await
        .expect("consumer");
    let (s, b) = env
        .post("/api/compute/metal/enroll", Some(&env.admin_token), &json!({"tenantId": "a", "poolId": "a-pool",
            "bmc": {"driver": "redfish", "address": sushy.system_address(1), "username": sushy.username, "password": sushy.password}}))
        .await
        .expect("enroll");
    assert_eq!(s, 200, "{b}");
    let id: NodeId = b["nodeId"].as_str().expect("id").parse().expect("id");
    env.wait_state(&id, ProvisionState::Inspecting, T)
        .await
        .expect("inspecting");
    env.verb_ok("abort", &id, json!({})).await;
    env.wait_state(&id, ProvisionState::Failed, T)
        .await
        .expect("failed");
    // Off, and nothing of the control plane's own still on its way to the
    // BMC (the inspection's power-on, the cleanup's power-off): a late one
    // would undo the power-on below (seen once in CI: "On: PowerState did
    // not read on within 120 s"). Power reads come every second; they
    // change nothing.
    eventually(T, || async {
        let off = env.node(&id).await?.power == PowerState::Off;
        let in_flight = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
            .await?
            .into_iter()
            .any(|c| c.kind != "bmc.powerStatus" && !c.status.is_done());
        Ok((off && !in_flight).then_some(()))
    })
    .await
    .expect("off after the abort's cleanup, its commands done");

    // Someone powers the machine on behind the control plane's back.
    let d = sushy.driver(1);
    d.power(bcm_core::PowerAction::On).await.expect("on");
    d.close().await;
    eventually(T, || async {
        Ok((env.node(&id).await?.power == PowerState::On).then_some(()))
    })
    .await
    .expect("the sync saw the drift");
    let events = reader
        .drain(Duration::from_millis(1500))
        .await
        .expect("events");
    let drift: Vec<_> = events
        .iter()
        .filter(|e| e.event.ty == "node.power.changed")
        .map(|e| {
            (
                e.event.data["previous"].clone(),
                e.event.data["power"].clone(),
            )
        })
        .collect();
    assert!(
        drift.contains(&(json!("off"), json!("on"))),
        "node.power.changed off → on: {drift:?}"
    );
    let reads = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands")
        .into_iter()
        .filter(|c| c.kind == "bmc.powerStatus")
        .count();
    assert!(reads >= 1, "the sync read the BMC");
}

/// The run: a pool whose profile says Redfish, one node that
/// overrides it with IPMI. Each is enrolled and powered through the driver
/// its effective profile binds: the neighbour through sushy-tools' Redfish,
/// the IPMI node through the `bcx-ipmi` plugin against ipmi_sim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redfish_pool_with_an_ipmi_override_powers_each_node_through_its_driver() {
    let sushy = Sushy::start(1).await;
    let sim = IpmiSim::start().await;
    let env = env_with_bmc_service(1).await;
    let _bmc = start(&env).await;
    let enroll = |body: serde_json::Value| {
        let env = &env;
        async move {
            let (s, b) = env
                .post("/api/compute/metal/enroll", Some(&env.admin_token), &body)
                .await
                .expect("enroll");
            assert_eq!(s, 200, "{b}");
            b
        }
    };
    // No driver named: each gets what its effective profile binds.
    let redfish = enroll(json!({"tenantId": "a", "poolId": "a-pool",
        "bmc": {"address": sushy.system_address(1), "username": sushy.username, "password": sushy.password}}))
    .await;
    let ipmi = enroll(
        json!({"tenantId": "a", "poolId": "a-pool", "hardwareProfile": "ipmi",
        "macs": ["52:54:00:aa:00:07"],
        "bmc": {"address": sim.address(), "username": sim.username, "password": sim.password}}),
    )
    .await;
    assert_eq!(redfish["bmc"]["driver"], "redfish");
    assert_eq!(ipmi["bmc"]["driver"], "ipmi");
    let ids: Vec<NodeId> = [&redfish, &ipmi]
        .iter()
        .map(|b| b["nodeId"].as_str().expect("id").parse().expect("id"))
        .collect();
    for id in &ids {
        env.wait_state(id, ProvisionState::Inspecting, T)
            .await
            .expect("enrolled through its driver");
        env.force_state(id, ProvisionState::Ready, None)
            .await
            .expect("ready");
    }
    let resets_before = sushy.resets(1);
    let events_before = sim.events().len();
    for id in &ids {
        env.verb_ok("power", id, json!({"action": "cycle"})).await;
    }
    eventually(T, || async {
        Ok((sushy.resets(1) > resets_before && sim.events().len() > events_before).then_some(()))
    })
    .await
    .expect("each BMC saw its power cycle");
    // And each command went out with its own driver.
    for (id, driver) in ids.iter().zip(["redfish", "ipmi"]) {
        let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
            .await
            .expect("commands");
        let power = commands
            .iter()
            .rev()
            .find(|c| c.kind == "bmc.power")
            .expect("a power command");
        assert_eq!(power.params["bmc"]["driver"], driver);
    }
}

/// Each vendor-shaped BMC (`peers::vendor_sim`: Dell iDRAC 9 with its NICs
/// only under the adapters, HPE iLO 5, Supermicro X13, Lenovo XCC, DMTF's
/// rackmount) enrolled through the public API ends `metal-enroll` in
/// `inspecting` with the MACs its firmware shape puts where it does, in
/// boot order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vendor_shaped_bmcs_enroll_through_the_api_with_their_macs() {
    let env = env_with_bmc_service(1).await;
    let _bmc = start(&env).await;
    let mut sims = vec![];
    for shape in peers::vendor_sim::all() {
        let sim = peers::vendor_sim::VendorSim::start(shape).await;
        let (s, b) = env
            .post(
                "/api/compute/metal/enroll",
                Some(&env.admin_token),
                &json!({"tenantId": "a", "poolId": "a-pool", "bmc": {"driver": "redfish",
                    "address": sim.address(), "username": peers::vendor_sim::USER,
                    "password": peers::vendor_sim::PASSWORD}}),
            )
            .await
            .expect("enroll");
        assert_eq!(s, 200, "{}: {b}", sim.shape.name);
        let id: NodeId = b["nodeId"].as_str().expect("id").parse().expect("id");
        sims.push((sim, id));
    }
    for (sim, id) in &sims {
        let n = env
            .wait_state(id, ProvisionState::Inspecting, T)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", sim.shape.name));
        let want: Vec<String> = sim.shape.macs.iter().map(|m| m.to_string()).collect();
        assert_eq!(n.macs, want, "{}", sim.shape.name);
    }
}
