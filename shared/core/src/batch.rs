//! Destructive batches as data: the operations a batch may name, the
//! states each one's chain runs through, which destructive command kinds
//! that chain may send (derived from the workflow profiles themselves, so
//! the table cannot drift from what the engine does), the batch states,
//! and the limits of a bulk request.
//!
//! Every edge (the BMC service, the site, `bcd`) asks [`allows`] before it
//! runs a destructive command under a batch: an approved `inspect` batch
//! cannot carry a `deploy.image`, and a `power-off` leaf carries nothing
//! but a `bmc.power` that powers off.

use crate::agentless::AgentMode;
use crate::workflow::{self, Profile};
use crate::{PowerAction, ProvisionState, WipeMode};

crate::wire_enum! {
    /// What a batch's approvers allow: a verb's whole chain (for one node,
    /// or for every node of a bulk request) or one BMC command.
    pub enum Operation "batch operation" {
        /// `metal.enroll`: verifying, inspection and commissioning.
        Enroll = "enroll",
        Manage = "manage",
        Inspect = "inspect",
        Provide = "provide",
        Deploy = "deploy",
        Undeploy = "undeploy",
        Rescue = "rescue",
        Unrescue = "unrescue",
        Recover = "recover",
        Retire = "retire",
        /// `metal.power` with `on`: one `bmc.power` command that powers on.
        PowerOn = "power-on",
        /// `metal.power` with `off`.
        PowerOff = "power-off",
        /// `metal.power` with `cycle`.
        PowerCycle = "power-cycle",
        /// `metal.power` with `reset`.
        PowerReset = "power-reset",
        /// A one-leaf `metal.power` batch made before the action was
        /// bound into the operation: read, never authorizing (it covers
        /// no command), so an approval of one action can never run another.
        Power = "power",
        /// `metal.rotateCredentials`: one `bmc.rotateCredentials` command.
        RotateCredentials = "rotateCredentials",
    }
}

crate::wire_enum! {
    /// Where a batch is.
    pub enum BatchState "batch state" {
        AwaitingApproval = "awaiting-approval",
        Approved = "approved",
        Running = "running",
        Finished = "finished",
        Expired = "expired",
        Rejected = "rejected",
        Cancelled = "cancelled",
    }
}

impl BatchState {
    /// Whether its destructive commands may be sent now.
    pub const fn authorizes(self) -> bool {
        matches!(self, Self::Approved | Self::Running)
    }

    /// Whether nothing changes it any more.
    pub const fn is_final(self) -> bool {
        matches!(
            self,
            Self::Finished | Self::Expired | Self::Rejected | Self::Cancelled
        )
    }
}

crate::wire_enum! {
    /// Where one node of a bulk request is.
    pub enum BulkNodeState "bulk node state" {
        /// Admitted, not started yet (waits for approval or its wave).
        Queued = "queued",
        /// Refused at admission or when its wave came (with a code).
        Refused = "refused",
        /// Its verb was applied; its chain runs.
        Started = "started",
        Succeeded = "succeeded",
        Failed = "failed",
        /// The bulk was cancelled before its wave came.
        Cancelled = "cancelled",
    }
}

impl BulkNodeState {
    /// Whether the node is done with (counts toward the bulk's end).
    pub const fn is_final(self) -> bool {
        !matches!(self, Self::Queued | Self::Started)
    }
}

crate::wire_enum! {
    /// The verbs `metal.bulk` applies.
    pub enum BulkVerb "bulk verb" {
        Manage = "manage",
        Inspect = "inspect",
        Provide = "provide",
        Undeploy = "undeploy",
        Rescue = "rescue",
        Retire = "retire",
    }
}

impl BulkVerb {
    /// The batch operation it names.
    pub const fn operation(self) -> Operation {
        match self {
            Self::Manage => Operation::Manage,
            Self::Inspect => Operation::Inspect,
            Self::Provide => Operation::Provide,
            Self::Undeploy => Operation::Undeploy,
            Self::Rescue => Operation::Rescue,
            Self::Retire => Operation::Retire,
        }
    }
}

/// The most nodes one bulk request names.
pub const BULK_MAX_NODES: usize = 10_000;

impl Operation {
    /// The verb of the state table this operation applies (none for
    /// `enroll`, which creates the node).
    pub const fn verb(self) -> Option<crate::Verb> {
        use crate::Verb;
        Some(match self {
            Self::Enroll => return None,
            Self::Manage => Verb::Manage,
            Self::Inspect => Verb::Inspect,
            Self::Provide => Verb::Provide,
            Self::Deploy => Verb::Deploy,
            Self::Undeploy => Verb::Release,
            Self::Rescue => Verb::Rescue,
            Self::Unrescue => Verb::Unrescue,
            Self::Recover => Verb::Recover,
            Self::Retire => Verb::Retire,
            Self::Power | Self::PowerOn | Self::PowerOff | Self::PowerCycle | Self::PowerReset => {
                Verb::Power
            }
            Self::RotateCredentials => Verb::RotateCredentials,
        })
    }

    /// The operation of a `metal.power` with `action`.
    pub const fn for_power(action: PowerAction) -> Self {
        match action {
            PowerAction::On => Self::PowerOn,
            PowerAction::Off => Self::PowerOff,
            PowerAction::Cycle => Self::PowerCycle,
            PowerAction::Reset => Self::PowerReset,
        }
    }

    /// The power action a one-leaf power batch allows (none for every
    /// other operation, and for the unbound legacy `power`).
    pub const fn power_action(self) -> Option<PowerAction> {
        match self {
            Self::PowerOn => Some(PowerAction::On),
            Self::PowerOff => Some(PowerAction::Off),
            Self::PowerCycle => Some(PowerAction::Cycle),
            Self::PowerReset => Some(PowerAction::Reset),
            _ => None,
        }
    }

    /// The operation a verb's batch names; `None` for `abort`, which
    /// creates no batch (its cleanup runs under the batch it stops), and
    /// for `power`, whose batch names its action ([`Operation::for_power`]).
    pub const fn for_verb(verb: crate::Verb) -> Option<Self> {
        use crate::Verb;
        Some(match verb {
            Verb::Manage => Self::Manage,
            Verb::Inspect => Self::Inspect,
            Verb::Provide => Self::Provide,
            Verb::Deploy => Self::Deploy,
            Verb::Release => Self::Undeploy,
            Verb::Rescue => Self::Rescue,
            Verb::Unrescue => Self::Unrescue,
            Verb::Recover => Self::Recover,
            Verb::Retire => Self::Retire,
            Verb::RotateCredentials => Self::RotateCredentials,
            Verb::Power | Verb::Abort => return None,
        })
    }

    /// The workflow-driven states the operation's chain runs through.
    pub const fn chain(self) -> &'static [ProvisionState] {
        use ProvisionState::*;
        match self {
            Self::Enroll | Self::Manage => &[Enrolling, Inspecting, Commissioning],
            Self::Inspect => &[Inspecting, Commissioning],
            Self::Provide => &[Commissioning],
            Self::Deploy => &[Deploying],
            Self::Undeploy => &[Releasing],
            Self::Rescue | Self::Unrescue => &[Rescue],
            Self::Recover => &[Enrolling, Inspecting, Commissioning, Releasing, Retiring],
            Self::Retire => &[Retiring],
            Self::Power
            | Self::PowerOn
            | Self::PowerOff
            | Self::PowerCycle
            | Self::PowerReset
            | Self::RotateCredentials => &[],
        }
    }

    /// Where a node's chain ends well (a bulk counts the node succeeded
    /// there) — the first state out of the chain that is not a workflow's.
    pub const fn settles_in(self) -> &'static [ProvisionState] {
        use ProvisionState::*;
        match self {
            Self::Enroll | Self::Manage | Self::Inspect | Self::Provide | Self::Undeploy => {
                &[Ready]
            }
            Self::Deploy | Self::Unrescue => &[Deployed],
            Self::Rescue => &[Rescue],
            Self::Recover => &[Ready, Deployed, Retired],
            Self::Retire => &[Retired],
            Self::Power
            | Self::PowerOn
            | Self::PowerOff
            | Self::PowerCycle
            | Self::PowerReset
            | Self::RotateCredentials => &[],
        }
    }

    /// Whether the operation's leaf names a wipe mode (the release's).
    pub const fn takes_wipe(self) -> bool {
        matches!(self, Self::Undeploy)
    }
}

/// The profiles a workflow-driven state may run on a pool of `agent`
/// mode, with every wipe mode.
pub(crate) fn profiles_of_mode(state: ProvisionState, agent: AgentMode) -> Vec<Profile> {
    if state == ProvisionState::Deploying {
        return vec![workflow::tenant_deploy_for("any", 1, agent)];
    }
    let mut out = vec![];
    for wipe in WipeMode::ALL {
        let dedicated = (state == ProvisionState::Releasing).then(|| match agent {
            AgentMode::Bcd => workflow::metal_release_dedicated(wipe),
            AgentMode::None => workflow::metal_release_oob_dedicated(wipe),
        });
        for p in [false, true]
            .into_iter()
            .filter_map(|unrescue| workflow::metal_profile_for(state, unrescue, wipe, agent))
            .chain(dedicated)
        {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// The profiles a workflow-driven state may run on any pool, with an
/// adopted machine's retire beside the others.
pub(crate) fn profiles_of(state: ProvisionState) -> Vec<Profile> {
    let adopted = (state == ProvisionState::Retiring).then(workflow::metal_retire_adopted);
    AgentMode::ALL
        .iter()
        .flat_map(|a| profiles_of_mode(state, *a))
        .chain(adopted)
        .collect()
}

/// The destructive command kinds (wire names) the operation's chain may
/// send: its states' profiles' destructive steps, main and cleanup.
pub fn destructive_kinds(op: Operation) -> Vec<&'static str> {
    let mut kinds: Vec<&'static str> = match op {
        Operation::PowerOn
        | Operation::PowerOff
        | Operation::PowerCycle
        | Operation::PowerReset => {
            vec!["bmc.power"]
        }
        Operation::Power => vec![],
        Operation::RotateCredentials => vec!["bmc.rotateCredentials"],
        _ => op
            .chain()
            .iter()
            .flat_map(|s| profiles_of(*s))
            .flat_map(|p| p.steps.into_iter().chain(p.cleanup))
            .filter(|s| s.kind.destructive())
            .map(|s| s.kind.command_kind())
            .collect(),
    };
    kinds.sort_unstable();
    kinds.dedup();
    kinds
}

/// Whether a batch of `op` (with the leaf's `wipe`) allows a destructive
/// command of `kind` whose wipe mode, for `disk.wipe`, is `command_wipe`
/// and whose action, for `bmc.power`, is `command_power`. A leaf that
/// names a wipe mode allows a wipe of that mode only; a power batch allows
/// its own action only.
pub fn allows(
    op: Operation,
    leaf_wipe: Option<WipeMode>,
    kind: &str,
    command_wipe: Option<WipeMode>,
    command_power: Option<PowerAction>,
) -> Result<(), String> {
    if !destructive_kinds(op).contains(&kind) {
        return Err(format!("a {op} batch does not cover {kind}"));
    }
    if let Some(approved) = op.power_action() {
        if command_power != Some(approved) {
            return Err(format!(
                "the batch approved power {approved}, the command asks for {}",
                command_power.map_or("no action", |a| a.as_str())
            ));
        }
    }
    match (leaf_wipe, command_wipe) {
        (Some(l), Some(c)) if op.chain().contains(&ProvisionState::Releasing) && l != c => Err(
            format!("the batch approved a {l} wipe, the command asks for {c}"),
        ),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_covers_what_its_chain_sends_and_nothing_else() {
        let deploy = destructive_kinds(Operation::Deploy);
        assert!(deploy.contains(&"deploy.image"));
        assert!(deploy.contains(&"bmc.power"));
        let inspect = destructive_kinds(Operation::Inspect);
        assert!(!inspect.contains(&"deploy.image"));
        // Commissioning wipes.
        assert!(inspect.contains(&"disk.wipe"));
        let undeploy = destructive_kinds(Operation::Undeploy);
        assert!(undeploy.contains(&"disk.wipe"));
        assert!(!undeploy.contains(&"deploy.image"));
        // A dedicated teardown rotates the BMC password; an agentless
        // release erases through the BMC; an agentless deploy inserts media.
        assert!(undeploy.contains(&"bmc.rotateCredentials"));
        assert!(undeploy.contains(&"bmc.diskErase"));
        assert!(deploy.contains(&"bmc.virtualMedia"));
        assert!(!inspect.contains(&"bmc.rotateCredentials"));
        assert!(!deploy.contains(&"bmc.rotateCredentials"));
        assert_eq!(destructive_kinds(Operation::PowerOff), vec!["bmc.power"]);
        // An adopted machine's retire wipes and powers off through its own
        // OS; nothing else sends those.
        let retire = destructive_kinds(Operation::Retire);
        assert!(retire.contains(&"node.wipe") && retire.contains(&"node.powerOff"));
        assert!(!undeploy.contains(&"node.wipe") && !inspect.contains(&"node.powerOff"));
        assert!(allows(Operation::PowerOff, None, "disk.wipe", None, None).is_err());
        assert!(allows(Operation::Inspect, None, "deploy.image", None, None).is_err());
        assert!(allows(Operation::Deploy, None, "deploy.image", None, None).is_ok());
        // Unrescue boots the disk; rescue the ramdisk.
        assert!(destructive_kinds(Operation::Unrescue).contains(&"bmc.bootDevice"));
        // Every operation that runs a chain covers the power-off of its
        // cleanup, so an abort can always stop the machine.
        for op in Operation::ALL {
            if !op.chain().is_empty() {
                assert!(destructive_kinds(op).contains(&"bmc.power"), "{op}");
            }
        }
    }

    #[test]
    fn an_undeploy_leaf_binds_the_wipe_mode() {
        let q = Some(WipeMode::Quick);
        assert!(allows(Operation::Undeploy, q, "disk.wipe", q, None).is_ok());
        let e = allows(
            Operation::Undeploy,
            q,
            "disk.wipe",
            Some(WipeMode::SecureErase),
            None,
        )
        .expect_err("another mode");
        assert!(e.contains("quick"), "{e}");
    }

    #[test]
    fn a_power_leaf_binds_the_action() {
        for approved in PowerAction::ALL {
            let op = Operation::for_power(approved);
            assert_eq!(op.power_action(), Some(approved));
            assert_eq!(op.verb(), Some(crate::Verb::Power));
            for asked in PowerAction::ALL {
                let r = allows(op, None, "bmc.power", None, Some(asked));
                assert_eq!(r.is_ok(), asked == approved, "{op} running {asked}: {r:?}");
            }
            let e = allows(op, None, "bmc.power", None, None).expect_err("no action");
            assert!(e.contains(approved.as_str()), "{e}");
        }
        // The unbound batch of an older control plane allows nothing.
        assert!(destructive_kinds(Operation::Power).is_empty());
        assert!(allows(
            Operation::Power,
            None,
            "bmc.power",
            None,
            Some(PowerAction::On)
        )
        .is_err());
        // A chain's own power commands are not bound to one action.
        assert!(allows(
            Operation::Deploy,
            None,
            "bmc.power",
            None,
            Some(PowerAction::Off)
        )
        .is_ok());
    }

    #[test]
    fn every_verb_but_abort_names_an_operation_and_back() {
        for v in crate::Verb::ALL {
            match Operation::for_verb(v) {
                Some(op) => assert_eq!(op.verb(), Some(v)),
                None => assert!(matches!(v, crate::Verb::Abort | crate::Verb::Power), "{v}"),
            }
        }
        for v in BulkVerb::ALL {
            assert!(!v.operation().settles_in().is_empty());
        }
        assert!(BatchState::Approved.authorizes() && !BatchState::AwaitingApproval.authorizes());
    }
}
