//! Work for the metal reconciler (`work.reconcile.<shard>.<nodeId>`).

use bcm_core::NodeId;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A reconcile request: look at this node again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReconcileRequest {
    pub node_id: NodeId,
    /// The node version that asked; the reconciler re-reads the row anyway.
    pub version: i64,
    /// Why: the verb or event that asked.
    pub reason: String,
}
