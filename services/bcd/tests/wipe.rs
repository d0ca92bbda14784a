//! `disk.wipe` on real block devices: a loop device pre-filled with a GPT,
//! ext4 and random data is left with no signature any prober finds and
//! reads back clean; a disk that drops writes fails verification; a device
//! erase on a device without one fails with the reason and erases nothing
//! when the pool admits nothing else, and is a full overwrite read back
//! byte for byte (reported as such) when the pool admits that.

mod support;

use bcm_bcd::disks;
use bcm_bcd::wipe::{self, Method, WipeOutcome};
use bcm_core::erase::{EraseMethod, ErasePolicy};
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
    let report = wipe::wipe_disk(&d, Method::Quick, &[], 4);
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
    let report = wipe::wipe_disk(&d, Method::Quick, &[], 4);
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
    let strict = [
        EraseMethod::NvmeSanitizeCrypto,
        EraseMethod::NvmeCryptoFormat,
    ];
    for (method, admitted) in [
        (Method::SecureErase, &[][..]),
        (Method::CryptoErase, &strict[..]),
    ] {
        let report = wipe::wipe_disk(&d, method, admitted, 4);
        assert_eq!(report.erase, None);
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

/// bcd takes no one's word that a wipe was approved: a `disk.wipe` whose
/// batch authority is missing, names a node set that was tampered with,
/// lacks its proof or has too few signatures fails with `FORBIDDEN` and
/// leaves the disk as it was; the same wipe under a genuine authority runs.
#[test]
fn a_wipe_without_a_valid_batch_authority_touches_nothing() {
    use bcm_contracts::batch::{ApprovalSignature, BatchAuthority, BatchHeader};
    use bcm_core::batch::Operation;
    use bcm_core::WipeMode;
    let mut rng = rand::rngs::OsRng;
    let keys: Vec<ed25519_dalek::SigningKey> = (0..2)
        .map(|_| ed25519_dalek::SigningKey::generate(&mut rng))
        .collect();
    let anchor = bcm_quorum::Anchor {
        approvers: keys
            .iter()
            .enumerate()
            .map(|(i, k)| bcm_quorum::AnchorKey {
                id: format!("approver-{i}"),
                public_key: bcm_quorum::public_key_b64(k),
                tenants: vec![],
            })
            .collect(),
        quorum: 2,
        auto_approver: None,
    };
    let me = "node_01jd0000000000000000000000".to_owned();
    let other = "node_01jd0000000000000000000001".to_owned();
    let intruder = "node_01jd0000000000000000000002".to_owned();
    let batch = |nodes: &[String]| {
        let built =
            bcm_quorum::build(nodes, Operation::Undeploy, Some(WipeMode::Quick)).expect("nodes");
        let h = BatchHeader {
            batch_id: "bat_01jd0000000000000000000000".into(),
            tenant_id: "a".into(),
            pool_id: "p".into(),
            operation: Operation::Undeploy,
            wipe: Some(WipeMode::Quick),
            reason_sha256: bcm_quorum::reason_sha256("r"),
            expires_at: chrono::Utc::now().timestamp() + 600,
            root: built.root.clone(),
            leaf_count: nodes.len() as u32,
        };
        (h, built)
    };
    let sign = |h: &BatchHeader, who: &[usize]| -> Vec<ApprovalSignature> {
        who.iter()
            .map(|i| ApprovalSignature {
                approver_id: format!("approver-{i}"),
                signature: bcm_quorum::sign(&keys[*i], h),
            })
            .collect()
    };
    let (h, built) = batch(&[me.clone(), other.clone()]);
    let (added, added_built) = batch(&[me.clone(), other.clone(), intruder.clone()]);
    let genuine = BatchAuthority {
        header: h.clone(),
        leaf_index: 0,
        proof: built.proofs[0].clone(),
        approvals: sign(&h, &[0, 1]),
    };
    let forged: Vec<(&str, String, Option<BatchAuthority>)> = vec![
        ("no authority", me.clone(), None),
        (
            "the node added to the signed set",
            intruder.clone(),
            Some(BatchAuthority {
                header: added.clone(),
                leaf_index: 2,
                proof: added_built.proofs[2].clone(),
                approvals: sign(&h, &[0, 1]),
            }),
        ),
        (
            "a missing proof",
            me.clone(),
            Some(BatchAuthority {
                proof: vec![],
                ..genuine.clone()
            }),
        ),
        (
            "one signature of two",
            me.clone(),
            Some(BatchAuthority {
                approvals: sign(&h, &[1]),
                ..genuine.clone()
            }),
        ),
    ];

    let dir = Scratch::new("quorum");
    let file = dir.0.join("disk.img");
    sparse(&file, 1 << 30);
    prefill(&file);
    let disk = LoopDisk::attach(&file);
    let cfg = |node: &str| bcm_bcd::agent::AgentConfig {
        api: "http://127.0.0.1:9".into(),
        node: Some(node.to_owned()),
        join_token: "t".into(),
        role: bcm_contracts::agent::AgentRole::Ramdisk,
        hostname: None,
        disks: vec![disk.dev.clone()],
        image_keys: vec![],
        ca_pem: None,
        proxy: None,
        cache: None,
        heartbeat: std::time::Duration::from_secs(10),
        wipe_stripes: 4,
        state_dir: None,
        quorum_anchor: Some(anchor.clone()),
        power_off: bcm_bcd::agent::PowerOff::Exit,
    };
    let wipe = |authority: Option<BatchAuthority>| bcm_contracts::agent::AgentCommand {
        command_id: "cmd_01jd0000000000000000000000".into(),
        kind: bcm_contracts::CommandKind::DiskWipe,
        params: serde_json::json!({"mode": "quick", "verify": true}),
        issued_at: chrono::Utc::now(),
        join_tokens: Default::default(),
        traceparent: None,
        authority,
    };
    for (name, node, authority) in forged {
        let out = bcm_bcd::agent::execute(&cfg(&node), &[], &wipe(authority));
        assert!(!out.ok, "{name}: ran");
        let error = out.error.unwrap_or_default();
        assert!(error.starts_with("FORBIDDEN"), "{name}: {error}");
        assert!(
            wipefs(&disk.dev).contains("gpt"),
            "{name}: the disk was touched"
        );
    }
    let out = bcm_bcd::agent::execute(&cfg(&me), &[], &wipe(Some(genuine)));
    assert!(out.ok, "the genuine wipe: {:?}", out.error);
    assert!(!wipefs(&disk.dev).contains("gpt"), "wiped");
}

/// A disk with no erase command of its own (a loop device, as a virtio
/// disk) under the default policy: every byte is overwritten and read
/// back, and the report names `overwrite-verified`; the device-erase
/// methods before it in the list were never the disk's to try.
#[test]
fn a_disk_without_an_erase_command_is_overwritten_whole_and_read_back() {
    let dir = Scratch::new("overwrite");
    let file = dir.0.join("disk.img");
    sparse(&file, 1 << 30);
    prefill(&file);
    let disk = LoopDisk::attach(&file);
    let d = disks::describe(&disk.dev).expect("describe");
    let policy = ErasePolicy::default();
    let report = wipe::wipe_disk(&d, Method::CryptoErase, &policy.crypto_erase, 2);
    assert_eq!(report.outcome, WipeOutcome::Verified, "{report:?}");
    assert_eq!(report.erase, Some(EraseMethod::OverwriteVerified));
    assert_eq!(report.method, bcm_core::WipeMode::CryptoErase);
    let whole: Vec<_> = report
        .verified_regions
        .iter()
        .filter(|c| c.offset == 0 && c.len == 1 << 30)
        .collect();
    assert_eq!(whole.len(), 1, "every byte read back: {report:?}");
    let data = std::fs::read(&file).expect("read");
    assert!(data.iter().all(|b| *b == 0), "the middle too");
    assert!(wipefs(&disk.dev).trim().is_empty());
}
