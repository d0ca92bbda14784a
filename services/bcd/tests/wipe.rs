//! `disk.wipe` on real block devices: a loop device pre-filled with a GPT,
//! ext4 and random data is left with no signature any prober finds and
//! reads back clean; a disk that drops writes fails verification; a device
//! erase on a device without one fails with the reason and erases nothing.

mod support;

use bcm_bcd::disks;
use bcm_bcd::wipe::{self, Method, WipeOutcome};
use support::*;

#[test]
fn quick_wipe_of_a_prefilled_disk_leaves_no_signature_and_reads_back_clean() {
    let dir = Scratch::new("quick");
    let file = dir.0.join("disk.img");
    sparse(&file, 1 << 30);
    prefill(&file);
    let disk = LoopDisk::attach(&file);
    let before = wipefs(&disk.dev);
    assert!(
        before.contains("gpt") && before.contains("PMBR"),
        "{before}"
    );
    assert!(blkid_finds(&disk.dev, 1 << 20), "ext4 in the partition");

    let d = disks::describe(&disk.dev).expect("describe");
    assert_eq!(d.size_bytes, 1 << 30);
    let report = wipe::wipe_disk(&d, Method::Quick, 4);
    assert_eq!(report.outcome, WipeOutcome::Verified, "{report:?}");
    let names: Vec<&str> = report
        .verified_regions
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert!(
        names.contains(&"head") && names.contains(&"tail"),
        "{names:?}"
    );
    assert!(
        names.iter().filter(|n| n.starts_with("stripe-")).count() == 4,
        "{names:?}"
    );
    assert!(report.verified_regions.iter().all(|c| c.ok));

    let after = wipefs(&disk.dev);
    assert!(after.trim().is_empty(), "wipefs still finds: {after}");
    assert!(!blkid_finds(&disk.dev, 0), "blkid finds something at 0");
    assert!(!blkid_finds(&disk.dev, 1 << 20), "blkid finds the ext4");
    // The middle (not a quick wipe's business) still holds the data.
    let data = std::fs::read(&file).expect("read");
    assert!(data[600 << 20..(600 << 20) + 4096].iter().any(|b| *b != 0));
    assert!(data[..64 << 20].iter().all(|b| *b == 0));
    assert!(data[(1 << 30) - (64 << 20)..].iter().all(|b| *b == 0));
}

#[test]
fn a_disk_that_drops_writes_fails_read_back_verification() {
    let dir = Scratch::new("liar");
    let backing = dir.0.join("backing.img");
    sparse(&backing, 1 << 30);
    prefill(&backing);
    let liar = LyingDisk::mount(&backing, &dir.0.join("mnt"));
    let d = disks::describe(&liar.file).expect("describe");
    let report = wipe::wipe_disk(&d, Method::Quick, 4);
    assert_eq!(report.outcome, WipeOutcome::Failed, "{report:?}");
    let reason = report.reason.clone().unwrap_or_default();
    assert!(reason.contains("read-back found data in head"), "{reason}");
    assert!(report
        .verified_regions
        .iter()
        .any(|c| c.name == "head" && !c.ok));
    // It really kept everything.
    assert!(wipefs(&backing).contains("gpt"));
}

#[test]
fn a_device_erase_without_an_erase_command_fails_and_erases_nothing() {
    let dir = Scratch::new("secure");
    let file = dir.0.join("disk.img");
    sparse(&file, 1 << 30);
    prefill(&file);
    let disk = LoopDisk::attach(&file);
    let d = disks::describe(&disk.dev).expect("describe");
    for method in [Method::SecureErase, Method::CryptoErase] {
        let report = wipe::wipe_disk(&d, method, 4);
        assert_eq!(report.outcome, WipeOutcome::Failed);
        let reason = report.reason.unwrap_or_default();
        assert!(
            reason.contains("has no erase command") && reason.contains("nothing was erased"),
            "{reason}"
        );
        assert!(
            report.verified_regions.is_empty(),
            "no read-back of an erase that did not run"
        );
    }
    assert!(
        wipefs(&disk.dev).contains("gpt"),
        "nothing was downgraded to a quick wipe"
    );
}
