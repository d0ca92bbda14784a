//! `metalctl events --durable` consumes a tenant's events across restarts
//! without losing or repeating one: a run prints what is new since the last
//! run, and a `--follow` stopped by SIGTERM hands back nothing it printed.

use bcm_testkit::{tenant_a, Options, TestEnv};
use std::collections::BTreeSet;
use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::time::Duration;

fn metalctl(env: &TestEnv, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metalctl"));
    c.args([
        "--tenant",
        "a",
        "-o",
        "json",
        "events",
        "--durable",
        "team-a-audit",
    ])
    .args(extra)
    .arg("--nats")
    .arg(&env.bus_config.url)
    .arg("--namespace")
    .arg(env.bus_config.namespace.clone().expect("namespace"));
    c
}

/// The ids of the events one run printed (JSON lines).
fn ids(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            v["id"].as_str().expect("an event id").to_owned()
        })
        .collect()
}

fn run_once(env: &TestEnv) -> Vec<String> {
    let out = metalctl(env, &[]).output().expect("metalctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ids(&String::from_utf8_lossy(&out.stdout))
}

/// Enrolls `n` machines and waits until their events (two each) are in the
/// stream; returns every event id of the tenant so far.
async fn enroll(
    env: &TestEnv,
    reader: &bcm_testkit::EventReader,
    names: &[&str],
    seen: &mut Vec<String>,
) {
    for n in names {
        env.enroll_sim(n).await;
    }
    let got = reader
        .read(2 * names.len(), Duration::from_secs(10))
        .await
        .expect("events");
    assert_eq!(got.len(), 2 * names.len());
    seen.extend(got.into_iter().map(|e| e.event.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_consumer_resumes_after_the_last_event_it_printed() {
    // No engine, no reconciler: only the verbs make events.
    let env = TestEnv::start_with(Options {
        engine: false,
        reconcilers: 0,
        ..Default::default()
    })
    .await
    .expect("env");
    let reader = env
        .events_consumer("all", &env.subjects().events_of_tenant(&tenant_a()))
        .await
        .expect("reader");
    let mut all = vec![];

    enroll(&env, &reader, &["ev-1", "ev-2"], &mut all).await;
    let first = run_once(&env);
    assert_eq!(first, all, "the first run prints every event, in order");

    enroll(&env, &reader, &["ev-3", "ev-4"], &mut all).await;
    let second = run_once(&env);
    assert_eq!(
        second,
        all[4..].to_vec(),
        "the second run prints only the new ones"
    );

    // --follow, stopped by SIGTERM once it printed the next two.
    let mut child = metalctl(&env, &["--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("metalctl --follow");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    enroll(&env, &reader, &["ev-5"], &mut all).await;
    let followed: Vec<String> = (0..2)
        .map(|_| {
            rx.recv_timeout(Duration::from_secs(20))
                .expect("a followed event")
        })
        .collect();
    assert_eq!(ids(&followed.join("\n")), all[8..].to_vec());
    let pid = child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = child.wait().expect("wait");
    assert!(status.success(), "SIGTERM ends it cleanly: {status}");

    enroll(&env, &reader, &["ev-6"], &mut all).await;
    let third = run_once(&env);
    assert_eq!(third, all[10..].to_vec(), "nothing lost, nothing repeated");
    let distinct: BTreeSet<&String> = all.iter().collect();
    assert_eq!(distinct.len(), all.len());
}
