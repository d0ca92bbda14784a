//! What the agents (`bcd ramdisk`, `bcd node`, the simulated site's agents)
//! and the API's agent endpoints exchange over HTTP: join, heartbeat, the
//! commands a long-poll hands out and the signed results posted back.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::commands::{Command, CommandKind};
use crate::ContractError;

/// What an agent is: the ramdisk's or the installed OS's.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AgentRole {
    /// The inspection ramdisk's agent (`bcd ramdisk`), joined with a
    /// `discovery` token.
    Ramdisk,
    /// The installed or adopted OS's agent (`bcd node`), joined with a
    /// `provisioned` or a pool's `node` token.
    Node,
}

impl AgentRole {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            AgentRole::Ramdisk => "ramdisk",
            AgentRole::Node => "node",
        }
    }
}

impl std::fmt::Display for AgentRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An agent's join request (`POST /api/agent/join`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequest {
    /// The one-time join token from the kernel command line or user data.
    #[schema(min_length = 1, max_length = 256)]
    pub token: String,
    /// A PKCS#10 certificate signing request (PEM) for the agent's ed25519
    /// key, which never leaves the agent's memory.
    #[schema(min_length = 1, max_length = 16384)]
    pub csr: String,
    pub role: AgentRole,
    /// For an adopt (`node` token of a pool): what the machine calls itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 253)]
    pub hostname: Option<String>,
}

/// The answer to a join.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinResponse {
    pub node_id: String,
    /// Bearer token of the agent's session.
    pub session_token: String,
    pub cert_serial: String,
    /// The node certificate (PEM) issued for the CSR's key.
    pub certificate: String,
    /// The CA certificate (PEM) that issued it.
    pub ca_certificate: String,
    /// ed25519 public keys (base64) whose signature on an image manifest
    /// the agent trusts.
    #[serde(default)]
    pub image_keys: Vec<String>,
}

/// A heartbeat (`POST /api/agent/heartbeat`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Heartbeat {
    pub role: AgentRole,
}

/// A command handed to an agent. `params` is kept as the control plane
/// stored it: the agent signs over exactly these bytes' JSON, and reads
/// them through [`AgentCommand::command`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentCommand {
    pub command_id: String,
    pub kind: CommandKind,
    #[schema(value_type = Object)]
    pub params: serde_json::Value,
    /// When the control plane issued it; part of the signing input.
    pub issued_at: DateTime<Utc>,
}

impl AgentCommand {
    /// The typed command; parameters that are not the kind's are an error
    /// (the agent then fails the command, it never guesses).
    pub fn command(&self) -> Result<Command, ContractError> {
        Command::from_parts(self.kind.as_str(), self.params.clone())
    }
}

/// A result an agent posts (`POST /api/agent/results`), signed over
/// `bcm_pki::signing_input` with its key. `output` is the command kind's
/// [`crate::Output`] as JSON; the attestation service decodes it with the
/// stored command's kind before it records anything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentResult {
    #[schema(min_length = 1, max_length = 64)]
    pub command_id: String,
    pub ok: bool,
    #[serde(default)]
    pub retryable: bool,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub output: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the agent finished; part of the signing input.
    pub finished_at: DateTime<Utc>,
    /// ed25519 signature, base64; absent when the agent cannot sign.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// What made an agent's presence record change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PresenceEvent {
    Join,
    Heartbeat,
}

/// An agent's last sign of life as the record keeps it (the `node_facts`
/// row `agent:<purpose>`): written by the attestation service at a join and
/// by the API at a heartbeat, read by the engine (a step waiting for a
/// join) and the reconciler (an adoption's acceptance check), which run in
/// other processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentPresence {
    pub role: AgentRole,
    pub event: PresenceEvent,
    /// The certificate the join issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_serial: Option<String>,
    /// What an adopted machine calls itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

impl AgentPresence {
    /// Reads a stored presence (`None` when there is none).
    pub fn from_stored(v: Option<serde_json::Value>) -> Result<Option<Self>, ContractError> {
        v.map(|v| {
            serde_json::from_value(v).map_err(|e| ContractError::Undecodable {
                what: "agent presence",
                why: e.to_string(),
            })
        })
        .transpose()
    }
}
