//! The boot service in the control plane: the simulated site leaves
//! `site.*` to it and its machines PXE-boot by fetching their iPXE script
//! from it, as real ones do (a DHCP exchange for the script's one-time
//! link, then the script). `metal-inspect`'s boot entry (with the
//! ramdisk's one-time join token) therefore reaches the ramdisk only through
//! our boot service; the nodes get to `ready`, and the entries are cleared
//! once inspection is done.

mod support;

use bcm_core::ProvisionState;
use bcm_testkit::{Options, TestEnv};
use std::time::Duration;
use support::Scratch;

/// The control plane with a simulated site whose machines boot through a
/// boot service whose proxy DHCP (PXE port) is on the returned UDP port
/// (started by the test, or not).
async fn env_with_boot_service() -> (TestEnv, u16) {
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let mut site = bcm_sim::SimConfig::new("s1");
    site.boot_service = true;
    site.boot_dhcp = Some(format!("127.0.0.1:{port}").parse().expect("addr"));
    let env = TestEnv::start_with(Options {
        site: Some(site),
        ..Options::with_site()
    })
    .await
    .expect("env");
    (env, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_boots_the_ramdisk_through_the_boot_service() {
    let (env, port) = env_with_boot_service().await;
    let dir = Scratch::new("wired");
    support::boot_files(&dir.0.join("boot"));
    let mut cfg = support::config(&env, &dir.0, 9, "a");
    cfg.dhcp.pxe_port = port;
    let boot = support::Boot::start(&cfg).await;

    let nodes = env.enroll_sims("wired", 3).await;
    for id in &nodes {
        env.wait_state(id, ProvisionState::Ready, Duration::from_secs(90))
            .await
            .expect("ready through the real boot service");
    }
    for id in &nodes {
        let node = env.node(id).await.expect("node");
        for mac in &node.macs {
            let mac = bcm_boot::entries::Mac::parse(mac).expect("mac");
            assert!(
                boot.running.entries.live(&mac).is_none(),
                "the boot entry of {mac} was cleared after inspection"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_boot_service_inspection_does_not_finish() {
    // The same site pointing at a boot service that is not there: the
    // machines find no script, the ramdisk never joins, nothing is `ready`.
    let (env, _) = env_with_boot_service().await;
    let nodes = env.enroll_sims("unwired", 1).await;
    env.wait_state(
        &nodes[0],
        ProvisionState::Inspecting,
        Duration::from_secs(30),
    )
    .await
    .expect("enrolled");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let node = env.node(&nodes[0]).await.expect("node");
    assert_eq!(
        node.provision_state,
        ProvisionState::Inspecting,
        "still waiting for a ramdisk"
    );
}
