//! A result injected past the bus's permissions (issue 18, finding 1): the
//! control plane itself accepts a result only from the site the command was
//! addressed to, read from the subject the site's identity may publish on
//! and checked against the command row. Published as another site's, it is
//! dead-lettered and the command keeps waiting; published as its own
//! site's, the same answer is recorded.

use bcm_contracts::{CloudEvent, CommandKind};
use bcm_core::workflow::CommandStatus;
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

fn failed_result(command_id: &str) -> Vec<u8> {
    let ev = CloudEvent::new(
        format!("result-{command_id}"),
        bcm_contracts::events::types::COMMAND_RESULT.to_owned(),
        None,
        None,
        json!({ "commandId": command_id, "kind": "bmc.verify", "ok": false, "retryable": false, "error": "forged" }),
    );
    serde_json::to_vec(&ev).expect("json")
}

#[tokio::test]
async fn a_result_in_another_sites_name_is_refused_by_the_control_plane() {
    // The control plane without any site: the enroll's bmc.verify waits.
    let env = TestEnv::start_with(Options::default()).await.expect("env");
    env.spawn_engine();
    env.spawn_reconciler();
    let id = env.enroll_sim("unanswered").await;
    let deadline = Instant::now() + T;
    let verify = loop {
        let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
            .await
            .expect("commands");
        if let Some(c) = commands
            .into_iter()
            .find(|c| c.kind == CommandKind::BmcVerify.as_str())
        {
            break c;
        }
        assert!(Instant::now() < deadline, "no bmc.verify was issued");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(verify.site_id.as_deref(), Some("s1"));

    let other: bcm_core::SiteId = "s2".parse().expect("site");
    env.publish_raw(
        &env.subjects().result(&other, &verify.id),
        &failed_result(&verify.id),
    )
    .await
    .expect("publish");
    let dead = env
        .dead_letters("engine-results", 1, T)
        .await
        .expect("dead letter");
    assert!(
        dead[0].reason.contains(&format!(
            "site s2 answered command {}, which was addressed to s1",
            verify.id
        )),
        "{dead:?}"
    );
    let row = bcm_db::commands::command_fetch(&env.db, &verify.id)
        .await
        .expect("row");
    assert!(
        matches!(row.status, CommandStatus::Pending | CommandStatus::Sent),
        "the command took another site's answer: {row:?}"
    );

    // The same answer from its own site lands.
    let own: bcm_core::SiteId = "s1".parse().expect("site");
    env.publish_raw(
        &env.subjects().result(&own, &verify.id),
        &failed_result(&verify.id),
    )
    .await
    .expect("publish");
    let deadline = Instant::now() + T;
    loop {
        let row = bcm_db::commands::command_fetch(&env.db, &verify.id)
            .await
            .expect("row");
        if row.status == CommandStatus::Failed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the site's own answer was not recorded: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.stop();
}
