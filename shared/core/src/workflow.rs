//! Workflows as data: the step kinds, where each runs, their retry policy,
//! the versioned profiles of every metal state, and the pure planner the
//! engine follows (which step runs next, what a step's outcome does, when
//! cleanup runs). The engine does the I/O; every decision is here.

use serde::{Deserialize, Serialize};

use crate::agentless::AgentMode;
use crate::state::ProvisionState;
use crate::{PowerAction, WipeMode};

/// Where a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum StepTarget {
    /// In the engine itself (database changes, identity).
    ControlPlane,
    /// A site service: `bmc` or `boot`, over `cmd.<siteId>.<kind>`.
    Site,
    /// The installed OS's agent (an adopted machine's `bcd node`), over
    /// the agent endpoints.
    Node,
    /// The ramdisk agent, over the agent endpoints.
    Ramdisk,
}

impl StepTarget {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            StepTarget::ControlPlane => "control-plane",
            StepTarget::Site => "site",
            StepTarget::Node => "node",
            StepTarget::Ramdisk => "ramdisk",
        }
    }
}

/// What a step does. Each kind has one command kind on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum StepKind {
    /// Log in to the BMC with the sealed credentials.
    BmcVerify,
    /// Out-of-band inspection: vendor, model, serial and the PXE MACs.
    BmcInspect,
    /// Store the MACs the inspection found on the node.
    StoreMacs,
    /// Create the node's boot entry (ramdisk kernel, initrd, join token).
    BootEntrySet,
    /// Remove the node's boot entry.
    BootEntryClear,
    /// Boot from the network, once or persistently.
    BmcBootPxe { persistent: bool },
    /// Boot from disk, once or persistently.
    BmcBootDisk { persistent: bool },
    /// Power action through the BMC.
    BmcPower { action: PowerAction },
    /// Power off through the BMC (graceful, then forced).
    BmcPowerOff,
    /// Wait for the ramdisk to join with its discovery token.
    WaitRamdiskJoin,
    /// The ramdisk reports its inventory.
    Inventory,
    /// GPU diagnostics at a level (`dcgmi diag -r <level>`).
    DiagDcgm { level: u8 },
    /// Wipe every disk with `mode` and verify by read-back.
    DiskWipe { mode: WipeMode },
    /// Stream the profile's signed image to disk.
    DeployImage,
    /// Wait for the installed OS a deploy wrote to join with `role` (a
    /// join with the deploy's token; a heartbeat is never a join), up to
    /// `timeout_secs`.
    WaitOsJoin { role: String, timeout_secs: u32 },
    /// Wait for the installed OS that rescue kept to be heard again with
    /// `role`: a join, or a request of its identity in force (rescue does
    /// not end it), since the step began; up to `timeout_secs`.
    WaitOsBack { role: String, timeout_secs: u32 },
    /// Revoke the node's certificates and join tokens.
    RevokeIdentity,
    /// Forget the sealed BMC credentials.
    ForgetBmcCredentials,
    /// Erase every drive through the BMC (Redfish `Drive.SecureErase`),
    /// an agentless machine's wipe. `required`: a BMC that offers no erase
    /// fails the step (retire); otherwise the step records that none was
    /// offered and the release is judged unattested.
    BmcErase { mode: WipeMode, required: bool },
    /// Insert the deploy profile's installer image as the BMC's virtual CD.
    MediaInsert,
    /// Eject the BMC's virtual CD (an empty slot reads back empty).
    MediaEject,
    /// Boot from the virtual CD, once or persistently.
    BmcBootCd { persistent: bool },
    /// Read the BMC's power state until the machine is off: an agentless
    /// installer hands the machine back by powering it off. Each attempt is
    /// one read; the retry policy is the poll.
    WaitPowerOff,
    /// Record the out-of-band inspection (`inspect-oob`) as the node's
    /// inventory, which an agentless release's erase must account for.
    StoreInventory,
    /// Rotate the BMC password to the teardown password the release verb
    /// recorded (sealed) for a dedicated node: its root tenant could reach
    /// the BMC through the host interface. Two-phase, as
    /// `metal.rotateCredentials`; committed, the new credentials are the
    /// only ones on record.
    RotateBmcPassword,
    /// Read the firmware versions out of band: record them (`check`
    /// false: commissioning) or compare them with the recorded ones
    /// (`check`: a dedicated teardown; a change fails the step for good).
    BmcFirmware { check: bool },
    /// An adopted machine's own OS wipes every disk with `mode` and
    /// verifies by read-back (no BMC can boot it a ramdisk).
    NodeWipe { mode: WipeMode },
    /// An adopted machine's own OS powers it off once it has answered.
    NodePowerOff,
    /// Profile v1's one-step `metal.ensureRamdisk`, which no site service
    /// executes; kept only so workflows stored before v2 still load. The
    /// engine fails it for good (the node goes to `failed`; `recover` runs
    /// the state again with the v2 profiles).
    #[serde(rename = "ensureRamdisk")]
    RetiredEnsureRamdisk,
}

impl StepKind {
    /// Whether the step writes the node row (the engine re-reads it after).
    pub fn writes_node(&self) -> bool {
        matches!(
            self,
            StepKind::StoreMacs | StepKind::ForgetBmcCredentials | StepKind::RotateBmcPassword
        )
    }

    /// Where the step runs.
    pub const fn target(&self) -> StepTarget {
        match self {
            StepKind::StoreMacs
            | StepKind::StoreInventory
            | StepKind::RevokeIdentity
            | StepKind::ForgetBmcCredentials
            | StepKind::WaitRamdiskJoin
            // Waits the engine decides from the joins it records.
            | StepKind::WaitOsJoin { .. }
            | StepKind::WaitOsBack { .. }
            | StepKind::RetiredEnsureRamdisk => StepTarget::ControlPlane,
            StepKind::BmcErase { .. }
            | StepKind::RotateBmcPassword
            | StepKind::BmcFirmware { .. }
            | StepKind::MediaInsert
            | StepKind::MediaEject
            | StepKind::BmcBootCd { .. }
            | StepKind::WaitPowerOff
            | StepKind::BmcVerify
            | StepKind::BmcInspect
            | StepKind::BootEntrySet
            | StepKind::BootEntryClear
            | StepKind::BmcBootPxe { .. }
            | StepKind::BmcBootDisk { .. }
            | StepKind::BmcPower { .. }
            | StepKind::BmcPowerOff => StepTarget::Site,
            StepKind::NodeWipe { .. } | StepKind::NodePowerOff => StepTarget::Node,
            StepKind::Inventory
            | StepKind::DiagDcgm { .. }
            | StepKind::DiskWipe { .. }
            | StepKind::DeployImage => StepTarget::Ramdisk,
        }
    }

    /// The command kind on the wire, e.g. `bmc.power`, `site.bootEntry`,
    /// `disk.wipe`.
    pub const fn command_kind(&self) -> &'static str {
        match self {
            StepKind::BmcVerify => "bmc.verify",
            StepKind::BmcInspect => "bmc.inspect",
            StepKind::StoreMacs => "metal.storeMacs",
            StepKind::BootEntrySet => "site.bootEntry.set",
            StepKind::BootEntryClear => "site.bootEntry.clear",
            StepKind::BmcBootPxe { .. }
            | StepKind::BmcBootDisk { .. }
            | StepKind::BmcBootCd { .. } => "bmc.bootDevice",
            StepKind::BmcErase { .. } => "bmc.diskErase",
            StepKind::MediaInsert | StepKind::MediaEject => "bmc.virtualMedia",
            StepKind::WaitPowerOff => "bmc.powerStatus",
            StepKind::StoreInventory => "metal.storeInventory",
            StepKind::RotateBmcPassword => "bmc.rotateCredentials",
            StepKind::BmcFirmware { .. } => "bmc.inspect",
            StepKind::BmcPower { .. } | StepKind::BmcPowerOff => "bmc.power",
            StepKind::WaitRamdiskJoin => "metal.waitRamdiskJoin",
            StepKind::Inventory => "inventory",
            StepKind::DiagDcgm { .. } => "diag.dcgm",
            StepKind::DiskWipe { .. } => "disk.wipe",
            StepKind::DeployImage => "deploy.image",
            StepKind::WaitOsJoin { .. } => "metal.waitOsJoin",
            StepKind::WaitOsBack { .. } => "metal.waitOsBack",
            StepKind::RevokeIdentity => "pki.revoke",
            StepKind::ForgetBmcCredentials => "bmc.forgetCredentials",
            StepKind::NodeWipe { .. } => "node.wipe",
            StepKind::NodePowerOff => "node.powerOff",
            StepKind::RetiredEnsureRamdisk => "metal.ensureRamdisk",
        }
    }

    /// Whether the step destroys data or changes the machine: such a step's
    /// command is recorded before it is sent and never sent twice.
    pub const fn destructive(&self) -> bool {
        matches!(
            self,
            StepKind::DiskWipe { .. }
                | StepKind::NodeWipe { .. }
                | StepKind::NodePowerOff
                | StepKind::DeployImage
                | StepKind::BmcPower { .. }
                | StepKind::BmcPowerOff
                | StepKind::BmcBootPxe { .. }
                | StepKind::BmcBootDisk { .. }
                | StepKind::BmcBootCd { .. }
                | StepKind::BmcErase { .. }
                | StepKind::MediaInsert
                | StepKind::MediaEject
                | StepKind::RotateBmcPassword
        )
    }
}

/// Retries of a step: exponential backoff with jitter, a bounded number of
/// attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
}

impl RetryPolicy {
    /// The default: 5 attempts, 1 s doubling up to 60 s.
    pub const DEFAULT: RetryPolicy = RetryPolicy {
        max_attempts: 5,
        initial_backoff_ms: 1_000,
        max_backoff_ms: 60_000,
    };
    /// A poll, not a retry: one read every 2.5–5 s for up to about 3
    /// minutes (an installed OS's clean shutdown, `wait-os-off`).
    pub const POLL_SHUTDOWN: RetryPolicy = RetryPolicy {
        max_attempts: 48,
        initial_backoff_ms: 5_000,
        max_backoff_ms: 5_000,
    };
    /// A poll, not a retry: one read every 2.5–5 s for up to about 50
    /// minutes (an agentless installer's run, `wait-installer`).
    pub const POLL_INSTALLER: RetryPolicy = RetryPolicy {
        max_attempts: 800,
        initial_backoff_ms: 5_000,
        max_backoff_ms: 5_000,
    };
    /// One attempt only, for steps whose failure is final (a wipe that failed read-back).
    pub const ONCE: RetryPolicy = RetryPolicy {
        max_attempts: 1,
        initial_backoff_ms: 0,
        max_backoff_ms: 0,
    };

    /// The wait before attempt `next_attempt` (2 or more): the initial
    /// backoff doubled per earlier retry, capped, then scaled into
    /// `[50 %, 100 %]` by `jitter` in `[0, 1)` ("equal jitter").
    pub fn backoff_ms(&self, next_attempt: u32, jitter: f64) -> u64 {
        let retries_before = next_attempt.saturating_sub(2).min(32);
        let full = self
            .initial_backoff_ms
            .saturating_mul(1u64 << retries_before)
            .min(self.max_backoff_ms);
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let half = full / 2;
        half + (half as f64 * jitter) as u64
    }
}

/// One step of a profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepDef {
    /// A name unique in the profile, e.g. `power-on`.
    pub name: String,
    #[serde(flatten)]
    pub kind: StepKind,
    pub timeout_secs: u32,
    pub retry: RetryPolicy,
    /// A step the workflow can do without: one that fails for good is
    /// skipped, with the optional steps right after it (they follow from
    /// it), and the workflow goes on. Absent (false) in definitions stored
    /// before it existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// A versioned workflow profile: the main steps and the cleanup steps that
/// run when the workflow fails or is cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    pub id: String,
    pub version: u32,
    pub steps: Vec<StepDef>,
    pub cleanup: Vec<StepDef>,
}

fn step(name: &str, kind: StepKind, timeout_secs: u32) -> StepDef {
    StepDef {
        name: name.to_owned(),
        kind,
        timeout_secs,
        retry: RetryPolicy::DEFAULT,
        optional: false,
    }
}

fn optional(def: StepDef) -> StepDef {
    StepDef {
        optional: true,
        ..def
    }
}

fn once(name: &str, kind: StepKind, timeout_secs: u32) -> StepDef {
    StepDef {
        retry: RetryPolicy::ONCE,
        ..step(name, kind, timeout_secs)
    }
}

fn power_off() -> StepDef {
    step("power-off", StepKind::BmcPowerOff, 300)
}

/// The firmware versions commissioning records, which a dedicated
/// teardown compares with.
fn record_firmware() -> StepDef {
    step(
        "record-firmware",
        StepKind::BmcFirmware { check: false },
        300,
    )
}

fn boot_cleanup() -> Vec<StepDef> {
    vec![
        step("clear-boot-entry", StepKind::BootEntryClear, 60),
        power_off(),
    ]
}

/// `metal.ensureRamdisk`: the steps that boot the ramdisk and wait for it
/// to join — a boot entry with a fresh join token, PXE once, a power cycle
/// (on when off), the join. Each is its own step so a real site's `boot`
/// and `bmc` services each do their part, and a retry repeats only the
/// part that failed.
pub fn ensure_ramdisk() -> Vec<StepDef> {
    vec![
        step("prepare-boot-entry", StepKind::BootEntrySet, 60),
        step("pxe-once", StepKind::BmcBootPxe { persistent: false }, 120),
        step(
            "power-cycle",
            StepKind::BmcPower {
                action: PowerAction::Cycle,
            },
            300,
        ),
        // Waiting again would not boot the machine again: a join that does
        // not come fails the workflow (cleanup powers off; `recover` retries).
        once("wait-ramdisk-join", StepKind::WaitRamdiskJoin, 1_200),
    ]
}

/// `metal-enroll` v1: verify the BMC, inspect out of band, store PXE MACs.
pub fn metal_enroll() -> Profile {
    Profile {
        id: "metal-enroll".into(),
        version: 1,
        steps: vec![
            step("verify-bmc", StepKind::BmcVerify, 120),
            step("inspect-oob", StepKind::BmcInspect, 300),
            step("store-macs", StepKind::StoreMacs, 30),
        ],
        cleanup: vec![],
    }
}

/// `metal-inspect` v2: PXE-boot the ramdisk and collect inventory in band.
pub fn metal_inspect() -> Profile {
    let mut steps = ensure_ramdisk();
    steps.extend([
        step("collect-inventory", StepKind::Inventory, 600),
        power_off(),
        step("clear-boot-entry", StepKind::BootEntryClear, 60),
    ]);
    Profile {
        id: "metal-inspect".into(),
        version: 2,
        steps,
        cleanup: boot_cleanup(),
    }
}

/// `metal-commission` v3: the firmware versions recorded (v2 had no such
/// step), ramdisk, DCGM level 2, the pool's wipe (`quick` unless its policy
/// says more), power off.
pub fn metal_commission(mode: WipeMode) -> Profile {
    let mut steps = vec![record_firmware()];
    steps.extend(ensure_ramdisk());
    steps.push(once("dcgm-diag", StepKind::DiagDcgm { level: 2 }, 3_600));
    if mode != WipeMode::None {
        let (name, secs) = match mode {
            WipeMode::Quick => ("quick-wipe", 7_200),
            _ => ("wipe", 86_400),
        };
        steps.push(once(name, StepKind::DiskWipe { mode }, secs));
    }
    steps.extend([
        power_off(),
        step("clear-boot-entry", StepKind::BootEntryClear, 60),
    ]);
    Profile {
        id: "metal-commission".into(),
        version: 3,
        steps,
        cleanup: boot_cleanup(),
    }
}

/// `metal-release` v2: ramdisk, wipe with `mode` verified, power off.
pub fn metal_release(mode: WipeMode) -> Profile {
    let mut steps = ensure_ramdisk();
    if mode != WipeMode::None {
        steps.push(once("wipe", StepKind::DiskWipe { mode }, 86_400));
    }
    steps.push(power_off());
    steps.push(step("clear-boot-entry", StepKind::BootEntryClear, 60));
    Profile {
        id: "metal-release".into(),
        version: 2,
        steps,
        cleanup: boot_cleanup(),
    }
}

/// `metal-release-dedicated` v1: the release of a node its tenant had
/// root on — the ramdisk's wipe (never `quick`: the release verb sees to
/// it) of every recorded disk, the firmware compared with what
/// commissioning recorded (a change fails the release for an operator),
/// then the boot override the control plane manages reset to the disk and
/// read back, and the BMC password rotated to the teardown password the
/// verb recorded, before the machine goes back.
pub fn metal_release_dedicated(mode: WipeMode) -> Profile {
    let mut steps = ensure_ramdisk();
    if mode != WipeMode::None {
        steps.push(once("wipe", StepKind::DiskWipe { mode }, 86_400));
    }
    steps.push(power_off());
    steps.extend(dedicated_teardown());
    steps.push(step("clear-boot-entry", StepKind::BootEntryClear, 60));
    Profile {
        id: "metal-release-dedicated".into(),
        version: 1,
        steps,
        cleanup: boot_cleanup(),
    }
}

/// `metal-rescue` v5: `metal.ensureRamdisk`, with the installed OS shut
/// down cleanly first, so its file systems are left clean before the power
/// cycle boots the ramdisk. Its agent is asked to power the machine off
/// (`node.powerOff`) and the BMC is read until it is off; both optional: an
/// OS whose agent does not answer (none runs, it hangs, it refuses, or it
/// was not heard lately: an idle OS in a large fleet beats only every
/// several minutes) or that does not go off in time is let be. Then the
/// BMC powers it off (`bmc-power-off`, v5): a graceful shutdown where the
/// BMC offers one (ACPI), forced after its time, and nothing when the OS
/// already went off. v4 power-cycled an OS that had not answered hard.
/// Cancelled (undeploy while the rescue ramdisk still boots) or failed, it
/// clears the boot entry it made and powers off.
pub fn metal_rescue() -> Profile {
    let mut steps = ensure_ramdisk();
    steps.splice(
        1..1,
        [
            // An idle OS hears of the workflow at its next heartbeat
            // (a minute in a small fleet, more in a large one), then takes
            // the command.
            optional(once("os-power-off", StepKind::NodePowerOff, 150)),
            optional(StepDef {
                retry: RetryPolicy::POLL_SHUTDOWN,
                ..step("wait-os-off", StepKind::WaitPowerOff, 60)
            }),
            step("bmc-power-off", StepKind::BmcPowerOff, 300),
        ],
    );
    Profile {
        id: "metal-rescue".into(),
        version: 5,
        steps,
        cleanup: boot_cleanup(),
    }
}

/// `metal-unrescue` v2: disk persistently, power cycle, wait ≤ 20 min for
/// the installed OS with role `node` to be heard again, clean up boot
/// entries. (v1 waited for a join, which the kept OS never makes.)
pub fn metal_unrescue() -> Profile {
    Profile {
        id: "metal-unrescue".into(),
        version: 2,
        steps: vec![
            step("boot-disk", StepKind::BmcBootDisk { persistent: true }, 120),
            step(
                "power-cycle",
                StepKind::BmcPower {
                    action: PowerAction::Cycle,
                },
                300,
            ),
            once(
                "wait-os",
                StepKind::WaitOsBack {
                    role: "node".into(),
                    timeout_secs: 1_200,
                },
                1_200,
            ),
            step("clear-boot-entry", StepKind::BootEntryClear, 60),
        ],
        cleanup: vec![],
    }
}

/// `metal-retire-adopted` v1: the retire of an adopted machine, which has
/// no BMC to boot it a ramdisk or power it off: its own OS's agent
/// crypto-erases every disk (by the pool's erase methods, read back) and
/// powers it off; then its identity is revoked. There is nothing to clean
/// up: nothing was booted or changed beside the disks.
pub fn metal_retire_adopted() -> Profile {
    Profile {
        id: "metal-retire-adopted".into(),
        version: 1,
        steps: vec![
            once(
                "crypto-erase",
                StepKind::NodeWipe {
                    mode: WipeMode::CryptoErase,
                },
                86_400,
            ),
            once("power-off", StepKind::NodePowerOff, 300),
            step("revoke-identity", StepKind::RevokeIdentity, 60),
        ],
        cleanup: vec![],
    }
}

/// `metal-retire` v2: crypto-erase, power off, revoke identity, forget
/// BMC credentials.
pub fn metal_retire() -> Profile {
    let mut steps = ensure_ramdisk();
    steps.extend([
        once(
            "crypto-erase",
            StepKind::DiskWipe {
                mode: WipeMode::CryptoErase,
            },
            86_400,
        ),
        power_off(),
        step("clear-boot-entry", StepKind::BootEntryClear, 60),
        step("revoke-identity", StepKind::RevokeIdentity, 60),
        step("forget-bmc-credentials", StepKind::ForgetBmcCredentials, 60),
    ]);
    Profile {
        id: "metal-retire".into(),
        version: 2,
        steps,
        cleanup: boot_cleanup(),
    }
}

/// A tenant deploy profile: stream an image, boot from disk, reboot, wait
/// for the installed OS's agent to join (agent role `node`). The reconciler
/// sets the node's role (`host` unless the profile says `dedicated`) when
/// it applies `complete`.
pub fn tenant_deploy(id: &str, version: u32) -> Profile {
    let mut steps = ensure_ramdisk();
    steps.extend([
        once("deploy-image", StepKind::DeployImage, 7_200),
        step("boot-disk", StepKind::BmcBootDisk { persistent: true }, 120),
        step(
            "reboot",
            StepKind::BmcPower {
                action: PowerAction::Cycle,
            },
            300,
        ),
        once(
            "wait-os",
            StepKind::WaitOsJoin {
                role: "node".to_owned(),
                timeout_secs: 1_800,
            },
            1_800,
        ),
        step("clear-boot-entry", StepKind::BootEntryClear, 60),
    ]);
    Profile {
        id: id.to_owned(),
        version,
        steps,
        cleanup: boot_cleanup(),
    }
}

/// `metal-inspect-oob` v1 (agentless): the BMC's inventory — systems,
/// processors, memory, storage, network interfaces — recorded as the
/// node's; nothing boots.
pub fn metal_inspect_oob() -> Profile {
    Profile {
        id: "metal-inspect-oob".into(),
        version: 1,
        steps: vec![
            step("verify-bmc", StepKind::BmcVerify, 120),
            step("inspect-oob", StepKind::BmcInspect, 300),
            step("store-inventory", StepKind::StoreInventory, 30),
        ],
        cleanup: vec![],
    }
}

/// The BMC drive erase of an agentless profile, once (an erase is never
/// sent twice).
fn bmc_erase(mode: WipeMode, required: bool) -> StepDef {
    once("bmc-erase", StepKind::BmcErase { mode, required }, 86_400)
}

/// `metal-commission-oob` v1 (agentless): the BMC answers with the
/// inventory recorded, the pool's wipe as a BMC drive erase where the BMC
/// offers one, power off.
pub fn metal_commission_oob(mode: WipeMode) -> Profile {
    let mut steps = vec![
        step("verify-bmc", StepKind::BmcVerify, 120),
        record_firmware(),
    ];
    if mode != WipeMode::None {
        steps.push(bmc_erase(mode, false));
    }
    steps.push(power_off());
    Profile {
        id: "metal-commission-oob".into(),
        version: 1,
        steps,
        cleanup: vec![power_off()],
    }
}

/// `metal-release-oob` v1 (agentless): eject what a deploy left in the
/// virtual CD, erase through the BMC where it offers one (the release is
/// attested only if it covered every recorded drive), power off.
pub fn metal_release_oob(mode: WipeMode) -> Profile {
    Profile {
        id: "metal-release-oob".into(),
        version: 1,
        steps: vec![
            step("eject-media", StepKind::MediaEject, 120),
            bmc_erase(mode, false),
            power_off(),
        ],
        cleanup: vec![power_off()],
    }
}

/// `metal-release-oob-dedicated` v1 (agentless, a node its tenant had
/// root on): the out-of-band release, then the firmware compared with
/// what commissioning recorded, the boot override reset to the disk, and
/// the BMC password rotated to the teardown password the verb recorded.
pub fn metal_release_oob_dedicated(mode: WipeMode) -> Profile {
    let mut p = metal_release_oob(mode);
    p.id = "metal-release-oob-dedicated".into();
    p.steps.extend(dedicated_teardown());
    p
}

/// What a dedicated teardown adds once the disks are done and the machine
/// is off.
fn dedicated_teardown() -> [StepDef; 3] {
    [
        once("check-firmware", StepKind::BmcFirmware { check: true }, 300),
        step(
            "reset-boot",
            StepKind::BmcBootDisk { persistent: true },
            120,
        ),
        step("rotate-bmc-password", StepKind::RotateBmcPassword, 300),
    ]
}

/// `metal-retire-oob` v1 (agentless): a crypto-erase the BMC must offer
/// (a BMC without one fails the retire: nothing else can erase), power off,
/// revoke identity, forget BMC credentials.
pub fn metal_retire_oob() -> Profile {
    Profile {
        id: "metal-retire-oob".into(),
        version: 1,
        steps: vec![
            step("eject-media", StepKind::MediaEject, 120),
            bmc_erase(WipeMode::CryptoErase, true),
            power_off(),
            step("revoke-identity", StepKind::RevokeIdentity, 60),
            step("forget-bmc-credentials", StepKind::ForgetBmcCredentials, 60),
        ],
        cleanup: vec![power_off()],
    }
}

/// A tenant deploy on an agentless pool: the profile's installer image as
/// the BMC's virtual CD, a one-time CD boot, a power cycle, then the
/// installer's run until it powers the machine off (its hand-off: no agent
/// reports), eject, disk persistently, power on into the installed OS.
pub fn tenant_deploy_oob(id: &str, version: u32) -> Profile {
    Profile {
        id: id.to_owned(),
        version,
        steps: vec![
            once("insert-media", StepKind::MediaInsert, 600),
            step("cd-once", StepKind::BmcBootCd { persistent: false }, 120),
            step(
                "power-cycle",
                StepKind::BmcPower {
                    action: PowerAction::Cycle,
                },
                300,
            ),
            StepDef {
                retry: RetryPolicy::POLL_INSTALLER,
                ..step("wait-installer", StepKind::WaitPowerOff, 60)
            },
            step("eject-media", StepKind::MediaEject, 120),
            step("boot-disk", StepKind::BmcBootDisk { persistent: true }, 120),
            step(
                "power-on",
                StepKind::BmcPower {
                    action: PowerAction::On,
                },
                300,
            ),
        ],
        cleanup: vec![step("eject-media", StepKind::MediaEject, 120), power_off()],
    }
}

/// The deploy profile a tenant's deploy runs on a pool of `agent` mode.
pub fn tenant_deploy_for(id: &str, version: u32, agent: AgentMode) -> Profile {
    match agent {
        AgentMode::Bcd => tenant_deploy(id, version),
        AgentMode::None => tenant_deploy_oob(id, version),
    }
}

/// The metal profile a workflow-driven state runs. `deploying` runs the
/// tenant's profile and is not decided here. `wipe` is the state's wipe:
/// the release's for `releasing`, the pool's commissioning wipe for
/// `commissioning`. An agentless pool (`agent` `none`) runs the
/// out-of-band variants and has no rescue (nothing boots an agent).
pub fn metal_profile_for(
    state: ProvisionState,
    unrescue: bool,
    wipe: WipeMode,
    agent: AgentMode,
) -> Option<Profile> {
    use ProvisionState::*;
    if agent.is_agentless() {
        return Some(match state {
            Enrolling => metal_enroll(),
            Inspecting => metal_inspect_oob(),
            Commissioning => metal_commission_oob(wipe),
            Releasing => metal_release_oob(wipe),
            Retiring => metal_retire_oob(),
            _ => return None,
        });
    }
    Some(match state {
        Enrolling => metal_enroll(),
        Inspecting => metal_inspect(),
        Commissioning => metal_commission(wipe),
        Releasing => metal_release(wipe),
        Rescue if unrescue => metal_unrescue(),
        Rescue => metal_rescue(),
        Retiring => metal_retire(),
        _ => return None,
    })
}

/// Why a wipe result does not count as verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnverifiedWipe {
    #[error("the disk.wipe result is not node-signed")]
    Unsigned,
    #[error("the disk.wipe result lists no disk")]
    NoDisk,
    #[error("a disk of the node's recorded inventory is missing from the disk.wipe result")]
    DiskMissing,
    #[error("a disk did not pass read-back verification")]
    ReadBackFailed,
}

/// A disk as the inventory recorded it or a wipe reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskId<'a> {
    pub name: &'a str,
    pub serial: &'a str,
}

/// The disks of the node's recorded inventory that a wipe result does not
/// account for, as `name (serial)`: a recorded disk with a serial is
/// accounted for by a reported disk with that serial (a disk swapped for
/// another under the same name is not), one without by a reported disk of
/// that name. A disk that went missing or silent since the inventory was
/// taken is therefore never taken for wiped.
pub fn disks_unaccounted(recorded: &[DiskId<'_>], reported: &[DiskId<'_>]) -> Vec<String> {
    recorded
        .iter()
        .filter(|r| {
            !reported.iter().any(|w| {
                if r.serial.is_empty() {
                    w.name == r.name
                } else {
                    w.serial == r.serial
                }
            })
        })
        .map(|r| match r.serial {
            "" => r.name.to_owned(),
            serial => format!("{} ({serial})", r.name),
        })
        .collect()
}

/// Whether a `disk.wipe` result proves a wipe: node-signed (the signature
/// was verified when it was stored), at least one disk, every disk of the
/// node's recorded inventory in it (`unaccounted`, from
/// [`disks_unaccounted`]), and every disk read back clean
/// (`disks_verified`, one flag per disk the result lists). Only such a
/// result lets a release reach `ready`.
pub fn wipe_verdict(
    signed: bool,
    disks_verified: &[bool],
    unaccounted: &[String],
) -> Result<(), UnverifiedWipe> {
    if !signed {
        Err(UnverifiedWipe::Unsigned)
    } else if disks_verified.is_empty() {
        Err(UnverifiedWipe::NoDisk)
    } else if !unaccounted.is_empty() {
        Err(UnverifiedWipe::DiskMissing)
    } else if disks_verified.iter().any(|v| !v) {
        Err(UnverifiedWipe::ReadBackFailed)
    } else {
        Ok(())
    }
}

crate::wire_enum! {
    /// The state of one step as the engine records it.
    pub enum StepStatus "step status" {
        Pending = "pending",
        Running = "running",
        Succeeded = "succeeded",
        Failed = "failed",
        Skipped = "skipped",
    }
}

impl StepStatus {
    /// Whether the step still has to run or is running.
    pub const fn is_open(self) -> bool {
        matches!(self, StepStatus::Pending | StepStatus::Running)
    }

    /// Whether the step ended (succeeded or failed).
    pub const fn is_finished(self) -> bool {
        matches!(self, StepStatus::Succeeded | StepStatus::Failed)
    }
}

crate::wire_enum! {
    /// The state of a command row.
    pub enum CommandStatus "command status" {
        /// Recorded; a site command is on its way through the outbox, an
        /// agent command waits for the agent's poll.
        Pending = "pending",
        /// Handed to the agent by a poll.
        Sent = "sent",
        Succeeded = "succeeded",
        Failed = "failed",
    }
}

impl CommandStatus {
    /// Whether a result arrived.
    pub const fn is_done(self) -> bool {
        matches!(self, CommandStatus::Succeeded | CommandStatus::Failed)
    }
}

/// What happened to a running step's attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    Succeeded,
    /// The executor failed; `retryable` false ends the step at once.
    Failed {
        retryable: bool,
        message: String,
    },
    TimedOut,
}

/// What the engine does next with a step after an outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterOutcome {
    /// The step succeeded.
    Done,
    /// Run attempt `attempt` after `after_ms`.
    Retry { attempt: u32, after_ms: u64 },
    /// The step failed for good with this message.
    GiveUp { message: String },
    /// An optional step failed for good with this message: it is skipped
    /// (with the optional steps right after it, [`skipped_after`]) and the
    /// workflow goes on.
    Skip { message: String },
}

/// Decides what an outcome of attempt `attempt` of `def` leads to. `jitter`
/// in `[0, 1)` comes from the caller's random source.
pub fn after_outcome(
    def: &StepDef,
    attempt: u32,
    outcome: &StepOutcome,
    jitter: f64,
) -> AfterOutcome {
    let (retryable, message) = match outcome {
        StepOutcome::Succeeded => return AfterOutcome::Done,
        StepOutcome::Failed { retryable, message } => (*retryable, message.clone()),
        StepOutcome::TimedOut => (
            true,
            format!("{} timed out after {} s", def.name, def.timeout_secs),
        ),
    };
    if retryable && attempt < def.retry.max_attempts {
        let next = attempt + 1;
        return AfterOutcome::Retry {
            attempt: next,
            after_ms: def.retry.backoff_ms(next, jitter),
        };
    }
    let message = if retryable {
        format!(
            "{message} (after {attempt} attempt{})",
            if attempt == 1 { "" } else { "s" }
        )
    } else {
        message
    };
    if def.optional {
        AfterOutcome::Skip { message }
    } else {
        AfterOutcome::GiveUp { message }
    }
}

/// The steps skipped with the optional step at `pos` that was skipped:
/// the optional steps right after it (up to the first step that is not
/// optional), which follow from it — a wait for the power-off an agent
/// did not do would only wait out its time.
pub fn skipped_after(steps: &[StepDef], pos: usize) -> std::ops::Range<usize> {
    let start = (pos + 1).min(steps.len());
    let end = steps[start..]
        .iter()
        .position(|s| !s.optional)
        .map_or(steps.len(), |n| start + n);
    start..end
}

/// Where a retried step starts again: itself, or — for a power action that
/// boots the ramdisk — the boot entry before it. Such an action may have
/// booted the machine before its answer was lost (an executor restarted
/// mid-command, a BMC that timed out after acting): the ramdisk that booted
/// has spent the entry's one-time join token, and a one-time PXE boot has
/// fallen back to disk. Power-cycling again as it was would boot nothing
/// that can join, while the join wait counted the first boot's agent, whose
/// machine was just reset under it. So the retry repeats the chain from a
/// fresh boot entry (a fresh token) and the one-time PXE boot.
///
/// `main` is the profile's main steps; `pos` the retried one.
pub fn retry_starts_at(main: &[StepKind], pos: usize) -> usize {
    let boots_ramdisk = matches!(
        main.get(pos),
        Some(StepKind::BmcPower {
            action: PowerAction::On | PowerAction::Cycle | PowerAction::Reset
        })
    ) && main[pos + 1..]
        .iter()
        .take_while(|k| !matches!(k, StepKind::BootEntrySet))
        .any(|k| matches!(k, StepKind::WaitRamdiskJoin));
    if !boots_ramdisk {
        return pos;
    }
    main[..pos]
        .iter()
        .rposition(|k| matches!(k, StepKind::BootEntrySet))
        .unwrap_or(pos)
}

/// The main steps a retry of main step `pos` opens again: from where
/// [`retry_starts_at`] says it starts up to `pos`, but for the optional
/// ones (the installed OS asked to shut down, and the wait for it) and a
/// BMC power-off (rescue's shutdown of the installed OS): those shut the
/// OS down once, what they did stands, and the ramdisk's chain does not
/// depend on them.
pub fn repeated_for_retry(main: &[StepDef], pos: usize) -> Vec<usize> {
    let kinds: Vec<StepKind> = main.iter().map(|d| d.kind.clone()).collect();
    (retry_starts_at(&kinds, pos)..pos)
        .filter(|&i| !main[i].optional && main[i].kind != StepKind::BmcPowerOff)
        .collect()
}

/// The main step since whose last start a ramdisk join counts for the join
/// wait at `pos`: the boot entry before it (the token that ramdisk joins
/// with), if any.
pub fn join_counts_since_step(main: &[StepKind], pos: usize) -> Option<usize> {
    main[..pos.min(main.len())]
        .iter()
        .rposition(|k| matches!(k, StepKind::BootEntrySet))
}

crate::wire_enum! {
    /// The phase of a workflow, as stored in `workflows.status`.
    pub enum WorkflowPhase "workflow status" {
        /// Main steps run.
        Running = "running",
        /// A main step failed for good: cleanup steps run, then `Failed`.
        FailingCleanup = "failing-cleanup",
        /// Cancelled: cleanup steps run, then `Cancelled`.
        CancellingCleanup = "cancelling-cleanup",
        Succeeded = "succeeded",
        Failed = "failed",
        Cancelled = "cancelled",
    }
}

impl WorkflowPhase {
    /// Whether a cancel may still stop it (it has not ended or begun its
    /// cancel).
    pub const fn cancellable(self) -> bool {
        matches!(self, WorkflowPhase::Running | WorkflowPhase::FailingCleanup)
    }

    /// Whether the workflow has ended.
    pub const fn is_final(self) -> bool {
        matches!(
            self,
            WorkflowPhase::Succeeded | WorkflowPhase::Failed | WorkflowPhase::Cancelled
        )
    }
}

/// What the engine must do next for a workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    /// Run main step `index`.
    Main(usize),
    /// Run cleanup step `index`.
    Cleanup(usize),
    /// The workflow ends in this phase.
    Finish(WorkflowPhase),
}

/// The next thing to run given the phase and the status of every main and
/// cleanup step. Cleanup steps run in order whatever each one's outcome
/// (best effort); a cancel never skips them.
pub fn next_step(phase: WorkflowPhase, main: &[StepStatus], cleanup: &[StepStatus]) -> NextStep {
    let open = |s: &StepStatus| matches!(s, StepStatus::Pending | StepStatus::Running);
    match phase {
        WorkflowPhase::Running => match main.iter().position(open) {
            Some(i) => NextStep::Main(i),
            None if main
                .iter()
                .all(|s| matches!(s, StepStatus::Succeeded | StepStatus::Skipped)) =>
            {
                NextStep::Finish(WorkflowPhase::Succeeded)
            }
            None => next_step(WorkflowPhase::FailingCleanup, main, cleanup),
        },
        WorkflowPhase::FailingCleanup | WorkflowPhase::CancellingCleanup => {
            match cleanup.iter().position(open) {
                Some(i) => NextStep::Cleanup(i),
                None if phase == WorkflowPhase::CancellingCleanup => {
                    NextStep::Finish(WorkflowPhase::Cancelled)
                }
                None => NextStep::Finish(WorkflowPhase::Failed),
            }
        }
        done => NextStep::Finish(done),
    }
}

#[cfg(test)]
mod tests;
