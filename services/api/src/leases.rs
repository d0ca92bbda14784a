//! Dedicated-root leases as the API reads them: a tenant's leases (open,
//! ended and refused, with the refusal's reason), decided on the tenant
//! with `compute:nodes:read`, so a tenant sees its own leases and no
//! other's. The leases themselves are opened and moved by
//! `bcm_metal::tenant_root` in the moves' transactions.

use axum::extract::State;
use axum::Json;
use bcm_core::authz::Action;
use bcm_core::dedicated::LeaseState;
use bcm_core::TenantId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::Query;
use crate::AppState;

/// Whose leases to list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LeasesQuery {
    pub tenant_id: TenantId,
}

/// A dedicated-root lease: tenant, node, start, end, state.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseView {
    pub lease_id: String,
    pub tenant_id: String,
    pub pool_id: String,
    pub node_id: String,
    /// The deploy profile, `id@version`.
    pub deploy_profile: String,
    pub state: LeaseState,
    /// Why it was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    pub started_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ending_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
}

impl From<bcm_db::tenant_leases::Lease> for LeaseView {
    fn from(l: bcm_db::tenant_leases::Lease) -> Self {
        LeaseView {
            lease_id: l.id,
            tenant_id: l.tenant_id,
            pool_id: l.pool_id,
            node_id: l.node_id,
            deploy_profile: l.deploy_profile,
            state: l.state,
            reason: l.reason,
            requested_by: l.requested_by,
            started_at: l.started_at,
            bound_at: l.bound_at,
            ending_at: l.ending_at,
            ended_at: l.ended_at,
        }
    }
}

/// The most leases one listing returns.
const LIST_LIMIT: i64 = 1000;

/// `GET /api/compute/metal/leases?tenantId=…`: the tenant's dedicated-root
/// leases, newest first.
#[utoipa::path(get, path = "/api/compute/metal/leases", operation_id = "listLeases", tag = "metal", params(LeasesQuery),
    responses((status = 200, body = [LeaseView]), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn list(
    State(app): State<AppState>,
    who: Principal,
    Query(q): Query<LeasesQuery>,
) -> Result<Json<Vec<LeaseView>>, ApiError> {
    who.require_on_tenant(Action::NodesRead, &q.tenant_id, || {
        format!("tenant {}", q.tenant_id)
    })?;
    let rows =
        bcm_db::tenant_leases::leases_of_tenant(&app.inner.db, q.tenant_id.as_str(), LIST_LIMIT)
            .await?;
    Ok(Json(rows.into_iter().map(LeaseView::from).collect()))
}
