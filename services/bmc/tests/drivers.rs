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
    s.plugins.insert(BmcDriver::Ipmi, ipmi_plugin(3));
    s
}

/// IPMI as the site hosts it: the `bcx-ipmi` plugin this package builds.
fn ipmi_plugin(retries: u8) -> bcm_bmc::plugin::PluginSettings {
    bcm_bmc::plugin::PluginSettings {
        executable: env!("CARGO_BIN_EXE_bcx-ipmi").into(),
        timeout: Duration::from_secs(60),
        env: vec![
            ("BCX_POWER_TIMEOUT_SECS".into(), "10".into()),
            ("BCX_GRACEFUL_TIMEOUT_SECS".into(), "3".into()),
            ("BCX_IPMI_RETRIES".into(), retries.to_string()),
        ],
    }
}

fn redfish(sushy: &Sushy, system: usize, password: &str) -> Driver {
    Driver::open(
        BmcDriver::Redfish,
        &sushy.system_address(system),
        sushy.username.clone().into(),
        password.to_owned().into(),
        &fast(),
        None,
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
        None,
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
        None,
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
        vec!["power 1", "reset", "shutdown"],
        "the chassis saw each change once; on-when-on did nothing; off was the OS's soft-off"
    );
    assert_eq!(
        d.power(PowerAction::Off).await.expect("off again"),
        PowerState::Off
    );
    assert_eq!(sim.events().len(), 3, "off when off did nothing");

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
    let cd = d.boot(BootDevice::Cd, false, None).await.expect("cd once");
    assert_eq!(cd.target, "cdrom");
    assert_eq!(sim.boot(), "cdrom");
    let e = d
        .boot(BootDevice::UefiHttp, false, None)
        .await
        .expect_err("no UEFI HTTP over IPMI");
    assert!(matches!(e, BmcError::Unsupported(_)), "{e:?}");
}

#[tokio::test]
async fn ipmi_off_is_forced_when_the_os_ignores_the_soft_off() {
    let sim = IpmiSim::start().await;
    let d = ipmi(&sim, &sim.password);
    assert_eq!(d.power(PowerAction::On).await.expect("on"), PowerState::On);
    sim.ignore_acpi();
    let asked = std::time::Instant::now();
    assert_eq!(
        d.power(PowerAction::Off).await.expect("off"),
        PowerState::Off
    );
    assert_eq!(
        sim.events(),
        vec!["power 1", "shutdown ignored", "power 0"],
        "a soft-off first, then forced"
    );
    assert!(
        asked.elapsed() >= Duration::from_secs(3),
        "forced before the graceful timeout (3 s) ran out: {:?}",
        asked.elapsed()
    );
}

#[tokio::test]
async fn ipmi_wrong_password_is_a_clear_error_without_the_password() {
    let sim = IpmiSim::start().await;
    let mut settings = fast();
    settings.plugins.insert(BmcDriver::Ipmi, ipmi_plugin(1));
    let d = Driver::open(
        BmcDriver::Ipmi,
        &sim.address(),
        sim.username.clone().into(),
        "not-the-password".to_owned().into(),
        &settings,
        None,
    )
    .expect("driver");
    let e = d.verify().await.expect_err("wrong password");
    let text = e.to_string();
    assert!(text.contains(&sim.address()), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");
    assert!(sim.events().is_empty(), "nothing happened to the chassis");
}

#[tokio::test]
async fn redfish_sets_a_password_through_account_service() {
    let sushy = Sushy::start(1).await;
    let d = redfish(&sushy, 1, &sushy.password);
    let new = "Rotated-Pass-42";
    d.set_password(&new.to_owned().into())
        .await
        .expect("set password");
    assert!(
        sushy.takes(new).await,
        "the emulator takes the new password"
    );
    assert!(
        !sushy.takes(&sushy.password).await,
        "and no longer the old one"
    );
    let again = redfish(&sushy, 1, new);
    again.verify().await.expect("the driver logs in with it");
    // A password the BMC refuses (too short for its policy) is its error.
    let e = again
        .set_password(&"short".to_owned().into())
        .await
        .expect_err("refused");
    assert!(
        matches!(e, BmcError::Refused { status: 400, ref message, .. } if message.contains("8-32")),
        "{e}"
    );
    assert!(sushy.takes(new).await, "a refused change changes nothing");
}

#[tokio::test]
async fn ipmi_sets_a_password_without_putting_it_on_a_command_line() {
    let sim = IpmiSim::start().await;
    let d = ipmi(&sim, &sim.password);
    let new = "Ipmi-Rotated-7";
    d.set_password(&new.to_owned().into())
        .await
        .expect("set password");
    assert!(sim.takes(new), "ipmi_sim takes the new password");
    assert!(!sim.takes(&sim.password), "and no longer the old one");
    ipmi(&sim, new).verify().await.expect("the driver logs in");
    let e = ipmi(&sim, new)
        .set_password(&"x".repeat(21).into())
        .await
        .expect_err("too long for IPMI");
    assert!(matches!(e, BmcError::Invalid(_)), "{e}");
}

/// A self-signed certificate for 127.0.0.1 and its SHA-256 fingerprint.
fn self_signed() -> (String, String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("params");
    let cert = params.self_signed(&key).expect("cert");
    let fingerprint = {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(cert.der()))
    };
    (cert.pem(), key.serialize_pem(), fingerprint)
}

fn redfish_tls(sushy: &Sushy, tls: Option<bcm_core::BmcTls>) -> Driver {
    Driver::open(
        BmcDriver::Redfish,
        &sushy.system_address(1),
        sushy.username.clone().into(),
        sushy.password.clone().into(),
        &fast(),
        tls.as_ref(),
    )
    .expect("driver")
}

#[tokio::test]
async fn redfish_tls_policy_per_node_ca_pinned_insecure_and_refusals() {
    use bcm_core::BmcTls;
    let (cert, key, fingerprint) = self_signed();
    let sushy = Sushy::start_tls(1, &cert, &key).await;
    assert!(sushy.origin().starts_with("https://"));

    // The system roots do not know a self-signed certificate.
    let e = redfish_tls(&sushy, None)
        .verify()
        .await
        .expect_err("untrusted");
    assert!(
        matches!(e, BmcError::Unreachable { .. }) && e.to_string().contains("UnknownIssuer"),
        "{e}"
    );
    // Its CA (itself) as the node's CA.
    redfish_tls(
        &sushy,
        Some(BmcTls::Ca {
            ca_pem: cert.clone(),
        }),
    )
    .verify()
    .await
    .expect("verified against the node's CA");
    // Pinned: the right fingerprint passes, any other is refused.
    redfish_tls(
        &sushy,
        Some(BmcTls::Pinned {
            sha256: fingerprint.clone(),
        }),
    )
    .verify()
    .await
    .expect("pinned");
    let e = redfish_tls(
        &sushy,
        Some(BmcTls::Pinned {
            sha256: "00".repeat(32),
        }),
    )
    .verify()
    .await
    .expect_err("another pin");
    assert!(
        matches!(e, BmcError::Unreachable { .. }) && e.to_string().contains("not the pinned one"),
        "{e}"
    );
    // Another CA does not vouch for it.
    let (other, _, _) = self_signed();
    assert!(redfish_tls(&sushy, Some(BmcTls::Ca { ca_pem: other }))
        .verify()
        .await
        .is_err());
    // Insecure only when the node says so.
    redfish_tls(&sushy, Some(BmcTls::Insecure {}))
        .verify()
        .await
        .expect("insecure by the node's policy");
}

/// Virtual media against sushy-tools: the emulator downloads the image
/// from the URL it is given (a real HTTP server on loopback here, which
/// counts the fetches) and reports it inserted; the machine is told to
/// boot the CD once; the eject empties the slot.
#[tokio::test]
async fn redfish_virtual_media_against_sushy() {
    let sushy = Sushy::start(1).await;
    let fetches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = fetches.clone();
    let iso = axum::Router::new().route(
        "/installer.iso",
        axum::routing::get(move || {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async { vec![0u8; 64 * 1024] }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let image = format!(
        "http://{}/installer.iso",
        listener.local_addr().expect("addr")
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, iso).await;
    });
    let d = redfish(&sushy, 1, &sushy.password);

    let inserted = d.insert_media(&image).await.expect("insert");
    assert!(inserted.inserted, "{inserted:?}");
    assert_eq!(inserted.image.as_deref(), Some(image.as_str()));
    assert!(inserted.slot.contains("/VirtualMedia/"), "{inserted:?}");
    assert_eq!(
        fetches.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the emulator fetched the image"
    );
    // Asked again, the slot already holds it: nothing is sent.
    assert_eq!(d.insert_media(&image).await.expect("again"), inserted);
    assert_eq!(fetches.load(std::sync::atomic::Ordering::Relaxed), 1);
    let cd = d.boot(BootDevice::Cd, false, None).await.expect("boot cd");
    assert_eq!(cd.target, "Cd");

    let ejected = d.eject_media().await.expect("eject");
    assert!(!ejected.inserted && ejected.image.is_none(), "{ejected:?}");
    assert_eq!(ejected.slot, inserted.slot);
    d.close().await;
}
