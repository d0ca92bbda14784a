//! The bmc service's consumer (`bmc-<site>`) against commands that are not
//! its to run: bytes that are not a command, a command of an unknown kind,
//! a command for another site, a command published on another kind's
//! subject, a site command on a bmc subject. Each is dead-lettered with its
//! reason and no BMC operation runs.

use bcm_contracts::commands::{BmcParams, BmcTarget, Command};
use bcm_contracts::{CloudEvent, CommandEnvelope};
use bcm_core::BmcDriver;
use bcm_testkit::TestEnv;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const T: Duration = Duration::from_secs(30);

fn envelope(site: &str, command: Command) -> Vec<u8> {
    let cmd = CommandEnvelope {
        command_id: bcm_core::CommandId::generate().to_string(),
        site_id: site.parse().expect("site"),
        node_id: Some(bcm_core::NodeId::generate()),
        command,
        issued_at: chrono::Utc::now(),
        deadline: None,
        authority: None,
    };
    let ty = bcm_contracts::events::types::command(cmd.kind());
    serde_json::to_vec(&CloudEvent::new("c".into(), ty, None, None, cmd)).expect("json")
}

#[tokio::test]
async fn commands_that_are_not_this_services_are_dead_lettered_and_never_run() {
    let env = TestEnv::start().await.expect("env");
    let cfg = bcm_bmc::BmcConfig {
        site: "s1".into(),
        bus: env.bus_config.clone(),
        sealing_keys: env.sealing_keys.clone(),
        concurrency: 4,
        power_timeout_secs: 5,
        graceful_timeout_secs: 5,
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
        quorum_anchor_file: None,
    };
    let stop = CancellationToken::new();
    let drivers = cfg.drivers().expect("drivers");
    let (bmc, task) = bcm_bmc::start(&cfg, drivers, stop.clone())
        .await
        .expect("bmc service");
    let site: bcm_core::SiteId = "s1".parse().expect("site");
    let on = |kind: &str| env.subjects().command(&site, kind);
    let verify = || {
        Command::BmcVerify(BmcParams {
            bmc: BmcTarget {
                driver: BmcDriver::Redfish,
                address: "https://127.0.0.1:9".into(),
                tls: None,
                sealed_credentials: None,
            },
        })
    };

    env.publish_raw(&on("bmc.power"), b"power on, please")
        .await
        .expect("publish");
    env.publish_raw(
        &on("bmc.reboot"),
        &serde_json::to_vec(&json!({"specversion": "1.0", "id": "x", "source": "/x", "type": "x",
            "time": "2026-12-01T00:00:00Z", "datacontenttype": "application/json",
            "data": {"commandId": "c", "kind": "bmc.reboot", "siteId": "s1", "params": {}, "issuedAt": "2026-12-01T00:00:00Z"}}))
        .expect("json"),
    )
    .await
    .expect("publish");
    env.publish_raw(&on("bmc.verify"), &envelope("s2", verify()))
        .await
        .expect("publish");
    env.publish_raw(&on("bmc.power"), &envelope("s1", verify()))
        .await
        .expect("publish");
    env.publish_raw(
        &on("bmc.verify"),
        &envelope(
            "s1",
            Command::BootEntryClear(bcm_contracts::commands::BootEntryClearParams {
                macs: vec!["52:54:00:00:00:01".into()],
            }),
        ),
    )
    .await
    .expect("publish");

    let dead = env
        .dead_letters("bmc-s1", 5, T)
        .await
        .expect("dead letters");
    let reasons: Vec<&str> = dead.iter().map(|d| d.reason.as_str()).collect();
    assert_eq!(
        reasons
            .iter()
            .filter(|r| r.starts_with("undecodable"))
            .count(),
        2,
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("unknown command kind \"bmc.reboot\"")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("for site s2")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("bmc.verify command for site s1 arrived on")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("site.bootEntry.clear is not a bmc command")),
        "{reasons:?}"
    );
    assert_eq!(
        bmc.executed.load(Ordering::Relaxed),
        0,
        "no BMC operation ran"
    );
    stop.cancel();
    let _ = task.await;
    env.stop();
}
