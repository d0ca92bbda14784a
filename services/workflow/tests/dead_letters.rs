//! The results consumer (`engine-results`) against what breaks the
//! contracts: bytes that are not a result, a result for no command, a
//! result of another kind than its command's, an output that is not its
//! kind's. Each is dead-lettered with its reason, and no command, step or
//! node changes.

use bcm_contracts::{CloudEvent, CommandKind};
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn result_event(command_id: &str, kind: &str, output: serde_json::Value) -> Vec<u8> {
    let ev = CloudEvent::new(
        format!("result-{command_id}"),
        bcm_contracts::events::types::COMMAND_RESULT.to_owned(),
        None,
        None,
        json!({ "commandId": command_id, "kind": kind, "ok": true, "retryable": false, "output": output }),
    );
    serde_json::to_vec(&ev).expect("json")
}

#[tokio::test]
async fn results_that_break_the_contract_are_dead_lettered_and_change_nothing() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.enroll_sim("dl-results").await;
    env.wait_state(&id, bcm_core::ProvisionState::Ready, T)
        .await
        .expect("ready");
    let before = env.node(&id).await.expect("node");
    let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let verify = commands
        .iter()
        .find(|c| c.kind == CommandKind::BmcVerify.as_str())
        .expect("the enroll's bmc.verify");
    let site: bcm_core::SiteId = "s1".parse().expect("site");
    let subject = |cmd: &str| env.subjects().result(&site, cmd);

    env.publish_raw(&subject("cmd_garbage"), b"\xff\xfe not json")
        .await
        .expect("publish");
    env.publish_raw(
        &subject("cmd_01jd0000000000000000000000"),
        &result_event(
            "cmd_01jd0000000000000000000000",
            "bmc.powerStatus",
            json!({"power": "on"}),
        ),
    )
    .await
    .expect("publish");
    // The enroll's verify answered again, as a power read.
    env.publish_raw(
        &subject(&verify.id),
        &result_event(&verify.id, "bmc.powerStatus", json!({"power": "on"})),
    )
    .await
    .expect("publish");
    // A power read whose power is spelled the way the old document said.
    env.publish_raw(
        &subject(&verify.id),
        &result_event(&verify.id, "bmc.powerStatus", json!({"power": "On"})),
    )
    .await
    .expect("publish");
    // An unknown kind.
    env.publish_raw(
        &subject(&verify.id),
        &result_event(&verify.id, "bmc.reboot", json!({})),
    )
    .await
    .expect("publish");

    let dead = env
        .dead_letters("engine-results", 5, T)
        .await
        .expect("dead letters");
    let reasons: Vec<&str> = dead.iter().map(|d| d.reason.as_str()).collect();
    assert!(
        reasons
            .iter()
            .filter(|r| r.starts_with("undecodable"))
            .count()
            >= 3,
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("no command cmd_01jd0000000000000000000000 exists")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("which is a bmc.verify")),
        "{reasons:?}"
    );
    assert!(
        dead.iter().all(|d| d.subject.contains(".result.s1.")),
        "the original subjects: {dead:?}"
    );

    let after = env.node(&id).await.expect("node");
    assert_eq!(after.version, before.version, "the node did not change");
    let verify_now = bcm_db::commands::command_fetch(&env.db, &verify.id)
        .await
        .expect("row");
    assert_eq!(
        verify_now.result, verify.result,
        "the answered command kept its result"
    );
    env.stop();
}

/// Waits until the results consumer has handled everything in its stream:
/// delivered up to the stream's last message, nothing pending, nothing
/// awaiting an ack.
async fn results_drained(env: &TestEnv) {
    let bus = env.state.inner.bus.clone();
    bcm_testkit::eventually(T, || {
        let bus = bus.clone();
        async move {
            let name = bus
                .subjects()
                .stream(bcm_bus::subjects::StreamKind::Results);
            let mut stream = bus
                .jetstream()
                .get_stream(&name)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let last = stream
                .info()
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .state
                .last_sequence;
            let mut consumer: async_nats::jetstream::consumer::PullConsumer = stream
                .get_consumer("engine-results")
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let info = consumer.info().await.map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok((info.delivered.stream_sequence >= last
                && info.num_pending == 0
                && info.num_ack_pending == 0)
                .then_some(()))
        }
    })
    .await
    .expect("the results consumer handled its stream");
}

/// The power a result reports is recorded (in a transaction of its own,
/// before the result's) only while its command waits for it: a late copy of
/// an answered power command's result, saying otherwise, is acknowledged
/// as a repeat and leaves the node's power, version and events alone.
#[tokio::test]
async fn a_late_power_report_of_an_answered_command_changes_nothing() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.enroll_sim("late-power").await;
    env.wait_state(&id, bcm_core::ProvisionState::Ready, T)
        .await
        .expect("ready");
    let before = env.node(&id).await.expect("node");
    assert_eq!(before.power, bcm_core::PowerState::Off, "ready is off");
    let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let answered = commands
        .iter()
        .rfind(|c| c.kind == CommandKind::BmcPower.as_str() && c.result.is_some())
        .expect("the commissioning's answered bmc.power");
    let site: bcm_core::SiteId = "s1".parse().expect("site");
    env.publish_raw(
        &env.subjects().result(&site, &answered.id),
        &result_event(
            &answered.id,
            "bmc.power",
            json!({"action": "on", "power": "on"}),
        ),
    )
    .await
    .expect("publish");
    results_drained(&env).await;

    let after = env.node(&id).await.expect("node");
    assert_eq!(after.power, bcm_core::PowerState::Off, "the power stands");
    assert_eq!(after.version, before.version, "the node did not change");
    let dead = bcm_bus::consumer::dead_letters(&env.state.inner.bus, "engine-results")
        .await
        .expect("dead letters");
    assert!(dead.is_empty(), "a repeat is no breach: {dead:?}");
    let now = bcm_db::commands::command_fetch(&env.db, &answered.id)
        .await
        .expect("row");
    assert_eq!(now.result, answered.result, "the command kept its result");
    env.stop();
}
