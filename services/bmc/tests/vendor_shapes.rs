//! The Redfish driver's whole surface against BMCs in the vendors' shapes
//! (`peers::vendor_sim`: Dell iDRAC 9, HPE iLO 5, Supermicro X13, Lenovo
//! XCC, DMTF's rackmount): verify with a session or basic auth, inventory
//! (CPUs, memory, drives, the PXE MACs in boot order), power read and
//! actions read back, one-time and persistent boot overrides read back
//! with the vendor's mode rules, virtual media in and out (where the slot
//! is, actions or PATCH, an occupied slot), the BMC's drive erase where
//! the drives offer one (and none sent where they do not), and a password
//! change after which only the new password logs in.

mod peers;

use bcm_bmc::driver::{BootDevice, BootMode, Driver, DriverSettings};
use bcm_bmc::error::BmcError;
use bcm_core::{BmcDriver, PowerAction, PowerState};
use peers::vendor_sim::{self, Shape, VendorSim, PASSWORD, USER};
use std::time::Duration;

fn open(sim: &VendorSim, password: &str) -> Driver {
    let mut s = DriverSettings::default();
    s.redfish.power_timeout = Duration::from_secs(10);
    s.redfish.graceful_timeout = Duration::from_secs(5);
    s.redfish.backoff = Duration::from_millis(50);
    Driver::open(
        BmcDriver::Redfish,
        &sim.address(),
        USER.to_owned().into(),
        password.to_owned().into(),
        &s,
        None,
    )
    .expect("driver")
}

async fn whole_surface(shape: Shape) {
    let name = shape.name;
    let sim = VendorSim::start(shape).await;
    let d = open(&sim, PASSWORD);

    let v = d
        .verify()
        .await
        .unwrap_or_else(|e| panic!("{name}: verify: {e}"));
    assert_eq!(
        v.system_id,
        sim.shape.system_path.rsplit('/').next().unwrap_or_default(),
        "{name}"
    );
    assert_eq!(v.power, PowerState::On, "{name}");

    let inv = d
        .inspect()
        .await
        .unwrap_or_else(|e| panic!("{name}: inspect: {e}"));
    assert_eq!(
        inv.macs, sim.shape.macs,
        "{name}: the PXE MACs, booting first"
    );
    assert_eq!(inv.cpus, Some(sim.shape.cpus), "{name}");
    assert_eq!(inv.memory_gib, Some(sim.shape.memory_gib), "{name}");
    let bytes: Vec<u64> = inv.drives.iter().filter_map(|d| d.capacity_bytes).collect();
    assert_eq!(bytes, sim.shape.drive_bytes, "{name}: drives");
    assert!(
        inv.drives.iter().all(|d| !d.id.is_empty()),
        "{name}: {:?}",
        inv.drives
    );
    // Firmware versions, which a dedicated teardown compares: the system's
    // BiosVersion, the managing BMC's FirmwareVersion (where the tree has
    // them).
    assert_eq!(
        inv.bios_version.as_deref(),
        sim.system()["BiosVersion"].as_str(),
        "{name}"
    );
    if sim.system()["Links"]["ManagedBy"].is_array() {
        assert_eq!(inv.bmc_firmware.as_deref(), Some("2.72"), "{name}");
    }

    // Power: an action, then the state read back from the BMC.
    assert_eq!(
        d.power(PowerAction::Off).await.expect("off"),
        PowerState::Off,
        "{name}"
    );
    assert_eq!(sim.system()["PowerState"], "Off", "{name}");
    assert_eq!(
        d.power_state().await.expect("read"),
        PowerState::Off,
        "{name}"
    );
    assert_eq!(
        d.power(PowerAction::On).await.expect("on"),
        PowerState::On,
        "{name}"
    );

    // One-time PXE with no mode named: the machine's UEFI mode survives
    // (Supermicro resets an omitted mode to Legacy; the driver sends it).
    let once = d
        .boot(BootDevice::Pxe, false, None)
        .await
        .unwrap_or_else(|e| panic!("{name}: boot: {e}"));
    assert_eq!(once.enabled_read_back.as_deref(), Some("Once"), "{name}");
    assert_eq!(
        once.mode_read_back.as_deref(),
        Some("UEFI"),
        "{name}: mode kept"
    );
    let boot = &sim.system()["Boot"];
    assert_eq!(boot["BootSourceOverrideTarget"], "Pxe", "{name}");
    assert_eq!(boot["BootSourceOverrideMode"], "UEFI", "{name}");
    // Persistent disk boot in UEFI.
    let persistent = d
        .boot(BootDevice::Disk, true, Some(BootMode::Uefi))
        .await
        .unwrap_or_else(|e| panic!("{name}: persistent boot: {e}"));
    assert_eq!(
        persistent.enabled_read_back.as_deref(),
        Some("Continuous"),
        "{name}"
    );
    assert_eq!(
        sim.system()["Boot"]["BootSourceOverrideTarget"],
        "Hdd",
        "{name}"
    );

    // Virtual media: a CD image in, read back, the machine told to boot it
    // once; a retried insert sends nothing; then out, and out again.
    let image = "http://127.0.0.1:8080/images/installer.iso";
    let inserted = d
        .insert_media(image)
        .await
        .unwrap_or_else(|e| panic!("{name}: insert_media: {e}"));
    assert_eq!(inserted.image.as_deref(), Some(image), "{name}");
    assert!(inserted.inserted, "{name}");
    let slot = sim.resource(&inserted.slot);
    assert_eq!(slot["Image"], image, "{name}: {slot}");
    assert!(
        slot["MediaTypes"]
            .as_array()
            .is_some_and(|t| t.contains(&serde_json::json!("CD"))),
        "{name}: a CD slot: {slot}"
    );
    let sent = (sim.patches().len(), sim.actions().len());
    assert_eq!(
        d.insert_media(image).await.expect("again"),
        inserted,
        "{name}"
    );
    assert_eq!(
        (sim.patches().len(), sim.actions().len()),
        sent,
        "{name}: a retried insert sends nothing"
    );
    let cd = d
        .boot(BootDevice::Cd, false, None)
        .await
        .unwrap_or_else(|e| panic!("{name}: boot cd: {e}"));
    assert_eq!(cd.target, "Cd", "{name}");
    assert_eq!(
        sim.system()["Boot"]["BootSourceOverrideTarget"],
        "Cd",
        "{name}"
    );
    let ejected = d
        .eject_media()
        .await
        .unwrap_or_else(|e| panic!("{name}: eject_media: {e}"));
    assert!(
        !ejected.inserted && ejected.image.is_none(),
        "{name}: {ejected:?}"
    );
    assert_eq!(sim.resource(&inserted.slot)["Inserted"], false, "{name}");
    assert_eq!(d.eject_media().await.expect("again"), ejected, "{name}");
    // Garbage is refused before anything is sent.
    let sent = (sim.patches().len(), sim.actions().len());
    for bad in [
        "ftp://h/x.iso",
        "http://",
        "http://h/a b.iso",
        "/local.iso",
        "",
    ] {
        match d.insert_media(bad).await {
            Err(BmcError::Invalid(m)) => assert!(m.contains("http(s) URL"), "{m}"),
            other => panic!("{name}: {bad:?}: {other:?}"),
        }
    }
    assert_eq!((sim.patches().len(), sim.actions().len()), sent, "{name}");

    // Every PATCH the firmware needed If-Match on carried the current ETag
    // (the sim answers 428 or 412 otherwise, and the boot would have failed).
    if sim.shape.rules.patch_needs_if_match {
        assert!(
            sim.patches()
                .iter()
                .all(|(_, if_match, _)| if_match.is_some()),
            "{name}: {:?}",
            sim.patches()
        );
    }

    // The BMC's drive erase: where the drives offer `#Drive.SecureErase`
    // every one is erased (a Task followed to `Completed`) and reported by
    // id and serial; elsewhere nothing is sent and it says it offers none.
    let erase = d
        .erase_drives()
        .await
        .unwrap_or_else(|e| panic!("{name}: erase: {e}"));
    let posted = sim
        .actions()
        .iter()
        .filter(|(target, _)| target.ends_with("/Actions/Drive.SecureErase"))
        .count();
    if erase.offered {
        assert_eq!(
            erase.drives.len(),
            sim.shape.drive_bytes.len(),
            "{name}: {erase:?}"
        );
        assert!(
            erase.drives.iter().all(|e| e.erased && e.serial.is_some()),
            "{name}: {erase:?}"
        );
        assert_eq!(posted, erase.drives.len(), "{name}: one erase per drive");
        for i in 1..=posted {
            let task = sim.resource(&format!("/redfish/v1/TaskService/Tasks/JID_{i}"));
            assert_eq!(
                task["TaskState"], "Completed",
                "{name}: the erase's Task was followed to its end"
            );
        }
    } else {
        assert!(erase.drives.is_empty(), "{name}: {erase:?}");
        let why = erase.reason.as_deref().unwrap_or("");
        assert!(
            why.contains("SecureErase")
                || (why.contains("no drive") && sim.shape.drive_bytes.is_empty()),
            "{name}: {erase:?}"
        );
        assert_eq!(posted, 0, "{name}: nothing sent");
    }
    assert_eq!(
        erase.offered,
        name == "dell-idrac9",
        "{name}: which shapes offer an erase"
    );

    // Password change: the BMC holds the new one; the old one is refused.
    d.set_password(&"N3w-Sim-pass".to_owned().into())
        .await
        .unwrap_or_else(|e| panic!("{name}: set_password: {e}"));
    d.close().await;
    assert_eq!(sim.password(), "N3w-Sim-pass", "{name}");
    let new = open(&sim, "N3w-Sim-pass");
    new.verify()
        .await
        .unwrap_or_else(|e| panic!("{name}: the new password: {e}"));
    new.close().await;
    let old = open(&sim, PASSWORD);
    match old.verify().await {
        Err(BmcError::Unauthorized { .. }) => {}
        other => panic!("{name}: the old password must be refused: {other:?}"),
    }
    assert!(
        sim.refused().iter().all(|(_, _, status)| *status == 401),
        "{name}: only the old password's login is refused: {:?}",
        sim.refused()
    );
}

#[tokio::test]
async fn dell_idrac9_nics_only_under_network_adapters() {
    whole_surface(vendor_sim::dell_idrac9()).await;
}

#[tokio::test]
async fn hpe_ilo5_trailing_slashes_and_if_match() {
    whole_surface(vendor_sim::hpe_ilo5()).await;
}

#[tokio::test]
async fn supermicro_x13_keeps_the_boot_mode() {
    whole_surface(vendor_sim::supermicro_x13()).await;
}

#[tokio::test]
async fn lenovo_xcc_uefi_only_with_if_match() {
    whole_surface(vendor_sim::lenovo_xcc()).await;
}

#[tokio::test]
async fn dmtf_rackmount_basic_auth_and_permanent_macs() {
    whole_surface(vendor_sim::dmtf_rackmount()).await;
}

/// Lenovo's XCC allows UEFI only: a Legacy boot is `unsupported` naming the
/// allowed modes, and nothing is PATCHed.
#[tokio::test]
async fn a_mode_the_bmc_does_not_allow_is_unsupported_and_patches_nothing() {
    let sim = VendorSim::start(vendor_sim::lenovo_xcc()).await;
    let d = open(&sim, PASSWORD);
    match d.boot(BootDevice::Pxe, false, Some(BootMode::Legacy)).await {
        Err(BmcError::Unsupported(m)) => assert!(m.contains("UEFI"), "{m}"),
        other => panic!("want unsupported: {other:?}"),
    }
    assert!(sim.patches().is_empty(), "{:?}", sim.patches());
    d.close().await;
}

/// A BMC whose `Storage` it cannot serve (sushy-tools without storage
/// answers 500; here the collection is gone) offers no erase: the report
/// says why and no erase is sent, even where the drives had the action.
#[tokio::test]
async fn a_storage_tree_the_bmc_cannot_serve_offers_no_erase_and_sends_nothing() {
    let mut shape = vendor_sim::dell_idrac9();
    let storage = format!("{}/Storage", shape.system_path);
    shape.tree.remove(&storage);
    let sim = VendorSim::start(shape).await;
    let d = open(&sim, PASSWORD);
    let erase = d.erase_drives().await.expect("a report, not an error");
    assert!(!erase.offered, "{erase:?}");
    assert!(
        erase
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("Storage cannot be read"),
        "{erase:?}"
    );
    assert!(
        sim.actions()
            .iter()
            .all(|(target, _)| !target.ends_with("Drive.SecureErase")),
        "nothing sent"
    );
}
