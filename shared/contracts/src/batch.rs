//! What a destructive command carries to prove its approvers allowed it
//! (`BatchAuthority`): the batch's header (which approvers' signatures
//! cover, through its digest), the node's leaf index and Merkle inclusion
//! proof, and the approvals. The edges (the BMC service, the site, `bcd`)
//! verify it with `bcm-quorum` against their own trust anchor; the control
//! plane only carries it.

use bcm_core::batch::Operation;
use bcm_core::WipeMode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What approvers sign (through its digest): everything about a batch but
/// the node list, which `root` commits to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BatchHeader {
    #[schema(pattern = "^bat_[0-7][0-9a-hjkmnp-tv-z]{25}$")]
    pub batch_id: String,
    pub tenant_id: String,
    pub pool_id: String,
    pub operation: Operation,
    /// The release's wipe mode, for `undeploy` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wipe: Option<WipeMode>,
    /// SHA-256 (hex) of the reason approvers read.
    pub reason_sha256: String,
    /// Unix seconds: no approval and no command counts after it.
    pub expires_at: i64,
    /// The Merkle root (hex) over the leaves `(nodeId, operation, wipe)`.
    pub root: String,
    pub leaf_count: u32,
}

/// One approver's signature (ed25519, base64) over the batch's approval
/// message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalSignature {
    pub approver_id: String,
    pub signature: String,
}

/// The proof a destructive command carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BatchAuthority {
    pub header: BatchHeader,
    /// The node's leaf's position in the batch.
    pub leaf_index: u32,
    /// The sibling hashes (hex) from the leaf up to the root.
    pub proof: Vec<String>,
    pub approvals: Vec<ApprovalSignature>,
}
