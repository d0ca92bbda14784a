//! The table test over every (state, verb) pair, written from the spec's
//! tables by hand, and the property tests of the state machine.

use super::*;
use proptest::prelude::*;

/// The expected outcome of each verb from each state, as the spec's tables
/// say. Columns: manage, inspect, provide, deploy, release (undeploy),
/// rescue, unrescue, abort, recover, retire, power.
/// `-` is INVALID_STATE, `=` is legal and unchanged, `u` is legal, unchanged
/// state, unrescue started; `R` is the recover table (tested below); any
/// other entry is the target state.
const EXPECTED: [(&str, [&str; 11]); 13] = [
    (
        "adopting",
        ["-", "-", "-", "-", "-", "-", "-", "-", "-", "retiring", "="],
    ),
    (
        "adopted",
        ["-", "-", "-", "-", "-", "-", "-", "-", "-", "retiring", "="],
    ),
    (
        "enrolling",
        [
            "-", "-", "-", "-", "-", "-", "-", "failed", "-", "retiring", "=",
        ],
    ),
    (
        "inspecting",
        ["-", "-", "-", "-", "-", "-", "-", "failed", "-", "-", "-"],
    ),
    (
        "commissioning",
        ["-", "-", "-", "-", "-", "-", "-", "failed", "-", "-", "-"],
    ),
    (
        "ready",
        [
            "enrolling",
            "inspecting",
            "commissioning",
            "deploying",
            "-",
            "-",
            "-",
            "-",
            "-",
            "retiring",
            "=",
        ],
    ),
    (
        "deploying",
        ["-", "-", "-", "-", "-", "-", "-", "failed", "-", "-", "-"],
    ),
    (
        "deployed",
        [
            "-",
            "-",
            "-",
            "-",
            "releasing",
            "rescue",
            "-",
            "-",
            "-",
            "-",
            "=",
        ],
    ),
    (
        "releasing",
        ["-", "-", "-", "-", "-", "-", "-", "failed", "-", "-", "-"],
    ),
    (
        "rescue",
        [
            "-",
            "-",
            "-",
            "-",
            "releasing",
            "-",
            "u",
            "-",
            "-",
            "-",
            "=",
        ],
    ),
    (
        "failed",
        ["-", "-", "-", "-", "-", "-", "-", "-", "R", "retiring", "="],
    ),
    (
        "retiring",
        ["-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "="],
    ),
    (
        "retired",
        ["-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "="],
    ),
];

fn state(s: &str) -> ProvisionState {
    ProvisionState::parse(s).unwrap_or_else(|| panic!("bad state {s} in the expected table"))
}

#[test]
fn every_state_verb_pair_matches_the_spec() {
    assert_eq!(EXPECTED.len(), ProvisionState::ALL.len());
    let mut checked = 0;
    for (name, row) in EXPECTED {
        let from = state(name);
        for (verb, expected) in Verb::ALL.into_iter().zip(row) {
            let facts = NodeFacts {
                failed_from: (from == Failed).then_some(Enrolling),
                ..NodeFacts::at(from)
            };
            let got = apply(facts, Move::Verb(verb));
            match expected {
                "-" => {
                    let err = got.expect_err(&format!("{verb:?} from {from} must be refused"));
                    assert_eq!(
                        err.code(),
                        crate::ErrorCode::InvalidState,
                        "{verb:?} from {from}"
                    );
                }
                "=" => {
                    let t = got.unwrap_or_else(|e| panic!("{verb:?} from {from}: {e}"));
                    assert_eq!(
                        (t.to, t.changed, t.event),
                        (from, false, None),
                        "{verb:?} from {from}"
                    );
                }
                "u" => {
                    let t = got.unwrap_or_else(|e| panic!("{verb:?} from {from}: {e}"));
                    assert_eq!(t.to, from);
                    assert!(t.changed && t.unrescue_pending);
                    assert_eq!(t.event, Some(MoveEvent::Unrescuing));
                }
                "R" => {
                    let t = got.unwrap_or_else(|e| panic!("{verb:?} from {from}: {e}"));
                    assert_eq!(t.to, Enrolling, "recover from enrolling goes to enrolling");
                }
                target => {
                    let t = got.unwrap_or_else(|e| panic!("{verb:?} from {from}: {e}"));
                    assert_eq!(t.to, state(target), "{verb:?} from {from}");
                    assert!(t.changed);
                    assert_eq!(t.event, Some(MoveEvent::Provision(state(target))));
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 13 * 11);
}

#[test]
fn recover_follows_the_table_for_every_failed_from() {
    let expected = [
        (Enrolling, Some(Enrolling)),
        (Inspecting, Some(Enrolling)),
        (Commissioning, Some(Enrolling)),
        (Deploying, Some(Releasing)),
        (Releasing, Some(Releasing)),
        (Rescue, Some(Deployed)),
        (Retiring, Some(Retiring)),
    ];
    for failed_from in ProvisionState::ALL {
        let want = expected
            .iter()
            .find(|(f, _)| *f == failed_from)
            .and_then(|(_, t)| *t);
        let facts = NodeFacts {
            failed_from: Some(failed_from),
            ..NodeFacts::at(Failed)
        };
        let got = apply(facts, Move::Verb(Verb::Recover));
        match want {
            Some(to) => {
                let t = got.unwrap_or_else(|e| panic!("recover from {failed_from}: {e}"));
                assert_eq!(t.to, to);
                assert_eq!(t.failed_from, None, "recover clears failedFrom");
                assert_eq!(t.maintenance, None, "recover leaves maintenance on");
            }
            None => assert!(got.is_err(), "recover with failedFrom {failed_from}"),
        }
    }
    // Never straight to ready.
    assert!(expected.iter().all(|(_, t)| *t != Some(Ready)));
}

#[test]
fn abort_and_fail_record_failed_from_and_turn_maintenance_on() {
    for from in Verb::Abort.legal_from() {
        let t = apply(NodeFacts::at(*from), Move::Verb(Verb::Abort)).expect("abort is legal");
        assert_eq!(
            (t.to, t.failed_from, t.maintenance),
            (Failed, Some(*from), Some(true))
        );
    }
    for from in ProvisionState::ALL
        .into_iter()
        .filter(|s| s.is_workflow_driven())
    {
        let t = apply(NodeFacts::at(from), Move::Fail).expect("fail is legal");
        assert_eq!(
            (t.to, t.failed_from, t.maintenance),
            (Failed, Some(from), Some(true))
        );
    }
    for from in [Ready, Deployed, Failed, Retired, Adopted] {
        assert!(
            apply(NodeFacts::at(from), Move::Fail).is_err(),
            "fail from {from}"
        );
    }
}

#[test]
fn complete_chains_the_spec_moves() {
    let ok = |from, verified| {
        apply(
            NodeFacts::at(from),
            Move::Complete {
                wipe_verified: verified,
            },
        )
    };
    assert_eq!(ok(Enrolling, false).map(|t| t.to), Ok(Inspecting));
    assert_eq!(ok(Inspecting, false).map(|t| t.to), Ok(Commissioning));
    assert_eq!(ok(Commissioning, false).map(|t| t.to), Ok(Ready));
    assert_eq!(ok(Deploying, false).map(|t| t.to), Ok(Deployed));
    assert_eq!(ok(Releasing, true).map(|t| t.to), Ok(Ready));
    assert_eq!(ok(Releasing, false), Err(MoveError::UnverifiedWipe));
    assert_eq!(ok(Retiring, false).map(|t| t.to), Ok(Retired));
    assert_eq!(
        ok(Rescue, false).map(|t| (t.to, t.changed)),
        Ok((Rescue, false))
    );
    for from in [Ready, Deployed, Failed, Retired] {
        assert!(ok(from, true).is_err(), "complete from {from}");
    }
}

#[test]
fn unrescue_rules() {
    let booting = NodeFacts {
        rescue_booting: true,
        ..NodeFacts::at(Rescue)
    };
    assert_eq!(
        apply(booting, Move::Verb(Verb::Unrescue)),
        Err(MoveError::RescueBooting)
    );
    assert_eq!(MoveError::RescueBooting.code(), crate::ErrorCode::Conflict);
    let pending = NodeFacts {
        unrescue_pending: true,
        ..NodeFacts::at(Rescue)
    };
    let again = apply(pending, Move::Verb(Verb::Unrescue)).expect("second unrescue is legal");
    assert!(
        !again.changed,
        "a second unrescue returns the node unchanged"
    );
    assert_eq!(apply(pending, Move::Unrescued).map(|t| t.to), Ok(Deployed));
    assert!(apply(NodeFacts::at(Rescue), Move::Unrescued).is_err());
    assert!(apply(NodeFacts::at(Deployed), Move::Verb(Verb::Unrescue)).is_err());
}

fn any_move() -> impl Strategy<Value = Move> {
    prop_oneof![
        proptest::sample::select(Verb::ALL.to_vec()).prop_map(Move::Verb),
        any::<bool>().prop_map(|wipe_verified| Move::Complete { wipe_verified }),
        Just(Move::Fail),
        Just(Move::Unrescued),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// No sequence of moves reaches `ready` except by a completed
    /// commissioning or a completed release whose wipe was verified, and
    /// `retired` is terminal.
    #[test]
    fn ready_only_through_commissioning_or_verified_release(
        start in proptest::sample::select(vec![Enrolling, Adopting]),
        moves in proptest::collection::vec((any_move(), any::<bool>()), 1..80),
    ) {
        let mut facts = NodeFacts::at(start);
        for (mv, booting) in moves {
            facts.rescue_booting = booting;
            let Ok(t) = apply(facts, mv) else { continue };
            if facts.state == Retired {
                prop_assert_eq!(t.to, Retired, "retired is terminal");
                prop_assert!(!t.changed);
            }
            if t.to == Ready && facts.state != Ready {
                let via_commissioning = facts.state == Commissioning
                    && matches!(mv, Move::Complete { .. });
                let via_verified_release = facts.state == Releasing
                    && mv == Move::Complete { wipe_verified: true };
                prop_assert!(via_commissioning || via_verified_release,
                    "reached ready from {} by {:?}", facts.state, mv);
            }
            facts = NodeFacts {
                state: t.to,
                failed_from: t.failed_from,
                unrescue_pending: t.unrescue_pending,
                rotation_pending: false,
                rescue_booting: false,
            };
            prop_assert_eq!(facts.failed_from.is_some(), facts.state == Failed);
        }
    }
}

#[test]
fn a_pending_rotation_holds_back_every_verb_but_abort_retire_and_rotation() {
    for from in ProvisionState::ALL {
        for verb in Verb::ALL {
            let facts = NodeFacts {
                rotation_pending: true,
                failed_from: (from == Failed).then_some(Enrolling),
                ..NodeFacts::at(from)
            };
            let free = apply(
                NodeFacts {
                    rotation_pending: false,
                    ..facts
                },
                Move::Verb(verb),
            );
            let held = apply(facts, Move::Verb(verb));
            match (free, verb) {
                (Err(e), _) => assert_eq!(held, Err(e), "{verb:?} from {from}"),
                (Ok(t), Verb::Abort | Verb::Retire | Verb::RotateCredentials) => {
                    assert_eq!(held, Ok(t), "{verb:?} from {from}")
                }
                (Ok(_), _) => assert!(
                    matches!(held, Err(MoveError::RotationPending(_))),
                    "{verb:?} from {from} must wait for the rotation: {held:?}"
                ),
            }
        }
    }
}
