//! TFTP with real clients: tftp-hpa's `tftp` and `curl tftp://` fetch
//! byte-identical files (blksize and tsize negotiated by curl); paths out
//! of the root (`..`, absolute, a symlink out) and writes are refused with a
//! TFTP error; 100 parallel fetches all succeed.

mod support;

use std::process::Command;
use support::{Boot, Scratch};

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What a client printed, stdout then stderr.
fn said(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn curl(
    port: u16,
    path: &str,
    out: &std::path::Path,
    blksize: Option<u32>,
) -> std::process::Output {
    let mut c = Command::new("curl");
    c.args(["-sS", "--max-time", "20", "-o"]).arg(out);
    if let Some(b) = blksize {
        c.args(["--tftp-blksize", &b.to_string()]);
    }
    c.arg(format!("tftp://127.0.0.1:{port}/{path}"));
    c.output().expect("curl")
}

fn tftp_hpa(port: u16, path: &str, out: &std::path::Path) -> std::process::Output {
    Command::new("tftp")
        .args([
            "-m",
            "binary",
            "127.0.0.1",
            &port.to_string(),
            "-c",
            "get",
            path,
        ])
        .arg(out)
        .output()
        .expect("tftp")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_fetch_identical_bytes_and_nothing_outside_the_root() {
    assert!(
        have("tftp") && have("curl"),
        "tftp-hpa and curl are needed: run tests/peers/install.sh (the test command does)"
    );
    let env = bcm_testkit::TestEnv::start().await.expect("env");
    let dir = Scratch::new("tftp");
    let files = support::boot_files(&dir.0.join("boot"));
    std::fs::write(dir.0.join("secret"), b"outside the root").expect("secret");
    std::os::unix::fs::symlink(dir.0.join("secret"), dir.0.join("boot/escape")).expect("symlink");
    let boot = Boot::start(&support::config(&env, &dir.0, 9, "a")).await;
    let port = boot.running.tftp.port();
    let out = dir.0.join("out");
    std::fs::create_dir_all(&out).expect("out");

    for (name, bytes) in &files {
        let by_tftp = out.join(format!("{name}.tftp"));
        let o = tokio::task::spawn_blocking({
            let (name, by_tftp) = (name.clone(), by_tftp.clone());
            move || tftp_hpa(port, &name, &by_tftp)
        })
        .await
        .expect("join");
        assert!(o.status.success(), "tftp {name}: {o:?}");
        assert_eq!(
            &std::fs::read(&by_tftp).expect("read"),
            bytes,
            "tftp-hpa: {name}"
        );
        for blksize in [None, Some(1468)] {
            let by_curl = out.join(format!("{name}.curl"));
            let o = tokio::task::spawn_blocking({
                let (name, by_curl) = (name.clone(), by_curl.clone());
                move || curl(port, &name, &by_curl, blksize)
            })
            .await
            .expect("join");
            assert!(o.status.success(), "curl {name}: {o:?}");
            assert_eq!(
                &std::fs::read(&by_curl).expect("read"),
                bytes,
                "curl {blksize:?}: {name}"
            );
        }
    }

    for bad in ["../secret", "escape", "%2Fetc%2Fpasswd", "..%2Fsecret"] {
        let target = out.join("refused");
        let _ = std::fs::remove_file(&target);
        let o = tokio::task::spawn_blocking({
            let (bad, target) = (bad.to_owned(), target.clone());
            move || curl(port, &bad, &target, None)
        })
        .await
        .expect("join");
        assert!(!o.status.success(), "{bad} must be refused: {o:?}");
        let got = std::fs::read(&target).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&got).contains("outside the root"),
            "{bad} leaked"
        );
        assert!(
            !String::from_utf8_lossy(&got).contains("root:"),
            "{bad} leaked /etc/passwd"
        );
    }
    // tftp-hpa sends the absolute path as it is.
    let o = tokio::task::spawn_blocking({
        let target = out.join("abs");
        move || tftp_hpa(port, "/etc/passwd", &target)
    })
    .await
    .expect("join");
    let text = said(&o);
    assert!(
        text.contains("Error code"),
        "an absolute path gets a TFTP error: {text}"
    );
    assert!(!std::fs::read(out.join("abs"))
        .unwrap_or_default()
        .starts_with(b"root:"));
    // Writes are refused.
    let upload = dir.0.join("upload");
    std::fs::write(&upload, b"x").expect("upload");
    let o = Command::new("tftp")
        .args(["-m", "binary", "127.0.0.1", &port.to_string(), "-c", "put"])
        .arg(&upload)
        .arg("new.bin")
        .output()
        .expect("tftp put");
    let text = said(&o);
    assert!(
        text.contains("Error code"),
        "a write gets a TFTP error: {text}"
    );
    assert!(!dir.0.join("boot/new.bin").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_parallel_fetches_all_succeed() {
    let env = bcm_testkit::TestEnv::start().await.expect("env");
    let (dir, boot) = support::started(&env, "tftp100", 9).await;
    let port = boot.running.tftp.port();
    let out = dir.0.join("out");
    std::fs::create_dir_all(&out).expect("out");
    let want = std::fs::read(dir.0.join("boot/undionly.kpxe")).expect("served file");
    let children: Vec<_> = (0..100)
        .map(|i| {
            Command::new("curl")
                .args(["-sS", "--max-time", "60", "--tftp-blksize", "1468", "-o"])
                .arg(out.join(format!("{i}.bin")))
                .arg(format!("tftp://127.0.0.1:{port}/undionly.kpxe"))
                .spawn()
                .expect("curl")
        })
        .collect();
    let statuses = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|mut c| c.wait().expect("wait"))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    let ok = statuses.iter().filter(|s| s.success()).count();
    assert_eq!(ok, 100, "every fetch succeeded");
    for i in 0..100 {
        assert_eq!(
            std::fs::read(out.join(format!("{i}.bin"))).expect("read"),
            want,
            "fetch {i}"
        );
    }
}
