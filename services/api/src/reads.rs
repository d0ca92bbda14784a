//! Reading nodes: one node, and a filtered, paginated list.

use axum::extract::State;
use axum::Json;
use bcm_core::authz::{Action, Placement};
use bcm_core::{NodeId, PoolId, ProvisionState, TenantId};
use bcm_db::nodes::{self, NodeFilter};
use serde::Deserialize;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{Path, Query};
use crate::views::{NodePage, NodeView};
use crate::AppState;

/// The largest page.
pub const MAX_PAGE: u32 = 1000;

/// `GET /api/compute/metal/nodes/{nodeId}`.
#[utoipa::path(get, path = "/api/compute/metal/nodes/{nodeId}", tag = "metal",
    params(("nodeId" = NodeId, Path, description = "The node id")),
    responses((status = 200, body = NodeView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn get_node(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<Json<NodeView>, ApiError> {
    let id: NodeId = id
        .parse()
        .map_err(|e: bcm_core::IdError| ApiError::invalid(e.to_string()))?;
    let read = match nodes::node_read(&app.inner.read_db, &id, "inventory").await {
        Ok(r) => r,
        Err(bcm_db::DbError::NotFound) => return Err(ApiError::node_not_found(id)),
        Err(e) => return Err(e.into()),
    };
    let (tenant, pool) = read.placement;
    who.require(Action::NodesRead, &Placement { tenant, pool }, || {
        format!("node {id}")
    })?;
    let mut view = NodeView::from(&read.node);
    view.inventory = read.fact;
    Ok(Json(view))
}

/// Filters of the node list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    pub tenant_id: Option<TenantId>,
    pub pool_id: Option<PoolId>,
    pub state: Option<ProvisionState>,
    /// 1-1000, default 100.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// `nextPageToken` of the previous page.
    #[param(value_type = Option<NodeId>)]
    pub page_token: Option<String>,
}

/// `GET /api/compute/metal/nodes`: nodes the caller may read, in id order.
#[utoipa::path(get, path = "/api/compute/metal/nodes", tag = "metal", params(ListParams),
    responses((status = 200, body = NodePage), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn list_nodes(
    State(app): State<AppState>,
    who: Principal,
    Query(q): Query<ListParams>,
) -> Result<Json<NodePage>, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::invalid(format!("limit must be 1-{MAX_PAGE}")));
    }
    let after = q
        .page_token
        .as_deref()
        .map(|t| {
            t.parse::<NodeId>()
                .map_err(|_| ApiError::invalid("pageToken is not one this API issued"))
        })
        .transpose()?;
    let filter = NodeFilter {
        tenant: q.tenant_id,
        pool: q.pool_id,
        state: q.state,
        after,
        visible: who.readable(),
        limit: i64::from(limit) + 1,
    };
    let mut found = nodes::node_list(&app.inner.read_db, &filter).await?;
    let more = found.len() > limit as usize;
    found.truncate(limit as usize);
    let next_page_token = if more {
        found.last().map(|n| n.id.to_string())
    } else {
        None
    };
    Ok(Json(NodePage {
        items: found.iter().map(NodeView::from).collect(),
        next_page_token,
    }))
}
