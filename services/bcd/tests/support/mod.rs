//! Real block devices for bcd's tests: sparse files attached as loop
//! devices (plain files where loop devices are unavailable), pre-filled
//! with a GPT (sgdisk), an ext4 file system (mkfs.ext4) and random data;
//! the FUSE disk that drops writes (tests/peers/lying_disk.py); and the
//! probes an operator would use afterwards (wipefs, blkid).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn run(cmd: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e} (run tests/peers/install.sh)"));
    out
}

pub fn ok(cmd: &str, args: &[&str]) -> String {
    let out = run(cmd, args);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("bcd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch");
        Self(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a GPT with one Linux partition from 1 MiB, an ext4 file system
/// in it and 4 MiB of random data at 600 MiB into `file` (≥ 1 GiB).
pub fn prefill(file: &Path) {
    let f = file.to_str().expect("path");
    ok("sgdisk", &["-o", "-n", "1:2048:+512M", "-t", "1:8300", f]);
    ok(
        "mkfs.ext4",
        &["-q", "-F", "-E", "offset=1048576", f, "512M"],
    );
    ok(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={f}"),
            "bs=1M",
            "seek=600",
            "count=4",
            "conv=notrunc",
            "status=none",
        ],
    );
}

/// A sparse file of `size` bytes.
pub fn sparse(path: &Path, size: u64) {
    let f = std::fs::File::create(path).expect("create");
    f.set_len(size).expect("set_len");
}

/// A loop device over a file, detached on drop; or the file itself where
/// loop devices are unavailable.
pub struct LoopDisk {
    pub dev: PathBuf,
    attached: bool,
}

impl LoopDisk {
    pub fn attach(file: &Path) -> Self {
        Self::attach_with(file, &[])
    }

    /// Attached with partition scanning (`losetup -P`): the kernel makes
    /// `<dev>p1`… when the partition table is re-read.
    pub fn attach_partscan(file: &Path) -> Self {
        Self::attach_with(file, &["-P"])
    }

    fn attach_with(file: &Path, extra: &[&str]) -> Self {
        let mut args = vec!["--show", "-f"];
        args.extend_from_slice(extra);
        args.push(file.to_str().expect("path"));
        let out = run("losetup", &args);
        if out.status.success() {
            let dev = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            Self {
                dev: PathBuf::from(dev),
                attached: true,
            }
        } else {
            eprintln!(
                "losetup unavailable ({}): using the plain file",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            Self {
                dev: file.to_owned(),
                attached: false,
            }
        }
    }

    pub fn is_loop(&self) -> bool {
        self.attached
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        if self.attached {
            let _ = run("losetup", &["-d", self.dev.to_str().unwrap_or_default()]);
        }
    }
}

/// What `wipefs` finds (no-act), one line per signature.
pub fn wipefs(dev: &Path) -> String {
    ok(
        "wipefs",
        &["-n", "--noheadings", dev.to_str().expect("path")],
    )
}

/// Whether `blkid` low-level probing finds anything at `offset`.
pub fn blkid_finds(dev: &Path, offset: u64) -> bool {
    let out = run(
        "blkid",
        &["-p", "-O", &offset.to_string(), dev.to_str().expect("path")],
    );
    out.status.success()
}

/// The FUSE disk that drops writes (while `<backing>.lie` exists),
/// mounted until drop.
pub struct LyingDisk {
    pub file: PathBuf,
    pub backing: PathBuf,
    mnt: PathBuf,
    child: Child,
}

impl LyingDisk {
    /// Mounts a disk that lies from the start.
    pub fn mount(backing: &Path, mnt: &Path) -> Self {
        let d = Self::mount_honest(backing, mnt);
        d.lie(true);
        d
    }

    /// Starts or stops lying.
    pub fn lie(&self, on: bool) {
        let flag = PathBuf::from(format!("{}.lie", self.backing.display()));
        if on {
            std::fs::write(&flag, b"").expect("flag");
        } else {
            let _ = std::fs::remove_file(&flag);
        }
    }

    /// Mounts a disk that keeps its writes until told to lie.
    pub fn mount_honest(backing: &Path, mnt: &Path) -> Self {
        std::fs::create_dir_all(mnt).expect("mnt");
        let python = std::env::var("BCM_SUSHY_PYTHON").unwrap_or_else(|_| {
            root()
                .join(".bcm/venv-sushy/bin/python")
                .display()
                .to_string()
        });
        let child = Command::new(python)
            .arg(root().join("tests/peers/lying_disk.py"))
            .arg(backing)
            .arg(mnt)
            .stdout(Stdio::null())
            .spawn()
            .expect("lying_disk.py (run tests/peers/install.sh)");
        let file = mnt.join("disk");
        for _ in 0..100 {
            if file.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(file.exists(), "the FUSE disk did not appear");
        Self {
            file,
            backing: backing.to_owned(),
            mnt: mnt.to_owned(),
            child,
        }
    }
}

impl Drop for LyingDisk {
    fn drop(&mut self) {
        let _ = run("umount", &[self.mnt.to_str().unwrap_or_default()]);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The next line a child wrote, within `within` (a test failure otherwise).
pub async fn next_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    within: Duration,
) -> String {
    tokio::time::timeout(within, lines.next_line())
        .await
        .expect("a line in time")
        .expect("read")
        .expect("a line")
}
