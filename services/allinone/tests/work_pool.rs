//! A `bcm` process that runs the API beside background services (here the
//! reconciler) gives those services a pool of their own
//! (`work_connections`, 16 by default), so their batches never hold the connections the
//! verbs and reads wait for: after one enroll, the process's metrics show
//! the verb's transaction on the API's `main` pool and the reconciler's on
//! `work`. (The relay, also run here, has a pool of its own on a thread of
//! its own.)

use bcm_testkit::{Options, TestEnv};
use std::time::Duration;

mod common;

/// The child, killed however the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The observations of `bcm_db_pool_wait_seconds` for `pool` in a
/// Prometheus text scrape.
fn pool_waits(metrics: &str, pool: &str) -> f64 {
    let key = format!("bcm_db_pool_wait_seconds_count{{pool=\"{pool}\"}}");
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(key.as_str()))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_services_beside_the_api_wait_on_a_pool_of_their_own() {
    let env = TestEnv::start_with(Options::api_only()).await.expect("env");
    let dir = std::env::temp_dir().join(format!("bcm-work-pool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let token = "work-pool-admin-token-0123456789";
    let config = common::config_file(
        &env,
        &dir,
        "work-pool.toml",
        &format!("admin_token = \"{token}\""),
        "[api.tls]\nplain_http = true\n[reconciler]\nmetal_poll_ms = 500\nlease_ttl_ms = 2000\n",
    );
    let listen = format!("127.0.0.1:{}", free_port());
    let child = Killed(common::spawn_child_on(
        &config,
        "api,relay,reconciler",
        &dir.join("bcm.log"),
        &listen,
    ));
    let http = reqwest::Client::new();
    let metrics = || async {
        let r = http.get(format!("http://{listen}/metrics")).send().await?;
        r.text().await
    };
    // A verb: its transaction is the API's; the relay publishes its event
    // and the reconciler answers it, in its own.
    let enroll = || async {
        http.post(format!("http://{listen}/api/compute/metal/enroll"))
            .bearer_auth(token)
            .json(&serde_json::json!({"tenantId": "a", "poolId": "a-pool", "hardwareProfile": "sim",
                "bmc": {"driver": "sim", "address": "sim://work-pool", "username": "admin", "password": "pw"}}))
            .send()
            .await
    };
    // The child's API answers once it has started.
    bcm_testkit::eventually(Duration::from_secs(60), || async {
        Ok(enroll()
            .await
            .is_ok_and(|r| r.status().is_success())
            .then_some(()))
    })
    .await
    .expect("the child's API enrolls a machine");
    let last = std::sync::Mutex::new(String::new());
    let seen = bcm_testkit::eventually(Duration::from_secs(60), || async {
        let text = metrics().await.unwrap_or_default();
        *last.lock().unwrap_or_else(|p| p.into_inner()) = text.clone();
        let (main, work) = (pool_waits(&text, "main"), pool_waits(&text, "work"));
        Ok((main > 0.0 && work > 0.0).then_some(()))
    })
    .await;
    drop(child);
    let log = std::fs::read_to_string(dir.join("bcm.log")).unwrap_or_default();
    let last = last.into_inner().unwrap_or_else(|p| p.into_inner());
    seen.unwrap_or_else(|e| panic!("both pools waited on: {e}\n{last}\n{log}"));
    let _ = std::fs::remove_dir_all(&dir);
}
