//! The deploy profile catalog, pools' policy and the bcd download, over
//! HTTP: a published version never changes; publishing and reading are
//! decided on the tenant; a deploy the pool does not accept, or whose user
//! data needs a bcd nobody published, is `INVALID_CONFIG` and changes
//! nothing; the download's digest is the served bytes' and the one the
//! rendered user data carries; a release without a wipe is refused.

use bcm_core::{ProvisionState, WipeMode};
use bcm_testkit::{Options, TestEnv};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use std::time::Duration;

const PROFILES: &str = "/api/compute/deployProfiles";

fn body(id: &str, version: u32, extra: Value) -> Value {
    let mut b = json!({
        "tenantId": "a", "id": id, "version": version,
        "image": {"url": format!("http://images.invalid/{id}.raw"), "format": "raw",
                  "sha256": "5d".repeat(32), "sizeBytes": 1u64 << 30}
    });
    if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    b
}

async fn list(env: &TestEnv, token: &str) -> Vec<Value> {
    let (s, b) = env
        .get(&format!("{PROFILES}?tenantId=a"), Some(token))
        .await
        .expect("list");
    assert_eq!(s, 200, "{b}");
    b.as_array().expect("array").clone()
}

#[tokio::test]
async fn a_published_version_is_immutable_and_publishing_is_decided_on_the_tenant() {
    let env = TestEnv::start_with(Options::api_only()).await.expect("env");
    let admin = env.admin_token.clone();
    let (s, b) = env
        .post(
            PROFILES,
            Some(&admin),
            &body("cloud", 1, json!({"userDataTemplate": "nocloud"})),
        )
        .await
        .expect("publish");
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["publishedBy"], "admin", "{b}");
    assert_eq!(b["profile"]["role"], "host");
    assert!(b["profile"]["userData"]
        .as_str()
        .is_some_and(|t| t.contains("{{ bcdSha256 }}")));
    // The same content again answers the stored version.
    let (s, again) = env
        .post(
            PROFILES,
            Some(&admin),
            &body("cloud", 1, json!({"userDataTemplate": "nocloud"})),
        )
        .await
        .expect("again");
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["publishedAt"], b["publishedAt"]);
    // Other content under the same version is refused; a new version is not.
    let (s, e) = env
        .post(
            PROFILES,
            Some(&admin),
            &body("cloud", 1, json!({"userDataTemplate": "autoinstall"})),
        )
        .await
        .expect("changed");
    assert_eq!((s, e["code"].as_str()), (409, Some("CONFLICT")), "{e}");
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("publish version 2")),
        "{e}"
    );
    let (s, b2) = env
        .post(
            PROFILES,
            Some(&admin),
            &body(
                "cloud",
                2,
                json!({"userDataTemplate": "autoinstall", "role": "dedicated"}),
            ),
        )
        .await
        .expect("v2");
    assert_eq!(s, 201, "{b2}");
    let (s, got) = env
        .get(&format!("{PROFILES}/a/cloud/1"), Some(&admin))
        .await
        .expect("get");
    assert_eq!(s, 200);
    assert_eq!(
        got["profile"], b["profile"],
        "v1 is what was first published"
    );
    let (s, e) = env
        .get(&format!("{PROFILES}/a/cloud/9"), Some(&admin))
        .await
        .expect("get");
    assert_eq!((s, e["code"].as_str()), (404, Some("NOT_FOUND")));

    // Garbage is refused and stores nothing.
    let before = list(&env, &admin).await;
    let bad: Vec<Value> = vec![
        body("Cloud", 3, json!({})),
        body("cloud", 0, json!({})),
        body(
            "cloud",
            3,
            json!({"userData": "x", "userDataTemplate": "nocloud"}),
        ),
        body("cloud", 3, json!({"userDataTemplate": "kickstart"})),
        body(
            "cloud",
            3,
            json!({"userData": "#cloud-config\n{{ password }}"}),
        ),
        body("cloud", 3, json!({"userData": "#cloud-config\n"})),
        body(
            "cloud",
            3,
            json!({"userData": format!("{{{{ joinToken }}}}{{{{ controlPlaneUrl }}}}{}", "x".repeat(70_000))}),
        ),
        body("cloud", 3, json!({"role": "root"})),
        body("cloud", 3, json!({"surprise": 1})),
        body(
            "cloud",
            3,
            json!({"image": {"url": "file:///etc/shadow", "format": "raw", "sha256": "5d".repeat(32), "sizeBytes": 1}}),
        ),
        body(
            "cloud",
            3,
            json!({"image": {"url": "http://x/y", "format": "raw", "sha256": "XYZ", "sizeBytes": 1}}),
        ),
        body("cloud", 3, json!({"version": "3"})),
        json!({"tenantId": "a"}),
        json!([]),
    ];
    for garbage in &bad {
        let (s, e) = env
            .post(PROFILES, Some(&admin), garbage)
            .await
            .expect("post");
        assert_eq!(
            (s, e["code"].as_str()),
            (400, Some("INVALID_ARGUMENT")),
            "{garbage}: {e}"
        );
    }
    let (s, _) = env
        .post_raw(PROFILES, Some(&admin), "{\"tenantId\": \"a\", \"id\": ")
        .await
        .expect("raw");
    assert_eq!(s, 400);
    assert_eq!(list(&env, &admin).await, before, "garbage stored nothing");

    // Decided on the tenant: a reader of `a` reads and may not publish;
    // another tenant's publisher sees nothing of `a`; a pool grant does not
    // reach the catalog.
    let reader = env
        .token("reader", &[("compute:profiles:read", "tenant", "a")])
        .await
        .expect("token");
    let other = env
        .token(
            "b-publisher",
            &[
                ("compute:profiles:publish", "tenant", "b"),
                ("compute:profiles:read", "tenant", "b"),
            ],
        )
        .await
        .expect("token");
    let pooled = env
        .token("pooled", &[("compute:profiles:publish", "pool", "a-pool")])
        .await
        .expect("token");
    assert_eq!(list(&env, &reader).await.len(), before.len());
    let (s, e) = env
        .post(PROFILES, Some(&reader), &body("mine", 1, json!({})))
        .await
        .expect("post");
    assert_eq!((s, e["code"].as_str()), (403, Some("FORBIDDEN")), "{e}");
    for token in [&other, &pooled] {
        let (s, e) = env
            .post(PROFILES, Some(token), &body("mine", 1, json!({})))
            .await
            .expect("post");
        assert_eq!((s, e["code"].as_str()), (404, Some("NOT_FOUND")), "{e}");
        let (s, _) = env
            .get(&format!("{PROFILES}/a/cloud/1"), Some(token))
            .await
            .expect("get");
        assert_eq!(s, 404);
    }
    let (s, _) = env
        .get(&format!("{PROFILES}?tenantId=a"), None)
        .await
        .expect("anonymous");
    assert_eq!(s, 401);
    let publisher = env
        .token(
            "a-publisher",
            &[("compute:profiles:publish", "tenant", "a")],
        )
        .await
        .expect("token");
    let (s, b) = env
        .post(PROFILES, Some(&publisher), &body("mine", 1, json!({})))
        .await
        .expect("post");
    assert_eq!(s, 201, "{b}");
    assert_eq!(
        b["publishedBy"], "a-publisher",
        "the acting principal is recorded"
    );

    // A deploy whose user data installs bcd, where no bcd is published, is
    // refused before anything changes.
    let node = env.enroll("a", "a-pool").await.expect("enroll");
    let node: bcm_core::NodeId = node["nodeId"].as_str().expect("id").parse().expect("id");
    let version = env
        .force_state(&node, ProvisionState::Ready, None)
        .await
        .expect("ready");
    let (s, e) = env
        .verb(
            "deploy",
            &node,
            json!({"profileId": "cloud", "profileVersion": 1}),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (422, Some("INVALID_CONFIG")),
        "{e}"
    );
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("no bcd for linux-amd64")),
        "{e}"
    );
    let n = env.node(&node).await.expect("node");
    assert_eq!(
        (n.provision_state, n.version),
        (ProvisionState::Ready, version)
    );
}

#[tokio::test]
async fn a_pools_policy_reads_back_and_refuses_garbage() {
    let env = TestEnv::start_with(Options::api_only()).await.expect("env");
    let admin = env.admin_token.clone();
    let path = "/api/compute/admin/pools/a-pool";
    let (s, b) = env
        .put(
            path,
            Some(&admin),
            &json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "gpu-redfish",
            "deployProfiles": ["p", "ubuntu-24.04"], "releaseWipe": "secure-erase",
            "commissionWipe": "crypto-erase",
            "eraseMethods": {"secureErase": ["ata-security-erase", "overwrite-verified"],
                             "cryptoErase": ["nvme-crypto-format"]},
            "quorum": {"required": 2, "bulkConcurrency": 50}}),
        )
        .await
        .expect("put");
    assert_eq!(s, 204, "{b}");
    let (s, p) = env.get(path, Some(&admin)).await.expect("get");
    assert_eq!(s, 200, "{p}");
    assert_eq!(p["deployProfiles"], json!(["p", "ubuntu-24.04"]));
    assert_eq!(p["releaseWipe"], "secure-erase");
    assert_eq!(p["commissionWipe"], "crypto-erase");
    assert_eq!(p["agentMode"], "bcd");
    assert_eq!(
        p["eraseMethods"],
        json!({"secureErase": ["ata-security-erase", "overwrite-verified"],
               "cryptoErase": ["nvme-crypto-format"]})
    );
    assert_eq!(p["quorum"]["required"], 2);
    assert_eq!(p["quorum"]["bulkConcurrency"], 50);
    let (s, all) = env
        .get("/api/compute/admin/pools?tenantId=b", Some(&admin))
        .await
        .expect("list");
    assert_eq!(s, 200);
    assert_eq!(all.as_array().map(|a| a.len()), Some(1), "{all}");
    assert_eq!(all[0]["id"], "b-pool");
    assert!(all[0]["deployProfiles"].is_null(), "no list: every profile");
    assert_eq!(
        all[0]["eraseMethods"]["cryptoErase"]
            .as_array()
            .and_then(|a| a.last()),
        Some(&json!("overwrite-verified")),
        "no policy: the default, ending in a verified overwrite"
    );

    let base = json!({"tenantId": "a", "siteId": "s1", "hardwareProfile": "gpu-redfish"});
    let with = |extra: Value| {
        let mut b = base.clone();
        if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        b
    };
    for garbage in [
        with(json!({"releaseWipe": "none"})),
        with(json!({"releaseWipe": "shred"})),
        with(json!({"commissionWipe": "none"})),
        with(json!({"commissionWipe": 1})),
        with(json!({"adoptAcceptance": [null, null]})),
        with(json!({"adoptAcceptance": {"minCpus": 0}})),
        with(json!({"adoptAcceptance": {"minCpus": "4"}})),
        with(json!({"deployProfiles": ["Bad Id"]})),
        with(json!({"deployProfiles": ["p", "p"]})),
        with(json!({"deployProfiles": "p"})),
        with(
            json!({"deployProfiles": vec!["p"; 300].iter().enumerate().map(|(i, _)| format!("p{i}")).collect::<Vec<_>>()}),
        ),
        with(json!({"agentMode": "ssh"})),
        with(json!({"eraseMethods": {"secureErase": [], "cryptoErase": ["nvme-crypto-format"]}})),
        with(
            json!({"eraseMethods": {"secureErase": ["quick"], "cryptoErase": ["nvme-crypto-format"]}}),
        ),
        with(
            json!({"eraseMethods": {"secureErase": ["shred"], "cryptoErase": ["nvme-crypto-format"]}}),
        ),
        with(
            json!({"eraseMethods": {"secureErase": ["nvme-format", "nvme-format"], "cryptoErase": ["nvme-crypto-format"]}}),
        ),
        with(json!({"eraseMethods": {"secureErase": ["nvme-format"]}})),
        with(json!({"eraseMethods": ["nvme-format"]})),
    ] {
        let (s, e) = env.put(path, Some(&admin), &garbage).await.expect("put");
        assert_eq!(
            (s, e["code"].as_str()),
            (400, Some("INVALID_ARGUMENT")),
            "{garbage}: {e}"
        );
    }
    let (_, after) = env.get(path, Some(&admin)).await.expect("get");
    assert_eq!(after, p, "garbage changed nothing");
    let reader = env
        .token("reader", &[("compute:nodes:read", "tenant", "a")])
        .await
        .expect("token");
    let (s, _) = env.get(path, Some(&reader)).await.expect("get");
    assert_eq!(s, 403, "pools are the administrator's");
    let (s, e) = env
        .get("/api/compute/admin/pools/nowhere", Some(&admin))
        .await
        .expect("get");
    assert_eq!((s, e["code"].as_str()), (404, Some("NOT_FOUND")));
}

#[tokio::test]
async fn a_nocloud_deploy_carries_the_published_bcd_and_the_pool_decides_what_it_accepts() {
    let dir = std::env::temp_dir().join(format!("bcm-downloads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("bcd");
    let bytes: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
    std::fs::write(&file, &bytes).expect("write");
    let sha = hex::encode(Sha256::digest(&bytes));
    let mut opts = Options::with_site();
    opts.downloads = serde_json::from_value(json!({
        "bcd": [{"version": "0.3.0-test", "arch": "amd64", "file": file}]
    }))
    .expect("downloads");
    let env = TestEnv::start_with(opts).await.expect("env");
    let admin = env.admin_token.clone();

    // The download: its bytes, its digest in the headers and beside it.
    let path = "/api/compute/downloads/bcd/0.3.0-test/linux-amd64";
    let res = env
        .http
        .get(format!("{}{path}", env.base))
        .send()
        .await
        .expect("get");
    assert_eq!(res.status().as_u16(), 200);
    let header = res.headers()["x-checksum-sha256"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let served = res.bytes().await.expect("body");
    assert_eq!(hex::encode(Sha256::digest(&served)), sha);
    assert_eq!(header, sha);
    let text = env
        .http
        .get(format!("{}{path}.sha256", env.base))
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    assert_eq!(text, format!("{sha}  bcd\n"));
    let (s, listed) = env.get("/api/compute/downloads", None).await.expect("list");
    assert_eq!(s, 200);
    assert_eq!(listed[0]["sha256"], sha.as_str(), "{listed}");
    assert_eq!(listed[0]["path"], path);
    for missing in [
        "/api/compute/downloads/bcd/0.9.9/linux-amd64",
        "/api/compute/downloads/bcd/0.3.0-test/linux-riscv64",
        "/api/compute/downloads/bcd/0.3.0-test/..%2F..%2Fetc%2Fpasswd",
    ] {
        let (s, e) = env.get(missing, None).await.expect("get");
        assert_eq!(
            (s, e["code"].as_str()),
            (404, Some("NOT_FOUND")),
            "{missing}: {e}"
        );
    }

    let (s, b) = env
        .post(
            PROFILES,
            Some(&admin),
            &body("cloud", 1, json!({"userDataTemplate": "nocloud"})),
        )
        .await
        .expect("publish");
    assert_eq!(s, 201, "{b}");
    let (s, b) = env
        .put("/api/compute/admin/pools/a-pool", Some(&admin), &json!({"tenantId": "a", "siteId": "s1",
            "hardwareProfile": "gpu-redfish", "acceptUnsupportedDiag": true, "deployProfiles": ["p"],
            "releaseWipe": "secure-erase"}))
        .await
        .expect("pool");
    assert_eq!(s, 204, "{b}");
    let node = env.enroll_sim("cloud-1").await;
    env.wait_state(&node, ProvisionState::Ready, Duration::from_secs(60))
        .await
        .expect("ready");
    let version = env.node(&node).await.expect("node").version;

    // A profile the pool does not accept, and an unknown version.
    let (s, e) = env
        .verb(
            "deploy",
            &node,
            json!({"profileId": "cloud", "profileVersion": 1}),
        )
        .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (422, Some("INVALID_CONFIG")),
        "{e}"
    );
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("does not accept deploy profile cloud")),
        "{e}"
    );
    let (s, e) = env
        .verb(
            "deploy",
            &node,
            json!({"profileId": "cloud", "profileVersion": 9}),
        )
        .await;
    assert_eq!((s, e["code"].as_str()), (404, Some("NOT_FOUND")), "{e}");
    let n = env.node(&node).await.expect("node");
    assert_eq!(
        (n.provision_state, n.version),
        (ProvisionState::Ready, version),
        "nothing changed"
    );

    let (s, b) = env
        .put("/api/compute/admin/pools/a-pool", Some(&admin), &json!({"tenantId": "a", "siteId": "s1",
            "hardwareProfile": "gpu-redfish", "acceptUnsupportedDiag": true, "deployProfiles": ["p", "cloud"],
            "releaseWipe": "secure-erase"}))
        .await
        .expect("pool");
    assert_eq!(s, 204, "{b}");
    env.verb_ok(
        "deploy",
        &node,
        json!({"profileId": "cloud", "profileVersion": 1}),
    )
    .await;
    env.wait_state(&node, ProvisionState::Deployed, Duration::from_secs(60))
        .await
        .expect("deployed");
    let commands = bcm_db::commands::commands_of_node(&env.db, &node.to_string())
        .await
        .expect("commands");
    let deploy = commands
        .iter()
        .find(|c| c.kind == "deploy.image")
        .expect("a deploy.image command");
    let user_data = deploy.params["userData"].as_str().expect("user data");
    assert!(
        user_data.contains(&format!("\"{}{path}\"", env.base)),
        "bcdUrl is the API's download: {user_data}"
    );
    assert!(
        user_data.contains(&format!(
            "echo \"{sha}  /usr/local/bin/.bcd.download\" | sha256sum -c -"
        )),
        "bcdSha256 is the served file's: {user_data}"
    );

    // A release without a wipe is refused; without a mode it takes the
    // pool's.
    let version = env.node(&node).await.expect("node").version;
    let (s, e) = env.verb("undeploy", &node, json!({"wipe": "none"})).await;
    assert_eq!(
        (s, e["code"].as_str()),
        (400, Some("INVALID_ARGUMENT")),
        "{e}"
    );
    let n = env.node(&node).await.expect("node");
    assert_eq!(
        (n.provision_state, n.version),
        (ProvisionState::Deployed, version)
    );
    env.verb_ok("undeploy", &node, json!({})).await;
    assert_eq!(
        env.node(&node).await.expect("node").release_wipe,
        Some(WipeMode::SecureErase)
    );
    env.wait_state(&node, ProvisionState::Ready, Duration::from_secs(60))
        .await
        .expect("released");
    let _ = std::fs::remove_dir_all(&dir);
}
