//! The one provision state table: every verb's legal-from set and target,
//! the recover table by `failedFrom`, and the reconciler's internal moves.
//!
//! [`apply`] is a pure function from the facts of a node and a move to the
//! transition it makes, or the error the spec names. The API, the reconciler
//! and the tests all call it; nothing else decides whether a move is legal.

use crate::state::ProvisionState::{self, *};

crate::wire_enum! {
    /// An operator verb of the metal API group (the spec's "Verb" column;
    /// `power` is the power-axis method, which never moves the provision
    /// state). The name is the one the API and the audit trail spell.
    pub enum Verb "verb" {
        Manage = "manage",
        Inspect = "inspect",
        Provide = "provide",
        Deploy = "deploy",
        /// `metal.undeploy`.
        Release = "release",
        Rescue = "rescue",
        Unrescue = "unrescue",
        Abort = "abort",
        Recover = "recover",
        Retire = "retire",
        Power = "power",
        /// `metal.rotateCredentials`: a two-phase BMC password rotation; the
        /// provision state is unchanged.
        RotateCredentials = "rotateCredentials",
    }
}

impl Verb {
    /// The states this verb is legal from, exactly as the spec's table says.
    /// `recover` is further decided by `failedFrom` (see [`recover_target`]).
    pub fn legal_from(self) -> &'static [ProvisionState] {
        match self {
            Verb::Manage | Verb::Inspect | Verb::Provide | Verb::Deploy => &[Ready],
            Verb::Release => &[Deployed, Rescue],
            Verb::Rescue => &[Deployed],
            Verb::Unrescue => &[Rescue],
            Verb::Abort => &[Enrolling, Inspecting, Commissioning, Deploying, Releasing],
            Verb::Recover => &[Failed],
            Verb::Retire => &[Adopting, Adopted, Enrolling, Ready, Failed],
            Verb::Power => &[
                Adopting, Adopted, Enrolling, Ready, Deployed, Rescue, Failed, Retiring, Retired,
            ],
            // Only where no workflow is using the BMC with the current
            // password: a rotation under a running workflow would fail its
            // next BMC step.
            Verb::RotateCredentials => &[Adopted, Ready, Deployed, Failed],
        }
    }
}

/// `metal.recover` target by `failedFrom`: the last stable point, never `ready`.
pub const fn recover_target(failed_from: ProvisionState) -> Option<ProvisionState> {
    match failed_from {
        Enrolling | Inspecting | Commissioning => Some(Enrolling),
        Deploying | Releasing => Some(Releasing),
        Rescue => Some(Deployed),
        Retiring => Some(Retiring),
        _ => None,
    }
}

/// The state a succeeded workflow moves a node to (`complete`). `releasing`
/// additionally needs a verified wipe; `rescue` stays put (the rescue ramdisk
/// is up) until `unrescue` succeeds.
const fn complete_target(from: ProvisionState) -> Option<ProvisionState> {
    match from {
        Adopting => Some(Adopted),
        Enrolling => Some(Inspecting),
        Inspecting => Some(Commissioning),
        Commissioning => Some(Ready),
        Deploying => Some(Deployed),
        Releasing => Some(Ready),
        Rescue => Some(Rescue),
        Retiring => Some(Retired),
        _ => None,
    }
}

/// A move: an operator verb, or one of the reconciler's internal moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// An operator verb from the API.
    Verb(Verb),
    /// The state's workflow succeeded. `wipe_verified` says whether every
    /// disk's wipe result was node-signed and passed read-back; it matters
    /// only for `releasing`.
    Complete { wipe_verified: bool },
    /// The state's workflow failed or was cancelled.
    Fail,
    /// The `metal-unrescue` workflow succeeded: the installed OS is back.
    Unrescued,
    /// An agentless pool's release succeeded without an attested erase,
    /// and the pool's policy (`unattestedRelease: ready`) lets the node
    /// return to `ready` all the same. Legal from `releasing` only.
    ReleasedUnattested,
}

/// What the table needs to know of a node to decide a move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFacts {
    pub state: ProvisionState,
    pub failed_from: Option<ProvisionState>,
    /// `metal.unrescue` was accepted and its workflow has not ended.
    pub unrescue_pending: bool,
    /// The `metal-rescue` workflow (booting the rescue ramdisk) still runs.
    pub rescue_booting: bool,
    /// A BMC password rotation is in progress or unresolved: the record
    /// holds two passwords, and a verb that would use the BMC waits.
    pub rotation_pending: bool,
}

impl NodeFacts {
    /// Facts of a node in `state` with nothing pending.
    pub const fn at(state: ProvisionState) -> Self {
        Self {
            state,
            failed_from: None,
            unrescue_pending: false,
            rescue_booting: false,
            rotation_pending: false,
        }
    }
}

/// What a legal move does to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: ProvisionState,
    pub to: ProvisionState,
    /// The node's `failedFrom` after the move (set only in `failed`).
    pub failed_from: Option<ProvisionState>,
    /// `Some(true)` turns maintenance on; `None` leaves it alone.
    pub maintenance: Option<bool>,
    /// The node's unrescue-pending flag after the move.
    pub unrescue_pending: bool,
    /// Whether the node row changes (version bump, events). A `power` call or
    /// a repeated `unrescue` changes nothing.
    pub changed: bool,
    /// The event kind the move publishes, if any.
    pub event: Option<MoveEvent>,
}

/// The event a move publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveEvent {
    /// `node.provision.<state>` of the target state.
    Provision(ProvisionState),
    /// `node.provision.unrescuing`.
    Unrescuing,
}

/// Why a move is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MoveError {
    #[error("{mv} is not legal from provision state {from}")]
    InvalidState { from: ProvisionState, mv: MoveName },
    #[error("the rescue ramdisk is still booting; unrescue once it is up")]
    RescueBooting,
    #[error("a BMC password rotation is pending; {0} waits for it (rotateCredentials again resumes an unresolved one)")]
    RotationPending(MoveName),
    #[error("the release's wipe was not verified (unsigned result or a disk failed read-back)")]
    UnverifiedWipe,
}

impl MoveError {
    /// The spec's error code for this refusal.
    pub const fn code(&self) -> crate::ErrorCode {
        match self {
            MoveError::InvalidState { .. } => crate::ErrorCode::InvalidState,
            MoveError::RescueBooting | MoveError::RotationPending(_) => crate::ErrorCode::Conflict,
            MoveError::UnverifiedWipe => crate::ErrorCode::UnverifiedWipe,
        }
    }
}

/// A printable name of a move, for errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoveName(&'static str);

impl std::fmt::Display for MoveName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl Move {
    /// The move's name, for errors and logs.
    pub const fn name(self) -> MoveName {
        match self {
            Move::Verb(v) => MoveName(v.as_str()),
            Move::Complete { .. } => MoveName("complete"),
            Move::Fail => MoveName("fail"),
            Move::Unrescued => MoveName("unrescue (workflow succeeded)"),
            Move::ReleasedUnattested => MoveName("complete (unattested release)"),
        }
    }
}

fn moved(facts: NodeFacts, to: ProvisionState) -> Transition {
    Transition {
        from: facts.state,
        to,
        failed_from: None,
        maintenance: None,
        unrescue_pending: false,
        changed: true,
        event: Some(MoveEvent::Provision(to)),
    }
}

fn unchanged(facts: NodeFacts) -> Transition {
    Transition {
        from: facts.state,
        to: facts.state,
        failed_from: facts.failed_from,
        maintenance: None,
        unrescue_pending: facts.unrescue_pending,
        changed: false,
        event: None,
    }
}

fn to_failed(facts: NodeFacts) -> Transition {
    Transition {
        failed_from: Some(facts.state),
        maintenance: Some(true),
        ..moved(facts, Failed)
    }
}

/// Decides `mv` for a node with `facts`: the transition it makes, or why not.
pub fn apply(facts: NodeFacts, mv: Move) -> Result<Transition, MoveError> {
    let from = facts.state;
    let invalid = MoveError::InvalidState {
        from,
        mv: mv.name(),
    };
    match mv {
        Move::Verb(verb) => {
            if !verb.legal_from().contains(&from) {
                return Err(invalid);
            }
            // Every other verb's steps would carry a password the BMC may
            // no longer take; abort and retire need no BMC login to be legal.
            if facts.rotation_pending
                && !matches!(verb, Verb::Abort | Verb::Retire | Verb::RotateCredentials)
            {
                return Err(MoveError::RotationPending(Move::Verb(verb).name()));
            }
            Ok(match verb {
                Verb::Manage => moved(facts, Enrolling),
                Verb::Inspect => moved(facts, Inspecting),
                Verb::Provide => moved(facts, Commissioning),
                Verb::Deploy => moved(facts, Deploying),
                Verb::Release => moved(facts, Releasing),
                Verb::Rescue => moved(facts, Rescue),
                Verb::Retire => moved(facts, Retiring),
                Verb::Abort => to_failed(facts),
                Verb::Power | Verb::RotateCredentials => unchanged(facts),
                Verb::Recover => {
                    let target = facts.failed_from.and_then(recover_target).ok_or(invalid)?;
                    moved(facts, target)
                }
                Verb::Unrescue => {
                    if facts.unrescue_pending {
                        unchanged(facts)
                    } else if facts.rescue_booting {
                        return Err(MoveError::RescueBooting);
                    } else {
                        Transition {
                            unrescue_pending: true,
                            event: Some(MoveEvent::Unrescuing),
                            ..unchanged(facts)
                        }
                        .with_change()
                    }
                }
            })
        }
        Move::Complete { wipe_verified } => {
            let to = complete_target(from).ok_or(invalid)?;
            if from == Releasing && !wipe_verified {
                return Err(MoveError::UnverifiedWipe);
            }
            if from == Rescue {
                // The rescue ramdisk is up; the node stays in `rescue`.
                return Ok(unchanged(facts));
            }
            Ok(moved(facts, to))
        }
        Move::ReleasedUnattested => {
            if from == Releasing {
                Ok(moved(facts, Ready))
            } else {
                Err(invalid)
            }
        }
        Move::Fail => {
            if from.is_workflow_driven() || from == Adopting {
                Ok(to_failed(facts))
            } else {
                Err(invalid)
            }
        }
        Move::Unrescued => {
            if from == Rescue && facts.unrescue_pending {
                Ok(moved(facts, Deployed))
            } else {
                Err(invalid)
            }
        }
    }
}

impl Transition {
    const fn with_change(mut self) -> Self {
        self.changed = true;
        self
    }

    /// Whether the move takes the node out of the state whose workflow it
    /// points at. That workflow is cancelled, exactly as `abort` cancels
    /// it: the running step stops and the cleanup steps run (undeploy from
    /// `rescue`, retire from `enrolling`, abort itself). A move that keeps
    /// the state (`unrescue`, `power`) leaves the workflow alone.
    pub fn leaves_workflow(&self) -> bool {
        self.to != self.from
    }
}

#[cfg(test)]
mod tests;
