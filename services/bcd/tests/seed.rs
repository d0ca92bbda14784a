//! The profile's user data lands on the installed root as a NoCloud seed:
//! an image with a GPT and an ext4 root is deployed to a loop device, and
//! the seed is found in the root file system with debugfs.

mod support;

use bcm_bcd::{disks, seed};
use support::*;

#[test]
fn user_data_is_written_as_a_nocloud_seed_on_the_installed_root() {
    let dir = Scratch::new("seed");
    // The "image": GPT, one ext4 partition holding an /etc.
    let rootfs = dir.0.join("rootfs");
    std::fs::create_dir_all(rootfs.join("etc")).expect("etc");
    std::fs::write(rootfs.join("etc/os-release"), "ID=test\n").expect("os-release");
    let img = dir.0.join("disk.img");
    sparse(&img, 256 << 20);
    let f = img.to_str().expect("path");
    ok("sgdisk", &["-o", "-n", "1:2048:+128M", "-t", "1:8300", f]);
    ok(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-E",
            "offset=1048576",
            "-d",
            rootfs.to_str().expect("p"),
            f,
            "128M",
        ],
    );
    let disk = LoopDisk::attach_partscan(&img);
    assert!(disk.is_loop(), "this test needs loop devices");
    let d = disks::describe(&disk.dev).expect("describe");
    let user_data = "#cloud-config\nwrite_files:\n- path: /etc/bcd/join.env\n  content: BCD_JOIN_TOKEN=bcmj_x\n";
    let anchor = bcm_quorum::Anchor {
        approvers: vec![bcm_quorum::AnchorKey {
            id: "alice".into(),
            public_key: "AAAA".into(),
            tenants: vec![],
        }],
        quorum: 1,
        auto_approver: None,
    };
    let report = seed::write_nocloud(&d, user_data, "node_42", Some(&anchor)).expect("seed");
    assert_eq!(report.fs_type, "ext4");
    // Read back on the host through a loop device at the partition's
    // offset (this kernel may lack partition support; bcd handles both).
    let (offset, len) = seed::gpt_partitions(&d).expect("gpt")[0];
    assert_eq!((offset, len), (1 << 20, 128 << 20));
    let part_dev = ok(
        "losetup",
        &[
            "--show",
            "-f",
            "-o",
            &offset.to_string(),
            "--sizelimit",
            &len.to_string(),
            f,
        ],
    );
    let part = part_dev.trim().to_owned();
    let read = |path: &str| ok("debugfs", &["-R", &format!("cat {path}"), &part]);
    assert_eq!(read("/var/lib/cloud/seed/nocloud/user-data"), user_data);
    assert!(read("/var/lib/cloud/seed/nocloud/meta-data").contains("instance-id: node_42"));
    // The anchor the deploy ran under, where the OS's bcd node reads it.
    let written: bcm_quorum::Anchor =
        serde_json::from_str(&read("/etc/bcd/trust/quorum-anchor.json")).expect("an anchor");
    assert_eq!(written, anchor);
    assert_eq!(
        read("/etc/os-release"),
        "ID=test\n",
        "the root is otherwise untouched"
    );
    let _ = run("losetup", &["-d", &part]);

    // A disk without partitions, or a plain file, is refused with the reason.
    let blank = dir.0.join("blank.img");
    sparse(&blank, 64 << 20);
    let b = LoopDisk::attach_partscan(&blank);
    let err = seed::write_nocloud(&disks::describe(&b.dev).expect("d"), user_data, "n", None)
        .expect_err("no partitions");
    assert!(
        err.contains("no partitions") && err.contains("no GPT"),
        "{err}"
    );
    let err = seed::write_nocloud(&disks::describe(&blank).expect("d"), user_data, "n", None)
        .expect_err("plain file");
    assert!(err.contains("plain file"), "{err}");
}
