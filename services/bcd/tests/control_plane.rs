//! The real `bcd` binary as a simulated machine's ramdisk, against the
//! whole control plane (API, attestation, engine, reconciler on Postgres and
//! JetStream): a node reaches `ready` through real inventory, an
//! `unsupported` DCGM answer its pool accepts and a quick wipe that reads
//! back clean, every result attested; when the disk starts dropping writes
//! the release's signed wipe fails read-back and the node lands in `failed`
//! with `UNVERIFIED_WIPE`; once the disk is honest again `recover` releases
//! it to `ready`.

mod support;

use std::time::Duration;

use bcm_core::ProvisionState;
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_bcd_commissions_a_node_and_a_disk_that_lies_fails_the_release() {
    let dir = Scratch::new("cp");
    let backing = dir.0.join("backing.img");
    sparse(&backing, 1 << 30);
    prefill(&backing);
    let disk = LyingDisk::mount_honest(&backing, &dir.0.join("mnt"));

    let mut site = bcm_sim::SimConfig::new("s1");
    site.ramdisk_command = Some(vec![
        env!("CARGO_BIN_EXE_bcd").to_owned(),
        "ramdisk".to_owned(),
        "--disk".to_owned(),
        disk.file.display().to_string(),
        // Its key, session and command records stay in the test's scratch.
        "--state-dir".to_owned(),
        dir.0.join("bcd-state").display().to_string(),
    ]);
    let env = TestEnv::start_with(Options {
        site: Some(site),
        ..Default::default()
    })
    .await
    .expect("env");
    // A pool of machines without GPUs: `diag.dcgm` may answer unsupported.
    bcm_db::tenancy::pool_upsert(
        &env.db,
        &bcm_db::tenancy::Pool {
            id: "a-pool".parse().expect("pool"),
            tenant_id: "a".parse().expect("tenant"),
            site_id: "s1".parse().expect("site"),
            name: "a-pool".into(),
            hardware_profile: "gpu-redfish".into(),
            agent_mode: "bcd".into(),
            accept_unsupported_diag: true,
            deploy_profiles: None,
            release_wipe: "quick".into(),
            commission_wipe: "quick".into(),
            adopt_acceptance: None,
            unattested_release: "failed".into(),
            erase_methods: None,
        },
    )
    .await
    .expect("pool");

    let node = env.enroll_sim("bcd-1").await;
    env.wait_state(&node, ProvisionState::Ready, Duration::from_secs(120))
        .await
        .expect("ready");

    // Real inventory: our disk, this machine's CPUs.
    let inv = bcm_db::agents::node_fact_fetch(&env.db, &node.to_string(), "inventory")
        .await
        .expect("fact")
        .expect("inventory");
    assert_eq!(inv["disks"][0]["sizeBytes"], json!(1u64 << 30), "{inv}");
    let cpus = std::fs::read_to_string("/proc/cpuinfo")
        .expect("cpuinfo")
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    assert_eq!(inv["cpus"], json!(cpus));
    assert!(inv.get("sim").is_none(), "a real agent answered");

    // Every diagnostic and wipe result is signed and attested.
    let cmds = bcm_db::commands::commands_of_node(&env.db, &node.to_string())
        .await
        .expect("commands");
    let agent_cmds: Vec<_> = cmds
        .iter()
        .filter(|c| ["inventory", "diag.dcgm", "disk.wipe"].contains(&c.kind.as_str()))
        .collect();
    assert_eq!(
        agent_cmds.len(),
        3,
        "{:?}",
        cmds.iter().map(|c| &c.kind).collect::<Vec<_>>()
    );
    for c in &agent_cmds {
        assert!(c.attested_by.is_some(), "{} not attested", c.kind);
    }
    let dcgm = agent_cmds
        .iter()
        .find(|c| c.kind == "diag.dcgm")
        .expect("dcgm");
    assert_eq!(
        dcgm.result.as_ref().map(|r| r["output"]["status"].clone()),
        Some(json!("unsupported"))
    );
    let wipe = agent_cmds
        .iter()
        .find(|c| c.kind == "disk.wipe")
        .expect("wipe");
    assert_eq!(
        wipe.result
            .as_ref()
            .map(|r| r["output"]["disks"][0]["outcome"].clone()),
        Some(json!("verified"))
    );
    assert!(
        wipefs(&backing).trim().is_empty(),
        "commissioning's wipe took effect"
    );

    // Deployed (forced: the image path is bcd's own test), then the disk
    // starts lying: the release's wipe fails read-back.
    prefill(&backing);
    env.force_state(&node, ProvisionState::Deployed, None)
        .await
        .expect("force");
    disk.lie(true);
    let (status, body) = env.verb("undeploy", &node, json!({"wipe": "quick"})).await;
    assert_eq!(status, 200, "{body}");
    let failed = env
        .wait_state(&node, ProvisionState::Failed, Duration::from_secs(120))
        .await
        .expect("failed");
    assert_eq!(failed.failed_from, Some(ProvisionState::Releasing));
    let err = failed.last_error.clone().unwrap_or_default();
    assert!(err.contains("UNVERIFIED_WIPE"), "{err}");
    assert!(
        wipefs(&backing).contains("gpt"),
        "the lying disk kept its data"
    );
    let cmds = bcm_db::commands::commands_of_node(&env.db, &node.to_string())
        .await
        .expect("commands");
    let last_wipe = cmds
        .iter()
        .rev()
        .find(|c| c.kind == "disk.wipe")
        .expect("wipe");
    assert!(
        last_wipe.attested_by.is_some(),
        "the failed wipe is signed too"
    );
    assert_eq!(
        last_wipe
            .result
            .as_ref()
            .map(|r| r["output"]["disks"][0]["outcome"].clone()),
        Some(json!("failed"))
    );

    // Honest again: recover re-runs the release, which now verifies.
    disk.lie(false);
    let (status, body) = env.verb("recover", &node, json!({})).await;
    assert_eq!(status, 200, "{body}");
    env.wait_state(&node, ProvisionState::Ready, Duration::from_secs(120))
        .await
        .expect("ready after recover");
    assert!(wipefs(&backing).trim().is_empty());
    env.stop();
}
