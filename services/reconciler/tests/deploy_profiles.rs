//! Tenant deploy profiles: a deploy names a version from the tenant's
//! catalog, the node keeps a snapshot of it, the ramdisk gets the image
//! reference and the user data rendered for that node, and the finished
//! deploy takes the profile's role.

use bcm_core::ProvisionState;
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_deploy_installs_its_profile_and_takes_its_role() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.enroll_sim("m1").await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");

    // Unknown id, unknown version, another tenant's profile: well-formed
    // requests for something that is not there, so NOT_FOUND, and nothing
    // changes.
    let before = env.node(&id).await.expect("node");
    for (profile, version) in [("nope", 1), ("ubuntu-24.04", 7), ("b-only", 1)] {
        let (s, b) = env
            .verb(
                "deploy",
                &id,
                json!({"profileId": profile, "profileVersion": version}),
            )
            .await;
        assert_eq!(s, 404, "{b}");
        assert_eq!(b["code"], "NOT_FOUND", "{b}");
        assert!(
            b["message"].as_str().unwrap_or("").contains(profile),
            "the error names the profile: {b}"
        );
    }
    assert_eq!(env.node(&id).await.expect("node"), before, "unchanged");

    env.verb_ok(
        "deploy",
        &id,
        json!({"profileId": "dedicated-ubuntu", "profileVersion": 1}),
    )
    .await;
    let deployed = env
        .wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("deployed");
    assert_eq!(
        deployed.role.as_deref(),
        Some("dedicated"),
        "the profile's role"
    );

    let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let deploy = commands
        .iter()
        .find(|c| c.kind == "deploy.image")
        .expect("a deploy.image command");
    assert_eq!(deploy.params["profileId"], "dedicated-ubuntu");
    assert_eq!(deploy.params["image"]["sha256"], "5d".repeat(32));
    let user_data = deploy.params["userData"].as_str().expect("rendered text");
    assert!(user_data.starts_with("#cloud-config\n"), "{user_data}");
    assert!(
        user_data.contains(&format!("BCD_NODE={id}\n")),
        "{user_data}"
    );
    // The token is a reference here: only the API's answer to the agent
    // carries the token it stands for.
    assert!(user_data.contains("BCD_JOIN_TOKEN=bcmjref_"), "{user_data}");
    assert!(!user_data.contains("bcmj_"), "no token: {user_data}");
    assert!(!user_data.contains("{{"), "every placeholder rendered");

    // Released (a dedicated node's release is never quick) and deployed
    // again with a host profile: the role follows.
    env.verb_ok("undeploy", &id, json!({"wipe": "secure-erase"}))
        .await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");
    env.verb_ok(
        "deploy",
        &id,
        json!({"profileId": "ubuntu-24.04", "profileVersion": 1}),
    )
    .await;
    let again = env
        .wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("deployed");
    assert_eq!(again.role.as_deref(), Some("host"));
}

/// A profile that names a catalog image hands the ramdisk the image's path
/// in the site's cache beside its manifest, so the ramdisk fetches it from
/// its boot server first; an inline image has none.
#[tokio::test]
async fn a_catalog_images_deploy_names_its_place_in_the_sites_cache() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let admin = env.admin_token.clone();
    let (s, b) = env
        .post(
            "/api/compute/images",
            Some(&admin),
            &json!({"tenantId": "a", "name": "noble", "url": "http://images.invalid/noble.raw",
                    "format": "raw", "sha256": "5d".repeat(32), "sizeBytes": 1u64 << 30}),
        )
        .await
        .expect("image");
    assert_eq!(s, 201, "{b}");
    let (s, b) = env
        .post(
            "/api/compute/deployProfiles",
            Some(&admin),
            &json!({"tenantId": "a", "id": "noble-host", "version": 1, "catalogImage": "noble"}),
        )
        .await
        .expect("profile");
    assert_eq!(s, 201, "{b}");
    let id = env.enroll_sim("cat").await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");
    env.verb_ok(
        "deploy",
        &id,
        json!({"profileId": "noble-host", "profileVersion": 1}),
    )
    .await;
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("deployed");
    let deploy_params = |cmds: Vec<bcm_db::commands::CommandRow>| {
        cmds.into_iter()
            .rev()
            .find(|c| c.kind == "deploy.image")
            .map(|c| c.params)
            .expect("a deploy.image command")
    };
    let p = deploy_params(
        bcm_db::commands::commands_of_node(&env.db, &id.to_string())
            .await
            .expect("commands"),
    );
    assert_eq!(p["cachePath"], "catalog/a/noble", "{p}");
    assert_eq!(p["image"]["url"], "http://images.invalid/noble.raw");

    env.verb_ok("undeploy", &id, json!({"wipe": "quick"})).await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");
    env.verb_ok(
        "deploy",
        &id,
        json!({"profileId": "ubuntu-24.04", "profileVersion": 1}),
    )
    .await;
    env.wait_state(&id, ProvisionState::Deployed, T)
        .await
        .expect("deployed");
    let p = deploy_params(
        bcm_db::commands::commands_of_node(&env.db, &id.to_string())
            .await
            .expect("commands"),
    );
    assert!(p.get("cachePath").is_none(), "an inline image: {p}");
}
