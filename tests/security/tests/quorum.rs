//! A compromised reconciler or a forged bus message cannot power, boot or
//! wipe a machine: the BMC service and the simulated site (which plays the
//! site's services and machines as the real ones do) refuse a destructive
//! command whose batch authority is missing, whose node set was tampered
//! with, whose proof is missing or wrong, or that too few approvers signed,
//! each verifying against the site's own anchor, never the control plane's
//! word. `bcd`'s own refusals are its unit tests (`agent::tests`).

use bcm_contracts::batch::{ApprovalSignature, BatchAuthority, BatchHeader};
use bcm_contracts::commands::{BmcTarget, Command, PowerParams};
use bcm_contracts::{CloudEvent, CommandEnvelope, CommandResult};
use bcm_core::batch::Operation;
use bcm_core::{BmcDriver, NodeId, PowerAction, WipeMode};
use bcm_testkit::{Options, TestEnv};
use futures::StreamExt as _;
use std::collections::HashMap;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

fn header(nodes: &[NodeId], batch: &str) -> (BatchHeader, bcm_quorum::Built) {
    let ids: Vec<String> = nodes.iter().map(ToString::to_string).collect();
    let built = bcm_quorum::build(&ids, Operation::Undeploy, Some(WipeMode::Quick)).expect("nodes");
    (
        BatchHeader {
            batch_id: batch.to_owned(),
            tenant_id: "a".into(),
            pool_id: "a-pool".into(),
            operation: Operation::Undeploy,
            wipe: Some(WipeMode::Quick),
            reason_sha256: bcm_quorum::reason_sha256("rack 7"),
            expires_at: chrono::Utc::now().timestamp() + 3600,
            root: built.root.clone(),
            leaf_count: ids.len() as u32,
        },
        built,
    )
}

fn signed(env: &TestEnv, h: &BatchHeader, who: &[usize]) -> Vec<ApprovalSignature> {
    who.iter()
        .map(|n| ApprovalSignature {
            approver_id: format!("approver-{n}"),
            signature: bcm_quorum::sign(&env.quorum.approvers[n - 1], h),
        })
        .collect()
}

/// Every forgery (name, the node the command is for, its authority), and
/// last a genuine authority the edge must accept.
fn forgeries(env: &TestEnv) -> Vec<(&'static str, NodeId, Option<BatchAuthority>)> {
    let (n1, n2, target) = (NodeId::generate(), NodeId::generate(), NodeId::generate());
    let (h, built) = header(&[n1, n2], "bat_01jd0000000000000000000001");
    let approvals = signed(env, &h, &[1, 2]);
    let authority = |h: &BatchHeader, i: usize, proof: Vec<String>, a: Vec<ApprovalSignature>| {
        Some(BatchAuthority {
            header: h.clone(),
            leaf_index: i as u32,
            proof,
            approvals: a,
        })
    };
    // The approved set with the target added: a new root nobody signed.
    let (tampered, tampered_built) = header(&[n1, n2, target], "bat_01jd0000000000000000000001");
    vec![
        ("no authority at all", target, None),
        (
            "a node set with the target added",
            target,
            authority(
                &tampered,
                2,
                tampered_built.proofs[2].clone(),
                approvals.clone(),
            ),
        ),
        (
            "the target under another node's proof",
            target,
            authority(&h, 0, built.proofs[0].clone(), approvals.clone()),
        ),
        (
            "a missing proof",
            n2,
            authority(&h, 1, vec![], approvals.clone()),
        ),
        (
            "one approver of the two the site needs",
            n1,
            authority(&h, 0, built.proofs[0].clone(), signed(env, &h, &[1])),
        ),
        (
            "the policy key on a batch of two",
            n1,
            authority(
                &h,
                0,
                built.proofs[0].clone(),
                vec![ApprovalSignature {
                    approver_id: "policy".into(),
                    signature: bcm_quorum::sign(&env.quorum.policy, &h),
                }],
            ),
        ),
        (
            "genuine",
            n1,
            authority(&h, 0, built.proofs[0].clone(), approvals),
        ),
    ]
}

/// Publishes a `bmc.power` for each forgery to site `s1` and returns each
/// one's result, by name.
async fn power_each(
    env: &TestEnv,
    address: &str,
    cases: &[(&'static str, NodeId, Option<BatchAuthority>)],
) -> HashMap<&'static str, (String, CommandResult)> {
    let bus = &env.state.inner.bus;
    let site: bcm_core::SiteId = "s1".parse().expect("site");
    let mut results = bus
        .client()
        .subscribe(bus.subjects().result(&site, "*"))
        .await
        .expect("subscribe");
    let mut ids = HashMap::new();
    for (name, node, authority) in cases {
        let cmd = CommandEnvelope {
            command_id: bcm_core::CommandId::generate().to_string(),
            site_id: site.clone(),
            node_id: Some(*node),
            command: Command::BmcPower(PowerParams {
                bmc: BmcTarget {
                    driver: if address.starts_with("sim://") {
                        BmcDriver::Sim
                    } else {
                        BmcDriver::Redfish
                    },
                    address: address.to_owned(),
                    tls: None,
                    sealed_credentials: None,
                },
                action: PowerAction::Off,
            }),
            issued_at: chrono::Utc::now(),
            deadline: None,
            authority: authority.clone(),
        };
        ids.insert(cmd.command_id.clone(), *name);
        let ev = CloudEvent::new(
            cmd.command_id.clone(),
            "cmd.bmc.power".into(),
            Some(node.to_string()),
            None,
            cmd.clone(),
        );
        env.publish_raw(
            &bus.subjects().command(&site, "bmc.power"),
            &serde_json::to_vec(&ev).expect("json"),
        )
        .await
        .expect("publish");
    }
    let mut out = HashMap::new();
    let deadline = tokio::time::Instant::now() + T;
    while out.len() < cases.len() {
        let msg = tokio::time::timeout_at(deadline, results.next())
            .await
            .expect("every command answered in time")
            .expect("subscription");
        let ev: CloudEvent<CommandResult> = serde_json::from_slice(&msg.payload).expect("a result");
        if let Some(name) = ids.get(&ev.data.command_id) {
            out.insert(*name, (ev.data.command_id.clone(), ev.data));
        }
    }
    out
}

fn assert_refused(results: &HashMap<&'static str, (String, CommandResult)>) {
    for (name, (_, r)) in results {
        let error = r.error.clone().unwrap_or_default();
        if *name == "genuine" {
            assert!(
                !error.contains("FORBIDDEN"),
                "genuine authority refused: {error}"
            );
        } else {
            assert!(!r.ok && !r.retryable, "{name}: {r:?}");
            assert!(
                error.starts_with("FORBIDDEN: refused by the destructive-batch quorum"),
                "{name}: {error}"
            );
        }
    }
}

#[tokio::test]
async fn the_bmc_service_refuses_forged_destructive_commands() {
    let env = TestEnv::start().await.expect("env");
    let cfg = bcm_bmc::BmcConfig {
        site: "s1".into(),
        bus: env.bus_config.clone(),
        sealing_keys: env.sealing_keys.clone(),
        concurrency: 4,
        power_timeout_secs: 2,
        graceful_timeout_secs: 2,
        tls_ca_file: None,
        tls_insecure: false,
        ipmitool: "ipmitool".into(),
        plugins: Default::default(),
        telemetry: Default::default(),
        quorum_anchor_file: Some(env.anchor_file()),
    };
    let (bmc, _task) = bcm_bmc::start(&cfg, cfg.drivers().expect("drivers"), env.child_token())
        .await
        .expect("bmc service");
    let cases = forgeries(&env);
    let forged: Vec<_> = cases[..cases.len() - 1].to_vec();
    let results = power_each(&env, "https://127.0.0.1:9", &forged).await;
    assert_refused(&results);
    assert_eq!(
        bmc.executed.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "no forged command reached a BMC"
    );
    // The genuine one gets past the quorum (and then finds no BMC there).
    let results = power_each(&env, "https://127.0.0.1:9", &cases[cases.len() - 1..]).await;
    assert_refused(&results);
    env.stop();
}

#[tokio::test]
async fn a_bmc_service_without_an_anchor_runs_no_destructive_command() {
    let env = TestEnv::start().await.expect("env");
    let cfg = bcm_bmc::BmcConfig {
        site: "s1".into(),
        bus: env.bus_config.clone(),
        sealing_keys: env.sealing_keys.clone(),
        concurrency: 4,
        power_timeout_secs: 2,
        graceful_timeout_secs: 2,
        tls_ca_file: None,
        tls_insecure: false,
        ipmitool: "ipmitool".into(),
        plugins: Default::default(),
        telemetry: Default::default(),
        quorum_anchor_file: None,
    };
    let (_bmc, _task) = bcm_bmc::start(&cfg, cfg.drivers().expect("drivers"), env.child_token())
        .await
        .expect("bmc service");
    let cases = forgeries(&env);
    let results = power_each(&env, "https://127.0.0.1:9", &cases[cases.len() - 1..]).await;
    let (_, r) = &results["genuine"];
    assert!(
        r.error
            .as_deref()
            .unwrap_or_default()
            .contains("holds no quorum trust anchor"),
        "{r:?}"
    );
    env.stop();
}

#[tokio::test]
async fn the_site_refuses_forged_destructive_commands() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let cases = forgeries(&env);
    let results = power_each(&env, "sim://forged", &cases).await;
    assert_refused(&results);
    for (name, (id, _)) in &results {
        let runs = env.executions.count(id);
        assert_eq!(
            runs,
            u32::from(*name == "genuine"),
            "{name} ran {runs} times"
        );
    }
    env.stop();
}
