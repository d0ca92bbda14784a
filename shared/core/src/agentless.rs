//! Agentless pools (`agentMode: none`): machines that never run `bcd`. This
//! module owns the pool's two agentless settings — whether its machines run
//! the agent, and what its policy does with a release that ends without an
//! attested erase — and the verdict on a BMC drive erase: a release counts
//! as wiped only when the BMC erased every drive of the node's recorded
//! (out-of-band) inventory. Pure: the engine and the reconciler do the I/O.

use crate::workflow::{disks_unaccounted, DiskId};

crate::wire_enum! {
    /// Whether a pool's machines run the in-band agent: `bcd` or `none`
    /// (agentless: every workflow runs out of band, through the BMC).
    pub enum AgentMode "agent mode" {
        Bcd = "bcd",
        None = "none",
    }
}

// `wire_enum!` takes no `#[default]` on a variant.
#[allow(clippy::derivable_impls)]
impl Default for AgentMode {
    fn default() -> Self {
        AgentMode::Bcd
    }
}

impl AgentMode {
    /// Whether the pool's machines run no agent.
    pub const fn is_agentless(self) -> bool {
        matches!(self, AgentMode::None)
    }
}

crate::wire_enum! {
    /// What an agentless pool's policy does with a release that ended
    /// without an attested erase (the BMC offers none, or it did not cover
    /// every recorded drive): `failed` (the default) holds the node in
    /// `failed` with `UNVERIFIED_WIPE` for an operator; `ready` lets it
    /// return to `ready`. Either way `node.release.unverified` says so.
    pub enum UnattestedRelease "unattested release policy" {
        Failed = "failed",
        Ready = "ready",
    }
}

#[allow(clippy::derivable_impls)]
impl Default for UnattestedRelease {
    fn default() -> Self {
        UnattestedRelease::Failed
    }
}

/// Why a verb's chain cannot run on a pool of `agent` mode (an
/// `INVALID_CONFIG`), or `None` when it can.
pub fn refuses(agent: AgentMode, op: crate::batch::Operation) -> Option<&'static str> {
    use crate::batch::Operation::*;
    match (agent, op) {
        (AgentMode::None, Rescue | Unrescue) => Some(
            "rescue boots the ramdisk agent, and the machines of an agentless pool (agentMode none) never run one",
        ),
        _ => None,
    }
}

/// Whether a deploy profile's image can be deployed on a pool of `agent`
/// mode: an agentless pool hands the machine an installer ISO as virtual
/// media; a pool that runs bcd streams a raw or qcow2 disk image.
pub fn deploy_fits(agent: AgentMode, format: crate::deploy::ImageFormat) -> Result<(), String> {
    use crate::deploy::ImageFormat;
    match (agent, format) {
        (AgentMode::None, ImageFormat::Iso) | (AgentMode::Bcd, ImageFormat::Raw | ImageFormat::Qcow2) => Ok(()),
        (AgentMode::None, f) => Err(format!(
            "an agentless pool (agentMode none) deploys an installer ISO through the BMC's virtual media, not a {} disk image",
            format_name(f)
        )),
        (AgentMode::Bcd, f) => Err(format!(
            "a {} image is an installer for an agentless pool's virtual media; this pool's machines run bcd, which streams raw or qcow2 images",
            format_name(f)
        )),
    }
}

fn format_name(f: crate::deploy::ImageFormat) -> &'static str {
    use crate::deploy::ImageFormat;
    match f {
        ImageFormat::Raw => "raw",
        ImageFormat::Qcow2 => "qcow2",
        ImageFormat::Iso => "iso",
    }
}

/// One drive of a BMC erase's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErasedDrive<'a> {
    pub id: &'a str,
    pub serial: &'a str,
    pub erased: bool,
}

/// Why a BMC erase is not an attested erase.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnattestedErase {
    #[error("the BMC offers no drive erase")]
    NotOffered,
    #[error("the BMC erased no drive")]
    NoDrive,
    #[error("a drive of the node's recorded inventory is missing from the BMC's erase: {}", .0.join(", "))]
    DriveMissing(Vec<String>),
    #[error("the BMC did not erase every drive: {}", .0.join(", "))]
    NotErased(Vec<String>),
}

/// Whether a BMC's erase report attests the node's disks were erased: the
/// BMC offered an erase, reported at least one drive, every drive of the
/// recorded inventory (`recorded`, by serial else by id) is among them, and
/// every one it reported erased. The BMC is the attester of an agentless
/// machine: nothing on the host signs.
pub fn erase_verdict(
    offered: bool,
    recorded: &[DiskId<'_>],
    reported: &[ErasedDrive<'_>],
) -> Result<(), UnattestedErase> {
    if !offered {
        return Err(UnattestedErase::NotOffered);
    }
    if reported.is_empty() {
        return Err(UnattestedErase::NoDrive);
    }
    let ids: Vec<DiskId<'_>> = reported
        .iter()
        .map(|d| DiskId {
            name: d.id,
            serial: d.serial,
        })
        .collect();
    let missing = disks_unaccounted(recorded, &ids);
    if !missing.is_empty() {
        return Err(UnattestedErase::DriveMissing(missing));
    }
    let failed: Vec<String> = reported
        .iter()
        .filter(|d| !d.erased)
        .map(|d| d.id.to_owned())
        .collect();
    if !failed.is_empty() {
        return Err(UnattestedErase::NotErased(failed));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d<'a>(id: &'a str, serial: &'a str, erased: bool) -> ErasedDrive<'a> {
        ErasedDrive { id, serial, erased }
    }

    #[test]
    fn only_an_offered_erase_of_every_recorded_drive_attests() {
        let recorded = [
            DiskId {
                name: "Disk.0",
                serial: "S0",
            },
            DiskId {
                name: "Disk.1",
                serial: "",
            },
        ];
        let both = [d("Disk.0", "S0", true), d("Disk.1", "S9", true)];
        assert_eq!(erase_verdict(true, &recorded, &both), Ok(()));
        assert_eq!(
            erase_verdict(false, &recorded, &both),
            Err(UnattestedErase::NotOffered)
        );
        assert_eq!(
            erase_verdict(true, &recorded, &[]),
            Err(UnattestedErase::NoDrive)
        );
        // The recorded S0 swapped for another serial under the same id.
        let swapped = [d("Disk.0", "S7", true), d("Disk.1", "", true)];
        assert_eq!(
            erase_verdict(true, &recorded, &swapped),
            Err(UnattestedErase::DriveMissing(vec!["Disk.0 (S0)".into()]))
        );
        let one_failed = [d("Disk.0", "S0", true), d("Disk.1", "", false)];
        assert_eq!(
            erase_verdict(true, &recorded, &one_failed),
            Err(UnattestedErase::NotErased(vec!["Disk.1".into()]))
        );
        // No recorded inventory: the report alone decides.
        assert_eq!(erase_verdict(true, &[], &both), Ok(()));
    }

    #[test]
    fn rescue_and_disk_images_do_not_fit_an_agentless_pool() {
        use crate::batch::Operation;
        use crate::deploy::ImageFormat;
        for op in Operation::ALL {
            let refused = refuses(AgentMode::None, op).is_some();
            assert_eq!(
                refused,
                matches!(op, Operation::Rescue | Operation::Unrescue),
                "{op}"
            );
            assert!(refuses(AgentMode::Bcd, op).is_none(), "{op}");
        }
        assert!(deploy_fits(AgentMode::None, ImageFormat::Iso).is_ok());
        assert!(deploy_fits(AgentMode::None, ImageFormat::Raw).is_err());
        assert!(deploy_fits(AgentMode::Bcd, ImageFormat::Qcow2).is_ok());
        assert!(deploy_fits(AgentMode::Bcd, ImageFormat::Iso).is_err());
    }

    #[test]
    fn the_modes_read_their_wire_names_and_default_safe() {
        assert_eq!(AgentMode::parse("none"), Some(AgentMode::None));
        assert!(AgentMode::parse("ssh").is_none());
        assert_eq!(AgentMode::default(), AgentMode::Bcd);
        assert_eq!(UnattestedRelease::default(), UnattestedRelease::Failed);
        assert_eq!(
            UnattestedRelease::parse("ready"),
            Some(UnattestedRelease::Ready)
        );
    }
}
