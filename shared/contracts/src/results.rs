//! The result a site service publishes for a command
//! (`result.<siteId>.<commandId>`): its kind, whether it succeeded, and the
//! kind's typed output.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::commands::{CommandEnvelope, CommandKind};
use crate::outputs::Output;
use crate::ContractError;

/// The result of a site command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", try_from = "ResultWire", into = "ResultWire")]
pub struct CommandResult {
    pub command_id: String,
    /// The kind of the command it answers; its output is that kind's.
    pub kind: CommandKind,
    pub ok: bool,
    /// A failure the engine may retry (a timeout, a 503 from a BMC).
    #[serde(default)]
    pub retryable: bool,
    /// The kind's output: always when `ok`; when failed, only where the
    /// kind reports how far it got (a rotation that rolled back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Output>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl CommandResult {
    /// `cmd` succeeded with `output`.
    pub fn succeeded(cmd: &CommandEnvelope, output: Output) -> Self {
        Self {
            command_id: cmd.command_id.clone(),
            kind: cmd.kind(),
            ok: true,
            retryable: false,
            output: Some(output),
            error: None,
        }
    }

    /// `cmd` failed with `error`.
    pub fn failed(cmd: &CommandEnvelope, retryable: bool, error: impl Into<String>) -> Self {
        Self {
            command_id: cmd.command_id.clone(),
            kind: cmd.kind(),
            ok: false,
            retryable,
            output: None,
            error: Some(error.into()),
        }
    }

    /// The answer to a command that arrived after its deadline: not run,
    /// and not retryable (the control plane stopped waiting for it; a
    /// retry is a new command).
    pub fn expired(cmd: &CommandEnvelope) -> Self {
        let at = cmd.deadline.map(|d| d.to_rfc3339()).unwrap_or_default();
        Self::failed(
            cmd,
            false,
            format!("expired: the command's deadline ({at}) passed before it ran; not run"),
        )
    }

    /// The output as JSON (`{}` when there is none), as the command row
    /// stores it.
    pub fn output_json(&self) -> serde_json::Value {
        self.output
            .as_ref()
            .map(Output::to_json)
            .unwrap_or_else(|| serde_json::json!({}))
    }
}

/// A result as it is spelled: the output as JSON beside its kind.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ResultWire {
    command_id: String,
    kind: CommandKind,
    ok: bool,
    #[serde(default)]
    retryable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl TryFrom<ResultWire> for CommandResult {
    type Error = ContractError;
    fn try_from(w: ResultWire) -> Result<Self, ContractError> {
        Ok(Self {
            output: Output::decode_result(
                w.kind,
                w.ok,
                w.output.as_ref().unwrap_or(&serde_json::Value::Null),
            )?,
            command_id: w.command_id,
            kind: w.kind,
            ok: w.ok,
            retryable: w.retryable,
            error: w.error,
        })
    }
}

impl From<CommandResult> for ResultWire {
    fn from(r: CommandResult) -> Self {
        Self {
            output: r.output.as_ref().map(Output::to_json),
            command_id: r.command_id,
            kind: r.kind,
            ok: r.ok,
            retryable: r.retryable,
            error: r.error,
        }
    }
}
