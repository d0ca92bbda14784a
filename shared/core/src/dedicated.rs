//! Dedicated-root leases: a whole machine leased to a tenant with root (a
//! deploy of a profile whose role is `dedicated`), and the teardown that
//! takes it back. This module owns the lease's states, how a provision
//! move changes a node's open lease, the pool's admission of a new lease,
//! and the wipe a dedicated node's release must use (never `quick`: the
//! tenant was root). Pure: `bcm-metal` records the changes.

use crate::deploy::DeployRole;
use crate::state::ProvisionState;
use crate::{ErrorCode, WipeMode};

/// The sealed-secret purpose of a dedicated node's teardown password: the
/// BMC password its release rotates to (its tenant was root and could reach
/// the BMC through the host interface). Recorded before anything is sent,
/// kept until the rotation committed, so a retry resumes with it.
pub const TEARDOWN_PASSWORD_PURPOSE: &str = "bmc-teardown-password";

crate::wire_enum! {
    /// Where a dedicated-root lease is.
    pub enum LeaseState "lease state" {
        /// A dedicated deploy was admitted; the tenant's OS is not up yet.
        Leased = "leased",
        /// The tenant's OS runs on the node (the deploy finished).
        Bound = "bound",
        /// The teardown (release or retire) started.
        Ending = "ending",
        /// The teardown finished: the machine is back.
        Ended = "ended",
        /// Asked for and refused by the pool's policy or capacity (the
        /// reason is recorded); no node changed.
        Refused = "refused",
    }
}

impl LeaseState {
    /// Whether the lease still holds its node (one open lease per node).
    pub const fn is_open(self) -> bool {
        matches!(self, Self::Leased | Self::Bound | Self::Ending)
    }

    /// The state's event, `node.tenant-root.<state>`; `None` for `ended`
    /// (the provision event that returned the node says it).
    pub fn event_type(self) -> Option<String> {
        match self {
            Self::Ended => None,
            s => Some(format!("node.tenant-root.{}", s.as_str())),
        }
    }
}

/// What a committed provision move does to a node's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseChange {
    /// Open a lease in `leased`.
    Open,
    /// Move the open lease to this state.
    To(LeaseState),
}

/// How a move `from` → `to` of a node whose deploy profile snapshot is
/// `dedicated` (or not) changes its lease `open` (its open lease's state,
/// if any). Level-safe: the same move twice changes nothing the second
/// time.
pub fn on_move(
    from: ProvisionState,
    to: ProvisionState,
    dedicated: bool,
    open: Option<LeaseState>,
) -> Option<LeaseChange> {
    use ProvisionState::*;
    match (to, open) {
        (Deploying, None) if dedicated && from != Deploying => Some(LeaseChange::Open),
        (Deployed, Some(LeaseState::Leased)) if from == Deploying => {
            Some(LeaseChange::To(LeaseState::Bound))
        }
        (Releasing | Retiring, Some(LeaseState::Leased | LeaseState::Bound)) => {
            Some(LeaseChange::To(LeaseState::Ending))
        }
        (Ready | Retired, Some(_)) => Some(LeaseChange::To(LeaseState::Ended)),
        _ => None,
    }
}

/// Whether a pool admits one more dedicated-root lease: `max` is its
/// policy (`maxDedicatedLeases`; absent: no limit), `held` the open leases
/// it holds now. A refusal says why, with its code: the pool's policy
/// admits none (`INVALID_CONFIG`), or it is full (`CONFLICT`).
pub fn admit(pool: &str, max: Option<u32>, held: u64) -> Result<(), (ErrorCode, String)> {
    match max {
        Some(0) => Err((
            ErrorCode::InvalidConfig,
            format!("pool {pool} admits no dedicated-root leases (maxDedicatedLeases 0)"),
        )),
        Some(m) if held >= u64::from(m) => Err((
            ErrorCode::Conflict,
            format!(
                "pool {pool} holds {held} dedicated-root leases, its maximum (maxDedicatedLeases {m})"
            ),
        )),
        _ => Ok(()),
    }
}

/// The wipe of a release: the request's, else the pool's. A dedicated
/// node's tenant was root, so its release is always a full erase: a
/// request for `quick` is refused, and a pool whose release wipe is `quick`
/// gets `secure-erase` for it.
pub fn release_wipe(
    role: Option<DeployRole>,
    asked: Option<WipeMode>,
    pool: WipeMode,
) -> Result<WipeMode, String> {
    let dedicated = role == Some(DeployRole::Dedicated);
    match (dedicated, asked) {
        (true, Some(WipeMode::Quick)) => Err(
            "a dedicated-root node's release is a full erase of every disk (its tenant was root): wipe quick is refused; choose secure-erase or crypto-erase"
                .to_owned(),
        ),
        (true, None) if pool == WipeMode::Quick => Ok(WipeMode::SecureErase),
        (_, Some(w)) => Ok(w),
        (_, None) => Ok(pool),
    }
}

/// Firmware versions as the BMC reports them: what commissioning records,
/// and what a dedicated teardown compares with it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Firmware {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<String>,
}

/// What changed between the firmware recorded at commissioning and what
/// the BMC reports now, one entry per component (`bios SIM-1.0 → SIM-1.1`;
/// a version recorded and no longer readable counts as changed). A root
/// tenant may have flashed the machine: a change fails the teardown for an
/// operator to look at.
pub fn firmware_changes(recorded: &Firmware, now: &Firmware) -> Vec<String> {
    [
        ("bios", &recorded.bios, &now.bios),
        ("bmc", &recorded.bmc, &now.bmc),
    ]
    .into_iter()
    .filter_map(|(what, was, is)| match (was, is) {
        (Some(was), Some(is)) if was != is => Some(format!("{what} {was} → {is}")),
        (Some(was), None) => Some(format!("{what} {was} → unreadable")),
        _ => None,
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProvisionState::*;

    #[test]
    fn a_lease_goes_leased_bound_ending_ended_with_the_node() {
        let mut open = None;
        let mut seen = vec![];
        for (from, to) in [
            (Ready, Deploying),
            (Deploying, Deployed),
            (Deployed, Releasing),
            (Releasing, Ready),
        ] {
            match on_move(from, to, true, open) {
                Some(LeaseChange::Open) => open = Some(LeaseState::Leased),
                Some(LeaseChange::To(s)) => open = Some(s),
                None => panic!("{from} → {to} changes the lease"),
            }
            seen.push(open.map(LeaseState::as_str).unwrap_or_default());
        }
        assert_eq!(seen, ["leased", "bound", "ending", "ended"]);
    }

    #[test]
    fn host_deploys_and_repeats_change_nothing() {
        assert_eq!(on_move(Ready, Deploying, false, None), None);
        assert_eq!(on_move(Deploying, Deployed, false, None), None);
        assert_eq!(on_move(Deployed, Releasing, false, None), None);
        // The same move again: the lease already moved.
        assert_eq!(
            on_move(Deploying, Deployed, true, Some(LeaseState::Bound)),
            None
        );
        assert_eq!(
            on_move(Deployed, Releasing, true, Some(LeaseState::Ending)),
            None
        );
        // A failed deploy keeps the lease until the node is released.
        assert_eq!(
            on_move(Deploying, Failed, true, Some(LeaseState::Leased)),
            None
        );
        assert_eq!(
            on_move(Failed, Releasing, true, Some(LeaseState::Leased)),
            Some(LeaseChange::To(LeaseState::Ending))
        );
        assert_eq!(
            on_move(Deployed, Retiring, true, Some(LeaseState::Bound)),
            Some(LeaseChange::To(LeaseState::Ending))
        );
    }

    #[test]
    fn the_pool_admits_up_to_its_maximum_and_says_why_not() {
        assert!(admit("p", None, 1_000).is_ok());
        assert!(admit("p", Some(2), 1).is_ok());
        let (code, full) = admit("p", Some(2), 2).expect_err("full");
        assert_eq!(code, ErrorCode::Conflict);
        assert!(
            full.contains("holds 2") && full.contains("maxDedicatedLeases 2"),
            "{full}"
        );
        let (code, none) = admit("p", Some(0), 0).expect_err("none");
        assert_eq!(code, ErrorCode::InvalidConfig);
        assert!(none.contains("admits no"), "{none}");
    }

    #[test]
    fn firmware_changes_name_each_component() {
        let at = |b: Option<&str>, m: Option<&str>| Firmware {
            bios: b.map(str::to_owned),
            bmc: m.map(str::to_owned),
        };
        let recorded = at(Some("1.0"), Some("2.0"));
        assert!(firmware_changes(&recorded, &recorded).is_empty());
        assert_eq!(
            firmware_changes(&recorded, &at(Some("1.1"), Some("2.0"))),
            ["bios 1.0 → 1.1"]
        );
        assert_eq!(
            firmware_changes(&recorded, &at(Some("1.0"), None)),
            ["bmc 2.0 → unreadable"]
        );
        // Nothing recorded for a component: nothing to compare.
        assert!(firmware_changes(&at(None, None), &at(Some("9"), Some("9"))).is_empty());
    }

    #[test]
    fn a_dedicated_release_is_never_quick() {
        let d = Some(DeployRole::Dedicated);
        assert!(release_wipe(d, Some(WipeMode::Quick), WipeMode::Quick).is_err());
        assert_eq!(
            release_wipe(d, None, WipeMode::Quick),
            Ok(WipeMode::SecureErase)
        );
        assert_eq!(
            release_wipe(d, None, WipeMode::CryptoErase),
            Ok(WipeMode::CryptoErase)
        );
        assert_eq!(
            release_wipe(
                Some(DeployRole::Host),
                Some(WipeMode::Quick),
                WipeMode::SecureErase
            ),
            Ok(WipeMode::Quick)
        );
        assert_eq!(
            release_wipe(None, None, WipeMode::Quick),
            Ok(WipeMode::Quick)
        );
        assert_eq!(
            LeaseState::Bound.event_type().as_deref(),
            Some("node.tenant-root.bound")
        );
        assert_eq!(LeaseState::Ended.event_type(), None);
    }
}
