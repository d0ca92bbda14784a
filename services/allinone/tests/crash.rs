//! SIGKILL the workflow engine and the reconciler (a separate `bcm
//! --services workflow,reconciler` process) in the middle of a 50-node
//! lifecycle, twice, and restart them: every node reaches its target, every
//! step of every workflow ran, and no step recorded more commands than it
//! made attempts (a restarted engine never re-sends).

use bcm_core::{NodeId, ProvisionState};
use bcm_testkit::{Options, TestEnv};
use serde_json::json;
use std::process::Child;

mod common;
use common::{all_reach, child_config, count_in, spawn_child, T};
use std::time::Duration;

const NODES: usize = 50;

/// Waits until at least `min` nodes are in `state`, then kills the child.
/// A child that dies on its own fails the test with the end of its log.
async fn kill_midway(
    env: &TestEnv,
    ids: &[NodeId],
    state: ProvisionState,
    min: usize,
    child: &mut Child,
    log: &std::path::Path,
) -> usize {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: String = text
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            panic!("the child exited by itself ({status}):\n{tail}");
        }
        let n = count_in(env, ids, state).await;
        if n >= min {
            child.kill().expect("SIGKILL"); // std's kill is SIGKILL on Unix
            let _ = child.wait();
            return n;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress before the kill: {n}/{} in {state}",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_engine_and_reconciler_resume_without_resending_or_skipping() {
    let opts = Options {
        reconcilers: 0,
        engine: false,
        ..Options::with_site()
    };
    let env = TestEnv::start_with(opts).await.expect("env");
    let dir = std::env::temp_dir().join(format!("bcm-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = child_config(&env, &dir);
    let mut child = spawn_child(&config, "workflow,reconciler", &dir.join("child-1.log"));

    let ids = env.enroll_sims("crash", NODES).await;
    let before = kill_midway(
        &env,
        &ids,
        ProvisionState::Ready,
        5,
        &mut child,
        &dir.join("child-1.log"),
    )
    .await;
    eprintln!("killed the engine and reconciler with {before}/{NODES} nodes ready");
    let mut child = spawn_child(&config, "workflow,reconciler", &dir.join("child-2.log"));
    all_reach(&env, &ids, ProvisionState::Ready).await;

    for id in &ids {
        env.verb_ok("deploy", id, json!({"profileId": "p", "profileVersion": 1}))
            .await;
    }
    let before = kill_midway(
        &env,
        &ids,
        ProvisionState::Deployed,
        5,
        &mut child,
        &dir.join("child-2.log"),
    )
    .await;
    eprintln!("killed them again with {before}/{NODES} nodes deployed");
    let mut child = spawn_child(&config, "workflow,reconciler", &dir.join("child-3.log"));
    all_reach(&env, &ids, ProvisionState::Deployed).await;
    for id in &ids {
        let (s, b) = env
            .post(
                "/api/compute/metal/undeploy",
                Some(&env.admin_token),
                &json!({"tenantId": "a", "nodeId": id.to_string()}),
            )
            .await
            .expect("undeploy");
        assert_eq!(s, 200, "{b}");
    }
    all_reach(&env, &ids, ProvisionState::Ready).await;
    let _ = child.kill();
    let _ = child.wait();

    for id in &ids {
        let wfs = bcm_db::workflows::workflows_of_node(&env.db, &id.to_string())
            .await
            .expect("workflows");
        assert_eq!(
            wfs.len(),
            5,
            "enroll, inspect, commission, deploy, release: one each"
        );
        for wf in wfs {
            assert_eq!(
                wf.status,
                bcm_core::workflow::WorkflowPhase::Succeeded,
                "{}",
                wf.profile_id
            );
            let steps = bcm_db::workflows::steps_fetch(&env.db, &wf.id)
                .await
                .expect("steps");
            for s in steps.iter().filter(|s| !s.cleanup) {
                assert_eq!(
                    s.status,
                    bcm_core::workflow::StepStatus::Succeeded,
                    "{} / {}: no step skipped",
                    wf.profile_id,
                    s.name
                );
            }
            for (idx, attempt, commands) in
                bcm_db::workflows::command_counts_by_step(&env.db, &wf.id)
                    .await
                    .expect("counts")
            {
                assert!(
                    commands <= i64::from(attempt.max(1)),
                    "{} step {idx}: {commands} commands for {attempt} attempts",
                    wf.profile_id
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
