//! The metal reconciler's decision, as a pure function of what it reads:
//! the node's facts and the summary of the workflow the node points at.
//! Level-triggered: the same inputs always give the same action, so a
//! missed or repeated wake-up is harmless.

use crate::agentless::UnattestedRelease;
use crate::state::ProvisionState;
use crate::table::{Move, NodeFacts};
use crate::workflow::WorkflowPhase;

/// The workflow a node points at, as the reconciler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowSummary {
    pub profile_id: String,
    pub phase: WorkflowPhase,
    /// Every wipe result of the workflow was node-signed and passed read-back.
    pub wipe_verified: bool,
    /// The workflow's error, when it failed.
    pub error: Option<String>,
}

/// What the reconciler does for a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconcileAction {
    /// Nothing to do: the node is not in a workflow-driven state, or waits
    /// for an operator.
    Idle,
    /// Start the state's workflow (`unrescue` picks `metal-unrescue`).
    StartWorkflow,
    /// A workflow runs; look again later.
    Wait,
    /// Apply a move, recording `last_error` when it fails the node.
    Apply {
        mv: Move,
        last_error: Option<String>,
    },
    /// An agentless pool's release ended without an attested erase:
    /// publish `node.release.unverified` saying `reason`, in the
    /// transaction that applies `mv` (the pool's policy: `ready`, or
    /// `fail` recording `last_error`).
    ReleaseUnattested {
        mv: Move,
        reason: String,
        last_error: Option<String>,
    },
}

/// What a succeeded agentless release without a verified wipe means: its
/// erase step succeeds unattested only when the BMC offers no erase (an
/// erase that missed or failed a drive fails the step).
pub const NO_BMC_ERASE: &str = "the BMC offers no drive erase";

/// The profile id of `metal-unrescue`.
pub const UNRESCUE_PROFILE: &str = "metal-unrescue";

/// A pool's acceptance checks for adopted machines (`policy.adoptAcceptance`):
/// the least the machine must have, as its agent reported it at join. An
/// absent bound is not checked; no bound at all accepts any machine whose
/// agent joined.
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdoptAcceptance {
    /// Logical CPUs, at least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub min_cpus: Option<u64>,
    /// Memory in MiB, at least.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "minMemoryMiB"
    )]
    #[schema(minimum = 1)]
    pub min_memory_mib: Option<u64>,
    /// Disks, at least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1024)]
    pub min_disks: Option<u32>,
    /// Bytes of the largest disk, at least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub min_disk_bytes: Option<u64>,
}

/// What an adopted machine's agent reported of itself at join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineSummary {
    pub cpus: u64,
    pub memory_mib: u64,
    pub disk_bytes: Vec<u64>,
}

impl AdoptAcceptance {
    /// Whether any bound is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the bounds themselves: each set one is 1 or more.
    pub fn validate(&self) -> Result<(), String> {
        let zero = [
            ("minCpus", self.min_cpus == Some(0)),
            ("minMemoryMiB", self.min_memory_mib == Some(0)),
            ("minDisks", self.min_disks == Some(0)),
            ("minDiskBytes", self.min_disk_bytes == Some(0)),
        ];
        match zero.iter().find(|(_, z)| *z) {
            Some((name, _)) => Err(format!(
                "adoptAcceptance.{name} must be 1 or more (or absent)"
            )),
            None if self.min_disks.is_some_and(|d| d > 1024) => {
                Err("adoptAcceptance.minDisks must be at most 1024".to_owned())
            }
            // Stored as JSON numbers any reader can hold.
            None if [self.min_cpus, self.min_memory_mib, self.min_disk_bytes]
                .into_iter()
                .flatten()
                .any(|v| v > i64::MAX as u64) =>
            {
                Err(format!(
                    "adoptAcceptance bounds must be at most {}",
                    i64::MAX
                ))
            }
            None => Ok(()),
        }
    }

    /// Every bound the machine misses, in words (empty: accepted).
    pub fn misses(&self, m: &MachineSummary) -> Vec<String> {
        let mut out = vec![];
        if let Some(min) = self.min_cpus.filter(|min| m.cpus < *min) {
            out.push(format!("{} CPUs, the pool needs {min}", m.cpus));
        }
        if let Some(min) = self.min_memory_mib.filter(|min| m.memory_mib < *min) {
            out.push(format!(
                "{} MiB of memory, the pool needs {min}",
                m.memory_mib
            ));
        }
        if let Some(min) = self
            .min_disks
            .filter(|min| m.disk_bytes.len() < *min as usize)
        {
            out.push(format!(
                "{} disks, the pool needs {min}",
                m.disk_bytes.len()
            ));
        }
        let largest = m.disk_bytes.iter().copied().max().unwrap_or(0);
        if let Some(min) = self.min_disk_bytes.filter(|min| largest < *min) {
            out.push(format!(
                "a largest disk of {largest} bytes, the pool needs {min}"
            ));
        }
        out
    }
}

/// The pool's acceptance checks of an adopting node (server-side, no
/// workflow): its own OS's agent joined with role `node` and holds a live
/// certificate, and the machine it reported at join meets the pool's
/// `acceptance`. Passed: complete (→ `adopted`); missed: fail, saying what
/// (`ACCEPTANCE: …`); not joined yet: wait.
pub fn decide_adoption(
    live_node_certs: i64,
    agent_role_node: bool,
    acceptance: &AdoptAcceptance,
    machine: Option<&MachineSummary>,
) -> ReconcileAction {
    if live_node_certs <= 0 || !agent_role_node {
        return ReconcileAction::Idle;
    }
    let misses = match (acceptance.is_empty(), machine) {
        (true, _) => vec![],
        (false, None) => vec!["its agent reported no inventory at join".to_owned()],
        (false, Some(m)) => acceptance.misses(m),
    };
    if misses.is_empty() {
        ReconcileAction::Apply {
            mv: Move::Complete {
                wipe_verified: false,
            },
            last_error: None,
        }
    } else {
        ReconcileAction::Apply {
            mv: Move::Fail,
            last_error: Some(format!("ACCEPTANCE: the machine has {}", misses.join("; "))),
        }
    }
}

/// Decides what to do for a node with `facts` whose current workflow is
/// `wf`. `agentless` is the node's pool's policy for a release without an
/// attested erase when the pool is agentless (`None`: its machines run
/// `bcd`, whose release must be verified).
pub fn decide(
    facts: NodeFacts,
    wf: Option<&WorkflowSummary>,
    agentless: Option<UnattestedRelease>,
) -> ReconcileAction {
    if !facts.state.is_workflow_driven() {
        return ReconcileAction::Idle;
    }
    let Some(wf) = wf else {
        return ReconcileAction::StartWorkflow;
    };
    if let (Some(policy), ProvisionState::Releasing) = (agentless, facts.state) {
        let unattested = match wf.phase {
            WorkflowPhase::Succeeded if !wf.wipe_verified => Some(NO_BMC_ERASE.to_owned()),
            WorkflowPhase::Failed => wf
                .error
                .as_deref()
                .filter(|e| e.starts_with("UNVERIFIED_WIPE"))
                .map(str::to_owned),
            _ => None,
        };
        if let Some(reason) = unattested {
            let ready = policy == UnattestedRelease::Ready && wf.phase == WorkflowPhase::Succeeded;
            return if ready {
                ReconcileAction::ReleaseUnattested {
                    mv: Move::ReleasedUnattested,
                    reason,
                    last_error: None,
                }
            } else {
                let last_error = if reason.starts_with("UNVERIFIED_WIPE") {
                    reason.clone()
                } else {
                    format!("UNVERIFIED_WIPE: agentless release without an attested erase: {reason}; the pool's policy (unattestedRelease: failed) holds the node for an operator")
                };
                ReconcileAction::ReleaseUnattested {
                    mv: Move::Fail,
                    reason,
                    last_error: Some(last_error),
                }
            };
        }
    }
    match wf.phase {
        WorkflowPhase::Running | WorkflowPhase::FailingCleanup | WorkflowPhase::CancellingCleanup => ReconcileAction::Wait,
        WorkflowPhase::Succeeded if facts.state == ProvisionState::Rescue => {
            if wf.profile_id == UNRESCUE_PROFILE {
                ReconcileAction::Apply { mv: Move::Unrescued, last_error: None }
            } else if facts.unrescue_pending {
                ReconcileAction::StartWorkflow
            } else {
                ReconcileAction::Idle
            }
        }
        WorkflowPhase::Succeeded if facts.state == ProvisionState::Releasing && !wf.wipe_verified => ReconcileAction::Apply {
            mv: Move::Fail,
            last_error: Some(
                "UNVERIFIED_WIPE: the release's wipe result was not node-signed or a disk failed read-back".to_owned(),
            ),
        },
        WorkflowPhase::Succeeded => {
            ReconcileAction::Apply { mv: Move::Complete { wipe_verified: wf.wipe_verified }, last_error: None }
        }
        WorkflowPhase::Failed | WorkflowPhase::Cancelled => ReconcileAction::Apply {
            mv: Move::Fail,
            last_error: Some(wf.error.clone().unwrap_or_else(|| format!("{} {:?}", wf.profile_id, wf.phase).to_lowercase())),
        },
    }
}

/// Whether a look at a node without its row lock settles the pass: the
/// decision on what the look read (the node's facts, its workflow's
/// summary) is to idle or to wait, and none of what a locked pass reads
/// besides (the pool's agentless policy, a superseded workflow, an
/// adopting node's agent) can change that. The reconciler's periodic look
/// at every node skips a settled one; any other is decided again under the
/// lock, where it counts. A look that is stale by the time it settles
/// misses nothing: whatever changed a node's decision since asked for a
/// pass of its own.
pub fn settled_at_a_glance(facts: NodeFacts, wf: Option<&WorkflowSummary>) -> bool {
    // An adopting node's decision reads its agent, not its workflow.
    facts.state != ProvisionState::Adopting
        && matches!(
            decide(facts, wf, None),
            ReconcileAction::Idle | ReconcileAction::Wait
        )
}

/// The wait for a workflow the node left: a verb that moved the node out
/// of a workflow's state cancelled that workflow, whose cleanup steps may
/// still be running. The new state's workflow starts only once it ended,
/// so two workflows never drive one machine.
pub fn after_superseded(action: ReconcileAction, superseded_running: bool) -> ReconcileAction {
    match action {
        ReconcileAction::StartWorkflow if superseded_running => ReconcileAction::Wait,
        action => action,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::apply;
    use ProvisionState::*;

    /// Every node and workflow a look can read, with each agentless
    /// policy: what a look settles, the locked pass would have settled too
    /// (idle or wait), whatever the policy and a superseded workflow.
    #[test]
    fn a_look_settles_only_what_the_locked_pass_would_not_act_on() {
        let mut settled = 0;
        let mut unsettled = 0;
        for state in ProvisionState::ALL {
            for failed_from in [None, Some(Deploying)] {
                for unrescue_pending in [false, true] {
                    for rotation_pending in [false, true] {
                        let facts = NodeFacts {
                            state,
                            failed_from,
                            unrescue_pending,
                            rescue_booting: false,
                            rotation_pending,
                        };
                        let mut workflows = vec![None];
                        for phase in WorkflowPhase::ALL {
                            for verified in [false, true] {
                                for profile in ["metal-release", UNRESCUE_PROFILE] {
                                    for error in [None, Some("UNVERIFIED_WIPE: no erase")] {
                                        workflows.push(Some(WorkflowSummary {
                                            profile_id: profile.into(),
                                            phase,
                                            wipe_verified: verified,
                                            error: error.map(str::to_owned),
                                        }));
                                    }
                                }
                            }
                        }
                        for w in &workflows {
                            // An adopting node's decision reads its agent.
                            assert!(state != Adopting || !settled_at_a_glance(facts, w.as_ref()));
                            if !settled_at_a_glance(facts, w.as_ref()) {
                                unsettled += 1;
                                continue;
                            }
                            settled += 1;
                            for policy in [
                                None,
                                Some(UnattestedRelease::Failed),
                                Some(UnattestedRelease::Ready),
                            ] {
                                for superseded in [false, true] {
                                    let locked = after_superseded(
                                        decide(facts, w.as_ref(), policy),
                                        superseded,
                                    );
                                    assert!(
                                        matches!(locked, ReconcileAction::Idle | ReconcileAction::Wait),
                                        "{facts:?} {w:?} {policy:?}: settled at a glance, but the locked pass does {locked:?}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(
            settled > 0 && unsettled > 0,
            "{settled} settled, {unsettled} not"
        );
    }

    #[test]
    fn a_look_leaves_to_the_lock_what_needs_a_move_or_reads_more() {
        let facts = |state| NodeFacts {
            state,
            failed_from: None,
            unrescue_pending: false,
            rescue_booting: false,
            rotation_pending: false,
        };
        // Running: wait. Ended, or none yet: a move or a start, under the lock.
        assert!(settled_at_a_glance(
            facts(Commissioning),
            Some(&wf("metal-commission", WorkflowPhase::Running, false))
        ));
        assert!(!settled_at_a_glance(
            facts(Commissioning),
            Some(&wf("metal-commission", WorkflowPhase::Succeeded, true))
        ));
        assert!(!settled_at_a_glance(
            facts(Releasing),
            Some(&wf("metal-release", WorkflowPhase::Failed, false))
        ));
        assert!(!settled_at_a_glance(facts(Deploying), None));
        // Not workflow-driven: idle. An adopting node reads its agent.
        assert!(settled_at_a_glance(facts(Ready), None));
        assert!(!settled_at_a_glance(facts(Adopting), None));
    }

    fn wf(profile: &str, phase: WorkflowPhase, verified: bool) -> WorkflowSummary {
        WorkflowSummary {
            profile_id: profile.into(),
            phase,
            wipe_verified: verified,
            error: None,
        }
    }

    #[test]
    fn adoption_completes_only_with_a_joined_node_agent() {
        let any = AdoptAcceptance::default();
        assert_eq!(decide_adoption(0, true, &any, None), ReconcileAction::Idle);
        assert_eq!(decide_adoption(1, false, &any, None), ReconcileAction::Idle);
        let ReconcileAction::Apply { mv, .. } = decide_adoption(1, true, &any, None) else {
            panic!("expected a move");
        };
        let t = apply(NodeFacts::at(Adopting), mv).expect("legal");
        assert_eq!(t.to, Adopted);
    }

    #[test]
    fn adoption_fails_a_machine_below_the_pools_bounds_saying_which() {
        let needs = AdoptAcceptance {
            min_cpus: Some(4),
            min_memory_mib: Some(8192),
            min_disks: Some(2),
            min_disk_bytes: Some(1 << 30),
        };
        let big = MachineSummary {
            cpus: 8,
            memory_mib: 16384,
            disk_bytes: vec![1 << 40, 1 << 30],
        };
        let small = MachineSummary {
            cpus: 2,
            memory_mib: 16384,
            disk_bytes: vec![1 << 20],
        };
        assert!(matches!(
            decide_adoption(1, true, &needs, Some(&big)),
            ReconcileAction::Apply {
                mv: Move::Complete { .. },
                last_error: None
            }
        ));
        let ReconcileAction::Apply {
            mv,
            last_error: Some(e),
        } = decide_adoption(1, true, &needs, Some(&small))
        else {
            panic!("expected a failure");
        };
        assert_eq!(mv, Move::Fail);
        assert!(e.starts_with("ACCEPTANCE:"), "{e}");
        assert!(e.contains("2 CPUs, the pool needs 4"), "{e}");
        assert!(e.contains("1 disks, the pool needs 2"), "{e}");
        assert!(e.contains("largest disk of 1048576 bytes"), "{e}");
        assert!(!e.contains("memory"), "{e}");
        assert_eq!(
            apply(NodeFacts::at(Adopting), mv).expect("legal").to,
            Failed
        );
        // Bounds but no inventory: refused, not waited on forever.
        let ReconcileAction::Apply {
            last_error: Some(e),
            ..
        } = decide_adoption(1, true, &needs, None)
        else {
            panic!("expected a failure");
        };
        assert!(e.contains("no inventory"), "{e}");
        assert!(AdoptAcceptance {
            min_cpus: Some(0),
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(needs.validate().is_ok());
        assert!(AdoptAcceptance {
            min_memory_mib: Some(1 << 63),
            ..Default::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn idle_outside_workflow_states_and_start_when_none_runs() {
        for s in ProvisionState::ALL {
            let got = decide(NodeFacts::at(s), None, None);
            if s.is_workflow_driven() {
                assert_eq!(got, ReconcileAction::StartWorkflow, "{s}");
            } else {
                assert_eq!(got, ReconcileAction::Idle, "{s}");
            }
        }
        let running = wf("metal-enroll", WorkflowPhase::Running, false);
        assert_eq!(
            decide(NodeFacts::at(Enrolling), Some(&running), None),
            ReconcileAction::Wait
        );
        let cleaning = wf("metal-inspect", WorkflowPhase::CancellingCleanup, false);
        assert_eq!(
            decide(NodeFacts::at(Inspecting), Some(&cleaning), None),
            ReconcileAction::Wait
        );
    }

    #[test]
    fn the_chain_enrolling_to_ready_needs_no_caller() {
        let mut facts = NodeFacts::at(Enrolling);
        for (profile, next) in [
            ("metal-enroll", Inspecting),
            ("metal-inspect", Commissioning),
            ("metal-commission", Ready),
        ] {
            let ReconcileAction::Apply { mv, .. } = decide(
                facts,
                Some(&wf(profile, WorkflowPhase::Succeeded, false)),
                None,
            ) else {
                panic!("{profile} succeeded: apply complete");
            };
            let t = apply(facts, mv).expect("legal");
            assert_eq!(t.to, next);
            facts = NodeFacts::at(t.to);
        }
        assert_eq!(decide(facts, None, None), ReconcileAction::Idle);
    }

    #[test]
    fn a_release_reaches_ready_only_with_a_verified_wipe() {
        let ok = decide(
            NodeFacts::at(Releasing),
            Some(&wf("metal-release", WorkflowPhase::Succeeded, true)),
            None,
        );
        assert_eq!(
            ok,
            ReconcileAction::Apply {
                mv: Move::Complete {
                    wipe_verified: true
                },
                last_error: None
            }
        );
        match decide(
            NodeFacts::at(Releasing),
            Some(&wf("metal-release", WorkflowPhase::Succeeded, false)),
            None,
        ) {
            ReconcileAction::Apply {
                mv: Move::Fail,
                last_error: Some(e),
            } => assert!(e.starts_with("UNVERIFIED_WIPE")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_agentless_release_without_an_attested_erase_says_so_and_follows_the_pool() {
        let unattested = wf("metal-release-oob", WorkflowPhase::Succeeded, false);
        let at = NodeFacts::at(Releasing);
        // Policy ready: back to ready, announced.
        let ReconcileAction::ReleaseUnattested {
            mv,
            reason,
            last_error,
        } = decide(at, Some(&unattested), Some(UnattestedRelease::Ready))
        else {
            panic!("expected an unattested release");
        };
        assert_eq!(reason, NO_BMC_ERASE);
        assert_eq!(last_error, None);
        assert_eq!(apply(at, mv).expect("legal").to, Ready);
        // Policy failed: failed with UNVERIFIED_WIPE, announced.
        let ReconcileAction::ReleaseUnattested {
            mv,
            last_error: Some(e),
            ..
        } = decide(at, Some(&unattested), Some(UnattestedRelease::Failed))
        else {
            panic!("expected an unattested release");
        };
        assert!(e.starts_with("UNVERIFIED_WIPE"), "{e}");
        assert_eq!(apply(at, mv).expect("legal").to, Failed);
        // An erase that missed a drive failed the workflow: announced,
        // failed whatever the policy.
        let mut missed = wf("metal-release-oob", WorkflowPhase::Failed, false);
        missed.error = Some("UNVERIFIED_WIPE: the BMC did not erase every drive: Disk.1".into());
        let ReconcileAction::ReleaseUnattested { mv, reason, .. } =
            decide(at, Some(&missed), Some(UnattestedRelease::Ready))
        else {
            panic!("expected an unattested release");
        };
        assert_eq!(mv, Move::Fail);
        assert!(reason.contains("Disk.1"));
        // An attested erase is an ordinary release; a power-off that failed
        // is an ordinary failure: no announcement.
        let attested = wf("metal-release-oob", WorkflowPhase::Succeeded, true);
        assert!(matches!(
            decide(at, Some(&attested), Some(UnattestedRelease::Failed)),
            ReconcileAction::Apply {
                mv: Move::Complete {
                    wipe_verified: true
                },
                ..
            }
        ));
        let mut power = wf("metal-release-oob", WorkflowPhase::Failed, false);
        power.error = Some("bmc.power: 503".into());
        assert!(matches!(
            decide(at, Some(&power), Some(UnattestedRelease::Ready)),
            ReconcileAction::Apply { mv: Move::Fail, .. }
        ));
        // Only a release may go to ready unattested.
        assert!(apply(NodeFacts::at(Deploying), Move::ReleasedUnattested).is_err());
    }

    #[test]
    fn failures_and_cancels_fail_the_node_with_the_error() {
        let mut failed = wf("metal-enroll", WorkflowPhase::Failed, false);
        failed.error = Some("bmc.verify: 401 from the BMC".into());
        assert_eq!(
            decide(NodeFacts::at(Enrolling), Some(&failed), None),
            ReconcileAction::Apply {
                mv: Move::Fail,
                last_error: Some("bmc.verify: 401 from the BMC".into())
            }
        );
        assert!(matches!(
            decide(
                NodeFacts::at(Commissioning),
                Some(&wf("metal-commission", WorkflowPhase::Cancelled, false)),
                None
            ),
            ReconcileAction::Apply { mv: Move::Fail, .. }
        ));
    }

    #[test]
    fn rescue_then_unrescue() {
        let rescued = wf("metal-rescue", WorkflowPhase::Succeeded, false);
        assert_eq!(
            decide(NodeFacts::at(Rescue), Some(&rescued), None),
            ReconcileAction::Idle,
            "the rescue ramdisk stays up"
        );
        let pending = NodeFacts {
            unrescue_pending: true,
            ..NodeFacts::at(Rescue)
        };
        assert_eq!(
            decide(pending, Some(&rescued), None),
            ReconcileAction::StartWorkflow
        );
        let back = wf(UNRESCUE_PROFILE, WorkflowPhase::Succeeded, false);
        let ReconcileAction::Apply { mv, .. } = decide(pending, Some(&back), None) else {
            panic!("apply unrescue")
        };
        assert_eq!(apply(pending, mv).map(|t| t.to), Ok(Deployed));
        let broken = wf(UNRESCUE_PROFILE, WorkflowPhase::Failed, false);
        let ReconcileAction::Apply { mv, .. } = decide(pending, Some(&broken), None) else {
            panic!("apply fail")
        };
        let t = apply(pending, mv).expect("fail from rescue");
        assert_eq!((t.to, t.failed_from), (Failed, Some(Rescue)));
    }

    #[test]
    fn a_verb_that_leaves_a_workflows_state_cancels_it_and_the_next_waits() {
        use crate::table::Verb;
        // Undeploy from rescue and retire from enrolling leave the state
        // whose workflow runs; abort does too; unrescue and power do not.
        for (state, verb, leaves) in [
            (Rescue, Verb::Release, true),
            (Enrolling, Verb::Retire, true),
            (Deploying, Verb::Abort, true),
            (Rescue, Verb::Unrescue, false),
            (Deployed, Verb::Power, false),
        ] {
            let t = apply(NodeFacts::at(state), Move::Verb(verb)).expect("legal");
            assert_eq!(t.leaves_workflow(), leaves, "{verb} from {state}");
        }
        // The next state's workflow waits for the cancelled one's cleanup.
        let start = decide(NodeFacts::at(Releasing), None, None);
        assert_eq!(start, ReconcileAction::StartWorkflow);
        assert_eq!(after_superseded(start.clone(), true), ReconcileAction::Wait);
        assert_eq!(
            after_superseded(start, false),
            ReconcileAction::StartWorkflow
        );
        // Only a start waits: a running workflow's own outcome is applied.
        let done = decide(
            NodeFacts::at(Releasing),
            Some(&wf("metal-release", WorkflowPhase::Succeeded, true)),
            None,
        );
        assert_eq!(after_superseded(done.clone(), true), done);
    }
}
