//! The node's other axes and inputs the verbs take: power, wipe modes and
//! BMC drivers.

crate::wire_enum! {
/// How `metal.undeploy` wipes the disks. The default is `quick`.
pub enum WipeMode "wipe mode" {
    None = "none",
    Quick = "quick",
    SecureErase = "secure-erase",
    CryptoErase = "crypto-erase",
}}

impl WipeMode {
    /// Whether a release with this mode can end in `ready`: a node reaches
    /// `ready` only through commissioning or a verified wipe, so `none`
    /// never can. The API refuses a release with `none` before anything
    /// changes (`INVALID_ARGUMENT`, [`WIPE_NONE_REFUSED`]) instead of
    /// running a release that must end in `failed`.
    pub const fn can_reach_ready(self) -> bool {
        !matches!(self, WipeMode::None)
    }
}

/// Why a release with `wipe: none` is refused.
pub const WIPE_NONE_REFUSED: &str = "wipe none is refused: a released node reaches ready only through a verified wipe, and a release without one could only end in failed with UNVERIFIED_WIPE; choose quick, secure-erase or crypto-erase";

// The enum comes from a macro, so `#[default]` cannot mark the variant.
#[allow(clippy::derivable_impls)]
impl Default for WipeMode {
    fn default() -> Self {
        WipeMode::Quick
    }
}

crate::wire_enum! {
/// The power axis of a node as last read from its BMC.
pub enum PowerState "power state" {
    On = "on",
    Off = "off",
    Unknown = "unknown",
}}

crate::wire_enum! {
/// What `metal.power` asks the BMC to do.
pub enum PowerAction "power action" {
    On = "on",
    Off = "off",
    Cycle = "cycle",
    Reset = "reset",
}}

crate::wire_enum! {
/// The BMC driver a node is managed with. `sim` is the simulated BMC;
/// `none` is an adopted machine, which has no BMC on record.
pub enum BmcDriver "BMC driver" {
    Redfish = "redfish",
    Ipmi = "ipmi",
    Sim = "sim",
    None = "none",
}}
