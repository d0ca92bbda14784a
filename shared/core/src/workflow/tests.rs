//! Tests of the profiles and the planner.

use super::*;
use proptest::prelude::*;

#[test]
fn every_workflow_state_has_its_profile() {
    use ProvisionState::*;
    let ids: Vec<_> = [
        Enrolling,
        Inspecting,
        Commissioning,
        Releasing,
        Rescue,
        Retiring,
    ]
    .into_iter()
    .map(|s| metal_profile_for(s, false, WipeMode::Quick, AgentMode::Bcd).map(|p| p.id))
    .collect();
    assert_eq!(
        ids,
        [
            "metal-enroll",
            "metal-inspect",
            "metal-commission",
            "metal-release",
            "metal-rescue",
            "metal-retire"
        ]
        .map(|s| Some(s.to_owned()))
    );
    assert_eq!(
        metal_profile_for(Rescue, true, WipeMode::Quick, AgentMode::Bcd).map(|p| p.id),
        Some("metal-unrescue".into())
    );
    for s in [Ready, Deployed, Failed, Retired, Deploying, Adopted] {
        assert!(
            metal_profile_for(s, false, WipeMode::Quick, AgentMode::Bcd).is_none(),
            "{s}"
        );
    }
}

#[test]
fn an_agentless_pool_runs_out_of_band_profiles_only() {
    use ProvisionState::*;
    let agentless = |s, unrescue| metal_profile_for(s, unrescue, WipeMode::Quick, AgentMode::None);
    let ids: Vec<_> = [Enrolling, Inspecting, Commissioning, Releasing, Retiring]
        .into_iter()
        .map(|s| agentless(s, false).map(|p| p.id))
        .collect();
    assert_eq!(
        ids,
        [
            "metal-enroll",
            "metal-inspect-oob",
            "metal-commission-oob",
            "metal-release-oob",
            "metal-retire-oob"
        ]
        .map(|s| Some(s.to_owned()))
    );
    // Nothing boots an agent: no rescue at all.
    assert!(agentless(Rescue, false).is_none());
    assert!(agentless(Rescue, true).is_none());
    let mut profiles: Vec<Profile> = [Enrolling, Inspecting, Commissioning, Releasing, Retiring]
        .into_iter()
        .filter_map(|s| agentless(s, false))
        .collect();
    profiles.push(tenant_deploy_for("t", 1, AgentMode::None));
    for p in &profiles {
        for s in p.steps.iter().chain(&p.cleanup) {
            assert!(
                !matches!(s.kind.target(), StepTarget::Ramdisk | StepTarget::Node)
                    && !matches!(s.kind, StepKind::BootEntrySet | StepKind::WaitRamdiskJoin),
                "{}: {} needs an agent or a network boot",
                p.id,
                s.name
            );
        }
    }
    // Retire's erase is required; a release's is judged after.
    let erase = |p: Profile| {
        p.steps.into_iter().find_map(|s| match s.kind {
            StepKind::BmcErase { mode, required } => Some((mode, required, s.retry)),
            _ => None,
        })
    };
    assert_eq!(
        erase(agentless(Retiring, false).expect("retire")),
        Some((WipeMode::CryptoErase, true, RetryPolicy::ONCE))
    );
    assert_eq!(
        erase(agentless(Releasing, false).expect("release")),
        Some((WipeMode::Quick, false, RetryPolicy::ONCE))
    );
    // The deploy hands the machine to the installer and takes it back
    // when the installer powers it off.
    let deploy: Vec<_> = tenant_deploy_for("t", 1, AgentMode::None)
        .steps
        .into_iter()
        .map(|s| s.kind.command_kind())
        .collect();
    assert_eq!(
        deploy,
        [
            "bmc.virtualMedia",
            "bmc.bootDevice",
            "bmc.power",
            "bmc.powerStatus",
            "bmc.virtualMedia",
            "bmc.bootDevice",
            "bmc.power"
        ]
    );
}

#[test]
fn commissioning_wipes_as_the_pool_says() {
    let wipes = |m| {
        metal_profile_for(ProvisionState::Commissioning, false, m, AgentMode::Bcd)
            .expect("a profile")
            .steps
            .into_iter()
            .filter_map(|s| match s.kind {
                StepKind::DiskWipe { mode } => Some(mode),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(wipes(WipeMode::Quick), vec![WipeMode::Quick]);
    assert_eq!(wipes(WipeMode::SecureErase), vec![WipeMode::SecureErase]);
    assert_eq!(wipes(WipeMode::CryptoErase), vec![WipeMode::CryptoErase]);
}

#[test]
fn profiles_do_what_the_spec_says() {
    let kinds = |p: Profile| p.steps.into_iter().map(|s| s.kind).collect::<Vec<_>>();
    assert!(kinds(metal_commission(WipeMode::Quick)).contains(&StepKind::DiagDcgm { level: 2 }));
    assert!(
        kinds(metal_commission(WipeMode::Quick)).contains(&StepKind::DiskWipe {
            mode: WipeMode::Quick
        })
    );
    for mode in [
        WipeMode::Quick,
        WipeMode::SecureErase,
        WipeMode::CryptoErase,
    ] {
        assert!(kinds(metal_release(mode)).contains(&StepKind::DiskWipe { mode }));
    }
    assert!(kinds(metal_retire()).contains(&StepKind::DiskWipe {
        mode: WipeMode::CryptoErase
    }));
    assert!(kinds(metal_retire()).contains(&StepKind::RevokeIdentity));
    assert!(kinds(metal_retire()).contains(&StepKind::ForgetBmcCredentials));
    // Rescue boots the ramdisk as the others do, the installed OS shut
    // down first (asked, optionally, then by its BMC) between the entry
    // and the boot.
    let mut shut_down_first = ensure_ramdisk();
    shut_down_first.insert(1, step("bmc-power-off", StepKind::BmcPowerOff, 300));
    assert_eq!(
        metal_rescue()
            .steps
            .into_iter()
            .filter(|s| !s.optional)
            .collect::<Vec<_>>(),
        shut_down_first
    );
    // Every profile that needs the ramdisk boots it the same way, then
    // works in it.
    for p in [
        metal_inspect(),
        metal_release(WipeMode::Quick),
        metal_release_dedicated(WipeMode::SecureErase),
        metal_retire(),
        tenant_deploy("t", 1),
    ] {
        assert_eq!(p.steps[..4], ensure_ramdisk()[..], "{}", p.id);
    }
    // Commissioning records the firmware out of band first.
    let commission = metal_commission(WipeMode::Quick);
    assert_eq!(
        commission.steps[0].kind,
        StepKind::BmcFirmware { check: false }
    );
    assert_eq!(commission.steps[1..5], ensure_ramdisk()[..]);
    // A dedicated teardown: wipe, firmware compared, boot reset, password
    // rotated.
    let dedicated: Vec<StepKind> = kinds(metal_release_dedicated(WipeMode::SecureErase));
    let after_wipe: Vec<&StepKind> = dedicated
        .iter()
        .skip_while(|k| !matches!(k, StepKind::DiskWipe { .. }))
        .collect();
    assert_eq!(
        after_wipe,
        [
            &StepKind::DiskWipe {
                mode: WipeMode::SecureErase
            },
            &StepKind::BmcPowerOff,
            &StepKind::BmcFirmware { check: true },
            &StepKind::BmcBootDisk { persistent: true },
            &StepKind::RotateBmcPassword,
            &StepKind::BootEntryClear,
        ]
    );
    let unrescue = metal_unrescue();
    assert!(unrescue.steps.iter().any(|s| s.kind
        == StepKind::WaitOsBack {
            role: "node".into(),
            timeout_secs: 1_200
        }));
    // A deploy waits for a join with its own token, never a sign of life.
    assert!(tenant_deploy("t", 1)
        .steps
        .iter()
        .any(|s| matches!(s.kind, StepKind::WaitOsJoin { .. })));
    assert_eq!(
        unrescue.steps[0].kind,
        StepKind::BmcBootDisk { persistent: true }
    );
    // Names are unique within a profile, so (workflow, step, attempt) keys are.
    for p in [
        metal_enroll(),
        metal_inspect(),
        metal_commission(WipeMode::Quick),
        metal_release(WipeMode::Quick),
        metal_release_dedicated(WipeMode::CryptoErase),
        metal_retire(),
        tenant_deploy("t", 1),
    ] {
        let mut names: Vec<_> = p
            .steps
            .iter()
            .chain(&p.cleanup)
            .map(|s| s.name.clone())
            .collect();
        let main = p.steps.len();
        names.truncate(main);
        let mut dedup = names.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), names.len(), "{}", p.id);
    }
    // Wipes are never retried: a failed read-back must fail the workflow.
    for p in [
        metal_commission(WipeMode::Quick),
        metal_release(WipeMode::SecureErase),
        metal_retire(),
    ] {
        for s in p
            .steps
            .iter()
            .filter(|s| matches!(s.kind, StepKind::DiskWipe { .. }))
        {
            assert_eq!(s.retry.max_attempts, 1, "{}/{}", p.id, s.name);
            assert!(s.kind.destructive());
        }
    }
}

#[test]
fn backoff_doubles_caps_and_jitters() {
    let p = RetryPolicy {
        max_attempts: 10,
        initial_backoff_ms: 1_000,
        max_backoff_ms: 8_000,
    };
    assert_eq!(p.backoff_ms(2, 0.0), 500);
    assert_eq!(p.backoff_ms(2, 0.999), 999);
    assert_eq!(p.backoff_ms(3, 0.0), 1_000);
    assert_eq!(p.backoff_ms(5, 0.0), 4_000);
    assert_eq!(
        p.backoff_ms(9, 0.0),
        4_000,
        "capped at max, halved by jitter floor"
    );
    assert_eq!(p.backoff_ms(60, 1.0), 8_000);
    assert_eq!(p.backoff_ms(3, f64::NAN), 1_000);
}

#[test]
fn outcomes_retry_until_the_attempts_run_out() {
    let def = step("s", StepKind::BmcVerify, 10);
    let fail = StepOutcome::Failed {
        retryable: true,
        message: "503 from BMC".into(),
    };
    assert_eq!(
        after_outcome(&def, 1, &StepOutcome::Succeeded, 0.5),
        AfterOutcome::Done
    );
    assert!(matches!(
        after_outcome(&def, 1, &fail, 0.0),
        AfterOutcome::Retry {
            attempt: 2,
            after_ms: 500
        }
    ));
    assert!(matches!(
        after_outcome(&def, 4, &StepOutcome::TimedOut, 0.0),
        AfterOutcome::Retry { attempt: 5, .. }
    ));
    match after_outcome(&def, 5, &fail, 0.0) {
        AfterOutcome::GiveUp { message } => {
            assert!(message.contains("after 5 attempts"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let fatal = StepOutcome::Failed {
        retryable: false,
        message: "bad credentials".into(),
    };
    assert_eq!(
        after_outcome(&def, 1, &fatal, 0.0),
        AfterOutcome::GiveUp {
            message: "bad credentials".into()
        }
    );
}

#[test]
fn planner_runs_main_then_finishes_or_cleans_up() {
    use StepStatus::*;
    assert_eq!(
        next_step(WorkflowPhase::Running, &[Succeeded, Pending], &[Pending]),
        NextStep::Main(1)
    );
    assert_eq!(
        next_step(WorkflowPhase::Running, &[Succeeded, Succeeded], &[Pending]),
        NextStep::Finish(WorkflowPhase::Succeeded),
        "cleanup only runs on failure or cancel"
    );
    assert_eq!(
        next_step(
            WorkflowPhase::Running,
            &[Succeeded, Failed],
            &[Pending, Pending]
        ),
        NextStep::Cleanup(0)
    );
    assert_eq!(
        next_step(WorkflowPhase::FailingCleanup, &[Failed], &[Failed, Pending]),
        NextStep::Cleanup(1)
    );
    assert_eq!(
        next_step(
            WorkflowPhase::FailingCleanup,
            &[Failed],
            &[Failed, Succeeded]
        ),
        NextStep::Finish(WorkflowPhase::Failed)
    );
    assert_eq!(
        next_step(WorkflowPhase::CancellingCleanup, &[Skipped], &[Pending]),
        NextStep::Cleanup(0)
    );
    assert_eq!(
        next_step(WorkflowPhase::CancellingCleanup, &[Skipped], &[]),
        NextStep::Finish(WorkflowPhase::Cancelled)
    );
}

fn status() -> impl Strategy<Value = StepStatus> {
    proptest::sample::select(vec![
        StepStatus::Pending,
        StepStatus::Running,
        StepStatus::Succeeded,
        StepStatus::Failed,
        StepStatus::Skipped,
    ])
}

proptest! {
    /// Whatever the statuses, a cancel or a failure never finishes while a
    /// cleanup step is still open, and success never runs cleanup.
    #[test]
    fn cleanup_is_never_skipped(
        main in proptest::collection::vec(status(), 0..8),
        cleanup in proptest::collection::vec(status(), 0..4),
        phase in proptest::sample::select(vec![WorkflowPhase::Running, WorkflowPhase::FailingCleanup, WorkflowPhase::CancellingCleanup]),
    ) {
        let open_cleanup = cleanup.iter().any(|s| matches!(s, StepStatus::Pending | StepStatus::Running));
        match next_step(phase, &main, &cleanup) {
            NextStep::Finish(WorkflowPhase::Failed) | NextStep::Finish(WorkflowPhase::Cancelled) => prop_assert!(!open_cleanup),
            NextStep::Finish(WorkflowPhase::Succeeded) => {
                prop_assert_eq!(phase, WorkflowPhase::Running);
                prop_assert!(main.iter().all(|s| matches!(s, StepStatus::Succeeded | StepStatus::Skipped)));
            }
            NextStep::Cleanup(i) => prop_assert!(matches!(cleanup[i], StepStatus::Pending | StepStatus::Running)),
            NextStep::Main(i) => {
                prop_assert_eq!(phase, WorkflowPhase::Running);
                prop_assert!(main[..i].iter().all(|s| !matches!(s, StepStatus::Pending | StepStatus::Running)));
            }
            NextStep::Finish(other) => prop_assert!(false, "finished as {:?}", other),
        }
    }
}

#[test]
fn only_a_signed_wipe_with_every_disk_verified_counts() {
    assert_eq!(wipe_verdict(true, &[true, true], &[]), Ok(()));
    assert_eq!(
        wipe_verdict(false, &[true], &[]),
        Err(UnverifiedWipe::Unsigned)
    );
    assert_eq!(wipe_verdict(true, &[], &[]), Err(UnverifiedWipe::NoDisk));
    assert_eq!(
        wipe_verdict(true, &[true, false], &[]),
        Err(UnverifiedWipe::ReadBackFailed)
    );
    assert_eq!(
        wipe_verdict(true, &[true], &["sdb (S2)".to_owned()]),
        Err(UnverifiedWipe::DiskMissing)
    );
}

#[test]
fn a_recorded_disk_is_accounted_for_by_its_serial_else_its_name() {
    let d = |name, serial| DiskId { name, serial };
    let recorded = [d("nvme0n1", "S1"), d("sdb", "S2"), d("vda", "")];
    // All there (the names of serial-bearing disks may change across boots).
    assert!(disks_unaccounted(
        &recorded,
        &[d("nvme1n1", "S1"), d("sdb", "S2"), d("vda", "")]
    )
    .is_empty());
    // A disk that does not report, a disk swapped for another under its
    // name, a serial-less disk that is gone.
    assert_eq!(
        disks_unaccounted(&recorded, &[d("nvme0n1", "S1"), d("sdb", "S9")]),
        vec!["sdb (S2)".to_owned(), "vda".to_owned()]
    );
    // Nothing recorded: nothing to account for (the report alone decides).
    assert!(disks_unaccounted(&[], &[d("sda", "X")]).is_empty());
    // A reported disk the inventory did not know is no reason to fail.
    assert!(disks_unaccounted(&recorded[..1], &[d("nvme0n1", "S1"), d("sdz", "NEW")]).is_empty());
}

#[test]
fn an_unknown_stored_status_is_an_error_never_a_default() {
    for s in StepStatus::ALL {
        assert_eq!(StepStatus::parse(s.as_str()), Some(s));
        assert_eq!(StepStatus::try_from(s.as_str().to_owned()), Ok(s));
    }
    for p in WorkflowPhase::ALL {
        assert_eq!(WorkflowPhase::parse(p.as_str()), Some(p));
    }
    for c in CommandStatus::ALL {
        assert_eq!(CommandStatus::parse(c.as_str()), Some(c));
    }
    // A typo once read as `pending`, which ran the step again.
    assert!(StepStatus::try_from("suceeded".to_owned()).is_err());
    assert!(StepStatus::parse("").is_none());
    assert!(WorkflowPhase::try_from("finished".to_owned()).is_err());
    assert!(CommandStatus::try_from("done".to_owned()).is_err());
}

#[test]
fn a_stored_v1_ensure_ramdisk_step_still_loads_and_runs_in_the_engine() {
    let stored = serde_json::json!({
        "name": "ensure-ramdisk", "kind": "ensureRamdisk", "timeoutSecs": 1800,
        "retry": {"maxAttempts": 5, "initialBackoffMs": 1000, "maxBackoffMs": 60000}
    });
    let def: StepDef = serde_json::from_value(stored).expect("a v1 step loads");
    assert_eq!(def.kind, StepKind::RetiredEnsureRamdisk);
    // No site service is asked: the engine itself ends it.
    assert_eq!(def.kind.target(), StepTarget::ControlPlane);
    assert!(!def.kind.destructive());
    assert!(ensure_ramdisk()
        .iter()
        .all(|s| s.kind != StepKind::RetiredEnsureRamdisk));
}

/// A retried power action that boots the ramdisk repeats the chain from its
/// boot entry (a fresh join token, PXE once again); every other retry
/// repeats only its own step, and the join wait counts joins since that
/// boot entry.
#[test]
fn a_retried_ramdisk_boot_starts_again_at_its_boot_entry() {
    let kinds = |p: &Profile| p.steps.iter().map(|s| s.kind.clone()).collect::<Vec<_>>();
    for p in [
        metal_inspect(),
        metal_commission(WipeMode::Quick),
        metal_release(WipeMode::Quick),
        metal_rescue(),
        metal_retire(),
        tenant_deploy("t", 1),
    ] {
        let main = kinds(&p);
        let entry = main
            .iter()
            .position(|k| *k == StepKind::BootEntrySet)
            .expect("a boot entry");
        let join = main
            .iter()
            .position(|k| *k == StepKind::WaitRamdiskJoin)
            .expect("a join wait");
        for (pos, k) in main.iter().enumerate() {
            let expected = match k {
                StepKind::BmcPower { .. } if pos > entry && pos < join => entry,
                _ => pos,
            };
            assert_eq!(
                retry_starts_at(&main, pos),
                expected,
                "{} step {pos} {k:?}",
                p.id
            );
        }
        assert_eq!(join_counts_since_step(&main, join), Some(entry), "{}", p.id);
    }
    // A power action with no ramdisk join after it (unrescue's reboot into
    // the installed OS, a plain power-on) is retried alone.
    let main = vec![
        StepKind::BmcBootDisk { persistent: false },
        StepKind::BmcPower {
            action: PowerAction::Cycle,
        },
        StepKind::WaitOsJoin {
            role: "node".into(),
            timeout_secs: 60,
        },
    ];
    assert_eq!(retry_starts_at(&main, 1), 1);
    assert_eq!(join_counts_since_step(&main, 2), None);
    // Out of range is itself, never a panic.
    assert_eq!(retry_starts_at(&main, 7), 7);
}

/// Rescue asks the installed OS to shut down cleanly and waits for it, but
/// can do without: an optional step that fails for good is skipped with
/// the optional steps after it, never failing the workflow; a retried
/// power cycle repeats its boot entry and PXE boot, not the shutdown.
#[test]
fn rescue_shuts_the_os_down_first_and_can_do_without_it() {
    let p = metal_rescue();
    let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "prepare-boot-entry",
            "os-power-off",
            "wait-os-off",
            "bmc-power-off",
            "pxe-once",
            "power-cycle",
            "wait-ramdisk-join"
        ]
    );
    assert_eq!(p.version, 5);
    let optional: Vec<bool> = p.steps.iter().map(|s| s.optional).collect();
    assert_eq!(optional, [false, true, true, false, false, false, false]);
    assert_eq!(p.steps[1].kind, StepKind::NodePowerOff);
    assert_eq!(p.steps[1].kind.target(), StepTarget::Node);
    // Whatever the OS did, its BMC powers it off (gracefully first)
    // before the one-time PXE boot.
    assert_eq!(p.steps[3].kind, StepKind::BmcPowerOff);
    assert_eq!(p.steps[3].kind.target(), StepTarget::Site);
    // Skipping the ask skips the wait for it, and nothing else (never the
    // BMC's power-off).
    assert_eq!(skipped_after(&p.steps, 1), 2..3);
    assert_eq!(skipped_after(&p.steps, 2), 3..3);
    assert_eq!(skipped_after(&p.steps, 6), 7..7);
    assert_eq!(skipped_after(&p.steps, 9), 7..7);
    // The power cycle's retry repeats the entry and the PXE boot only:
    // the shutdown stands.
    assert_eq!(repeated_for_retry(&p.steps, 5), vec![0, 4]);
    assert_eq!(repeated_for_retry(&p.steps, 4), Vec::<usize>::new());
    // An optional step's final failure or time-out skips; a retryable one
    // with attempts left still retries.
    let ask = &p.steps[1];
    assert!(matches!(
        after_outcome(ask, 1, &StepOutcome::TimedOut, 0.5),
        AfterOutcome::Skip { message } if message.contains("os-power-off timed out after 150 s")
    ));
    assert!(matches!(
        after_outcome(ask, 1, &StepOutcome::Failed { retryable: false, message: "refused".into() }, 0.5),
        AfterOutcome::Skip { message } if message == "refused"
    ));
    let wait = &p.steps[2];
    assert!(matches!(
        after_outcome(
            wait,
            3,
            &StepOutcome::Failed {
                retryable: true,
                message: "on".into()
            },
            0.5
        ),
        AfterOutcome::Retry { attempt: 4, .. }
    ));
    assert!(matches!(
        after_outcome(
            wait,
            wait.retry.max_attempts,
            &StepOutcome::Failed {
                retryable: true,
                message: "on".into()
            },
            0.5
        ),
        AfterOutcome::Skip { .. }
    ));
    // A step that is not optional still gives up.
    assert!(matches!(
        after_outcome(&p.steps[5], 5, &StepOutcome::TimedOut, 0.5),
        AfterOutcome::GiveUp { .. }
    ));
    // Stored before `optional` existed, a definition reads as required and
    // one that is not optional is written as before.
    let mut json = serde_json::to_value(&p.steps[5]).expect("json");
    assert!(json.get("optional").is_none());
    json.as_object_mut().map(|o| o.remove("optional"));
    let back: StepDef = serde_json::from_value(json).expect("reads");
    assert!(!back.optional);
    let json = serde_json::to_value(ask).expect("json");
    assert_eq!(json["optional"], true);
}
