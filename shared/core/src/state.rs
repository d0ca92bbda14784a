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
