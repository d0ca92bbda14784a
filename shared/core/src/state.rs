//! The thirteen provision states and the sets the spec names over them.

use serde::{Deserialize, Serialize};

/// A node's provision state. The spec's table of states, in its order.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ProvisionState {
    Adopting,
    Adopted,
    Enrolling,
    Inspecting,
    Commissioning,
    Ready,
    Deploying,
    Deployed,
    Releasing,
    Rescue,
    Failed,
    Retiring,
    Retired,
}

impl ProvisionState {
    /// Every state, in the spec's order.
    pub const ALL: [ProvisionState; 13] = [
        Self::Adopting,
        Self::Adopted,
        Self::Enrolling,
        Self::Inspecting,
        Self::Commissioning,
        Self::Ready,
        Self::Deploying,
        Self::Deployed,
        Self::Releasing,
        Self::Rescue,
        Self::Failed,
        Self::Retiring,
        Self::Retired,
    ];

    /// The lowercase name used in the API, in events and in Postgres.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Adopting => "adopting",
            Self::Adopted => "adopted",
            Self::Enrolling => "enrolling",
            Self::Inspecting => "inspecting",
            Self::Commissioning => "commissioning",
            Self::Ready => "ready",
            Self::Deploying => "deploying",
            Self::Deployed => "deployed",
            Self::Releasing => "releasing",
            Self::Rescue => "rescue",
            Self::Failed => "failed",
            Self::Retiring => "retiring",
            Self::Retired => "retired",
        }
    }

    /// Parses the lowercase name; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

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

impl std::fmt::Display for ProvisionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `schedulableProvisionStates` of the spec.
pub const SCHEDULABLE_PROVISION_STATES: [ProvisionState; 2] =
    [ProvisionState::Adopted, ProvisionState::Deployed];
