//! The node's other axes and inputs the verbs take: power, wipe modes and
//! BMC drivers.

use serde::{Deserialize, Serialize};

macro_rules! wire_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $wire:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema)]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $wire)] $variant),+
        }

        impl $name {
            /// Every value.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The wire name.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $wire),+ }
            }

            /// Parses the wire name.
            pub fn parse(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

wire_enum!(
    /// How `metal.undeploy` wipes the disks. The default is `quick`.
    WipeMode {
        None = "none",
        Quick = "quick",
        SecureErase = "secure-erase",
        CryptoErase = "crypto-erase",
    }
);

// The enum comes from a macro, so `#[default]` cannot mark the variant.
#[allow(clippy::derivable_impls)]
impl Default for WipeMode {
    fn default() -> Self {
        WipeMode::Quick
    }
}

wire_enum!(
    /// The power axis of a node as last read from its BMC.
    PowerState {
        On = "on",
        Off = "off",
        Unknown = "unknown",
    }
);

wire_enum!(
    /// What `metal.power` asks the BMC to do.
    PowerAction {
        On = "on",
        Off = "off",
        Cycle = "cycle",
        Reset = "reset",
    }
);

wire_enum!(
    /// The BMC driver a node is managed with. `sim` is the simulated BMC;
    /// `none` is an adopted machine, which has no BMC on record.
    BmcDriver {
        Redfish = "redfish",
        Ipmi = "ipmi",
        Sim = "sim",
        None = "none",
    }
);
