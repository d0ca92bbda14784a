//! What each command kind reports when it ran: one typed output per kind.
//!
//! A result does not repeat its kind on the agent's wire (the command row
//! knows it), so an output is decoded with the kind it answers
//! ([`Output::decode`]). Every executor — the bmc and boot services, `bcd`
//! and the simulated site — builds these types, so the engine reads the
//! same fields whoever answered. `sim: true` marks an answer of the
//! simulated site.

use bcm_core::{PowerAction, PowerState, WipeMode};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::commands::{BootDevice, CommandKind, SealedValue};
use crate::{is_false, ContractError};

/// `bmc.verify`: the credentials log in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Verified {
    /// `RedfishVersion`, or the IPMI version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// The managed system (Redfish `Id`, or `0` for IPMI's one chassis).
    pub system_id: String,
    pub power: PowerState,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// `bmc.inspect`: what the BMC knows of the machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OobInventory {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<f64>,
    /// The host's NIC MACs, which become the node's PXE MACs (IPMI sees
    /// none: then the MACs given at enroll stand), the ones it boots from
    /// first.
    pub macs: Vec<String>,
    /// The drives the BMC reports (Redfish `Storage`; IPMI sees none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drives: Vec<OobDrive>,
    /// The system firmware's version (Redfish `BiosVersion`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios_version: Option<String>,
    /// The BMC's own firmware version (its manager's `FirmwareVersion`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc_firmware: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// One drive as the BMC reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OobDrive {
    /// The drive's resource id on the BMC.
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// `HDD` or `SSD`, as the BMC says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// `SATA`, `SAS`, `NVMe`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
}

/// `bmc.power`: the action taken and the power state read back after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PowerChanged {
    pub action: PowerAction,
    pub power: PowerState,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// `bmc.powerStatus`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PowerRead {
    pub power: PowerState,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// `bmc.bootDevice`: the override as asked and as read back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootOverride {
    pub device: BootDevice,
    pub persistent: bool,
    /// The BMC's name of the target (Redfish `BootSourceOverrideTarget`).
    pub target: String,
    pub enabled_requested: String,
    /// What the BMC reports; some (sushy-tools) always say `Continuous`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled_read_back: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode_read_back: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// `bmc.virtualMedia`: the virtual CD as read back after the action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MediaReport {
    /// The slot used (its Redfish resource path, or the sim's name).
    pub slot: String,
    pub inserted: bool,
    /// The image the slot holds, as read back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// One drive of a BMC erase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DriveErase {
    /// The drive's resource id on the BMC.
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// The BMC reported the erase done.
    pub erased: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `bmc.diskErase`: whether the BMC offers an erase, and each drive's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskEraseReport {
    /// The BMC offers a drive erase (Redfish `#Drive.SecureErase` on its
    /// drives). When it does not, nothing was sent and `drives` is empty.
    pub offered: bool,
    #[serde(default)]
    pub drives: Vec<DriveErase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// How a `bmc.rotateCredentials` ended at the BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RotationStep {
    /// The new password is set and logs in (an `ok` result).
    Committed,
    /// The new password was not taken and the current one still works (a
    /// failed result).
    RolledBack,
}

/// `bmc.rotateCredentials`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RotationReport {
    pub outcome: RotationStep,
    /// Phase 1 had already run before a crash; only phase 2 ran now.
    #[serde(default, skip_serializing_if = "is_false")]
    pub recovered: bool,
    /// The new credentials sealed for the node (committed only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_credentials: Option<SealedValue>,
}

/// `site.bootEntry.set`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootEntryStored {
    pub macs: Vec<String>,
    /// Seconds since the Unix epoch after which the entry is dead.
    pub expires_at: u64,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// `site.httpProxy`: the image as the site's cache holds it now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageCached {
    pub path: String,
    /// Its sha256 as the site computed it while it streamed (or read it).
    pub sha256: String,
    pub size_bytes: u64,
    /// The proxy it came through, `direct`, or `cache` when it was there
    /// already with the right sha256.
    pub via: String,
}

/// `site.bootEntry.clear`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootEntryCleared {
    pub cleared: Vec<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// How a disk is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Nvme,
    Ata,
    Scsi,
    Virtio,
    Loop,
    File,
    Other,
}

/// A disk the agent sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskInfo {
    pub name: String,
    pub path: String,
    pub size_bytes: u64,
    pub model: String,
    pub serial: String,
    pub rotational: bool,
    pub transport: Transport,
}

/// A NIC the agent sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NicInfo {
    pub name: String,
    pub mac: String,
    /// `up`, `down` or `unknown` (sysfs `operstate`).
    pub link: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mbps: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
}

/// The machine's identity from DMI.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SystemInfo {
    #[serde(default)]
    pub vendor: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub serial: Option<String>,
    #[serde(default)]
    pub uuid: Option<String>,
}

/// `inventory`: what the machine is, seen from inside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Inventory {
    pub system: SystemInfo,
    pub cpus: u64,
    #[serde(default)]
    pub cpu_model: String,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    pub disks: Vec<DiskInfo>,
    pub nics: Vec<NicInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// A byte range of a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Region {
    pub offset: u64,
    pub len: u64,
}

/// One region read back after a wipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckedRegion {
    /// `head`, `tail`, `mirror-…` or `stripe-…`.
    pub name: String,
    pub offset: u64,
    pub len: u64,
    pub ok: bool,
}

/// What a disk's wipe came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum WipeOutcome {
    /// The erase ran and every region read back clean: the only outcome
    /// that counts.
    Verified,
    /// The erase could not run or a region did not read back clean.
    Failed,
}

/// One disk's wipe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskWipe {
    pub name: String,
    pub serial: String,
    pub model: String,
    pub size_bytes: u64,
    pub transport: Transport,
    /// The mode asked for (never silently downgraded).
    pub method: WipeMode,
    /// The method that carried it out on this disk (absent from an older
    /// agent, or where nothing could be done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erase: Option<bcm_core::erase::EraseMethod>,
    pub wiped_regions: Vec<Region>,
    pub verified_regions: Vec<CheckedRegion>,
    pub outcome: WipeOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub millis: u64,
}

/// `disk.wipe`: every disk the agent found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WipeReport {
    pub disks: Vec<DiskWipe>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// Where a deploy wrote the user data (a NoCloud seed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SeedReport {
    pub partition: String,
    pub fs_type: String,
    pub path: String,
    pub user_data_bytes: usize,
}

/// `deploy.image`: what was written and read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeployReport {
    pub disk: String,
    pub serial: String,
    pub format: bcm_core::deploy::ImageFormat,
    pub image_sha256: String,
    pub bytes_downloaded: u64,
    pub virtual_size_bytes: u64,
    pub bytes_written: u64,
    /// sha256 of the target's first `virtualSizeBytes`: a qcow2 image's
    /// hashed as read back; a raw image's the image's, once every chunk
    /// read back checks against what was written (and zeros elsewhere).
    pub target_sha256: String,
    pub millis: u64,
    /// Downloaded bytes per second.
    pub bytes_per_sec: u64,
    /// The index of the trusted key that signed the manifest.
    pub signed_by_key: usize,
    /// Where the bytes came from: the site's cache or the manifest's URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// A block-mapped raw image: how many of its runs were fetched (HTTP
    /// ranges) and checked each against its signed sha256; the image's
    /// zeros were not transferred. What is proven is the signed map: each
    /// run's bytes, and zeros between them on the target as read back;
    /// `imageSha256` and `targetSha256` are then the manifest's, which its
    /// signer computed over the same bytes (`metalctl image sign` does so
    /// in one pass). Absent: the image was streamed whole and hashed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_ranges_checked: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<SeedReport>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// What `dcgmi diag` concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DcgmStatus {
    Pass,
    Fail,
    /// No GPU stack on the machine: never a pass.
    Unsupported,
}

/// `diag.dcgm`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DcgmReport {
    pub status: DcgmStatus,
    pub level: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// `dcgmi`'s own JSON report: NVIDIA's format, carried as it came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub sim: bool,
}

/// `boot.kexec`: the kernel loaded (the agent then boots it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KexecLoaded {
    pub loaded: String,
}

/// `node.powerOff`: the machine powers off once this is posted (so no
/// later answer can say it did).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoweringOff {
    /// Always true: the agent syncs and powers off after posting.
    pub powering_off: bool,
}

/// A command's output, one variant per kind. It serializes as the inner
/// type; it is decoded with its kind.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Output {
    BmcVerify(Verified),
    BmcInspect(OobInventory),
    BmcPower(PowerChanged),
    BmcPowerStatus(PowerRead),
    BmcBootDevice(BootOverride),
    BmcRotateCredentials(RotationReport),
    BmcVirtualMedia(MediaReport),
    BmcDiskErase(DiskEraseReport),
    BootEntrySet(BootEntryStored),
    BootEntryClear(BootEntryCleared),
    SiteHttpProxy(ImageCached),
    Inventory(Inventory),
    DiagDcgm(DcgmReport),
    DiskWipe(WipeReport),
    DeployImage(DeployReport),
    BootKexec(KexecLoaded),
    NodeWipe(WipeReport),
    NodePowerOff(PoweringOff),
}

impl Output {
    /// The kind it answers.
    pub fn kind(&self) -> CommandKind {
        match self {
            Output::BmcVerify(_) => CommandKind::BmcVerify,
            Output::BmcInspect(_) => CommandKind::BmcInspect,
            Output::BmcPower(_) => CommandKind::BmcPower,
            Output::BmcPowerStatus(_) => CommandKind::BmcPowerStatus,
            Output::BmcBootDevice(_) => CommandKind::BmcBootDevice,
            Output::BmcRotateCredentials(_) => CommandKind::BmcRotateCredentials,
            Output::BmcVirtualMedia(_) => CommandKind::BmcVirtualMedia,
            Output::BmcDiskErase(_) => CommandKind::BmcDiskErase,
            Output::BootEntrySet(_) => CommandKind::BootEntrySet,
            Output::BootEntryClear(_) => CommandKind::BootEntryClear,
            Output::SiteHttpProxy(_) => CommandKind::SiteHttpProxy,
            Output::Inventory(_) => CommandKind::Inventory,
            Output::DiagDcgm(_) => CommandKind::DiagDcgm,
            Output::DiskWipe(_) => CommandKind::DiskWipe,
            Output::DeployImage(_) => CommandKind::DeployImage,
            Output::BootKexec(_) => CommandKind::BootKexec,
            Output::NodeWipe(_) => CommandKind::NodeWipe,
            Output::NodePowerOff(_) => CommandKind::NodePowerOff,
        }
    }

    /// Decodes `value` as the output of `kind`.
    pub fn decode(kind: CommandKind, value: &serde_json::Value) -> Result<Output, ContractError> {
        fn as_<T: serde::de::DeserializeOwned>(
            kind: CommandKind,
            v: &serde_json::Value,
        ) -> Result<T, ContractError> {
            T::deserialize(v).map_err(|e| ContractError::Output {
                kind,
                why: e.to_string(),
            })
        }
        use CommandKind as K;
        Ok(match kind {
            K::BmcVerify => Output::BmcVerify(as_(kind, value)?),
            K::BmcInspect => Output::BmcInspect(as_(kind, value)?),
            K::BmcPower => Output::BmcPower(as_(kind, value)?),
            K::BmcPowerStatus => Output::BmcPowerStatus(as_(kind, value)?),
            K::BmcBootDevice => Output::BmcBootDevice(as_(kind, value)?),
            K::BmcRotateCredentials => Output::BmcRotateCredentials(as_(kind, value)?),
            K::BmcVirtualMedia => Output::BmcVirtualMedia(as_(kind, value)?),
            K::BmcDiskErase => Output::BmcDiskErase(as_(kind, value)?),
            K::BootEntrySet => Output::BootEntrySet(as_(kind, value)?),
            K::BootEntryClear => Output::BootEntryClear(as_(kind, value)?),
            K::SiteHttpProxy => Output::SiteHttpProxy(as_(kind, value)?),
            K::Inventory => Output::Inventory(as_(kind, value)?),
            K::DiagDcgm => Output::DiagDcgm(as_(kind, value)?),
            K::DiskWipe => Output::DiskWipe(as_(kind, value)?),
            K::DeployImage => Output::DeployImage(as_(kind, value)?),
            K::BootKexec => Output::BootKexec(as_(kind, value)?),
            K::NodeWipe => Output::NodeWipe(as_(kind, value)?),
            K::NodePowerOff => Output::NodePowerOff(as_(kind, value)?),
        })
    }

    /// Decodes the output of a result: a succeeded command must carry its
    /// kind's output; a failed one carries nothing (`{}` or `null`) or, where
    /// the kind reports how far it got, its output.
    pub fn decode_result(
        kind: CommandKind,
        ok: bool,
        value: &serde_json::Value,
    ) -> Result<Option<Output>, ContractError> {
        let empty = match value {
            serde_json::Value::Null => true,
            serde_json::Value::Object(m) => m.is_empty(),
            _ => false,
        };
        if !ok && empty {
            return Ok(None);
        }
        Self::decode(kind, value).map(Some)
    }

    /// The output as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// The power state the output reports, if it reports one.
    pub fn power(&self) -> Option<PowerState> {
        match self {
            Output::BmcVerify(v) => Some(v.power),
            Output::BmcPower(p) => Some(p.power),
            Output::BmcPowerStatus(p) => Some(p.power),
            _ => None,
        }
    }
}
