//! The API's requests to the attestation service (core NATS request/reply,
//! queue group `attestation`) and its replies.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::agent::{AgentResult, JoinRequest};

/// `attest.join`: an agent's join, forwarded by the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttestJoin {
    pub join: JoinRequest,
}

/// `attest.result`: a result from an authenticated agent session, forwarded
/// by the API; the attestation service records it and verifies its
/// signature against the stored command row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttestResult {
    pub node_id: String,
    /// The serial of the session's certificate.
    pub cert_serial: String,
    pub result: AgentResult,
}

/// What the attestation service did with a result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResultRecorded {
    /// False when the command already had a result (a repeat post).
    pub recorded: bool,
    /// The serial of the certificate the signature verified against;
    /// absent for an unsigned result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attested_by: Option<String>,
}

/// The reply of an attestation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum AttestReply<T> {
    Ok(T),
    Err {
        code: bcm_core::ErrorCode,
        message: String,
    },
}
