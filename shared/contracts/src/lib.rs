//! The contracts between processes: every message that crosses a process
//! boundary, as closed serde types.
//!
//! - [`envelope`]: the CloudEvents 1.0 envelope every bus message travels in.
//! - [`events`]: the payload of every event, with its type name.
//! - [`work`]: reconcile requests.
//! - [`commands`]: each command kind with its typed parameters, and the
//!   envelope a site command travels in.
//! - [`outputs`]: each command kind's typed output.
//! - [`results`]: the result a site service publishes.
//! - [`agent`]: the bodies the agents (`bcd`) and the API exchange over HTTP.
//! - [`attest`]: the API's requests to the attestation service.
//! - [`batch`]: the approvers' authority a destructive command carries.
//! - [`schemas`]: the JSON Schema of each of them (checked in under
//!   `proto/schemas/`).
//!
//! Fields that are ours are `deny_unknown_fields`; an unknown kind, status or
//! variant is a [`ContractError`], never a default. Vendor data we only carry
//! (a DCGM report) is the one place a value stays untyped JSON. The crate has
//! no I/O and links no NATS client, so the agent depends on it alone.

pub mod agent;
pub mod attest;
pub mod batch;
pub mod commands;
pub mod downloads;
pub mod envelope;
pub mod events;
pub mod outputs;
pub mod plugin;
pub mod results;
pub mod schemas;
pub mod work;

pub use commands::{Command, CommandEnvelope, CommandKind};
pub use envelope::CloudEvent;
pub use outputs::Output;
pub use results::CommandResult;

/// Why a message does not satisfy its contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    /// Not the JSON of the message at all.
    #[error("undecodable {what}: {why}")]
    Undecodable { what: &'static str, why: String },
    /// A command kind no executor knows.
    #[error("unknown command kind {0:?}")]
    UnknownKind(String),
    /// The parameters are not those of their kind.
    #[error("{kind} parameters: {why}")]
    Params { kind: CommandKind, why: String },
    /// The output is not that of its kind.
    #[error("{kind} output: {why}")]
    Output { kind: CommandKind, why: String },
}

impl ContractError {
    /// A short label for metrics (`reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            ContractError::Undecodable { .. } => "undecodable",
            ContractError::UnknownKind(_) => "unknown-kind",
            ContractError::Params { .. } => "bad-params",
            ContractError::Output { .. } => "bad-output",
        }
    }
}

/// Decodes `bytes` as the JSON of `T`, naming `what` in the error.
pub fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, ContractError> {
    serde_json::from_slice(bytes).map_err(|e| ContractError::Undecodable {
        what,
        why: e.to_string(),
    })
}

/// `serde(skip_serializing_if)` for flags that are off by default.
pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}
