//! Site commands carry a deadline (issue 18, finding 8): one that reaches
//! the site after the control plane stopped waiting for it is refused
//! unrun — a power cycle stuck in a queue must not act behind the engine's
//! back — while the same command within its deadline runs.

use bcm_contracts::commands::{BmcTarget, PowerParams};
use bcm_contracts::{CloudEvent, Command, CommandEnvelope, CommandResult};
use bcm_core::{PowerAction, ProvisionState};
use bcm_testkit::{Options, TestEnv};
use futures::StreamExt;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

async fn send(
    env: &TestEnv,
    node: bcm_core::NodeId,
    deadline: chrono::DateTime<chrono::Utc>,
) -> (String, CommandResult) {
    let site: bcm_core::SiteId = "s1".parse().expect("site");
    let cmd = CommandEnvelope {
        command_id: format!("cmd_{}", ulid::Ulid::new().to_string().to_lowercase()),
        site_id: site.clone(),
        node_id: Some(node),
        command: Command::BmcPower(PowerParams {
            bmc: BmcTarget {
                driver: bcm_core::BmcDriver::Sim,
                address: "sim://late".to_owned(),
                tls: None,
                sealed_credentials: None,
            },
            action: PowerAction::Cycle,
        }),
        issued_at: chrono::Utc::now() - chrono::Duration::minutes(30),
        deadline: Some(deadline),
        authority: Some(env.power_authority(&node, PowerAction::Cycle)),
    };
    let tenant = bcm_testkit::tenant_a();
    let msg = bcm_bus::outgoing::command(
        env.subjects(),
        bcm_bus::outgoing::About {
            node: &node,
            tenant: &tenant,
            version: 0,
            batch: None,
        },
        &cmd,
    );
    let mut results = env
        .state
        .inner
        .bus
        .client()
        .subscribe(env.subjects().result(&site, &cmd.command_id))
        .await
        .expect("subscribe");
    env.publish_raw(
        &msg.subject,
        &serde_json::to_vec(&msg.payload).expect("payload"),
    )
    .await
    .expect("publish");
    let m = tokio::time::timeout(T, results.next())
        .await
        .expect("answered")
        .expect("a result");
    let ev: CloudEvent<CommandResult> = serde_json::from_slice(&m.payload).expect("result");
    (cmd.command_id, ev.data)
}

#[tokio::test]
async fn a_command_past_its_deadline_is_refused_unrun() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.enroll_sim("late").await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");

    let (late, answer) = send(&env, id, chrono::Utc::now() - chrono::Duration::minutes(1)).await;
    assert!(!answer.ok && !answer.retryable, "{answer:?}");
    assert!(
        answer
            .error
            .as_deref()
            .is_some_and(|e| e.contains("expired")),
        "{answer:?}"
    );
    assert_eq!(
        env.executions.count(&late),
        0,
        "the late command did not run"
    );

    let (timely, answer) = send(&env, id, chrono::Utc::now() + chrono::Duration::minutes(5)).await;
    assert!(answer.ok, "{answer:?}");
    assert_eq!(env.executions.count(&timely), 1, "the timely command ran");
    env.stop();
}
