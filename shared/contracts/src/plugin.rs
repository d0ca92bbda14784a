//! The BMC driver plugin protocol: how the bmc service runs a driver it
//! does not carry inside itself (IPMI is one: `bcx-ipmi`). One process per
//! operation. The service writes one [`PluginRequest`] as JSON to the
//! plugin's standard input and closes it; the plugin writes one
//! [`PluginResponse`] as JSON to its standard output and exits 0.
//! Credentials travel on standard input only (never the command line or
//! the environment, which other users of the host can read); the plugin's
//! standard error is logged and must not carry them. A plugin that exits
//! non-zero, writes anything but one response, or answers another
//! protocol version is a failed operation (`unsupported`). The service
//! stops a plugin that outlives its time-out.
//!
//! A site hosts a driver by naming its executable in the bmc service's
//! configuration (`plugins.<driver>`), so a build of a driver replaces
//! another without rebuilding the services; a driver the site hosts
//! neither natively nor as a plugin answers `unsupported-driver`.

use bcm_core::{PowerAction, PowerState};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::commands::{BootDevice, BootMode};
use crate::outputs::{BootOverride, OobInventory, Verified};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// One operation on one BMC.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginRequest {
    /// [`PROTOCOL_VERSION`].
    pub protocol: u32,
    pub bmc: PluginBmc,
    pub operation: PluginOperation,
}

impl std::fmt::Debug for PluginRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRequest")
            .field("protocol", &self.protocol)
            .field("address", &self.bmc.address)
            .field("operation", &self.operation.name())
            .finish_non_exhaustive()
    }
}

/// The BMC and the credentials it is logged in to with.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginBmc {
    /// As the node is enrolled (`ipmi://host:port` for IPMI).
    pub address: String,
    pub username: String,
    pub password: String,
}

/// What to do.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(
    tag = "op",
    content = "params",
    rename_all = "camelCase",
    deny_unknown_fields
)]
pub enum PluginOperation {
    /// Log in; report the BMC's identity and the power state.
    Verify,
    /// Out-of-band inventory.
    Inspect,
    /// Read the power state.
    PowerState,
    /// Change the power state and wait until it shows.
    #[serde(rename_all = "camelCase")]
    Power { action: PowerAction },
    /// Set the boot device, once or persistently.
    #[serde(rename_all = "camelCase")]
    Boot {
        device: BootDevice,
        persistent: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<BootMode>,
    },
    /// Set a new password on the account the request logs in with.
    #[serde(rename_all = "camelCase")]
    SetPassword { new_password: String },
}

impl PluginOperation {
    /// The operation's wire name (what a log line may show).
    pub fn name(&self) -> &'static str {
        match self {
            PluginOperation::Verify => "verify",
            PluginOperation::Inspect => "inspect",
            PluginOperation::PowerState => "powerState",
            PluginOperation::Power { .. } => "power",
            PluginOperation::Boot { .. } => "boot",
            PluginOperation::SetPassword { .. } => "setPassword",
        }
    }
}

/// The plugin's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum PluginResponse {
    /// Boxed: an inventory is far larger than an error.
    Ok(Box<PluginOutput>),
    Error(PluginError),
}

/// What an operation produced, named by its operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(
    tag = "op",
    content = "output",
    rename_all = "camelCase",
    deny_unknown_fields
)]
pub enum PluginOutput {
    Verify(Verified),
    Inspect(OobInventory),
    PowerState(PowerState),
    Power(PowerState),
    Boot(BootOverride),
    SetPassword,
}

/// Why an operation failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginError {
    pub kind: PluginErrorKind,
    /// What the operator reads in the node's `lastError`; never a
    /// credential.
    pub message: String,
    /// The BMC's status, for `refused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

/// The kinds of failure, which decide whether a retry may help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PluginErrorKind {
    /// The credentials were refused.
    Unauthorized,
    /// No answer (retryable).
    Unreachable,
    /// The BMC answered with an error status.
    Refused,
    /// The machine did not reach the state in time (retryable).
    Timeout,
    /// The BMC or the plugin cannot do this.
    Unsupported,
    /// The request or the BMC's answer is malformed.
    Invalid,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_and_its_answers_round_trip_and_the_debug_form_hides_credentials() {
        let req = PluginRequest {
            protocol: PROTOCOL_VERSION,
            bmc: PluginBmc {
                address: "ipmi://10.0.0.1:623".into(),
                username: "admin".into(),
                password: "s3cret-pw".into(),
            },
            operation: PluginOperation::Power {
                action: PowerAction::Cycle,
            },
        };
        let text = serde_json::to_string(&req).expect("json");
        assert!(
            text.contains(r#""operation":{"op":"power","params":{"action":"cycle"}}"#),
            "{text}"
        );
        assert_eq!(
            serde_json::from_str::<PluginRequest>(&text).expect("back"),
            req
        );
        assert!(!format!("{req:?}").contains("s3cret-pw"));
        let ok = PluginResponse::Ok(Box::new(PluginOutput::Power(PowerState::On)));
        let text = serde_json::to_string(&ok).expect("json");
        assert_eq!(text, r#"{"ok":{"op":"power","output":"on"}}"#);
        assert_eq!(
            serde_json::from_str::<PluginResponse>(&text).expect("back"),
            ok
        );
        let err: PluginResponse = serde_json::from_str(
            r#"{"error":{"kind":"unauthorized","message":"RAKP 2 HMAC is invalid"}}"#,
        )
        .expect("error");
        assert!(matches!(
            err,
            PluginResponse::Error(PluginError {
                kind: PluginErrorKind::Unauthorized,
                ..
            })
        ));
        for bad in [
            r#"{"ok":{"op":"power","output":"sideways"}}"#,
            r#"{"error":{"kind":"panic","message":""}}"#,
            r#"{"ok":{"op":"power","output":"on"},"extra":1}"#,
            r#"{}"#,
        ] {
            assert!(
                serde_json::from_str::<PluginResponse>(bad).is_err(),
                "{bad}"
            );
        }
    }
}
