//! Failure paths: a BMC fault, an abort mid-workflow with its cleanup, the
//! recover table, unverified wipes, unrescue while the rescue ramdisk
//! still boots, undeploy from a rescue that still boots (the verb cancels
//! the rescue's workflow as abort would), and a ramdisk agent that falls
//! silent.

use bcm_core::ProvisionState;
use bcm_sim::Fault;
use bcm_testkit::{eventually, Options, TestEnv};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// The node's `metal-enroll` workflow id and its step called `name`.
async fn enroll_step(
    env: &TestEnv,
    node: &bcm_core::NodeId,
    name: &str,
) -> (String, bcm_db::workflows::StepRow) {
    workflow_step(env, node, "metal-enroll", name).await
}

/// The node's first workflow of `profile`: its id and its step `name`.
async fn workflow_step(
    env: &TestEnv,
    node: &bcm_core::NodeId,
    profile: &str,
    name: &str,
) -> (String, bcm_db::workflows::StepRow) {
    let wfs = bcm_db::workflows::workflows_of_node(&env.db, &node.to_string())
        .await
        .expect("workflows");
    let enroll = wfs
        .iter()
        .find(|w| w.profile_id == profile)
        .expect("the workflow");
    let steps = bcm_db::workflows::steps_fetch(&env.db, &enroll.id)
        .await
        .expect("steps");
    let step = steps
        .into_iter()
        .find(|s| s.name == name)
        .expect("the step");
    (enroll.id.clone(), step)
}

#[tokio::test]
async fn a_bmc_fault_fails_enrolling_with_a_clear_error() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    env.faults.set("sim://bad-bmc", Fault::BmcRejects);
    let id = env.enroll_sim("bad-bmc").await;
    let n = env
        .wait_state(&id, ProvisionState::Failed, T)
        .await
        .expect("failed");
    assert_eq!(n.failed_from, Some(ProvisionState::Enrolling));
    assert!(n.maintenance, "maintenance turns on");
    let err = n.last_error.clone().unwrap_or_default();
    assert!(err.contains("verify-bmc") && err.contains("401"), "{err}");

    // recover goes back to enrolling; healed, the chain reaches ready.
    env.faults.clear("sim://bad-bmc", Fault::BmcRejects);
    let (s, b) = env.verb("recover", &id, json!({})).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["provisionState"], "enrolling");
    let n = env
        .wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready after recover");
    assert!(n.maintenance, "recover leaves maintenance on");
}

#[tokio::test]
async fn transient_bmc_errors_are_retried_with_backoff_and_the_chain_completes() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    env.faults.set("sim://flaky", Fault::BmcFlaky);
    let id = env.enroll_sim("flaky").await;
    let n = env
        .wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready despite a flaky BMC");
    assert!(!n.maintenance);
    let (enroll, verify) = enroll_step(&env, &id, "verify-bmc").await;
    assert_eq!(verify.status.as_str(), "succeeded");
    assert_eq!(verify.attempt, 2, "the 503 was retried once");
    let counts = bcm_db::workflows::command_counts_by_step(&env.db, &enroll)
        .await
        .expect("counts");
    let (_, _, sent) = counts
        .iter()
        .find(|(idx, _, _)| *idx == verify.idx)
        .copied()
        .expect("count");
    assert_eq!(sent, 2, "one command per attempt");
    // The retry waited its backoff: 1 s doubling, with equal jitter (>= 0.5 s).
    let cmds = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let verifies: Vec<_> = cmds.iter().filter(|c| c.kind == "bmc.verify").collect();
    assert_eq!(verifies.len(), 2);
    let first_done = verifies[0].completed_at.expect("completed");
    let gap = verifies[1].created_at - first_done;
    assert!(
        gap >= chrono::Duration::milliseconds(450),
        "retried after {gap:?}, before its backoff"
    );
}

/// Asserts that the workflow's cleanup steps (a ramdisk workflow's boot
/// cleanup: the boot entry cleared, the machine powered off) all ran and
/// succeeded, and returns its steps.
async fn boot_cleanup_ran(env: &TestEnv, workflow: &str) -> Vec<bcm_db::workflows::StepRow> {
    let steps = bcm_db::workflows::steps_fetch(&env.db, workflow)
        .await
        .expect("steps");
    let cleanup: Vec<_> = steps
        .iter()
        .filter(|s| s.cleanup)
        .map(|s| (s.name.as_str(), s.status.as_str()))
        .collect();
    assert_eq!(
        cleanup,
        vec![
            ("clear-boot-entry", "succeeded"),
            ("power-off", "succeeded")
        ],
        "the cleanup of workflow {workflow}"
    );
    steps
}

#[tokio::test]
async fn abort_runs_the_cleanup_steps_and_fails_the_node() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    env.faults.set("sim://stuck", Fault::RamdiskNeverJoins);
    let id = env.enroll_sim("stuck").await;
    env.wait_state(&id, ProvisionState::Inspecting, T)
        .await
        .expect("inspecting");
    // Wait until the workflow waits for the ramdisk that never comes.
    let wf = eventually(T, || async {
        let n = env.node(&id).await?;
        let Some(w) = n.workflow_id else {
            return Ok(None);
        };
        let steps = bcm_db::workflows::steps_fetch(&env.db, &w.to_string()).await?;
        Ok(steps
            .iter()
            .any(|s| s.name == "wait-ramdisk-join" && s.status.as_str() == "running")
            .then_some(w))
    })
    .await
    .expect("waiting for the ramdisk");
    let (s, b) = env
        .verb("abort", &id, json!({"reason": "ramdisk never came up"}))
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["provisionState"], "failed");
    assert_eq!(b["failedFrom"], "inspecting");
    let done = eventually(T, || async {
        let w = bcm_db::workflows::workflow_fetch(&env.db, &wf.to_string()).await?;
        Ok((w.status.as_str() == "cancelled").then_some(()))
    })
    .await;
    done.expect("the workflow ends cancelled");
    let steps = boot_cleanup_ran(&env, &wf.to_string()).await;
    assert!(steps
        .iter()
        .any(|s| s.name == "wait-ramdisk-join" && s.status.as_str() == "skipped"));
    let n = env.node(&id).await.expect("node");
    assert_eq!(
        n.provision_state,
        ProvisionState::Failed,
        "the cancelled workflow does not move the node again"
    );
    assert!(n
        .last_error
        .unwrap_or_default()
        .contains("ramdisk never came up"));
}

/// Each way a wipe can fail to prove itself: unsigned, a disk that fails
/// read-back, and a disk of the recorded inventory that does not report
/// (swapped for another under its name since inspection).
#[tokio::test]
async fn an_unsigned_or_unverified_wipe_fails_the_release() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    for (name, fault, says) in [
        ("unsigned", Fault::UnsignedWipe, "not node-signed"),
        ("readback", Fault::WipeFailsReadBack, "read-back"),
        (
            "swapped",
            Fault::DiskSwapped,
            "missing from the disk.wipe result: nvme0n1 (SIM",
        ),
    ] {
        let id = env.enroll_sim(name).await;
        env.wait_state(&id, ProvisionState::Ready, T)
            .await
            .expect("ready");
        let (s, b) = env
            .verb(
                "deploy",
                &id,
                json!({"profileId": "p", "profileVersion": 1}),
            )
            .await;
        assert_eq!(s, 200, "{b}");
        env.wait_state(&id, ProvisionState::Deployed, T)
            .await
            .expect("deployed");
        env.faults.set(&format!("sim://{name}"), fault);
        let (s, b) = env.verb("undeploy", &id, json!({"wipe": "quick"})).await;
        assert_eq!(s, 200, "{b}");
        let n = env
            .wait_state(&id, ProvisionState::Failed, T)
            .await
            .expect("failed, never ready");
        assert_eq!(n.failed_from, Some(ProvisionState::Releasing));
        let last_error = n.last_error.clone().unwrap_or_default();
        assert!(
            last_error.contains("UNVERIFIED_WIPE") && last_error.contains(says),
            "{name}: {last_error}"
        );
        // recover goes to releasing (which wipes again), never to ready.
        env.faults.clear(&format!("sim://{name}"), fault);
        let (s, b) = env.verb("recover", &id, json!({})).await;
        assert_eq!((s, b["provisionState"].as_str()), (200, Some("releasing")));
        env.wait_state(&id, ProvisionState::Ready, T)
            .await
            .expect("ready after a verified wipe");
    }
}

#[tokio::test]
async fn unrescue_while_the_rescue_ramdisk_boots_is_a_conflict() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.deployed_sim("rescue-me").await;
    env.faults.set("sim://rescue-me", Fault::RamdiskNeverJoins);
    let (s, _) = env.verb("rescue", &id, json!({})).await;
    assert_eq!(s, 200);
    let (s, b) = env.verb("unrescue", &id, json!({})).await;
    assert_eq!((s, b["code"].as_str()), (409, Some("CONFLICT")), "{b}");
    let n = env.node(&id).await.expect("node");
    assert!(!n.unrescue_pending);
    // Once the ramdisk is up, unrescue is accepted and brings the OS back.
    env.faults
        .clear("sim://rescue-me", Fault::RamdiskNeverJoins);
    let (s, _) = env.verb("abort", &id, json!({})).await;
    assert_eq!(s, 409, "abort is not legal from rescue");
}

#[tokio::test]
async fn a_step_this_engine_cannot_read_fails_alone_and_holds_up_no_other_workflow() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let ids = env.enroll_sims("unreadable", 4).await;
    // A workflow whose step kind only a newer engine knows, due at once,
    // batched with the enrolling nodes' workflows. Version 0 is no state
    // entry of the node's, so the reconciler's own workflows are unaffected.
    let mut tx = env.db.begin().await.expect("tx");
    bcm_db::workflows::workflow_insert_in_txn(
        &mut tx,
        &bcm_db::workflows::NewWorkflow {
            id: "wf_from_a_newer_engine".into(),
            node_id: ids[0].to_string(),
            owner: "metal".into(),
            profile_id: "metal-teleport".into(),
            profile_version: 1,
            for_state: "ready".into(),
            for_version: 0,
            definition: json!({}),
            actor: None,
            traceparent: None,
            steps: vec![bcm_db::workflows::NewStep {
                name: "teleport".into(),
                target: "control-plane".into(),
                cleanup: false,
                definition: json!({ "name": "teleport", "kind": "teleport", "timeoutSecs": 10, "retry": { "maxAttempts": 1 } }),
            }],
        },
    )
    .await
    .expect("insert");
    tx.commit().await.expect("commit");

    let wf = eventually(T, || async {
        let wf = bcm_db::workflows::workflow_fetch(&env.db, "wf_from_a_newer_engine").await?;
        Ok((wf.status.as_str() == "failed").then_some(wf))
    })
    .await
    .expect("the unreadable workflow fails");
    let err = wf.error.unwrap_or_default();
    assert!(
        err.starts_with("teleport: this engine cannot read the step's definition"),
        "{err}"
    );
    let steps = bcm_db::workflows::steps_fetch(&env.db, "wf_from_a_newer_engine")
        .await
        .expect("steps");
    assert_eq!(steps[0].status.as_str(), "failed");
    assert_eq!(steps[0].due_at, None, "never claimed again");
    for id in &ids {
        env.wait_state(id, ProvisionState::Ready, T)
            .await
            .expect("every node reaches ready");
    }
}

#[tokio::test]
async fn a_bmc_that_pads_its_strings_with_nul_characters_still_enrolls() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    env.faults.set("sim://nul-padded", Fault::BmcPadsWithNul);
    // Its result is recorded among others' (a batch of results).
    let padded = env.enroll_sim("nul-padded").await;
    let others = env.enroll_sims("clean", 3).await;
    for id in others.iter().chain([&padded]) {
        env.wait_state(id, ProvisionState::Ready, T)
            .await
            .expect("every node reaches ready");
    }
    let (_, inspect) = enroll_step(&env, &padded, "inspect-oob").await;
    let output = inspect.output.clone().unwrap_or_default().to_string();
    assert!(
        output.contains("\"manufacturer\":\"Better Compute Sim\""),
        "{output}"
    );
    assert!(!output.contains("\\u0000"), "{output}");
    assert_eq!(
        inspect.attempt, 1,
        "recorded the first time, not after failed tries"
    );
}

/// A ramdisk agent that hangs after taking its command (a kernel panic, a
/// pulled cable) fails the step as soon as it has been silent for the
/// engine's `agent_silence_ms`, naming the step, the agent's session and
/// how long it was silent — not after the step's deadline (600 s for
/// `collect-inventory`), and not silently.
#[tokio::test]
async fn a_silent_ramdisk_agent_fails_its_step_early_and_says_so() {
    let env = TestEnv::start_with(Options {
        agent_silence_ms: 1500,
        ..Options::with_site()
    })
    .await
    .expect("env");
    env.faults.set("sim://hangs", Fault::RamdiskFallsSilent);
    let id = env.enroll_sim("hangs").await;
    // Within T (60 s): the step's own deadline is 600 s.
    let n = eventually(T, || async {
        let n = env.node(&id).await?;
        Ok((n.provision_state == ProvisionState::Failed).then_some(n))
    })
    .await
    .expect("the node fails");
    let error = n.last_error.unwrap_or_default();
    assert!(
        error.starts_with("collect-inventory: ") && error.contains("silent for"),
        "names the step and the silence: {error}"
    );
    let serial = bcm_db::agents::certs_of_node(&env.db, &id.to_string())
        .await
        .expect("certs")
        .pop()
        .expect("the agent joined")
        .serial;
    assert!(
        error.contains(&serial),
        "names the agent's session: {error}"
    );
    env.stop();
}

/// An agent whose requests the API turns away unheard (its agent pool
/// exhausted: a `503` before the session could be touched, recorded in
/// `agent_turnaways`) is not counted silent while that lasts: the control
/// plane's own overload never fails a step. Once the turning away stops,
/// the silence verdict comes as before.
#[tokio::test]
async fn an_agent_the_api_turns_away_is_not_counted_silent_until_that_stops() {
    let env = TestEnv::start_with(Options {
        agent_silence_ms: 4000,
        ..Options::with_site()
    })
    .await
    .expect("env");
    env.faults
        .set("sim://turned-away", Fault::RamdiskFallsSilent);
    let id = env.enroll_sim("turned-away").await;
    eventually(T, || async {
        let certs = bcm_db::agents::certs_of_node(&env.db, &id.to_string()).await?;
        Ok((!certs.is_empty()).then_some(()))
    })
    .await
    .expect("the agent joins");
    // Its last poll marks it alive for up to 25 s; it then falls silent.
    // Alone, its step's attempt is failed (and retried) 4 s after that
    // mark. Turned away throughout (recorded every 250 ms, well within the
    // 4 s even on a loaded machine), it is not, however long past the mark.
    let started = std::time::Instant::now();
    loop {
        bcm_db::agents::turnaway_record(&env.db)
            .await
            .expect("record");
        let (_, step) = workflow_step(&env, &id, "metal-inspect", "collect-inventory").await;
        assert!(
            step.attempt <= 1,
            "counted silent while turned away: attempt {} ({:?})",
            step.attempt,
            step.error
        );
        let mut tx = env.db.begin().await.expect("tx");
        let mark = bcm_db::agents::session_newest_in_txn(&mut tx, &id.to_string(), "discovery")
            .await
            .expect("session")
            .map(|(_, alive_until)| alive_until);
        tx.rollback().await.expect("rollback");
        if mark.is_some_and(|m| chrono::Utc::now() > m + chrono::Duration::seconds(7)) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the agent's mark never passed: {mark:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // (Its deadline is 600 s: only the silence verdict retries it now.)
    eventually(T, || async {
        let (_, step) = workflow_step(&env, &id, "metal-inspect", "collect-inventory").await;
        Ok((step.attempt > 1).then_some(()))
    })
    .await
    .expect("the attempt is failed once the turning away stops");
    env.stop();
}

/// A power cycle that booted the ramdisk but whose answer was lost is
/// retried from a fresh boot entry: the first boot's agent spent the
/// entry's one-time token and its machine is reset under it, so the retry
/// prepares a new entry, PXE once again, and the join wait counts only the
/// agent of the new entry. Before, the retry cycled the machine into
/// nothing (its one-time PXE boot was used up), the join wait counted the
/// first agent, and the inventory went to a session nobody held until the
/// silence check failed the node.
#[tokio::test]
async fn a_power_cycle_whose_answer_was_lost_boots_a_fresh_entry_and_the_chain_completes() {
    let env = TestEnv::start_with(Options {
        agent_silence_ms: 1500,
        ..Options::with_site()
    })
    .await
    .expect("env");
    env.faults.set("sim://answer-lost", Fault::PowerAnswerLost);
    let id = env.enroll_sim("answer-lost").await;
    let n = env
        .wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("ready despite the lost answer");
    assert!(!n.maintenance, "{:?}", n.last_error);
    let (wf, cycle) = workflow_step(&env, &id, "metal-inspect", "power-cycle").await;
    assert_eq!(cycle.attempt, 2, "the lost answer was retried once");
    let (_, entry) = workflow_step(&env, &id, "metal-inspect", "prepare-boot-entry").await;
    assert_eq!(entry.attempt, 2, "the retry made a fresh boot entry");
    let (_, pxe) = workflow_step(&env, &id, "metal-inspect", "pxe-once").await;
    assert_eq!(pxe.attempt, 2, "and set PXE once again");
    let counts = bcm_db::workflows::command_counts_by_step(&env.db, &wf)
        .await
        .expect("counts");
    let sent = |idx: i32| {
        counts
            .iter()
            .find(|(i, _, _)| *i == idx)
            .map(|(_, _, sent)| *sent)
            .unwrap_or_default()
    };
    assert_eq!(sent(entry.idx), 2, "one boot entry per attempt");
    assert_eq!(sent(cycle.idx), 2, "one power cycle per attempt");
    // The inventory came from the second boot's agent: each boot joined
    // with its own token, and the identity that signed the inventory was
    // issued after the fresh boot entry was made.
    let certs = bcm_db::agents::certs_of_node(&env.db, &id.to_string())
        .await
        .expect("certs");
    let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let inventory = commands
        .iter()
        .find(|c| c.kind == "inventory")
        .expect("the inventory command");
    let signer = certs
        .iter()
        .find(|c| Some(c.serial.as_str()) == inventory.attested_by.as_deref())
        .expect("the inventory is attested by one of the node's identities");
    let fresh_entry = commands
        .iter()
        .find(|c| Some(c.id.as_str()) == entry.command_id.as_deref())
        .expect("the fresh boot entry's command");
    assert!(
        signer.not_before >= fresh_entry.created_at,
        "signed by an identity from before the fresh entry: {signer:?} vs {fresh_entry:?}"
    );
    env.stop();
}

/// Undeploy from `rescue` while the rescue ramdisk still boots leaves the
/// state whose workflow runs: that workflow is cancelled and its cleanup
/// runs, exactly as abort's would, and the release's workflow starts only
/// after it ended.
#[tokio::test]
async fn undeploy_from_a_booting_rescue_cancels_the_rescue_first() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let id = env.deployed_sim("leave-rescue").await;
    env.faults
        .set("sim://leave-rescue", Fault::RamdiskNeverJoins);
    let (s, b) = env.verb("rescue", &id, json!({})).await;
    assert_eq!(s, 200, "{b}");
    let (rescue, _) = eventually(T, || async {
        let wfs = bcm_db::workflows::workflows_of_node(&env.db, &id.to_string()).await?;
        let Some(w) = wfs.into_iter().find(|w| w.profile_id == "metal-rescue") else {
            return Ok(None);
        };
        let steps = bcm_db::workflows::steps_fetch(&env.db, &w.id).await?;
        Ok(steps
            .iter()
            .any(|s| s.name == "wait-ramdisk-join" && s.status.as_str() == "running")
            .then_some((w.id, ())))
    })
    .await
    .expect("the rescue waits for its ramdisk");
    env.faults
        .clear("sim://leave-rescue", Fault::RamdiskNeverJoins);
    let (s, b) = env.verb("undeploy", &id, json!({"wipe": "quick"})).await;
    assert_eq!(
        (s, b["provisionState"].as_str()),
        (200, Some("releasing")),
        "{b}"
    );
    env.wait_state(&id, ProvisionState::Ready, T)
        .await
        .expect("released to ready");
    let rescued = bcm_db::workflows::workflow_fetch(&env.db, &rescue)
        .await
        .expect("rescue workflow");
    assert_eq!(rescued.status.as_str(), "cancelled", "{rescued:?}");
    let steps = boot_cleanup_ran(&env, &rescue).await;
    // The release's workflow began after the rescue's cleanup ended.
    let wfs = bcm_db::workflows::workflows_of_node(&env.db, &id.to_string())
        .await
        .expect("workflows");
    let release = wfs
        .iter()
        .find(|w| w.profile_id == "metal-release")
        .expect("the release workflow");
    let ended = steps
        .iter()
        .filter_map(|s| s.finished_at)
        .max()
        .expect("the rescue's steps ended");
    assert!(
        release.created_at >= ended,
        "release started {} before the rescue's cleanup ended {ended}",
        release.created_at
    );
}

/// A ramdisk agent that stays alive but never answers its command: only the
/// step's time-out (here the site's own, `engine.step_timeouts`) ends each
/// attempt; the step is retried per its policy (five attempts), then the
/// workflow fails and the node's `lastError` names the step and the
/// time-out.
#[tokio::test]
async fn a_step_whose_agent_never_answers_times_out_retries_then_fails() {
    let env = TestEnv::start_with(Options {
        step_timeouts: [(
            "collect-inventory".to_owned(),
            std::num::NonZeroU32::new(2).expect("non-zero"),
        )]
        .into(),
        ..Options::with_site()
    })
    .await
    .expect("env");
    env.faults.set("sim://mute", Fault::RamdiskIgnoresCommands);
    let id = env.enroll_sim("mute").await;
    let n = env
        .wait_state(&id, ProvisionState::Failed, Duration::from_secs(90))
        .await
        .expect("the node fails");
    assert_eq!(n.failed_from, Some(ProvisionState::Inspecting));
    let error = n.last_error.unwrap_or_default();
    assert_eq!(
        error, "collect-inventory: collect-inventory timed out after 2 s (after 5 attempts)",
        "names the step, the time-out and the attempts"
    );
    let (_, step) = workflow_step(&env, &id, "metal-inspect", "collect-inventory").await;
    assert_eq!(
        (step.status.as_str(), step.attempt),
        ("failed", 5),
        "retried per the step's policy"
    );
    // Each attempt was its own command, none of them answered.
    let commands = bcm_db::commands::commands_of_node(&env.db, &id.to_string())
        .await
        .expect("commands");
    let inventory: Vec<_> = commands.iter().filter(|c| c.kind == "inventory").collect();
    assert_eq!(inventory.len(), 5, "{inventory:?}");
    assert!(
        inventory.iter().all(|c| c.result.is_none()),
        "{inventory:?}"
    );
    env.stop();
}
