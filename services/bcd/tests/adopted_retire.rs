//! The retire of an adopted machine through its own OS, with the real
//! `bcd node` against the whole control plane: an adopted machine has no
//! BMC to boot it a ramdisk, so its own agent is sent `node.wipe` (every
//! disk, by the pool's erase methods, read back, its file systems
//! remounted read-only first) and `node.powerOff`, then its identity is
//! revoked. A bcd that pins no quorum anchor refuses the wipe and the
//! retire fails with the disk untouched; restarted with the anchor, bcd
//! rejoins with the identity it kept (entering `retiring` did not end it)
//! and the retire from `failed` erases the disk, powers off and ends in
//! `retired`.

mod support;

use std::process::Stdio;
use std::time::Duration;

use bcm_core::ProvisionState;
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

/// `bcd node` on `disk` only, keeping its identity in `state`, with the
/// quorum anchor `anchor` (or a path that does not exist: none).
fn bcd_node(env: &TestEnv, token: &str, state: &str, disk: &str, anchor: &str) -> Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_bcd"))
        .args(["--quorum-anchor-file", anchor])
        .args(["node", "--api", &env.base, "--token", token])
        .args(["--state-dir", state, "--disk", disk, "--power-off", "exit"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("bcd node")
}

/// The `kind` commands of `node`, oldest first.
async fn commands(env: &TestEnv, node: &bcm_core::NodeId, kind: &str) -> Vec<serde_json::Value> {
    bcm_db::commands::commands_of_node(&env.db, &node.to_string())
        .await
        .expect("commands")
        .into_iter()
        .filter(|c| c.kind == kind)
        .map(|c| {
            json!({"status": c.status.as_str(), "target": c.target, "attested": c.attested_by.is_some(),
                   "result": c.result})
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_machine_is_wiped_and_powered_off_by_its_own_bcd() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let scratch = Scratch::new("adopted-retire");
    // The machine's disk: an ext4 file system with a file, and random
    // data in the middle.
    let img = scratch.0.join("disk.img");
    sparse(&img, 64 << 20);
    let f = img.to_str().expect("path");
    ok("mkfs.ext4", &["-q", "-F", f]);
    ok(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={f}"),
            "bs=1M",
            "seek=40",
            "count=2",
            "conv=notrunc",
            "status=none",
        ],
    );
    let disk = LoopDisk::attach(&img);
    let dev = disk.dev.to_str().expect("dev").to_owned();
    // Mounted read-write, as the machine's own OS has its disks.
    let mnt = scratch.0.join("mnt");
    std::fs::create_dir_all(&mnt).expect("mnt");
    let mounted = disk.is_loop()
        && run("mount", &[&dev, mnt.to_str().expect("mnt")])
            .status
            .success();
    if mounted {
        std::fs::write(mnt.join("data"), b"the tenant's data").expect("write");
    }
    let state = scratch.0.join("state");
    let state = state.to_str().expect("state");
    let token = env.pool_join_token("a", "a-pool").await.expect("token");

    // No anchor pinned: the wipe is refused and the retire fails.
    let missing = scratch.0.join("no-anchor.json");
    let mut child = bcd_node(&env, &token, state, &dev, missing.to_str().expect("p"));
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = next_line(&mut lines, Duration::from_secs(30)).await;
    let node: bcm_core::NodeId = line
        .strip_prefix("joined as node ")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    env.wait_state(&node, ProvisionState::Adopted, Duration::from_secs(30))
        .await
        .expect("adopted");
    env.verb_ok("retire", &node, json!({})).await;
    let failed = env
        .wait_state(&node, ProvisionState::Failed, Duration::from_secs(60))
        .await
        .expect("the retire fails");
    let why = failed.last_error.unwrap_or_default();
    assert!(
        why.contains("crypto-erase") && why.contains("node.wipe"),
        "{why}"
    );
    let wipes = commands(&env, &node, "node.wipe").await;
    assert_eq!(wipes.len(), 1, "{wipes:?}");
    assert_eq!(wipes[0]["target"], "node");
    assert_eq!(wipes[0]["status"], "failed", "{wipes:?}");
    assert!(commands(&env, &node, "node.powerOff").await.is_empty());
    if mounted {
        assert_eq!(
            std::fs::read(mnt.join("data")).expect("read"),
            b"the tenant's data"
        );
    }
    // Its identity lives on: the machine's own OS is what wipes it.
    assert_eq!(
        bcm_db::agents::certs_live_count(&env.db, &node.to_string())
            .await
            .expect("certs"),
        1
    );
    let _ = child.kill().await;

    // With the anchor: bcd rejoins with its kept identity (no token) and
    // the retire from `failed` goes through.
    let anchor = env.anchor_file();
    let mut child = bcd_node(&env, "", state, &dev, anchor.to_str().expect("p"));
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = next_line(&mut lines, Duration::from_secs(30)).await;
    assert!(
        line.starts_with(&format!("rejoined as node {node} ")),
        "{line}"
    );
    env.verb_ok("retire", &node, json!({})).await;
    let line = next_line(&mut lines, Duration::from_secs(60)).await;
    assert!(
        line.starts_with("powering off (node.powerOff cmd_"),
        "{line}"
    );
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("bcd stops after powering off")
        .expect("wait");
    assert!(status.success(), "{status}");
    env.wait_state(&node, ProvisionState::Retired, Duration::from_secs(60))
        .await
        .expect("retired");
    let wipes = commands(&env, &node, "node.wipe").await;
    assert_eq!(wipes.len(), 2, "{wipes:?}");
    let done = &wipes[1];
    assert_eq!(
        (&done["status"], &done["attested"]),
        (&json!("succeeded"), &json!(true)),
        "{done}"
    );
    let reported = &done["result"]["output"]["disks"];
    assert_eq!(reported.as_array().map(Vec::len), Some(1), "{reported}");
    // No device erase on a loop device or a file: the pool's default
    // admits a full overwrite, read back, and says so.
    assert_eq!(reported[0]["erase"], "overwrite-verified", "{reported}");
    assert_eq!(reported[0]["outcome"], "verified", "{reported}");
    let off = commands(&env, &node, "node.powerOff").await;
    assert_eq!(off.len(), 1, "{off:?}");
    assert_eq!(off[0]["status"], "succeeded", "{off:?}");
    assert_eq!(
        bcm_db::agents::certs_live_count(&env.db, &node.to_string())
            .await
            .expect("certs"),
        0
    );
    if mounted {
        // The file system was remounted read-only before the wipe, so the
        // kernel wrote nothing back over it.
        let mounts = std::fs::read_to_string("/proc/mounts").expect("mounts");
        let line = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(1) == mnt.to_str())
            .unwrap_or_default()
            .to_owned();
        assert!(
            line.split_whitespace()
                .nth(3)
                .is_some_and(|o| o.split(',').any(|x| x == "ro")),
            "{line}"
        );
        ok("umount", &[mnt.to_str().expect("mnt")]);
    }
    drop(disk);
    let bytes = std::fs::read(&img).expect("read");
    assert!(bytes.iter().all(|b| *b == 0), "the disk is not all zeros");
    env.stop();
}
