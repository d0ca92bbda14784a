//! Commands: every kind an executor runs, with its typed parameters, and
//! the envelope a site command travels in (`cmd.<siteId>.<kind>`).
//!
//! On the wire a command is `kind` and `params` side by side; [`Command`]
//! is the two as one closed enum, so parameters that are not their kind's
//! (a missing field, an unknown one, a value out of its set) never decode.

use bcm_core::deploy::ImageRef;
use bcm_core::{BmcDriver, BmcTls, NodeId, PowerAction, SiteId, WipeMode};
use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ContractError;

/// Which executor runs a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// The site's bmc service (`cmd.<site>.bmc.*`).
    Bmc,
    /// The site's boot service (`cmd.<site>.site.*`).
    Site,
    /// The machine's agent, over the agent endpoints.
    Agent,
}

impl Family {
    /// The subject token of a site family (`bmc`, `site`); agents have none.
    pub const fn subject_token(self) -> Option<&'static str> {
        match self {
            Family::Bmc => Some("bmc"),
            Family::Site => Some("site"),
            Family::Agent => None,
        }
    }
}

macro_rules! command_kinds {
    ($($(#[$doc:meta])* $variant:ident = $wire:literal => $family:ident),+ $(,)?) => {
        /// Every command kind an executor runs.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum CommandKind {
            $($(#[$doc])* $variant),+
        }

        impl CommandKind {
            /// Every kind.
            pub const ALL: &'static [CommandKind] = &[$(CommandKind::$variant),+];

            /// The wire name, e.g. `bmc.power`.
            pub const fn as_str(self) -> &'static str {
                match self { $(CommandKind::$variant => $wire),+ }
            }

            /// Which executor runs it.
            pub const fn family(self) -> Family {
                match self { $(CommandKind::$variant => Family::$family),+ }
            }
        }
    };
}

command_kinds! {
    /// Log in to the BMC with the sealed credentials.
    BmcVerify = "bmc.verify" => Bmc,
    /// Out-of-band inspection: vendor, model, serial and the PXE MACs.
    BmcInspect = "bmc.inspect" => Bmc,
    /// A power action.
    BmcPower = "bmc.power" => Bmc,
    /// Read the power state.
    BmcPowerStatus = "bmc.powerStatus" => Bmc,
    /// Set the boot device, once or persistently.
    BmcBootDevice = "bmc.bootDevice" => Bmc,
    /// Two-phase password rotation.
    BmcRotateCredentials = "bmc.rotateCredentials" => Bmc,
    /// Insert or eject the BMC's virtual CD (an agentless deploy's
    /// installer).
    BmcVirtualMedia = "bmc.virtualMedia" => Bmc,
    /// Erase every drive through the BMC where it offers an erase (an
    /// agentless machine's wipe).
    BmcDiskErase = "bmc.diskErase" => Bmc,
    /// Create the boot entries of a node's MACs.
    BootEntrySet = "site.bootEntry.set" => Site,
    /// Remove the boot entries of a node's MACs.
    BootEntryClear = "site.bootEntry.clear" => Site,
    /// Fetch a catalog image into the site's HTTP image cache, through the
    /// site's upstream HTTP proxy when the site sets one.
    SiteHttpProxy = "site.httpProxy" => Site,
    /// The ramdisk reports the machine's inventory.
    Inventory = "inventory" => Agent,
    /// GPU diagnostics.
    DiagDcgm = "diag.dcgm" => Agent,
    /// Wipe every disk and verify by read-back.
    DiskWipe = "disk.wipe" => Agent,
    /// Stream a signed image to disk.
    DeployImage = "deploy.image" => Agent,
    /// Load the installed kernel and boot it.
    BootKexec = "boot.kexec" => Agent,
    /// An adopted machine's own OS wipes every disk and verifies by
    /// read-back (no BMC boots it a ramdisk): `bcd node`, with the file
    /// systems on those disks remounted read-only first.
    NodeWipe = "node.wipe" => Agent,
    /// The installed OS powers the machine off once its result is posted:
    /// an adopted machine's after its wipe (no BMC can; straight through
    /// the kernel, its disks being erased), a deployed machine's before a
    /// rescue boots the ramdisk (through its init system, so it shuts down
    /// cleanly before the BMC powers it on).
    NodePowerOff = "node.powerOff" => Agent,
}

impl CommandKind {
    /// Parses the wire name.
    pub fn parse(s: &str) -> Result<Self, ContractError> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| ContractError::UnknownKind(s.chars().take(64).collect()))
    }

    /// The agent identities that run the command: `node.wipe` is an
    /// adopted machine's own OS's (a `node` identity), `node.powerOff` any
    /// installed OS's (`node` or `provisioned`), every other agent command
    /// the ramdisk's (a `discovery` session); the others are no agent's
    /// (empty). A poll hands a command only to a session of one of these
    /// purposes, and a result is kept only from one.
    pub const fn run_by(self) -> &'static [crate::agent::AgentPurpose] {
        use crate::agent::AgentPurpose as P;
        match (self.family(), self) {
            (Family::Agent, CommandKind::NodeWipe) => &[P::Node],
            (Family::Agent, CommandKind::NodePowerOff) => &[P::Node, P::Provisioned],
            (Family::Agent, _) => &[P::Discovery],
            (Family::Bmc | Family::Site, _) => &[],
        }
    }

    /// Whether an identity of `purpose` runs the command.
    pub fn is_run_by(self, purpose: crate::agent::AgentPurpose) -> bool {
        self.run_by().contains(&purpose)
    }

    /// The kinds an identity of `purpose` runs.
    pub fn run_by_purpose(purpose: crate::agent::AgentPurpose) -> Vec<CommandKind> {
        Self::ALL
            .iter()
            .copied()
            .filter(|k| k.is_run_by(purpose))
            .collect()
    }

    /// Whether the command destroys data or changes the machine: such a
    /// command is recorded before it is sent and never executed twice.
    pub const fn destructive(self) -> bool {
        matches!(
            self,
            CommandKind::BmcPower
                | CommandKind::BmcBootDevice
                | CommandKind::BmcRotateCredentials
                | CommandKind::BmcVirtualMedia
                | CommandKind::BmcDiskErase
                | CommandKind::DiskWipe
                | CommandKind::DeployImage
                | CommandKind::BootKexec
                | CommandKind::NodeWipe
                | CommandKind::NodePowerOff
        )
    }
}

impl std::fmt::Display for CommandKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CommandKind {
    type Err = ContractError;
    fn from_str(s: &str) -> Result<Self, ContractError> {
        Self::parse(s)
    }
}

impl Serialize for CommandKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CommandKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for CommandKind {
    fn schema_name() -> String {
        "CommandKind".to_owned()
    }
    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        schemars::schema::SchemaObject {
            instance_type: Some(schemars::schema::InstanceType::String.into()),
            enum_values: Some(Self::ALL.iter().map(|k| k.as_str().into()).collect()),
            ..Default::default()
        }
        .into()
    }
}

impl utoipa::PartialSchema for CommandKind {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(Self::ALL.iter().map(|k| k.as_str())))
            .into()
    }
}

impl utoipa::ToSchema for CommandKind {}

/// A sealed value as a command carries it (binary fields in base64): only
/// the bmc service, which holds the sealing keys, can open it, and only for
/// the node it is bound to (`owner`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SealedValue {
    pub key_id: String,
    pub nonce: String,
    pub ciphertext: String,
    /// The node the value is sealed to (associated data).
    pub owner: String,
}

/// The BMC a command acts on: driver, address, TLS policy and the node's
/// credentials, still sealed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BmcTarget {
    pub driver: BmcDriver,
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<BmcTls>,
    /// Absent once the credentials were forgotten (retired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_credentials: Option<SealedValue>,
}

/// The parameters of `bmc.verify`, `bmc.inspect` and `bmc.powerStatus`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BmcParams {
    pub bmc: BmcTarget,
}

/// `bmc.power`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PowerParams {
    pub bmc: BmcTarget,
    pub action: PowerAction,
}

/// Where to boot from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BootDevice {
    Pxe,
    Disk,
    UefiHttp,
    /// The virtual (or physical) CD/DVD: what an image inserted as virtual
    /// media boots from.
    Cd,
}

/// Firmware boot mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BootMode {
    Uefi,
    Legacy,
}

/// `bmc.bootDevice`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootDeviceParams {
    pub bmc: BmcTarget,
    pub device: BootDevice,
    /// Every boot (true) or the next one only.
    #[serde(default)]
    pub persistent: bool,
    /// The firmware mode to boot in; the BMC's own when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<BootMode>,
}

/// `bmc.rotateCredentials`: the current credentials (in `bmc`) and the new
/// password, both sealed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RotateParams {
    pub bmc: BmcTarget,
    pub pending_credentials: SealedValue,
}

/// What `bmc.virtualMedia` does with the virtual CD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum MediaAction {
    /// Insert `image` (an occupied slot is ejected first; the same image
    /// already inserted is left as it is).
    Insert,
    /// Eject whatever is inserted (an empty slot stays empty).
    Eject,
}

/// `bmc.virtualMedia`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualMediaParams {
    pub bmc: BmcTarget,
    pub action: MediaAction,
    /// The image the BMC fetches (an `http(s)` URL with a host); only for
    /// `insert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// `bmc.diskErase`: erase every drive the BMC reports, by the BMC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskEraseParams {
    pub bmc: BmcTarget,
    /// The pool's wipe, which the BMC's erase stands in for (Redfish's
    /// `Drive.SecureErase` takes no mode: the drive decides the method).
    pub mode: WipeMode,
}

/// A boot entry as `site.bootEntry.set` asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootEntrySpec {
    /// The MACs that boot it (1–64).
    pub macs: Vec<String>,
    /// Kernel and initrd: a path in the image cache or an http(s) URL.
    pub kernel: String,
    pub initrd: String,
    /// The kernel command line (join token, control plane URL).
    pub cmdline: String,
    /// How long the entry lives (1 s to a day).
    pub expires_in_secs: u64,
}

/// `site.bootEntry.set`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootEntrySetParams {
    pub boot_entry: BootEntrySpec,
}

/// `site.bootEntry.clear`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootEntryClearParams {
    pub macs: Vec<String>,
}

/// Where a tenant's catalog image lives in a site's cache (served at
/// `/images/<path>` by the site's boot service).
pub fn catalog_cache_path(tenant: &str, name: &str) -> String {
    format!("catalog/{tenant}/{name}")
}

/// An image as the site's cache keeps it: where it lives under the cache,
/// where it comes from and what it must hash to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CacheImage {
    /// The path under the cache: `images/<tenant>/<name>`.
    pub path: String,
    /// `http(s)://…`.
    pub url: String,
    /// Lower-case hex SHA-256.
    pub sha256: String,
    pub size_bytes: u64,
}

/// `site.httpProxy`: fetch `image` into the site's cache, through
/// `upstream_proxy` (the site's HTTP proxy, `http://host:port`) when the
/// site sets one. An image already cached with its sha256 is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpProxyParams {
    pub image: CacheImage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_proxy: Option<String>,
}

/// The parameters of a kind that takes none (`inventory`,
/// `node.powerOff`): `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// `diag.dcgm`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DcgmParams {
    /// `dcgmi diag -r <level>` (1–4).
    pub level: u8,
    /// The pool accepts `unsupported` (a machine without GPUs), never a
    /// fake pass.
    #[serde(default)]
    pub accept_unsupported: bool,
}

/// `disk.wipe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WipeParams {
    pub mode: WipeMode,
    /// Read back what was wiped (always asked for).
    pub verify: bool,
    /// The methods the node's pool admits for `mode`, in the order the
    /// agent tries them on each disk (`policy.eraseMethods`); the first the
    /// disk can do is used and reported. Empty (an older control plane):
    /// the device's own NVMe erase only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<bcm_core::erase::EraseMethod>,
}

/// `deploy.image`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeployImageParams {
    pub profile_id: String,
    pub profile_version: u32,
    /// The signed manifest; the agent checks it before opening the disk.
    pub image: ImageRef,
    /// Where the image is in the site's cache when the profile names a
    /// catalog image (`catalog/<tenant>/<name>`): the ramdisk fetches it
    /// from its boot server's cache first (`bcm.cache=`), and from `url`
    /// when the cache does not have it. The manifest checks the bytes
    /// either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_path: Option<String>,
    /// The rendered user data, written as a NoCloud seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// The target disk by name; the first disk when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
}

/// `boot.kexec`: the installed kernel to load from the root file system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KexecParams {
    /// The installed root file system, e.g. `/dev/vda1`.
    pub root_device: String,
    #[serde(default = "default_fs")]
    pub fs_type: String,
    /// Paths inside the root file system.
    pub kernel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<String>,
    #[serde(default)]
    pub cmdline: String,
}

fn default_fs() -> String {
    "ext4".to_owned()
}

/// A command: its kind and its parameters. (Unknown fields beside them are
/// refused by the envelope that carries them; the parameters refuse their
/// own.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", content = "params")]
pub enum Command {
    #[serde(rename = "bmc.verify")]
    BmcVerify(BmcParams),
    #[serde(rename = "bmc.inspect")]
    BmcInspect(BmcParams),
    #[serde(rename = "bmc.power")]
    BmcPower(PowerParams),
    #[serde(rename = "bmc.powerStatus")]
    BmcPowerStatus(BmcParams),
    #[serde(rename = "bmc.bootDevice")]
    BmcBootDevice(BootDeviceParams),
    #[serde(rename = "bmc.rotateCredentials")]
    BmcRotateCredentials(RotateParams),
    #[serde(rename = "bmc.virtualMedia")]
    BmcVirtualMedia(VirtualMediaParams),
    #[serde(rename = "bmc.diskErase")]
    BmcDiskErase(DiskEraseParams),
    #[serde(rename = "site.bootEntry.set")]
    BootEntrySet(BootEntrySetParams),
    #[serde(rename = "site.bootEntry.clear")]
    BootEntryClear(BootEntryClearParams),
    #[serde(rename = "site.httpProxy")]
    SiteHttpProxy(HttpProxyParams),
    #[serde(rename = "inventory")]
    Inventory(NoParams),
    #[serde(rename = "diag.dcgm")]
    DiagDcgm(DcgmParams),
    #[serde(rename = "disk.wipe")]
    DiskWipe(WipeParams),
    #[serde(rename = "deploy.image")]
    DeployImage(DeployImageParams),
    #[serde(rename = "boot.kexec")]
    BootKexec(KexecParams),
    #[serde(rename = "node.wipe")]
    NodeWipe(WipeParams),
    #[serde(rename = "node.powerOff")]
    NodePowerOff(NoParams),
}

impl Command {
    /// The kind.
    pub fn kind(&self) -> CommandKind {
        match self {
            Command::BmcVerify(_) => CommandKind::BmcVerify,
            Command::BmcInspect(_) => CommandKind::BmcInspect,
            Command::BmcPower(_) => CommandKind::BmcPower,
            Command::BmcPowerStatus(_) => CommandKind::BmcPowerStatus,
            Command::BmcBootDevice(_) => CommandKind::BmcBootDevice,
            Command::BmcRotateCredentials(_) => CommandKind::BmcRotateCredentials,
            Command::BmcVirtualMedia(_) => CommandKind::BmcVirtualMedia,
            Command::BmcDiskErase(_) => CommandKind::BmcDiskErase,
            Command::BootEntrySet(_) => CommandKind::BootEntrySet,
            Command::BootEntryClear(_) => CommandKind::BootEntryClear,
            Command::SiteHttpProxy(_) => CommandKind::SiteHttpProxy,
            Command::Inventory(_) => CommandKind::Inventory,
            Command::DiagDcgm(_) => CommandKind::DiagDcgm,
            Command::DiskWipe(_) => CommandKind::DiskWipe,
            Command::DeployImage(_) => CommandKind::DeployImage,
            Command::BootKexec(_) => CommandKind::BootKexec,
            Command::NodeWipe(_) => CommandKind::NodeWipe,
            Command::NodePowerOff(_) => CommandKind::NodePowerOff,
        }
    }

    /// The BMC a `bmc.*` command acts on.
    pub fn bmc(&self) -> Option<&BmcTarget> {
        match self {
            Command::BmcVerify(p) | Command::BmcInspect(p) | Command::BmcPowerStatus(p) => {
                Some(&p.bmc)
            }
            Command::BmcPower(p) => Some(&p.bmc),
            Command::BmcBootDevice(p) => Some(&p.bmc),
            Command::BmcRotateCredentials(p) => Some(&p.bmc),
            Command::BmcVirtualMedia(p) => Some(&p.bmc),
            Command::BmcDiskErase(p) => Some(&p.bmc),
            _ => None,
        }
    }

    /// The parameters as JSON (what the `commands` row and a signature
    /// cover).
    pub fn params_json(&self) -> serde_json::Value {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(mut m)) => {
                m.remove("params").unwrap_or(serde_json::Value::Null)
            }
            _ => serde_json::Value::Null,
        }
    }

    /// A command from its wire parts: an unknown kind, or parameters that
    /// are not the kind's, is an error.
    pub fn from_parts(kind: &str, params: serde_json::Value) -> Result<Self, ContractError> {
        let kind = CommandKind::parse(kind)?;
        serde_json::from_value(serde_json::json!({ "kind": kind, "params": params })).map_err(|e| {
            ContractError::Params {
                kind,
                why: e.to_string(),
            }
        })
    }
}

/// A command to a site service (`cmd.<siteId>.<kind>`), e.g. `bmc.power`.
/// On the wire: `commandId`, `kind`, `siteId`, `nodeId`, `params`,
/// `issuedAt`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(
    rename_all = "camelCase",
    try_from = "EnvelopeWire",
    into = "EnvelopeWire"
)]
pub struct CommandEnvelope {
    /// The executors' dedupe key.
    pub command_id: String,
    pub site_id: SiteId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<NodeId>,
    #[serde(flatten)]
    pub command: Command,
    pub issued_at: DateTime<Utc>,
    /// After this the control plane no longer waits for it (a workflow
    /// step's deadline): a site that receives it later refuses it unrun,
    /// so a command stuck in a queue never acts behind the engine's back.
    /// Absent: no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// For a destructive kind: the approved batch that allows it, which
    /// the site verifies itself (`bcm-quorum`) before it acts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<crate::batch::BatchAuthority>,
}

impl CommandEnvelope {
    /// The command's kind.
    pub fn kind(&self) -> CommandKind {
        self.command.kind()
    }

    /// Whether its deadline has passed at `now`.
    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }
}

/// A command envelope as it is spelled: kind and parameters apart.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EnvelopeWire {
    command_id: String,
    kind: String,
    site_id: SiteId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_id: Option<NodeId>,
    params: serde_json::Value,
    issued_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deadline: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    authority: Option<crate::batch::BatchAuthority>,
}

impl TryFrom<EnvelopeWire> for CommandEnvelope {
    type Error = ContractError;
    fn try_from(w: EnvelopeWire) -> Result<Self, ContractError> {
        Ok(Self {
            command: Command::from_parts(&w.kind, w.params)?,
            command_id: w.command_id,
            site_id: w.site_id,
            node_id: w.node_id,
            issued_at: w.issued_at,
            deadline: w.deadline,
            authority: w.authority,
        })
    }
}

impl From<CommandEnvelope> for EnvelopeWire {
    fn from(c: CommandEnvelope) -> Self {
        Self {
            params: c.command.params_json(),
            kind: c.command.kind().as_str().to_owned(),
            command_id: c.command_id,
            site_id: c.site_id,
            node_id: c.node_id,
            issued_at: c.issued_at,
            deadline: c.deadline,
            authority: c.authority,
        }
    }
}
