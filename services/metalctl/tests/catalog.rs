//! `metalctl profiles publish|list|show`, `image register|list|show|prewarm`,
//! `site-proxy`, `hardware-profiles` and `pools`
//! against a real API: a table a person reads, JSON for scripts, and a
//! refused publish that says why and exits non-zero.

use bcm_testkit::{Options, TestEnv};
use serde_json::{json, Value};
use std::process::Command;

fn metalctl(env: &TestEnv) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_metalctl"));
    c.args([
        "--api",
        &env.base,
        "--token",
        &env.admin_token,
        "--tenant",
        "a",
    ]);
    c
}

fn run(env: &TestEnv, args: &[&str]) -> (bool, String, String) {
    let out = metalctl(env).args(args).output().expect("metalctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_hardware_profiles_and_pools_from_the_command_line() {
    let env = TestEnv::start_with(Options::api_only()).await.expect("env");
    let dir = std::env::temp_dir().join(format!("metalctl-catalog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("cloud.json");
    let profile = json!({"id": "cloud", "version": 1, "userDataTemplate": "nocloud",
        "image": {"url": "http://images.local/cloud.raw", "format": "raw", "sha256": "ab".repeat(32), "sizeBytes": 4096}});
    std::fs::write(&file, profile.to_string()).expect("write");
    let path = file.to_str().expect("utf-8");

    let (ok, out, err) = run(&env, &["profiles", "publish", path]);
    assert!(ok, "{err}");
    assert!(out.contains("cloud") && out.contains("admin"), "{out}");
    // The same file again is the stored version; a changed one is refused.
    let (ok, _, err) = run(&env, &["-o", "json", "profiles", "publish", path]);
    assert!(ok, "{err}");
    std::fs::write(
        &file,
        json!({"id": "cloud", "version": 1, "userDataTemplate": "autoinstall",
            "image": profile["image"].clone()})
        .to_string(),
    )
    .expect("write");
    let (ok, _, err) = run(&env, &["profiles", "publish", path]);
    assert!(!ok);
    assert!(
        err.contains("409 CONFLICT") && err.contains("publish version 2"),
        "{err}"
    );

    let (ok, out, err) = run(&env, &["-o", "json", "profiles", "list", "--id", "cloud"]);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(
        listed[0]["profile"]["userData"]
            .as_str()
            .map(|u| u.contains("{{ bcdUrl }}")),
        Some(true)
    );
    let (ok, out, err) = run(&env, &["profiles", "show", "cloud", "1"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("user data:") && out.contains("sha256sum -c"),
        "{out}"
    );

    let (ok, out, err) = run(&env, &["hardware-profiles"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("gpu-redfish (default)") && out.contains("image-stream"),
        "{out}"
    );
    let (ok, out, err) = run(&env, &["-o", "json", "pools"]);
    assert!(ok, "{err}");
    let pools: Value = serde_json::from_str(&out).expect("json");
    let a_pool = pools
        .as_array()
        .and_then(|p| p.iter().find(|p| p["id"] == "a-pool"))
        .unwrap_or_else(|| panic!("a-pool is listed: {pools}"));
    assert_eq!(a_pool["releaseWipe"], "quick");
    let agentless = pools
        .as_array()
        .and_then(|p| p.iter().find(|p| p["id"] == "a-agentless"))
        .unwrap_or_else(|| panic!("a-agentless is listed: {pools}"));
    assert_eq!(
        (&agentless["agentMode"], &agentless["unattestedRelease"]),
        (&serde_json::json!("none"), &serde_json::json!("ready"))
    );
    let (ok, out, _) = run(&env, &["pools"]);
    assert!(ok);
    assert!(out.contains("a-pool") && out.contains("(any)"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_and_a_sites_proxy_from_the_command_line() {
    let env = TestEnv::start_with(Options::api_only()).await.expect("env");
    let dir = std::env::temp_dir().join(format!("metalctl-images-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    // What `metalctl image sign` prints is what `image register` takes.
    let key = dir.join("publisher.key");
    let raw = dir.join("os.raw");
    std::fs::write(&raw, vec![7u8; 8192]).expect("image");
    let (ok, _, err) = run(&env, &["image", "keygen", key.to_str().expect("utf-8")]);
    assert!(ok, "{err}");
    let (ok, signed, err) = run(
        &env,
        &[
            "image",
            "sign",
            "--key-file",
            key.to_str().expect("utf-8"),
            "--url",
            "http://images.local/os.raw",
            raw.to_str().expect("utf-8"),
        ],
    );
    assert!(ok, "{err}");
    let reference = dir.join("os.json");
    std::fs::write(&reference, &signed).expect("write");
    let (ok, out, err) = run(
        &env,
        &[
            "image",
            "register",
            "os",
            reference.to_str().expect("utf-8"),
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("os") && out.contains("yes"), "signed: {out}");
    let (ok, out, err) = run(&env, &["-o", "json", "image", "list"]);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(listed[0]["name"], "os", "{listed}");
    assert_eq!(listed[0]["image"]["sizeBytes"], 8192);

    let (ok, out, err) = run(&env, &["site-proxy", "s1", "http://127.0.0.1:3128"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("http://127.0.0.1:3128") && out.contains("admin"),
        "{out}"
    );
    let (ok, _, err) = run(&env, &["site-proxy", "s1", "http://me:pw@127.0.0.1:3128"]);
    assert!(!ok);
    assert!(err.contains("400 INVALID_ARGUMENT"), "{err}");
    let (ok, out, err) = run(&env, &["image", "prewarm", "os", "--site", "s1"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("catalog/a/os") && out.contains("http://127.0.0.1:3128"),
        "{out}"
    );
    let (ok, out, err) = run(&env, &["image", "show", "os"]);
    assert!(ok, "{err}");
    assert!(out.contains("s1") && out.contains("pending"), "{out}");
    let (ok, out, err) = run(&env, &["site-proxy", "s1", "--clear"]);
    assert!(ok, "{err}");
    assert!(out.contains("(direct)"), "{out}");
    let (ok, _, err) = run(&env, &["image", "show", "nothing"]);
    assert!(!ok);
    assert!(err.contains("404 NOT_FOUND"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
