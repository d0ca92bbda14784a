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

/// The BMC driver a node is managed with. `redfish` is native to the bmc
/// service; `ipmi` and every `plugin:<name>` are hosted as plugins (an
/// executable named in the bmc service's `plugins.<name>`, so a site adds
/// a driver without a rebuild); `sim` is the simulated BMC; `none` is an
/// adopted machine, which has no BMC on record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BmcDriver {
    Redfish,
    Ipmi,
    Sim,
    None,
    /// A driver only a plugin knows, by its name.
    Plugin(PluginName),
}

/// The longest plugin name after `plugin:`.
pub const MAX_PLUGIN_NAME: usize = 32;

/// The wire prefix of a plugin driver.
pub const PLUGIN_PREFIX: &str = "plugin:";

/// The pattern of a BMC driver's wire name, for schemas.
pub const BMC_DRIVER_PATTERN: &str = "^(redfish|ipmi|sim|none|plugin:[a-z][a-z0-9-]{0,31})$";

/// The name of a driver hosted as a plugin: `[a-z][a-z0-9-]{0,31}`, kept
/// inline (with its `plugin:` prefix) so that a driver stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PluginName {
    len: u8,
    wire: [u8; PLUGIN_PREFIX.len() + MAX_PLUGIN_NAME],
}

impl PluginName {
    /// Checks a plugin's name (without the prefix).
    pub fn new(name: &str) -> Result<Self, String> {
        let ok = !name.is_empty()
            && name.len() <= MAX_PLUGIN_NAME
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !ok {
            return Err(format!(
                "plugin driver name {:?} is not [a-z][a-z0-9-]{{0,{}}}",
                name.chars().take(64).collect::<String>(),
                MAX_PLUGIN_NAME - 1
            ));
        }
        let mut wire = [0u8; PLUGIN_PREFIX.len() + MAX_PLUGIN_NAME];
        let full = format!("{PLUGIN_PREFIX}{name}");
        wire[..full.len()].copy_from_slice(full.as_bytes());
        Ok(Self {
            len: full.len() as u8,
            wire,
        })
    }

    /// `plugin:<name>`.
    pub fn wire(&self) -> &str {
        // Built from checked ASCII only.
        std::str::from_utf8(&self.wire[..usize::from(self.len)]).unwrap_or(PLUGIN_PREFIX)
    }

    /// The name without its prefix (the bmc service's `plugins.<name>`).
    pub fn name(&self) -> &str {
        &self.wire()[PLUGIN_PREFIX.len()..]
    }
}

impl std::fmt::Debug for PluginName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.wire())
    }
}

impl BmcDriver {
    /// The drivers every build knows.
    pub const BUILT_IN: [BmcDriver; 4] = [
        BmcDriver::Redfish,
        BmcDriver::Ipmi,
        BmcDriver::Sim,
        BmcDriver::None,
    ];

    /// The wire name.
    pub fn as_str(&self) -> &str {
        match self {
            BmcDriver::Redfish => "redfish",
            BmcDriver::Ipmi => "ipmi",
            BmcDriver::Sim => "sim",
            BmcDriver::None => "none",
            BmcDriver::Plugin(p) => p.wire(),
        }
    }

    /// Parses the wire name; an unknown one is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::parse_or_err(s).ok()
    }

    /// Parses the wire name; an unknown one is an error naming what was
    /// expected.
    pub fn parse_or_err(s: &str) -> Result<Self, crate::wire::UnknownWireName> {
        if let Some(d) = Self::BUILT_IN.into_iter().find(|d| d.as_str() == s) {
            return Ok(d);
        }
        s.strip_prefix(PLUGIN_PREFIX)
            .and_then(|name| PluginName::new(name).ok())
            .map(BmcDriver::Plugin)
            .ok_or_else(|| crate::wire::UnknownWireName {
                what: "BMC driver",
                value: s.chars().take(64).collect(),
                expected: "redfish, ipmi, sim, none, plugin:<name>".to_owned(),
            })
    }

    /// The plugin name a site hosts this driver under (`plugins.<name>`),
    /// if it is hosted as a plugin.
    pub fn plugin_name(&self) -> Option<&str> {
        match self {
            BmcDriver::Ipmi => Some("ipmi"),
            BmcDriver::Plugin(p) => Some(p.name()),
            _ => Option::None,
        }
    }

    /// The driver a site's `plugins.<name>` hosts.
    pub fn hosted_as(name: &str) -> Result<Self, String> {
        match name {
            "ipmi" => Ok(BmcDriver::Ipmi),
            "redfish" | "sim" | "none" => Err(format!(
                "{name} is not hosted as a plugin (redfish is native, sim is simulated, none has no BMC)"
            )),
            other => PluginName::new(other).map(BmcDriver::Plugin),
        }
    }
}

impl std::fmt::Display for BmcDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BmcDriver {
    type Err = crate::wire::UnknownWireName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_or_err(s)
    }
}

impl serde::Serialize for BmcDriver {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for BmcDriver {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::parse_or_err(&s).map_err(serde::de::Error::custom)
    }
}

const BMC_DRIVER_DOC: &str = "The BMC driver a node is managed with: redfish (native), ipmi (hosted as a plugin), plugin:<name> (a driver a site hosts as a plugin, plugins.<name> in its bmc service), sim (the simulated BMC), none (an adopted machine, no BMC on record).";

impl schemars::JsonSchema for BmcDriver {
    fn schema_name() -> String {
        "BmcDriver".to_owned()
    }
    fn json_schema(_: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        schemars::schema::SchemaObject {
            instance_type: Some(schemars::schema::InstanceType::String.into()),
            string: Some(Box::new(schemars::schema::StringValidation {
                pattern: Some(BMC_DRIVER_PATTERN.to_owned()),
                max_length: Some((PLUGIN_PREFIX.len() + MAX_PLUGIN_NAME) as u32),
                ..Default::default()
            })),
            metadata: Some(Box::new(schemars::schema::Metadata {
                description: Some(BMC_DRIVER_DOC.to_owned()),
                ..Default::default()
            })),
            ..Default::default()
        }
        .into()
    }
}

impl utoipa::PartialSchema for BmcDriver {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some(BMC_DRIVER_PATTERN))
            .max_length(Some(PLUGIN_PREFIX.len() + MAX_PLUGIN_NAME))
            .description(Some(BMC_DRIVER_DOC))
            .into()
    }
}

impl utoipa::ToSchema for BmcDriver {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bmc_drivers_are_built_in_or_named_plugins() {
        for d in BmcDriver::BUILT_IN {
            assert_eq!(BmcDriver::parse(d.as_str()), Some(d));
        }
        let acme = BmcDriver::parse("plugin:acme-2").expect("plugin");
        assert_eq!(acme.as_str(), "plugin:acme-2");
        assert_eq!(acme.plugin_name(), Some("acme-2"));
        assert_eq!(format!("{acme:?}"), "Plugin(plugin:acme-2)");
        assert_eq!(
            serde_json::to_string(&acme).expect("json"),
            "\"plugin:acme-2\""
        );
        let back: BmcDriver = serde_json::from_str("\"plugin:acme-2\"").expect("json");
        assert_eq!(back, acme);
        assert_eq!(BmcDriver::Ipmi.plugin_name(), Some("ipmi"));
        assert_eq!(BmcDriver::Redfish.plugin_name(), None);
        let longest = format!("plugin:a{}", "b".repeat(MAX_PLUGIN_NAME - 1));
        assert_eq!(
            BmcDriver::parse(&longest).map(|d| d.to_string()),
            Some(longest.clone())
        );
    }

    #[test]
    fn garbage_driver_names_are_refused() {
        for bad in [
            "",
            "plugin:",
            "plugin:Acme",
            "plugin:1acme",
            "plugin:acme_x",
            "plugin:acme x",
            "plugin:ä",
            "plugin:plugin:x",
            "Redfish",
            "acme",
            &format!("plugin:a{}", "b".repeat(MAX_PLUGIN_NAME)),
        ] {
            assert_eq!(BmcDriver::parse(bad), None, "{bad:?}");
            assert!(serde_json::from_value::<BmcDriver>(serde_json::json!(bad)).is_err());
        }
        assert!(BmcDriver::hosted_as("redfish").is_err());
        assert!(BmcDriver::hosted_as("none").is_err());
        assert!(BmcDriver::hosted_as("Bad Name").is_err());
        assert_eq!(BmcDriver::hosted_as("ipmi"), Ok(BmcDriver::Ipmi));
    }
}
