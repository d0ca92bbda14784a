//! Child `bcm` processes for the process-level tests: a config that points
//! them at a test environment's database and bus namespace, and spawning
//! them with a subset of services.
#![allow(dead_code)] // each test binary uses a part

use bcm_core::{NodeId, ProvisionState};
use bcm_testkit::TestEnv;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a node may take to reach a target state.
pub const T: Duration = Duration::from_secs(240);

/// Writes `dir/<name>` with the test environment's database, bus
/// namespace, join key and a sealing key, the simulated site `s1`, the
/// `[api]` keys of `api` (TOML lines) and the `sections` after it (TOML
/// tables: `[engine]`, `[api.telemetry]`, seeds, …).
pub fn config_file(
    env: &TestEnv,
    dir: &std::path::Path,
    name: &str,
    api: &str,
    sections: &str,
) -> std::path::PathBuf {
    let ns = env.bus_config.namespace.clone().expect("namespace");
    // The child mints join tokens the test's API and site must reveal: the
    // test's join key.
    let join_key = dir.join("join.key");
    std::fs::write(&join_key, env.join_key.to_text()).expect("write join key");
    // The test's quorum: its policy key signs one-node batches, its anchor
    // is the simulated site's.
    let policy_key = dir.join("policy.key");
    std::fs::write(&policy_key, hex::encode(env.quorum.policy.to_bytes()))
        .expect("write policy key");
    let anchor = env.anchor_file();
    let text = format!(
        r#"
[api]
database_url = "{db}"
{api}
[api.bus]
url = "{nats}"
namespace = "{ns}"
[api.join_key]
file = "{join_key}"
[api.quorum]
policy_key_file = "{policy_key}"
[[api.sealing_keys]]
id = "child"
key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
[sim]
site = "s1"
quorum_anchor_file = "{anchor}"
{sections}
"#,
        db = env.database_url,
        nats = env.bus_config.url,
        join_key = join_key.display(),
        policy_key = policy_key.display(),
        anchor = anchor.display(),
    );
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write config");
    path
}

/// A child's configuration: the engine's agents call `env`'s API.
pub fn child_config(env: &TestEnv, dir: &std::path::Path) -> std::path::PathBuf {
    config_file(
        env,
        dir,
        "child.toml",
        r#"admin_token = "child-admin-token-unused""#,
        &format!(
            r#"
[engine]
control_plane_url = "{api}"
poll_ms = 100
join_poll_ms = 50
[reconciler]
metal_poll_ms = 2000
lease_ttl_ms = 2000
"#,
            api = env.base
        ),
    )
}

pub fn spawn_child(config: &std::path::Path, services: &str, log: &std::path::Path) -> Child {
    spawn_child_with(config, services, log, &[])
}

/// [`spawn_child`] with the API (where it runs) listening on `listen`.
pub fn spawn_child_on(
    config: &std::path::Path,
    services: &str,
    log: &std::path::Path,
    listen: &str,
) -> Child {
    spawn_child_with(config, services, log, &[("BCM_ALL_API__LISTEN", listen)])
}

/// [`spawn_child`] with more environment (configuration overrides).
pub fn spawn_child_with(
    config: &std::path::Path,
    services: &str,
    log: &std::path::Path,
    env: &[(&str, &str)],
) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    Command::new(env!("CARGO_BIN_EXE_bcm"))
        .args(["--sim-machines", "0", "--services", services, "--config"])
        .arg(config)
        .env("BCM_ALL_API__LISTEN", "127.0.0.1:0")
        .envs(env.iter().copied())
        // Spans leave a process within 200 ms (where it exports any).
        .env("OTEL_BSP_SCHEDULE_DELAY", "200")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn bcm")
}

pub async fn count_in(env: &TestEnv, ids: &[NodeId], state: ProvisionState) -> usize {
    let mut n = 0;
    for id in ids {
        if env
            .node(id)
            .await
            .map(|x| x.provision_state == state)
            .unwrap_or(false)
        {
            n += 1;
        }
    }
    n
}

pub async fn all_reach(env: &TestEnv, ids: &[NodeId], state: ProvisionState) {
    for id in ids {
        env.wait_state(id, state, T).await.expect("target state");
    }
}
