//! bcd's figures, printed in one run (a benchmark, not a test):
//!   - `deploy.image` MB/s for a 2 GiB image (half data, half holes), raw
//!     and qcow2, streamed over loopback HTTP onto a plain-file target,
//!     against `qemu-img convert` of the same image onto the same kind of
//!     target. bcd's time is given to the stream's end (downloaded, hashed,
//!     converted, written) and whole (then holes zeroed, flushed, read back
//!     and checked); qemu-img's to `sync`, and with `qemu-img compare`
//!     after it (its own way of checking what it wrote). `raw+map` is the
//!     raw image signed with its block map: only its runs are fetched (HTTP
//!     ranges from `tower-http`'s file server, the site cache's);
//!   - the time of a `quick` wipe (with read-back) of a 100 GiB sparse disk
//!     on a loop device.
//!
//! Run: `cargo bench -p bcm-bcd --bench bcd` (root, for losetup).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use bcm_bcd::image::{DataRange, DeployOptions, Format, Manifest};
use ed25519_dalek::SigningKey;
use sha2::{Digest, Sha256};

const GIB: u64 = 1 << 30;

fn sh(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd).args(args).status().expect(cmd);
    assert!(st.success(), "{cmd} {args:?}");
}

/// `tower-http`'s file server over `dir` (the site cache's, with ranges,
/// reading 1 MiB at a time as the boot service's does).
fn serve(dir: PathBuf) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("rt");
        rt.block_on(async move {
            let app = axum::Router::new().fallback_service(
                tower_http::services::ServeDir::new(dir).with_buf_chunk_size(1 << 20),
            );
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let _ = tx.send(format!("http://{}", l.local_addr().expect("addr")));
            let _ = axum::serve(l, app).await;
        });
    });
    rx.recv().expect("server")
}

/// The file's runs of 1 MiB chunks that are not all zeros, each with its
/// sha256 (what `metalctl image sign` puts in a block map).
fn runs_of(p: &Path) -> Vec<DataRange> {
    use std::io::Read as _;
    let mut f = std::fs::File::open(p).expect("open");
    let (mut runs, mut buf, mut at) = (Vec::<(u64, u64, Sha256)>::new(), vec![0u8; 1 << 20], 0u64);
    loop {
        // Whole MiBs (the last may be short), as the map's runs must be.
        let mut n = 0;
        while n < buf.len() {
            match f.read(&mut buf[n..]).expect("read") {
                0 => break,
                got => n += got,
            }
        }
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|b| *b != 0) {
            match runs.last_mut() {
                Some((o, l, h)) if *o + *l == at => {
                    h.update(&buf[..n]);
                    *l += n as u64;
                }
                _ => runs.push((at, n as u64, Sha256::new_with_prefix(&buf[..n]))),
            }
        }
        at += n as u64;
    }
    runs.into_iter()
        .map(|(offset, length, h)| DataRange {
            offset,
            length,
            sha256: hex::encode(h.finalize()),
        })
        .collect()
}

fn sha_file(p: &Path) -> String {
    let mut f = std::fs::File::open(p).expect("open");
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).expect("hash");
    hex::encode(h.finalize())
}

fn main() {
    let dir = std::env::temp_dir().join(format!("bcd-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let raw = dir.join("image.raw");
    let qcow = dir.join("image.qcow2");
    // 2 GiB virtual: 1 GiB of random data in 64 MiB runs, holes between.
    std::fs::File::create(&raw)
        .expect("raw")
        .set_len(2 * GIB)
        .expect("len");
    for i in 0..16u64 {
        sh(
            "dd",
            &[
                "if=/dev/urandom",
                &format!("of={}", raw.display()),
                "bs=4M",
                &format!("seek={}", i * 32),
                "count=16",
                "conv=notrunc",
                "status=none",
            ],
        );
    }
    sh(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "qcow2",
            &raw.display().to_string(),
            &qcow.display().to_string(),
        ],
    );
    let base = serve(dir.clone());
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    println!("bcd benchmark (2 cores; loopback HTTP; plain-file targets on the same disk)");
    println!(
        "{:<28} {:>10} {:>10} {:>12}",
        "case", "bytes", "seconds", "MB/s"
    );
    for (name, format, path, mapped) in [
        ("raw", Format::Raw, &raw, false),
        ("raw+map", Format::Raw, &raw, true),
        ("qcow2", Format::Qcow2, &qcow, false),
    ] {
        let bytes = std::fs::metadata(path).expect("meta").len();
        let sha = sha_file(path);
        let url = format!(
            "{base}/{}",
            path.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
        );
        let fmt = if format == Format::Raw {
            "raw"
        } else {
            "qcow2"
        };
        let runs = mapped.then(|| runs_of(path));
        let signed: Option<Vec<(u64, u64, &str)>> = runs.as_ref().map(|r| {
            r.iter()
                .map(|d| (d.offset, d.length, d.sha256.as_str()))
                .collect()
        });
        let signature = bcm_pki::image::sign_manifest(
            &key,
            &bcm_pki::image::ManifestFields {
                url: &url,
                format: fmt,
                size_bytes: bytes,
                sha256: &sha,
                data_ranges: signed.as_deref(),
            },
        );
        let m = Manifest {
            signature: Some(signature),
            url,
            format,
            size_bytes: bytes,
            sha256: sha,
            data_ranges: runs,
        };
        let target = dir.join(format!("target-{name}.img"));
        std::fs::File::create(&target)
            .expect("t")
            .set_len(2 * GIB)
            .expect("len");
        let disk = bcm_bcd::disks::describe(&target).expect("describe");
        let t0 = Instant::now();
        let mut streamed = t0;
        let r = bcm_bcd::image::deploy(
            &m,
            &[key.verifying_key()],
            &disk,
            &DeployOptions::default(),
            &mut |_, _| streamed = Instant::now(),
        )
        .expect("deploy");
        let s = t0.elapsed().as_secs_f64();
        let st = streamed.duration_since(t0).as_secs_f64();
        println!(
            "{:<28} {:>10} {:>10.2} {:>12.1}",
            format!("bcd {name}: stream"),
            bytes,
            st,
            bytes as f64 / 1e6 / st
        );
        println!(
            "{:<28} {:>10} {:>10.2} {:>12.1}",
            format!("bcd {name}: + verified"),
            bytes,
            s,
            bytes as f64 / 1e6 / s
        );
        if let Some(n) = r.data_ranges_checked {
            println!(
                "{:<28} {:>10} {:>10} {:>12}",
                format!("  ({n} runs fetched)"),
                r.bytes_downloaded,
                "",
                ""
            );
        }
        println!(
            "{:<28} {:>10} {:>10} {:>12.1}",
            format!("  (virtual {name})"),
            r.virtual_size_bytes,
            "",
            r.virtual_size_bytes as f64 / 1e6 / s
        );
        let qt = dir.join(format!("qemu-{name}.img"));
        std::fs::File::create(&qt)
            .expect("t")
            .set_len(2 * GIB)
            .expect("len");
        let t0 = Instant::now();
        sh(
            "qemu-img",
            &[
                "convert",
                "-n",
                "-f",
                fmt,
                "-O",
                "raw",
                &path.display().to_string(),
                &qt.display().to_string(),
            ],
        );
        sh("sync", &[]);
        let s = t0.elapsed().as_secs_f64();
        println!(
            "{:<28} {:>10} {:>10.2} {:>12.1}",
            format!("qemu-img {name}: convert"),
            bytes,
            s,
            bytes as f64 / 1e6 / s
        );
        // Its own check of what it wrote, around the page cache as bcd's.
        sh(
            "qemu-img",
            &[
                "compare",
                "-q",
                "-T",
                "none",
                "-f",
                fmt,
                "-F",
                "raw",
                &path.display().to_string(),
                &qt.display().to_string(),
            ],
        );
        let s = t0.elapsed().as_secs_f64();
        println!(
            "{:<28} {:>10} {:>10.2} {:>12.1}",
            format!("qemu-img {name}: + compare"),
            bytes,
            s,
            bytes as f64 / 1e6 / s
        );
        let _ = std::fs::remove_file(&target);
        let _ = std::fs::remove_file(&qt);
    }
    // Quick wipe of a 100 GiB sparse disk on a loop device.
    let big = dir.join("big.img");
    std::fs::File::create(&big)
        .expect("big")
        .set_len(100 * GIB)
        .expect("len");
    let out = Command::new("losetup")
        .args(["--show", "-f", &big.display().to_string()])
        .output()
        .expect("losetup");
    let (dev, attached) = if out.status.success() {
        (
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
            true,
        )
    } else {
        (big.clone(), false)
    };
    let disk = bcm_bcd::disks::describe(&dev).expect("describe");
    let t0 = Instant::now();
    let r = bcm_bcd::wipe::wipe_disk(&disk, bcm_bcd::wipe::Method::Quick, &[], 16);
    let s = t0.elapsed().as_secs_f64();
    println!(
        "quick wipe of a 100 GiB sparse {} ({}): {:.2} s, outcome {:?}, {} regions read back",
        if attached { "loop device" } else { "file" },
        dev.display(),
        s,
        r.outcome,
        r.verified_regions.len()
    );
    if attached {
        sh("losetup", &["-d", &dev.display().to_string()]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
