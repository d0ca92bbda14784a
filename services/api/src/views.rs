//! The node's metal view, exactly the spec's shape. It never carries
//! credentials: only `bmc.credentialsSet`.

use bcm_core::{BmcDriver, NodeId, PoolId, PowerState, ProvisionState, SiteId, TenantId};
use bcm_db::nodes::Node;
use serde::{Deserialize, Serialize};

/// The BMC part of a node view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BmcView {
    pub driver: BmcDriver,
    pub address: String,
    /// Whether sealed credentials are on record; they are never returned.
    pub credentials_set: bool,
    /// A password rotation is in progress or left unresolved: the record
    /// holds the current and the new password until it commits or rolls back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rotation_pending: bool,
    /// The node's own TLS policy (`ca`, `pinned` or `insecure`); absent:
    /// the bmc service's setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<String>,
}

/// A node as every metal method returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub node_id: NodeId,
    pub tenant_id: TenantId,
    pub site_id: SiteId,
    pub pool_id: PoolId,
    pub provision_state: ProvisionState,
    pub maintenance: bool,
    pub power: PowerState,
    pub bmc: BmcView,
    pub macs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_from: Option<ProvisionState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// What the ramdisk reported in band (CPUs, memory, disks, NICs), as
    /// the attestation service stored it; only on a single node's read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub inventory: Option<serde_json::Value>,
}

impl From<&Node> for NodeView {
    fn from(n: &Node) -> Self {
        Self {
            node_id: n.id,
            tenant_id: n.tenant_id.clone(),
            site_id: n.site_id.clone(),
            pool_id: n.pool_id.clone(),
            provision_state: n.provision_state,
            maintenance: n.maintenance,
            power: n.power,
            bmc: BmcView {
                driver: n.bmc_driver,
                address: n.bmc_address.clone(),
                credentials_set: n.bmc_secret_id.is_some(),
                rotation_pending: n.bmc_pending_secret_id.is_some(),
                tls: n.bmc_tls.as_ref().map(|t| t.mode().to_owned()),
            },
            macs: n.macs.clone(),
            workflow_id: n.workflow_id.map(|w| w.to_string()),
            failed_from: n.failed_from,
            last_error: n.last_error.clone(),
            inventory: None,
        }
    }
}

/// A page of nodes.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePage {
    pub items: Vec<NodeView>,
    /// Pass as `pageToken` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_page_token: Option<String>,
}
