//! Administration by the bootstrap admin: tenants, sites, pools (with their
//! policy) and API tokens with grants.

use axum::extract::State;
use axum::Json;
use bcm_core::authz::Grant;
use bcm_core::{PoolId, SiteId, TenantId};
use serde::{Deserialize, Serialize};

use crate::auth::{new_token_secret, token_hash, Principal};
use crate::error::ApiError;
use crate::extract::{Body, Path};
use crate::AppState;

/// A tenant or a site.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamedRequest {
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    pub name: String,
}

bcm_core::wire_enum! {
    /// Whether a pool's machines run the in-band agent: `bcd` or `none`
    /// (agentless).
    pub enum AgentMode "agent mode" {
        Bcd = "bcd",
        None = "none",
    }
}

/// A pool and its policy.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolRequest {
    pub tenant_id: TenantId,
    pub site_id: SiteId,
    /// Default: the pool's id.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    pub name: Option<String>,
    /// `policy.hardwareProfile`.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    pub hardware_profile: String,
    /// `bcd` by default.
    #[serde(default)]
    pub agent_mode: Option<AgentMode>,
    /// Commissioning accepts `diag.dcgm` answering `unsupported`.
    #[serde(default)]
    pub accept_unsupported_diag: bool,
    /// The destructive-batch quorum and bulk waves (unchanged when absent).
    #[serde(default)]
    pub quorum: Option<PoolQuorum>,
}

/// A pool's quorum policy.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolQuorum {
    /// Distinct approvers a batch needs (1-16).
    #[serde(deserialize_with = "crate::whole_number::required")]
    #[schema(minimum = 1, maximum = 16)]
    pub required: u32,
    /// Whether the requester may be one of them.
    #[serde(default)]
    pub requester_may_approve: bool,
    /// Whether a single verb's one-node batch is approved by the control
    /// plane's policy key (where the edges' anchors accept it).
    #[serde(default = "yes")]
    pub auto_approve_single: bool,
    /// How many of a bulk's nodes run at once (1-10000).
    #[serde(
        default = "default_bulk_concurrency",
        deserialize_with = "crate::whole_number::required"
    )]
    #[schema(minimum = 1, maximum = 10000)]
    pub bulk_concurrency: u32,
}

fn yes() -> bool {
    true
}
fn default_bulk_concurrency() -> u32 {
    200
}

/// A token to mint.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenRequest {
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*[^\\u0000-\\u0020\\u007f-\\u009f][^\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    pub principal: String,
    #[schema(min_items = 1, max_items = 256)]
    pub grants: Vec<Grant>,
    /// Lifetime, 1 s to 10 years; no expiry when absent.
    #[serde(default, deserialize_with = "crate::whole_number::optional")]
    #[schema(minimum = 1, maximum = 315360000)]
    pub ttl_seconds: Option<u32>,
}

/// The longest lifetime of a minted token: ten years.
const MAX_TOKEN_TTL_SECS: u32 = 315_360_000;

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
    crate::verbs::check_text("name", n, 128)
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
    params(("id" = TenantId, Path)), responses((status = 204), crate::error::ErrorResponses), security(("bearer" = [])))]
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
    params(("id" = SiteId, Path)), responses((status = 204), crate::error::ErrorResponses), security(("bearer" = [])))]
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
    params(("id" = PoolId, Path)), responses((status = 204), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn put_pool(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Body(req): Body<PoolRequest>,
) -> Result<axum::http::StatusCode, ApiError> {
    who.require_admin()?;
    let id = parse::<PoolId>(&id)?;
    let agent_mode = req.agent_mode.unwrap_or(AgentMode::Bcd).as_str().to_owned();
    crate::verbs::check_text("hardwareProfile", &req.hardware_profile, 128)?;
    if let Some(name) = &req.name {
        crate::verbs::check_text("name", name, 128)?;
    }
    if let Some(q) = &req.quorum {
        if !(1..=16).contains(&q.required) {
            return Err(ApiError::invalid("quorum.required must be 1 to 16"));
        }
        if !(1..=10_000).contains(&q.bulk_concurrency) {
            return Err(ApiError::invalid(
                "quorum.bulkConcurrency must be 1 to 10000",
            ));
        }
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
    if let Some(q) = req.quorum {
        bcm_db::batches::pool_policy_set(
            &app.inner.db,
            pool.id.as_str(),
            &bcm_db::batches::QuorumPolicy {
                required: q.required as i32,
                requester_may_approve: q.requester_may_approve,
                auto_approve_single: q.auto_approve_single,
                bulk_concurrency: q.bulk_concurrency as i32,
            },
        )
        .await?;
    }
    tracing::info!(pool = %pool.id, by = %who.name, "pool written");
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// A token as an administrator sees it: its name, grants and lifetime,
/// never its secret or hash.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenView {
    pub id: String,
    pub principal: String,
    pub grants: Vec<Grant>,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl TokenView {
    fn from_row(t: bcm_db::tokens::ApiTokenInfo) -> Result<Self, ApiError> {
        Ok(Self {
            grants: serde_json::from_value(t.grants)
                .map_err(|e| ApiError::internal(format!("token {} has bad grants: {e}", t.id)))?,
            id: t.id,
            principal: t.principal,
            expires_at: t.expires_at,
            revoked_at: t.revoked_at,
            created_at: t.created_at,
        })
    }
}

/// The tokens minted, newest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenList {
    pub items: Vec<TokenView>,
}

/// `GET /api/compute/admin/tokens`: every minted token, without secrets.
#[utoipa::path(get, path = "/api/compute/admin/tokens", tag = "admin",
    responses((status = 200, body = TokenList), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn list_tokens(
    State(app): State<AppState>,
    who: Principal,
) -> Result<Json<TokenList>, ApiError> {
    who.require_admin()?;
    let items = bcm_db::tokens::api_tokens_list(&app.inner.db)
        .await?
        .into_iter()
        .map(TokenView::from_row)
        .collect::<Result<_, _>>()?;
    Ok(Json(TokenList { items }))
}

/// `DELETE /api/compute/admin/tokens/{id}`: revokes a token; the next
/// request that bears it is `UNAUTHENTICATED`. Revoking it again changes
/// nothing.
#[utoipa::path(delete, path = "/api/compute/admin/tokens/{id}", tag = "admin",
    params(("id" = String, Path, description = "The token's id (`tok_…`)")),
    responses((status = 200, body = TokenView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn revoke_token(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<Json<TokenView>, ApiError> {
    who.require_admin()?;
    let not_found = || {
        ApiError::new(
            bcm_core::ErrorCode::NotFound,
            format!("token {} not found", id.escape_debug()),
        )
    };
    // Ids are minted printable and short: any other names no token.
    if !bcm_core::text::is_printable(&id, 64) {
        return Err(not_found());
    }
    let row = match bcm_db::tokens::api_token_revoke(&app.inner.db, &id).await {
        Err(bcm_db::DbError::NotFound) => {
            return Err(ApiError::new(
                bcm_core::ErrorCode::NotFound,
                format!("token {id} not found"),
            ))
        }
        other => other?,
    };
    tracing::info!(token = %id, by = %who.name, "revoked an API token");
    Ok(Json(TokenView::from_row(row)?))
}

/// `POST /api/compute/admin/tokens`: mints a bearer token with grants.
#[utoipa::path(post, path = "/api/compute/admin/tokens", tag = "admin", request_body = TokenRequest,
    responses((status = 200, body = TokenCreated), crate::error::ErrorResponses), security(("bearer" = [])))]
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
    if req
        .ttl_seconds
        .is_some_and(|s| !(1..=MAX_TOKEN_TTL_SECS).contains(&s))
    {
        return Err(ApiError::invalid(format!(
            "ttlSeconds must be 1 to {MAX_TOKEN_TTL_SECS}"
        )));
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
