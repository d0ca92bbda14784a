//! The thirteen provision states and the sets the spec names over them.

crate::wire_enum! {
    /// A node's provision state. The spec's table of states, in its order;
    /// the lowercase name is what the API, events and Postgres use.
    pub enum ProvisionState "provision state" {
        Adopting = "adopting",
        Adopted = "adopted",
        Enrolling = "enrolling",
        Inspecting = "inspecting",
        Commissioning = "commissioning",
        Ready = "ready",
        Deploying = "deploying",
        Deployed = "deployed",
        Releasing = "releasing",
        Rescue = "rescue",
        Failed = "failed",
        Retiring = "retiring",
        Retired = "retired",
    }
}

impl ProvisionState {
    /// `schedulableProvisionStates`: only these nodes can be scheduled.
    pub const fn is_schedulable(self) -> bool {
        matches!(self, Self::Adopted | Self::Deployed)
    }

    /// States whose work is a metal workflow the reconciler must keep running.
    pub const fn is_workflow_driven(self) -> bool {
        matches!(
            self,
            Self::Enrolling
                | Self::Inspecting
                | Self::Commissioning
                | Self::Deploying
                | Self::Releasing
                | Self::Retiring
                | Self::Rescue
        )
    }

    /// `retired` is terminal: no move leaves it.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Retired)
    }
}

/// `schedulableProvisionStates` of the spec.
pub const SCHEDULABLE_PROVISION_STATES: [ProvisionState; 2] =
    [ProvisionState::Adopted, ProvisionState::Deployed];

/// Which agent identities of a node a provision-state transition ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentitiesEnded {
    /// Nothing (no transition).
    Nothing,
    /// The ramdisk's: every state that boots a ramdisk boots it anew and
    /// waits for a new join, so a transition ends the ramdisk session of
    /// the state it leaves.
    Ramdisk,
    /// Every identity, in a new epoch: release and undeploy end the
    /// tenant's OS, retire ends the machine's service.
    All,
}

/// What the transition `from` → `to` ends: entering `releasing`,
/// `retiring` or `retired` ends every identity; any other transition ends
/// the ramdisk's. The installed OS's and an adopted machine's identities
/// live on through rescue and back. An `adopted` machine (no BMC) is
/// retired by its own OS, which wipes its disks and powers it off: its
/// identity lives on into `retiring` (the retire revokes it once the
/// machine is off) and ends in `retired`.
pub fn identities_ended(
    from: ProvisionState,
    to: ProvisionState,
    adopted: bool,
) -> IdentitiesEnded {
    use ProvisionState::*;
    match to {
        Retiring if adopted && from != to => IdentitiesEnded::Ramdisk,
        Releasing | Retiring | Retired => IdentitiesEnded::All,
        _ if from == to => IdentitiesEnded::Nothing,
        _ => IdentitiesEnded::Ramdisk,
    }
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    #[test]
    fn release_undeploy_and_retire_end_every_identity_other_moves_the_ramdisks() {
        use ProvisionState::*;
        assert_eq!(
            identities_ended(Deployed, Releasing, false),
            IdentitiesEnded::All
        );
        assert_eq!(
            identities_ended(Rescue, Releasing, false),
            IdentitiesEnded::All
        );
        assert_eq!(
            identities_ended(Ready, Retiring, false),
            IdentitiesEnded::All
        );
        assert_eq!(
            identities_ended(Retiring, Retired, false),
            IdentitiesEnded::All
        );
        assert_eq!(
            identities_ended(Deploying, Deployed, false),
            IdentitiesEnded::Ramdisk
        );
        assert_eq!(
            identities_ended(Rescue, Deployed, false),
            IdentitiesEnded::Ramdisk
        );
        assert_eq!(
            identities_ended(Inspecting, Commissioning, false),
            IdentitiesEnded::Ramdisk
        );
        assert_eq!(
            identities_ended(Rescue, Rescue, false),
            IdentitiesEnded::Nothing
        );
        // An adopted machine's own OS wipes it in `retiring`.
        assert_eq!(
            identities_ended(Adopted, Retiring, true),
            IdentitiesEnded::Ramdisk
        );
        assert_eq!(
            identities_ended(Failed, Retiring, true),
            IdentitiesEnded::Ramdisk
        );
        assert_eq!(
            identities_ended(Retiring, Retired, true),
            IdentitiesEnded::All
        );
        assert_eq!(
            identities_ended(Adopted, Retiring, false),
            IdentitiesEnded::All
        );
    }
}
