//! `POST /api/compute/metal/joinTokens`: a one-time `node` token for
//! adopting a machine into a pool (install `bcd node` on it with the
//! token; it joins, becomes a node in `adopting`, and the pool's acceptance
//! checks move it to `adopted`). Needs `compute:pools:enroll` on the pool.
//! Only the token's hash is stored; the token is shown once.

use axum::extract::State;
use axum::Json;
use bcm_core::{PoolId, TenantId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::Body;
use crate::AppState;

/// A join token to mint.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinTokenRequest {
    pub tenant_id: TenantId,
    pub pool_id: PoolId,
    /// Lifetime, 60 s to 7 days; 1 hour by default.
    #[serde(default, deserialize_with = "crate::whole_number::optional")]
    #[schema(minimum = 60, maximum = 604800)]
    pub ttl_secs: Option<u64>,
}

/// A minted join token: shown once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenView {
    pub token: String,
    pub purpose: String,
    pub pool_id: String,
    pub expires_at: DateTime<Utc>,
}

/// `POST /api/compute/metal/joinTokens`.
#[utoipa::path(post, path = "/api/compute/metal/joinTokens", request_body = JoinTokenRequest, tag = "metal",
    responses((status = 200, body = JoinTokenView), crate::error::ErrorResponses),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<JoinTokenRequest>,
) -> Result<Json<JoinTokenView>, ApiError> {
    let a = &app.inner;
    let ttl = req.ttl_secs.unwrap_or(3600);
    if !(60..=7 * 24 * 3600).contains(&ttl) {
        return Err(ApiError::invalid("ttlSecs must be 60 to 604800"));
    }
    let pool = crate::verbs::pool_to_enroll_into(a, &who, &req.tenant_id, &req.pool_id).await?;
    if pool.agent_mode == bcm_core::agentless::AgentMode::None.as_str() {
        return Err(ApiError::new(
            bcm_core::ErrorCode::InvalidConfig,
            format!(
                "pool {} is agentless (agentMode none): a machine is adopted by its own bcd joining, which an agentless pool's machines never run",
                pool.id
            ),
        ));
    }
    let expires_at = Utc::now() + chrono::Duration::seconds(ttl as i64);
    let mut tx = a.db.begin().await?;
    let token = bcm_metal::identity::mint_join_token_in_txn(
        &mut tx,
        "node",
        &bcm_db::agents::TokenScope::Pool(pool.id.to_string()),
        expires_at,
    )
    .await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    tracing::info!(pool = %pool.id, "minted an adopt join token");
    Ok(Json(JoinTokenView {
        token,
        purpose: "node".into(),
        pool_id: pool.id.to_string(),
        expires_at,
    }))
}
