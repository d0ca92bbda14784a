//! No secret in the clear (issue 18, finding 2). A node goes through a whole
//! lifecycle — enroll, inspect (its ramdisk joins with a discovery token),
//! deploy (the installed OS joins with the token of its user data),
//! release — while a subscriber records every message published under the
//! run's namespace, to its buckets and to reply inboxes; then that record, a dump of the
//! database and every message still kept in a stream or bucket of the run
//! are searched for a join token, an agent session token and the BMC
//! password: none is there. Join tokens travel as
//! references (`bcmjref_<id>`) that the boot side and the API reveal only to
//! the machine, so the references are there instead.
//!
//! The simulated machines' own buckets (`sim`, `sim_runs`) are left out:
//! they are the machines' memory (a real machine holds its token in RAM),
//! not the control plane's record.

use bcm_core::ProvisionState;
use bcm_testkit::{Options, TestEnv};
use futures::StreamExt;
use serde_json::json;
use std::time::Duration;

const PASSWORD: &str = "calvin-Secret-7f3a9c";
const T: Duration = Duration::from_secs(120);

/// Every `<prefix>` followed by 64 hex digits in `text`.
fn secrets_with_prefix(text: &str, prefix: &str) -> Vec<String> {
    text.match_indices(prefix)
        .filter_map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            let hex: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
            (hex.len() >= 64).then(|| format!("{prefix}{hex}"))
        })
        .collect()
}

fn assert_clean(what: &str, text: &str) {
    for prefix in ["bcmj_", "bcms_"] {
        let found = secrets_with_prefix(text, prefix);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| found.iter().any(|f| l.contains(f.as_str())))
            .map(|l| &l[..l.len().min(300)])
            .collect();
        assert!(found.is_empty(), "{what} holds a token: {lines:#?}");
    }
    assert!(!text.contains(PASSWORD), "{what} holds the BMC password");
}

#[test]
fn the_search_finds_what_it_looks_for() {
    let token = format!("bcmj_{}", "ab".repeat(32));
    assert_eq!(
        secrets_with_prefix(&format!("x bcm.join={token} y"), "bcmj_"),
        vec![token]
    );
    assert!(secrets_with_prefix("bcmjref_01m8vas69nesyspnmz6e8an39q", "bcmj_").is_empty());
    assert!(secrets_with_prefix("bcmj_abc", "bcmj_").is_empty());
}

/// Every message of every stream of the run's namespace but the simulated
/// machines', as text.
async fn streams_text(env: &TestEnv) -> (String, Vec<String>) {
    let js = env.state.inner.bus.jetstream();
    let ns = env
        .bus_config
        .namespace
        .clone()
        .unwrap_or_default()
        .to_uppercase();
    let machines = [
        env.subjects()
            .kv_bucket("sim", &"s1".parse().expect("site")),
        env.subjects()
            .kv_bucket("sim_runs", &"s1".parse().expect("site")),
    ];
    let mut names = vec![];
    let mut list = js.stream_names();
    while let Some(name) = list.next().await {
        let name = name.expect("a stream name");
        if name.contains(&ns) && !machines.iter().any(|m| name == format!("KV_{m}")) {
            names.push(name);
        }
    }
    let mut text = String::new();
    for name in &names {
        let mut stream = js.get_stream(name).await.expect("stream");
        let state = stream.info().await.expect("info").state.clone();
        if state.messages == 0 {
            continue;
        }
        for seq in state.first_sequence..=state.last_sequence {
            if let Ok(m) = stream.get_raw_message(seq).await {
                text.push_str(&String::from_utf8_lossy(&m.payload));
                text.push('\n');
                text.push_str(&format!("{:?}\n", m.headers));
            }
        }
    }
    (text, names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_lifecycle_leaves_no_token_or_password_in_the_record_or_on_the_bus() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    // Everything published under the run's namespace (commands, results,
    // events, work, dead letters) and to its buckets, as it happens: the
    // work-queue streams forget a message once it is acked.
    let ns = env.bus_config.namespace.clone().expect("a namespace");
    let client = env.state.inner.bus.client();
    let mut subs = vec![
        client.subscribe(format!("{ns}.>")).await.expect("sub"),
        client.subscribe("$KV.>".to_owned()).await.expect("sub"),
        // Replies (the attestation service's answers to joins among them).
        client.subscribe("_INBOX.>".to_owned()).await.expect("sub"),
    ];
    let bucket_of = format!("BCM_{}", ns.to_uppercase());
    let sim_buckets = [
        env.subjects()
            .kv_bucket("sim", &"s1".parse().expect("site")),
        env.subjects()
            .kv_bucket("sim_runs", &"s1".parse().expect("site")),
    ];
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut recorders = vec![];
    for mut sub in subs.drain(..) {
        let (seen, bucket_of, sim_buckets) = (seen.clone(), bucket_of.clone(), sim_buckets.clone());
        recorders.push(tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let subject = m.subject.as_str();
                let ours = !subject.starts_with("$KV.")
                    || (subject.contains(&bucket_of)
                        && !sim_buckets
                            .iter()
                            .any(|b| subject.starts_with(&format!("$KV.{b}."))));
                if ours {
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    seen.push_str(subject);
                    seen.push(' ');
                    seen.push_str(&String::from_utf8_lossy(&m.payload));
                    seen.push('\n');
                }
            }
        }));
    }
    let (s, b) = env
        .post(
            "/api/compute/metal/enroll",
            Some(&env.admin_token),
            &json!({"tenantId": "a", "poolId": "a-pool",
                "hardwareProfile": "sim", "bmc": {"driver": "sim", "address": "sim://secrets-1", "username": "admin", "password": PASSWORD}}),
        )
        .await
        .expect("enroll");
    assert_eq!(s, 200, "{b}");
    let id: bcm_core::NodeId = b["nodeId"]
        .as_str()
        .and_then(|i| i.parse().ok())
        .expect("id");
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready: the ramdisk joined with its revealed token");
    env.verb_ok(
        "deploy",
        &id,
        json!({"profileId": "p", "profileVersion": 1}),
    )
    .await;
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("deployed: the installed OS joined with its revealed token");
    env.verb_ok("undeploy", &id, json!({})).await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("released");

    let dump = bcm_testkit::dump_database(&env.database_url);
    assert!(dump.contains("bcmjref_"), "the commands carry references");
    assert_clean("the database", &dump);

    let (streams, names) = streams_text(&env).await;
    assert!(
        names.iter().any(|n| n.contains("COMMANDS")) && names.iter().any(|n| n.contains("EVENTS")),
        "{names:?}"
    );
    assert_clean("the streams and buckets", &streams);
    for r in recorders {
        r.abort();
    }
    let published = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        published.contains("site.bootEntry.set") && published.contains("bcmjref_"),
        "the boot entry commands were seen, carrying references"
    );
    assert_clean("what was published on the bus", &published);

    let (_, view) = env
        .get(
            &format!("/api/compute/metal/nodes/{id}"),
            Some(&env.admin_token),
        )
        .await
        .expect("node");
    assert_clean("the API's view of the node", &view.to_string());
}
