//! Administration by the bootstrap admin: tenants, sites, pools (with their
//! policy) and API tokens with grants.

use axum::extract::State;
use axum::Json;
use bcm_core::authz::Grant;
use bcm_core::{PoolId, SiteId, TenantId};
use serde::{Deserialize, Serialize};

use crate::auth::{new_token_secret, token_hash, Principal};
use crate::error::{ApiError, ApiErrorBody};
use crate::extract::{Body, Path};
use crate::AppState;

/// A tenant or a site.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamedRequest {
    pub name: String,
}

/// A pool and its policy.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolRequest {
    pub tenant_id: TenantId,
    pub site_id: SiteId,
    #[serde(default)]
    pub name: Option<String>,
    /// `policy.hardwareProfile`.
    pub hardware_profile: String,
    /// `bcd` (default) or `none` (agentless).
    #[serde(default)]
    pub agent_mode: Option<String>,
    /// Commissioning accepts `diag.dcgm` answering `unsupported`.
    #[serde(default)]
    pub accept_unsupported_diag: bool,
}

/// A token to mint.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenRequest {
    pub principal: String,
    pub grants: Vec<Grant>,
    /// Lifetime; no expiry when absent.
    #[serde(default)]
    pub ttl_seconds: Option<u32>,
}

/// A minted token: the secret is shown once.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenCreated {
    pub id: String,
    pub token: String,
}

fn parse<T: std::str::FromStr<Err = bcm_core::IdError>>(s: &str) -> Result<T, ApiError> {
    s.parse()
        .map_err(|e: bcm_core::IdError| ApiError::invalid(e.to_string()))
}

fn check_name(n: &str) -> Result<(), ApiError> {
    if n.trim().is_empty() || n.chars().count() > 128 {
        return Err(ApiError::invalid("name must be 1-128 characters"));
    }
    Ok(())
}

/// What every named-resource upsert checks first: an admin, a valid id of
/// its kind and a valid name.
fn named<T: std::str::FromStr<Err = bcm_core::IdError>>(
    who: &Principal,
    id: &str,
    req: &NamedRequest,
) -> Result<T, ApiError> {
    who.require_admin()?;
    check_name(&req.name)?;
    parse::<T>(id)
}

/// `PUT /api/compute/admin/tenants/{id}`.
#[utoipa::path(put, path = "/api/compute/admin/tenants/{id}", tag = "admin", request_body = NamedRequest,
    params(("id" = String, Path)), responses((status = 204), (status = "4XX", body = ApiErrorBody)), security(("bearer" = [])))]
pub async fn put_tenant(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Body(req): Body<NamedRequest>,
) -> Result<axum::http::StatusCode, ApiError> {
    let id = named(&who, &id, &req)?;
    bcm_db::tenancy::tenant_upsert(&app.inner.db, &id, &req.name).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// `PUT /api/compute/admin/sites/{id}`.
#[utoipa::path(put, path = "/api/compute/admin/sites/{id}", tag = "admin", request_body = NamedRequest,
    params(("id" = String, Path)), responses((status = 204), (status = "4XX", body = ApiErrorBody)), security(("bearer" = [])))]
pub async fn put_site(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Body(req): Body<NamedRequest>,
) -> Result<axum::http::StatusCode, ApiError> {
    let id = named(&who, &id, &req)?;
    bcm_db::tenancy::site_upsert(&app.inner.db, &id, &req.name).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// `PUT /api/compute/admin/pools/{id}`.
#[utoipa::path(put, path = "/api/compute/admin/pools/{id}", tag = "admin", request_body = PoolRequest,
    params(("id" = String, Path)), responses((status = 204), (status = "4XX", body = ApiErrorBody)), security(("bearer" = [])))]
pub async fn put_pool(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Body(req): Body<PoolRequest>,
) -> Result<axum::http::StatusCode, ApiError> {
    who.require_admin()?;
    let id = parse::<PoolId>(&id)?;
    let agent_mode = req.agent_mode.unwrap_or_else(|| "bcd".to_owned());
    if !matches!(agent_mode.as_str(), "bcd" | "none") {
        return Err(ApiError::invalid("agentMode must be bcd or none"));
    }
    if req.hardware_profile.trim().is_empty() || req.hardware_profile.len() > 128 {
        return Err(ApiError::invalid(
            "hardwareProfile must be 1-128 characters",
        ));
    }
    let pool = bcm_db::tenancy::Pool {
        name: req.name.unwrap_or_else(|| id.to_string()),
        id,
        tenant_id: req.tenant_id,
        site_id: req.site_id,
        hardware_profile: req.hardware_profile,
        agent_mode,
        accept_unsupported_diag: req.accept_unsupported_diag,
    };
    bcm_db::tenancy::pool_upsert(&app.inner.db, &pool)
        .await
        .map_err(|e| match e {
            bcm_db::DbError::Duplicate { .. } => ApiError::new(
                bcm_core::ErrorCode::Conflict,
                "the pool belongs to another tenant",
            ),
            other => other.into(),
        })?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// `POST /api/compute/admin/tokens`: mints a bearer token with grants.
#[utoipa::path(post, path = "/api/compute/admin/tokens", tag = "admin", request_body = TokenRequest,
    responses((status = 200, body = TokenCreated), (status = "4XX", body = ApiErrorBody)), security(("bearer" = [])))]
pub async fn create_token(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<TokenRequest>,
) -> Result<Json<TokenCreated>, ApiError> {
    who.require_admin()?;
    check_name(&req.principal)?;
    if req.grants.is_empty() || req.grants.len() > 256 {
        return Err(ApiError::invalid("grants must hold 1-256 grants"));
    }
    let secret = new_token_secret();
    let id = format!("tok_{}", ulid::Ulid::new().to_string().to_lowercase());
    let row = bcm_db::tokens::ApiTokenRow {
        id: id.clone(),
        token_hash: token_hash(&secret),
        principal: req.principal,
        grants: serde_json::to_value(&req.grants).map_err(ApiError::internal)?,
        expires_at: req
            .ttl_seconds
            .map(|s| chrono::Utc::now() + chrono::Duration::seconds(i64::from(s))),
        revoked_at: None,
    };
    bcm_db::tokens::api_token_insert(&app.inner.db, &row).await?;
    Ok(Json(TokenCreated { id, token: secret }))
}
