//! The terminal of `bcm` as `local.sh` runs it (`--log-file`,
//! `--summary-file`): the demo's lines and the summary, and no log line —
//! the log lines go to the file. `--verbose` streams them again.

use bcm_testkit::{Options, TestEnv};
use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

fn config(env: &TestEnv, dir: &std::path::Path) -> std::path::PathBuf {
    common::config_file(
        env,
        dir,
        "quiet.toml",
        "listen = \"127.0.0.1:0\"\nadmin_token = \"quiet-admin-token-0123456789\"",
        r#"
[api.tls]
plain_http = true
[[api.seed.tenants]]
id = "q"
name = "Quiet"
[[api.seed.pools]]
id = "q-pool"
tenant = "q"
site = "s1"
hardware_profile = "sim"
[[api.seed.deploy_profiles]]
tenant = "q"
profile = { id = "ubuntu-24.04", version = 1, role = "host", image = { url = "http://127.0.0.1:1/i.raw", format = "raw", sha256 = "5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d5d", sizeBytes = 1048576 } }
"#,
    )
}

/// Runs the all-in-one's demo of two machines with `extra` arguments until
/// it prints `until` (or a minute passes); returns what the terminal got.
fn terminal_of(cfg: &std::path::Path, extra: &[&str], until: &str) -> String {
    let out_file = cfg.with_extension(format!("{}.out", extra.len()));
    let out = std::fs::File::create(&out_file).expect("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_bcm"))
        .args([
            "--sim-machines",
            "2",
            "--tenant",
            "q",
            "--pool",
            "q-pool",
            "--config",
        ])
        .arg(cfg)
        .args(extra)
        .stdout(out.try_clone().expect("dup"))
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn bcm");
    let started = Instant::now();
    let mut text = String::new();
    while started.elapsed() < Duration::from_secs(90) {
        text.clear();
        if let Ok(mut f) = std::fs::File::open(&out_file) {
            let _ = f.read_to_string(&mut text);
        }
        if text.contains(until) || child.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    text.clear();
    if let Ok(mut f) = std::fs::File::open(&out_file) {
        let _ = f.read_to_string(&mut text);
    }
    text
}

/// A line as the log formatter writes it (a level between the timestamp
/// and the target).
fn is_log_line(line: &str) -> bool {
    ["TRACE", "DEBUG", " INFO", " WARN", "ERROR"]
        .iter()
        .any(|l| line.contains(l))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_terminal_shows_the_demo_and_the_summary_and_no_log_line() {
    let env = TestEnv::start_with(Options::api_only()).await.expect("env");
    let dir = std::env::temp_dir().join(format!("bcm-quiet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cfg = config(&env, &dir);
    let summary = dir.join("summary.txt");
    std::fs::write(&summary, "SUMMARY: the URL, the token, the logs\n").expect("summary");
    let log = dir.join("logs/bcm.log");
    let (cfg2, log2, summary2) = (cfg.clone(), log.clone(), summary.clone());
    let quiet = tokio::task::spawn_blocking(move || {
        terminal_of(
            &cfg2,
            &[
                "--log-file",
                &log2.display().to_string(),
                "--summary-file",
                &summary2.display().to_string(),
            ],
            "SUMMARY:",
        )
    })
    .await
    .expect("quiet run");
    assert!(quiet.contains("2 machines ready"), "{quiet}");
    assert!(quiet.contains("released"), "{quiet}");
    assert!(quiet.contains("SUMMARY: the URL"), "{quiet}");
    let noisy: Vec<&str> = quiet.lines().filter(|l| is_log_line(l)).collect();
    assert!(noisy.is_empty(), "log lines on the terminal: {noisy:?}");
    let logged = std::fs::read_to_string(&log).expect("the log file");
    assert!(
        logged.lines().any(|l| l.contains(" INFO ")),
        "the log file holds the log lines: {logged}"
    );
    assert!(
        !logged.contains('\u{1b}'),
        "no terminal colours in the log file"
    );

    // --verbose: the lines are on the terminal again (the demo's machines
    // are there already; it goes straight to the summary).
    let (cfg3, log3) = (cfg.clone(), log.clone());
    let verbose = tokio::task::spawn_blocking(move || {
        terminal_of(
            &cfg3,
            &["--log-file", &log3.display().to_string(), "--verbose"],
            "the API stays up",
        )
    })
    .await
    .expect("verbose run");
    assert!(
        verbose.lines().any(|l| l.contains(" INFO ")),
        "--verbose streams the log lines: {verbose}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
