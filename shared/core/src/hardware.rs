//! Hardware profiles as data: a name bound to one driver per concern
//! (`power`, `management`, `boot`, `deploy`, `inspect`). A node's effective
//! profile is its enroll override, else its pool's, else the site's
//! default; the node keeps a snapshot of the resolved bindings, and every
//! workflow step resolves its driver by the concern it serves. A concern
//! bound to `none` cannot be served: a verb whose chain needs it is
//! `INVALID_CONFIG` before anything changes. Pure: the profiles come from
//! configuration.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::agentless::AgentMode;
use crate::batch::Operation;
use crate::node::BmcDriver;
use crate::workflow::{Profile, StepKind};

crate::wire_enum! {
/// What a driver does for a node.
pub enum Concern "concern" {
    Power = "power",
    Management = "management",
    Boot = "boot",
    Deploy = "deploy",
    Inspect = "inspect",
}}

crate::wire_enum! {
/// How a machine boots the control plane's ramdisk: the site's proxy DHCP,
/// TFTP and iPXE scripts; `none`: it cannot be network-booted.
pub enum BootDriver "boot driver" {
    Ipxe = "ipxe",
    None = "none",
}}

crate::wire_enum! {
/// How an image reaches the disk: the ramdisk agent streams it.
pub enum DeployDriver "deploy driver" {
    ImageStream = "image-stream",
    None = "none",
}}

crate::wire_enum! {
/// Who reports the in-band inventory: the ramdisk agent.
pub enum InspectDriver "inspect driver" {
    Agent = "agent",
    None = "none",
}}

/// One driver per concern.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Drivers {
    /// Power state and actions (`bmc.power`, power reads).
    pub power: BmcDriver,
    /// Everything else the BMC does: verify, out-of-band inspection, the
    /// boot device, the password.
    pub management: BmcDriver,
    pub boot: BootDriver,
    pub deploy: DeployDriver,
    pub inspect: InspectDriver,
}

impl Drivers {
    /// Every concern bound to the node's one BMC driver (a node enrolled
    /// before profiles were snapshotted).
    pub const fn of_bmc(bmc: BmcDriver) -> Self {
        Drivers {
            power: bmc,
            management: bmc,
            boot: BootDriver::Ipxe,
            deploy: DeployDriver::ImageStream,
            inspect: InspectDriver::Agent,
        }
    }

    /// The driver bound to `concern`, by its wire name.
    pub fn name_of(&self, concern: Concern) -> &str {
        match concern {
            Concern::Power => self.power.as_str(),
            Concern::Management => self.management.as_str(),
            Concern::Boot => self.boot.as_str(),
            Concern::Deploy => self.deploy.as_str(),
            Concern::Inspect => self.inspect.as_str(),
        }
    }

    /// Whether `concern` is bound to a driver (not `none`).
    pub fn serves(&self, concern: Concern) -> bool {
        self.name_of(concern) != "none"
    }

    /// The BMC driver a `bmc.*` step uses: `power` for power, `management`
    /// for the rest.
    pub fn bmc_for(&self, kind: &StepKind) -> BmcDriver {
        match kind {
            StepKind::BmcPower { .. } | StepKind::BmcPowerOff => self.power,
            _ => self.management,
        }
    }
}

/// A named hardware profile.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    #[serde(default)]
    pub description: String,
    pub drivers: Drivers,
}

impl StepKind {
    /// The concern whose driver runs the step; `None` for a step the
    /// control plane runs alone (storing MACs, revoking an identity).
    pub const fn concern(&self) -> Option<Concern> {
        Some(match self {
            StepKind::BmcPower { .. } | StepKind::BmcPowerOff => Concern::Power,
            StepKind::BmcVerify
            | StepKind::BmcInspect
            | StepKind::BmcBootPxe { .. }
            | StepKind::BmcBootDisk { .. }
            | StepKind::BmcBootCd { .. }
            | StepKind::BmcErase { .. }
            | StepKind::RotateBmcPassword
            | StepKind::BmcFirmware { .. }
            | StepKind::MediaInsert
            | StepKind::MediaEject => Concern::Management,
            StepKind::WaitPowerOff => Concern::Power,
            // The ramdisk: its boot entry, its join, what runs in it.
            StepKind::BootEntrySet
            | StepKind::BootEntryClear
            | StepKind::WaitRamdiskJoin
            | StepKind::RetiredEnsureRamdisk
            | StepKind::DiagDcgm { .. }
            | StepKind::DiskWipe { .. } => Concern::Boot,
            StepKind::Inventory => Concern::Inspect,
            StepKind::DeployImage | StepKind::WaitOsJoin { .. } => Concern::Deploy,
            StepKind::StoreMacs
            | StepKind::StoreInventory
            | StepKind::RevokeIdentity
            | StepKind::ForgetBmcCredentials
            | StepKind::WaitOsBack { .. }
            // An adopted machine's own OS: no driver is involved.
            | StepKind::NodeWipe { .. }
            | StepKind::NodePowerOff => return None,
        })
    }
}

/// The first concern `profiles` need that `drivers` leaves unbound.
pub fn unserved(drivers: &Drivers, profiles: &[Profile]) -> Option<Concern> {
    profiles
        .iter()
        .flat_map(|p| p.steps.iter().chain(&p.cleanup))
        .filter_map(|s| s.kind.concern())
        .find(|c| !drivers.serves(*c))
}

/// The first concern the chain `op` starts needs and `drivers` leaves
/// unbound: the verb cannot be served (`INVALID_CONFIG`).
pub fn unserved_by_chain(drivers: &Drivers, op: Operation, agent: AgentMode) -> Option<Concern> {
    let profiles: Vec<Profile> = op
        .chain()
        .iter()
        .flat_map(|s| crate::batch::profiles_of_mode(*s, agent))
        .collect();
    unserved(drivers, &profiles)
}

/// Why a profile name does not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("hardware profile {0:?} is not configured (hardware_profiles)")]
    Unknown(String),
    #[error("hardware profile name {0:?} must be 1-64 characters of a-z, 0-9, '.', '-' or '_'")]
    BadName(String),
}

/// The configured profiles, by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Profiles {
    by_name: BTreeMap<String, HardwareProfile>,
}

impl Profiles {
    /// The profiles this project ships, over which configuration adds or
    /// replaces by name: `gpu-redfish` (the spec's example), `redfish`,
    /// `ipmi`, and `sim` (a simulated site's machines).
    pub fn builtin() -> Self {
        let mut p = Profiles::default();
        let std = |bmc: BmcDriver, description: &str| HardwareProfile {
            description: description.into(),
            drivers: Drivers::of_bmc(bmc),
        };
        p.by_name.insert(
            "gpu-redfish".into(),
            std(
                BmcDriver::Redfish,
                "Redfish BMC, iPXE boot, image streaming from the ramdisk",
            ),
        );
        p.by_name.insert(
            "redfish".into(),
            std(
                BmcDriver::Redfish,
                "Redfish BMC, iPXE boot, image streaming from the ramdisk",
            ),
        );
        p.by_name.insert(
            "ipmi".into(),
            std(
                BmcDriver::Ipmi,
                "IPMI BMC, iPXE boot, image streaming from the ramdisk",
            ),
        );
        p.by_name.insert(
            "sim".into(),
            std(
                BmcDriver::Sim,
                "A simulated site's machines: simulated BMC, boot and ramdisk",
            ),
        );
        p
    }

    /// Adds or replaces `name`.
    pub fn insert(&mut self, name: &str, profile: HardwareProfile) -> Result<(), ProfileError> {
        if !crate::text::is_profile_id(name) {
            return Err(ProfileError::BadName(name.into()));
        }
        self.by_name.insert(name.into(), profile);
        Ok(())
    }

    /// The profile called `name`.
    pub fn get(&self, name: &str) -> Result<&HardwareProfile, ProfileError> {
        self.by_name
            .get(name)
            .ok_or_else(|| ProfileError::Unknown(name.into()))
    }

    /// Every profile, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &HardwareProfile)> {
        self.by_name.iter().map(|(n, p)| (n.as_str(), p))
    }

    /// A node's effective profile: its override, else its pool's, else
    /// `default`; the first one named is the one used, and it must exist.
    pub fn effective<'a>(
        &'a self,
        node_override: Option<&'a str>,
        pool: Option<&'a str>,
        default: &'a str,
    ) -> Result<(&'a str, &'a HardwareProfile), ProfileError> {
        let name = node_override.or(pool).unwrap_or(default);
        Ok((name, self.get(name)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profiles() -> Profiles {
        let mut p = Profiles::builtin();
        p.insert(
            "no-pxe",
            HardwareProfile {
                description: String::new(),
                drivers: Drivers {
                    boot: BootDriver::None,
                    ..Drivers::of_bmc(BmcDriver::Redfish)
                },
            },
        )
        .expect("name");
        p.insert(
            "split",
            HardwareProfile {
                description: String::new(),
                drivers: Drivers {
                    power: BmcDriver::Ipmi,
                    ..Drivers::of_bmc(BmcDriver::Redfish)
                },
            },
        )
        .expect("name");
        p
    }

    #[test]
    fn the_effective_profile_is_the_override_else_the_pools_else_the_default() {
        let p = profiles();
        // (override, pool, default) -> effective
        type Case<'a> = (
            Option<&'a str>,
            Option<&'a str>,
            &'a str,
            Result<&'a str, ProfileError>,
        );
        let cases: [Case; 6] = [
            (Some("ipmi"), Some("gpu-redfish"), "redfish", Ok("ipmi")),
            (None, Some("gpu-redfish"), "redfish", Ok("gpu-redfish")),
            (None, None, "redfish", Ok("redfish")),
            (Some("split"), None, "sim", Ok("split")),
            // The first name given is the one used: an unknown override is
            // an error, never a fall-through to the pool's.
            (
                Some("nope"),
                Some("gpu-redfish"),
                "redfish",
                Err(ProfileError::Unknown("nope".into())),
            ),
            (
                None,
                Some("gone"),
                "redfish",
                Err(ProfileError::Unknown("gone".into())),
            ),
        ];
        for (o, pool, d, want) in cases {
            let got = p.effective(o, pool, d).map(|(n, _)| n);
            assert_eq!(got, want, "{o:?} {pool:?} {d:?}");
        }
    }

    #[test]
    fn each_step_resolves_its_driver_by_concern() {
        let p = profiles();
        let split = p.get("split").expect("split").drivers;
        assert_eq!(split.bmc_for(&StepKind::BmcPowerOff), BmcDriver::Ipmi);
        assert_eq!(
            split.bmc_for(&StepKind::BmcPower {
                action: crate::PowerAction::On
            }),
            BmcDriver::Ipmi
        );
        assert_eq!(split.bmc_for(&StepKind::BmcVerify), BmcDriver::Redfish);
        assert_eq!(
            split.bmc_for(&StepKind::BmcBootPxe { persistent: false }),
            BmcDriver::Redfish
        );
        assert_eq!(StepKind::DeployImage.concern(), Some(Concern::Deploy));
        assert_eq!(StepKind::Inventory.concern(), Some(Concern::Inspect));
        assert_eq!(StepKind::StoreMacs.concern(), None);
    }

    #[test]
    fn a_chain_that_needs_an_unbound_concern_cannot_be_served() {
        let p = profiles();
        let no_pxe = p.get("no-pxe").expect("no-pxe").drivers;
        // Enrolling runs on into inspection, which boots the ramdisk.
        assert_eq!(
            unserved_by_chain(&no_pxe, Operation::Manage, AgentMode::Bcd),
            Some(Concern::Boot)
        );
        assert_eq!(
            unserved_by_chain(&no_pxe, Operation::Undeploy, AgentMode::Bcd),
            Some(Concern::Boot)
        );
        let full = p.get("gpu-redfish").expect("gpu").drivers;
        for op in Operation::ALL {
            assert_eq!(unserved_by_chain(&full, op, AgentMode::Bcd), None, "{op}");
        }
        // An agentless pool never boots the ramdisk: a BMC-only profile
        // serves every chain there, and none where machines run bcd.
        for op in Operation::ALL {
            assert_eq!(
                unserved_by_chain(&no_pxe, op, AgentMode::None),
                None,
                "{op}"
            );
        }
        assert!(Profiles::builtin()
            .insert("Bad Name", p.get("sim").expect("sim").clone())
            .is_err());
    }

    #[test]
    fn profiles_parse_from_configuration_and_refuse_unknown_drivers() {
        let ok: HardwareProfile = serde_json::from_value(serde_json::json!({
            "description": "lab",
            "drivers": {"power": "ipmi", "management": "ipmi", "boot": "ipxe",
                        "deploy": "image-stream", "inspect": "agent"}
        }))
        .expect("parses");
        assert_eq!(ok.drivers.power, BmcDriver::Ipmi);
        for bad in [
            serde_json::json!({"drivers": {"power": "amt", "management": "ipmi", "boot": "ipxe", "deploy": "image-stream", "inspect": "agent"}}),
            serde_json::json!({"drivers": {"power": "ipmi", "management": "ipmi", "boot": "ipxe", "deploy": "image-stream"}}),
            serde_json::json!({"drivers": {"power": "ipmi", "management": "ipmi", "boot": "ipxe", "deploy": "image-stream", "inspect": "agent", "x": 1}}),
        ] {
            assert!(
                serde_json::from_value::<HardwareProfile>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
