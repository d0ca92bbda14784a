//! The API's requests to the attestation service (core NATS request/reply,
//! queue group `attestation`) and its replies.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::agent::{AgentResult, AgentRole};

/// How long the API waits for the answer to one ask before it asks again
/// (joins, rejoins and results are idempotent). An answer later than this
/// is read by nobody, so the attestation service drops an ask it could not
/// start in time to answer within it rather than spend the database on it:
/// under a storm of results, working through asks whose asker moved on is
/// what buries the ones still waited for.
pub const ASK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `attest.join`: an agent's join, forwarded by the API without a secret:
/// the join token travels as its hash (what the record keeps), and the
/// session's bearer token, which the API derives and hands the agent, as
/// the hash the attestation service stores for it. Neither token is ever on
/// the bus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttestJoin {
    /// SHA-256 of the join token, hex.
    #[schemars(regex(pattern = "^[0-9a-f]{64}$"))]
    pub token_hash: String,
    /// SHA-256 of the session token the API hands the agent, hex: the same
    /// for every answer to one join (derived from the join token and the
    /// CSR), so a retried join keeps the session the agent holds.
    #[schemars(regex(pattern = "^[0-9a-f]{64}$"))]
    pub session_hash: String,
    /// The agent's CSR (PEM), as it sent it.
    pub csr: String,
    pub role: AgentRole,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// An adopting node's inventory, as it sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<crate::outputs::Inventory>,
}

/// The attestation service's answer to a join: the identity issued (or, to
/// a retried join, issued before). The API adds the session token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinGranted {
    pub node_id: String,
    pub cert_serial: String,
    /// The node certificate (PEM) issued for the CSR's key.
    pub certificate: String,
    /// The CA certificate (PEM) that issued it.
    pub ca_certificate: String,
    /// ed25519 public keys (base64) trusted to sign image manifests.
    #[serde(default)]
    pub image_keys: Vec<String>,
}

/// `attest.rejoin`: an installed OS's agent rejoining with its identity
/// (and, with a CSR, renewing it), forwarded by the API with the hash of
/// the session token it derives from the signature (the token is never on
/// the bus). Answered with a [`JoinGranted`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttestRejoin {
    pub node_id: String,
    pub cert_serial: String,
    pub signed_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csr: Option<String>,
    /// The agent's signature (base64) as it sent it.
    pub signature: String,
    /// SHA-256 of the session token the API hands the agent, hex.
    #[schemars(regex(pattern = "^[0-9a-f]{64}$"))]
    pub session_hash: String,
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
