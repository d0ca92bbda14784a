//! The boot service's `site.*` consumer (`boot-<site>`) against commands
//! that break the contract or are not its own: dead-lettered with their
//! reason, and no boot entry appears.

mod support;

use bcm_contracts::commands::{BootEntrySetParams, BootEntrySpec, Command};
use bcm_contracts::{CloudEvent, CommandEnvelope};
use bcm_testkit::TestEnv;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

fn entry(site: &str, mac: &str) -> Vec<u8> {
    let cmd = CommandEnvelope {
        command_id: bcm_core::CommandId::generate().to_string(),
        site_id: site.parse().expect("site"),
        node_id: None,
        command: Command::BootEntrySet(BootEntrySetParams {
            boot_entry: BootEntrySpec {
                macs: vec![mac.into()],
                kernel: "ramdisk/vmlinuz".into(),
                initrd: "ramdisk/initrd.img".into(),
                cmdline: "bcm.join=tok".into(),
                expires_in_secs: 600,
            },
        }),
        issued_at: chrono::Utc::now(),
        deadline: None,
        authority: None,
    };
    let ty = bcm_contracts::events::types::command(cmd.kind());
    serde_json::to_vec(&CloudEvent::new("c".into(), ty, None, None, cmd)).expect("json")
}

#[tokio::test]
async fn site_commands_that_break_the_contract_are_dead_lettered_and_make_no_entry() {
    let env = TestEnv::start().await.expect("env");
    let (_dir, boot) = support::started(&env, "deadletters", 9).await;
    let site: bcm_core::SiteId = "s1".parse().expect("site");
    let on = |kind: &str| env.subjects().command(&site, kind);
    let mac = "52:54:00:dd:00:01";

    env.publish_raw(&on("site.bootEntry.set"), b"<xml/>")
        .await
        .expect("publish");
    let mut extra: serde_json::Value = serde_json::from_slice(&entry("s1", mac)).expect("json");
    extra["data"]["params"]["bootEntry"]["ttl"] = serde_json::json!(5);
    env.publish_raw(
        &on("site.bootEntry.set"),
        &serde_json::to_vec(&extra).expect("json"),
    )
    .await
    .expect("publish");
    env.publish_raw(&on("site.bootEntry.set"), &entry("s2", mac))
        .await
        .expect("publish");
    env.publish_raw(&on("site.bootEntry.clear"), &entry("s1", mac))
        .await
        .expect("publish");

    let dead = env
        .dead_letters("boot-s1", 4, T)
        .await
        .expect("dead letters");
    let reasons: Vec<&str> = dead.iter().map(|d| d.reason.as_str()).collect();
    assert_eq!(
        reasons
            .iter()
            .filter(|r| r.starts_with("undecodable"))
            .count(),
        2,
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("unknown field `ttl`")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("for site s2")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("site.bootEntry.set command for site s1 arrived on")),
        "{reasons:?}"
    );
    let m = bcm_boot::entries::Mac::parse(mac).expect("mac");
    assert!(boot.running.entries.live(&m).is_none(), "no entry was made");
    env.stop();
}
