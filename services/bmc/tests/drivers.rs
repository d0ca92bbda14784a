//! The drivers against real BMC peers: sushy-tools' Redfish emulator with
//! auth on, and OpenIPMI's ipmi_sim. Power and boot round trips with the
//! state read back from the peer, wrong credentials, and a peer that stops
//! answering mid-operation and comes back.

mod peers;

use bcm_bmc::driver::{BootDevice, BootMode, Driver, DriverSettings};
use bcm_bmc::error::BmcError;
use bcm_core::{BmcDriver, PowerAction, PowerState};
use peers::{sushy_mac, IpmiSim, Sushy};
use std::time::Duration;

fn fast() -> DriverSettings {
    let mut s = DriverSettings::default();
    // sushy applies a power change 1-11 s after the Reset.
    s.redfish.power_timeout = Duration::from_secs(30);
    s.redfish.graceful_timeout = Duration::from_secs(15);
    s.redfish.backoff = Duration::from_millis(100);
    s.ipmi.power_timeout = Duration::from_secs(10);
    s
}

fn redfish(sushy: &Sushy, system: usize, password: &str) -> Driver {
    Driver::open(
        BmcDriver::Redfish,
        &sushy.system_address(system),
        sushy.username.clone().into(),
        password.to_owned().into(),
        &fast(),
    )
    .expect("driver")
}

#[tokio::test]
async fn redfish_power_and_boot_round_trips_against_sushy() {
    let sushy = Sushy::start(3).await;
    let d = redfish(&sushy, 2, &sushy.password);

    let v = d.verify().await.expect("verify");
    assert_eq!(v.system_id, peers::sushy_uuid(2));
    assert!(v.protocol_version.is_some());
    let inv = d.inspect().await.expect("inspect");
    assert_eq!(
        inv.macs,
        vec![sushy_mac(2)],
        "the MACs of EthernetInterfaces"
    );

    assert_eq!(d.power(PowerAction::On).await.expect("on"), PowerState::On);
    assert_eq!(d.power_state().await.expect("read"), PowerState::On);
    assert_eq!(
        d.power(PowerAction::Off).await.expect("off"),
        PowerState::Off
    );
    assert_eq!(d.power_state().await.expect("read"), PowerState::Off);
    assert_eq!(
        d.power(PowerAction::Cycle).await.expect("cycle"),
        PowerState::On
    );
    assert_eq!(d.power_state().await.expect("read"), PowerState::On);

    let pxe = d
        .boot(BootDevice::Pxe, false, Some(BootMode::Uefi))
        .await
        .expect("pxe once");
    assert_eq!(pxe.target, "Pxe");
    assert_eq!(pxe.mode_read_back.as_deref(), Some("UEFI"));
    let disk = d
        .boot(BootDevice::Disk, true, None)
        .await
        .expect("disk persistent");
    assert_eq!(disk.target, "Hdd");
    assert_eq!(disk.enabled_read_back.as_deref(), Some("Continuous"));
    d.close().await;

    // The other systems were not touched.
    assert_eq!(sushy.resets(1), 0);
    assert_eq!(sushy.resets(3), 0);
    assert!(sushy.resets(2) >= 3);
}

#[tokio::test]
async fn redfish_refuses_bad_credentials_and_an_ambiguous_address() {
    let sushy = Sushy::start(2).await;
    let d = redfish(&sushy, 1, "wrong-password");
    let e = d.verify().await.expect_err("wrong password");
    assert!(matches!(e, BmcError::Unauthorized { .. }), "{e:?}");
    assert!(!e.retryable());
    assert!(!e.to_string().contains("wrong-password"), "{e}");

    let whole = Driver::open(
        BmcDriver::Redfish,
        &sushy.origin(),
        sushy.username.clone().into(),
        sushy.password.clone().into(),
        &fast(),
    )
    .expect("driver");
    let e = whole.verify().await.expect_err("two systems, none named");
    assert!(e.to_string().contains("manages 2 systems"), "{e}");
}

#[tokio::test]
async fn redfish_survives_the_emulator_going_away_and_coming_back() {
    let mut sushy = Sushy::start(1).await;
    let d = redfish(&sushy, 1, &sushy.password);
    d.verify().await.expect("verify");
    sushy.stop();
    let e = d.power(PowerAction::On).await.expect_err("nobody answers");
    assert!(matches!(e, BmcError::Unreachable { .. }), "{e:?}");
    assert!(e.retryable(), "the engine retries it");
    sushy.restart().await;
    let d = redfish(&sushy, 1, &sushy.password);
    assert_eq!(d.power(PowerAction::On).await.expect("on"), PowerState::On);
}

fn ipmi(sim: &IpmiSim, password: &str) -> Driver {
    Driver::open(
        BmcDriver::Ipmi,
        &sim.address(),
        sim.username.clone().into(),
        password.to_owned().into(),
        &fast(),
    )
    .expect("driver")
}

#[tokio::test]
async fn ipmi_power_and_boot_round_trips_against_ipmi_sim() {
    let sim = IpmiSim::start().await;
    let d = ipmi(&sim, &sim.password);
    let v = d.verify().await.expect("verify");
    assert_eq!(v.protocol_version.as_deref(), Some("IPMI 2.0"));
    assert_eq!(v.power, PowerState::Off);

    assert_eq!(d.power(PowerAction::On).await.expect("on"), PowerState::On);
    assert_eq!(
        d.power(PowerAction::On).await.expect("on again"),
        PowerState::On
    );
    assert_eq!(
        d.power(PowerAction::Reset).await.expect("reset"),
        PowerState::On
    );
    assert_eq!(
        d.power(PowerAction::Off).await.expect("off"),
        PowerState::Off
    );
    assert_eq!(
        sim.events(),
        vec!["power 1", "reset", "power 0"],
        "the chassis saw each change once; on-when-on did nothing"
    );

    let pxe = d
        .boot(BootDevice::Pxe, false, None)
        .await
        .expect("pxe once");
    assert_eq!(pxe.target, "pxe");
    assert_eq!(sim.boot(), "pxe");
    let disk = d
        .boot(BootDevice::Disk, true, None)
        .await
        .expect("disk persistent");
    assert_eq!(disk.target, "disk");
    assert_eq!(sim.boot(), "default");
    let e = d
        .boot(BootDevice::UefiHttp, false, None)
        .await
        .expect_err("no UEFI HTTP over IPMI");
    assert!(matches!(e, BmcError::Unsupported(_)), "{e:?}");
}

#[tokio::test]
async fn ipmi_wrong_password_is_a_clear_error_without_the_password() {
    let sim = IpmiSim::start().await;
    let mut settings = fast();
    settings.ipmi.retries = 1;
    let d = Driver::open(
        BmcDriver::Ipmi,
        &sim.address(),
        sim.username.clone().into(),
        "not-the-password".to_owned().into(),
        &settings,
    )
    .expect("driver");
    let e = d.verify().await.expect_err("wrong password");
    let text = e.to_string();
    assert!(text.contains(&sim.address()), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");
    assert!(sim.events().is_empty(), "nothing happened to the chassis");
}
