//! The simulated site restarted mid-lifecycle, as an operator restarts any
//! process: its machines keep their power, boot devices, disks and running
//! agents (kept in its own JetStream buckets), so every node in flight
//! carries on; a command it already ran and gets again is answered from its
//! record, never run twice.

use bcm_contracts::commands::{BmcTarget, Command, PowerParams};
use bcm_contracts::CommandEnvelope;
use bcm_core::{PowerAction, ProvisionState};
use bcm_testkit::{eventually, Options, TestEnv};
use futures::StreamExt as _;
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

/// Nodes whose workflows are running when the site process is restarted
/// (twice) all reach `ready`, then deploy; nothing is run twice.
#[tokio::test]
async fn a_site_restart_mid_workflow_strands_no_node() {
    let mut sim = bcm_sim::SimConfig::new("s1");
    sim.latency_ms = 150;
    let env = TestEnv::start_with(Options {
        site: Some(sim.clone()),
        ..Options::with_site()
    })
    .await
    .expect("env");
    let ids = env.enroll_sims("r", 4).await;
    // Restart while ramdisk agents run: once the first node has joined.
    eventually(T, || async {
        for id in &ids {
            if !bcm_db::agents::certs_of_node(&env.db, &id.to_string())
                .await?
                .is_empty()
            {
                return Ok(Some(()));
            }
        }
        Ok(None)
    })
    .await
    .expect("a ramdisk joined");
    env.spawn_site(sim.clone()).await.expect("restart");
    env.spawn_site(sim.clone()).await.expect("restart again");
    for id in &ids {
        let n = env
            .wait_state(id, ProvisionState::Ready, T)
            .await
            .unwrap_or_else(|e| panic!("{id} ready after the site restarts: {e}"));
        assert!(n.last_error.is_none(), "{id}: {:?}", n.last_error);
    }
    // The deploy of one of them, restarted under its ramdisk again.
    env.verb_ok(
        "deploy",
        &ids[0],
        json!({"profileId": "ubuntu-24.04", "profileVersion": 1}),
    )
    .await;
    env.wait_state(&ids[0], ProvisionState::Deploying, T)
        .await
        .expect("deploying");
    env.spawn_site(sim).await.expect("restart during deploy");
    env.wait_state(&ids[0], ProvisionState::Deployed, T)
        .await
        .expect("deployed after the restart");
    assert_eq!(env.executions.repeated(), Vec::<String>::new());
    env.stop();
}

/// A power command the site already ran, delivered again after the site
/// restarted (it died before its ack), is answered from the record: the
/// machine is not power-cycled twice.
#[tokio::test]
async fn a_redelivered_destructive_command_runs_once_across_a_site_restart() {
    let sim = bcm_sim::SimConfig::new("s1");
    let env = TestEnv::start_with(Options {
        site: Some(sim.clone()),
        ..Options::with_site()
    })
    .await
    .expect("env");
    let id = env.enroll_sim("once").await;
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready");
    let site: bcm_core::SiteId = "s1".parse().expect("site");
    let cmd = CommandEnvelope {
        command_id: format!("cmd_{}", ulid::Ulid::new().to_string().to_lowercase()),
        site_id: site.clone(),
        node_id: Some(id),
        command: Command::BmcPower(PowerParams {
            bmc: BmcTarget {
                driver: bcm_core::BmcDriver::Sim,
                address: "sim://once".to_owned(),
                tls: None,
                sealed_credentials: None,
            },
            action: PowerAction::Cycle,
        }),
        issued_at: chrono::Utc::now(),
        deadline: None,
        authority: Some(env.power_authority(&id, PowerAction::Cycle)),
    };
    let tenant = bcm_testkit::tenant_a();
    let msg = bcm_bus::outgoing::command(
        env.subjects(),
        bcm_bus::outgoing::About {
            node: &id,
            tenant: &tenant,
            version: 0,
            batch: None,
        },
        &cmd,
    );
    let payload = serde_json::to_vec(&msg.payload).expect("payload");
    let mut results = env
        .state
        .inner
        .bus
        .client()
        .subscribe(env.subjects().result(&site, &cmd.command_id))
        .await
        .expect("subscribe");
    env.publish_raw(&msg.subject, &payload)
        .await
        .expect("publish");
    tokio::time::timeout(T, results.next())
        .await
        .expect("answered")
        .expect("a result");
    assert_eq!(env.executions.count(&cmd.command_id), 1, "ran once");

    env.spawn_site(sim).await.expect("restart");
    env.publish_raw(&msg.subject, &payload)
        .await
        .expect("publish again");
    // The redelivery is answered (the result is published again) ...
    let again = tokio::time::timeout(T, results.next())
        .await
        .expect("answered again")
        .expect("a result");
    let again: bcm_contracts::CloudEvent<bcm_contracts::CommandResult> =
        serde_json::from_slice(&again.payload).expect("a result");
    assert!(again.data.ok, "the recorded result: {:?}", again.data);
    // ... and was not run again.
    assert_eq!(env.executions.count(&cmd.command_id), 1);
    env.stop();
}
