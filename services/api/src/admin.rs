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

pub use bcm_core::agentless::{AgentMode, UnattestedRelease};

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
    /// `policy.hardwareProfile`: a configured hardware profile
    /// (`GET /api/compute/hardwareProfiles`; another is `INVALID_CONFIG`).
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9._-]{1,64}$")]
    pub hardware_profile: String,
    /// `bcd` by default; `none`: agentless (every workflow out of band,
    /// through the BMC; deploys hand the machine an installer ISO as
    /// virtual media; no rescue, no adoption).
    #[serde(default)]
    pub agent_mode: Option<AgentMode>,
    /// An agentless pool's release that ended without an attested erase
    /// (the BMC offers none): `failed` (default) holds the node with
    /// `UNVERIFIED_WIPE`; `ready` returns it. `node.release.unverified`
    /// says so either way.
    #[serde(default)]
    pub unattested_release: Option<UnattestedRelease>,
    /// Commissioning accepts `diag.dcgm` answering `unsupported`.
    #[serde(default)]
    pub accept_unsupported_diag: bool,
    /// The destructive-batch quorum and bulk waves (unchanged when absent).
    #[serde(default)]
    pub quorum: Option<PoolQuorum>,
    /// The deploy profile ids the pool accepts; absent: every profile of
    /// its tenant. Deploying another is `INVALID_CONFIG`.
    #[serde(default)]
    #[schema(schema_with = deploy_profile_ids_schema)]
    pub deploy_profiles: Option<Vec<String>>,
    /// A release's wipe when the request names none (default `quick`;
    /// `none` is refused).
    #[serde(default)]
    #[schema(schema_with = crate::openapi::release_wipe_schema)]
    pub release_wipe: Option<bcm_core::WipeMode>,
    /// Commissioning's wipe (default `quick`; `none` is refused: a node
    /// reaches `ready` only through a verified wipe).
    #[serde(default)]
    #[schema(schema_with = crate::openapi::commission_wipe_schema)]
    pub commission_wipe: Option<bcm_core::WipeMode>,
    /// Adoption's acceptance checks: the least an adopted machine must
    /// have, as its agent reports it at join (absent: any machine whose
    /// agent joins). A machine below them goes to `failed` with an
    /// `ACCEPTANCE:` error naming what it lacks.
    #[serde(default, deserialize_with = "object_only")]
    pub adopt_acceptance: Option<bcm_core::reconcile::AdoptAcceptance>,
    /// The erase methods that satisfy `secure-erase` and `crypto-erase`, in
    /// the order the agent tries them on each disk (absent: the device's
    /// own erase, then a verified full overwrite). A wipe whose disk was
    /// erased by a method the list does not name is `UNVERIFIED_WIPE`.
    #[serde(default, deserialize_with = "object_only")]
    pub erase_methods: Option<bcm_core::erase::ErasePolicy>,
    /// How many dedicated-root leases (deploys of a `dedicated` profile)
    /// the pool holds at once; absent: no limit, `0`: none. A deploy past
    /// it is refused (`node.tenant-root.refused`, with the reason).
    #[serde(default, deserialize_with = "crate::whole_number::optional")]
    #[schema(minimum = 0, maximum = 1000000)]
    pub max_dedicated_leases: Option<u32>,
}

/// An optional JSON object field: serde would also read a struct from an
/// array (`[null, null]`), which the schema does not allow.
fn object_only<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::de::Error as _;
    match Option::<serde_json::Value>::deserialize(d)? {
        None => Ok(None),
        Some(mut v @ serde_json::Value::Object(_)) => {
            crate::whole_number::canonical(&mut v);
            serde_json::from_value(v)
                .map(Some)
                .map_err(D::Error::custom)
        }
        Some(_) => Err(D::Error::custom("expected an object")),
    }
}

/// A pool's accepted deploy profile ids as the OpenAPI document states
/// them: null, or up to [`MAX_POOL_PROFILES`] distinct profile ids.
fn deploy_profile_ids_schema() -> utoipa::openapi::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
    ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[a-z0-9._-]{1,64}$"))
                .min_length(Some(1))
                .max_length(Some(64)),
        )
        .max_items(Some(MAX_POOL_PROFILES))
        .unique_items(true)
        .description(Some(
            "The deploy profile ids the pool accepts; absent or null: every profile of its tenant. Deploying another is INVALID_CONFIG.",
        ))
        .build()
}

/// The most deploy profile ids a pool's policy names.
const MAX_POOL_PROFILES: usize = 256;

/// Checks a pool's policy before it is stored (the API's and the seed's).
pub fn check_pool_policy(p: &bcm_db::tenancy::Pool) -> Result<(), ApiError> {
    crate::verbs::check_profile_id("hardwareProfile", &p.hardware_profile)?;
    crate::verbs::check_text("name", &p.name, 128)?;
    if AgentMode::parse(&p.agent_mode).is_none() {
        return Err(ApiError::invalid(format!(
            "agentMode {:?} must be bcd or none",
            p.agent_mode
        )));
    }
    if UnattestedRelease::parse(&p.unattested_release).is_none() {
        return Err(ApiError::invalid(format!(
            "unattestedRelease {:?} must be failed or ready",
            p.unattested_release
        )));
    }
    if let Some(ids) = &p.deploy_profiles {
        if ids.len() > MAX_POOL_PROFILES {
            return Err(ApiError::invalid(format!(
                "deployProfiles names at most {MAX_POOL_PROFILES} profiles"
            )));
        }
        for (i, id) in ids.iter().enumerate() {
            crate::verbs::check_profile_id(&format!("deployProfiles[{i}]"), id)?;
            if ids[..i].contains(id) {
                return Err(ApiError::invalid(format!(
                    "deployProfiles names {id} twice"
                )));
            }
        }
    }
    if let Some(a) = &p.adopt_acceptance {
        a.validate().map_err(ApiError::invalid)?;
    }
    if let Some(e) = &p.erase_methods {
        e.validate().map_err(ApiError::invalid)?;
    }
    for (field, value) in [
        ("releaseWipe", &p.release_wipe),
        ("commissionWipe", &p.commission_wipe),
    ] {
        match bcm_core::WipeMode::parse(value) {
            Some(w) if w.can_reach_ready() => {}
            Some(_) => {
                return Err(ApiError::invalid(format!(
                    "{field}: {}",
                    bcm_core::node::WIPE_NONE_REFUSED
                )))
            }
            None => {
                return Err(ApiError::invalid(format!(
                    "{field} {value:?} is not a wipe mode"
                )))
            }
        }
    }
    Ok(())
}

/// A pool as an administrator reads it: where it is and its whole policy.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolView {
    pub id: PoolId,
    pub tenant_id: TenantId,
    pub site_id: SiteId,
    pub name: String,
    pub hardware_profile: String,
    pub agent_mode: AgentMode,
    pub unattested_release: UnattestedRelease,
    pub accept_unsupported_diag: bool,
    /// Absent: every profile of the tenant.
    pub deploy_profiles: Option<Vec<String>>,
    pub release_wipe: bcm_core::WipeMode,
    pub commission_wipe: bcm_core::WipeMode,
    /// Absent: any machine whose agent joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt_acceptance: Option<bcm_core::reconcile::AdoptAcceptance>,
    /// The pool's erase policy (the default when it sets none).
    pub erase_methods: bcm_core::erase::ErasePolicy,
    /// Absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_dedicated_leases: Option<u32>,
    pub quorum: PoolQuorum,
}

impl PoolView {
    fn from_parts(
        p: bcm_db::tenancy::Pool,
        q: bcm_db::batches::QuorumPolicy,
    ) -> Result<Self, ApiError> {
        let corrupt = |w: &str| ApiError::internal(format!("pool {} has a bad {w}", p.id));
        Ok(Self {
            agent_mode: AgentMode::parse(&p.agent_mode).ok_or_else(|| corrupt("agent mode"))?,
            unattested_release: UnattestedRelease::parse(&p.unattested_release)
                .ok_or_else(|| corrupt("unattested release"))?,
            release_wipe: bcm_core::WipeMode::parse(&p.release_wipe)
                .ok_or_else(|| corrupt("release wipe"))?,
            commission_wipe: bcm_core::WipeMode::parse(&p.commission_wipe)
                .ok_or_else(|| corrupt("commission wipe"))?,
            quorum: PoolQuorum {
                required: q.required.max(1) as u32,
                requester_may_approve: q.requester_may_approve,
                auto_approve_single: q.auto_approve_single,
                bulk_concurrency: q.bulk_concurrency.max(1) as u32,
            },
            id: p.id,
            tenant_id: p.tenant_id,
            site_id: p.site_id,
            name: p.name,
            hardware_profile: p.hardware_profile,
            accept_unsupported_diag: p.accept_unsupported_diag,
            deploy_profiles: p.deploy_profiles,
            adopt_acceptance: p.adopt_acceptance,
            erase_methods: p.erase_methods.unwrap_or_default(),
            max_dedicated_leases: None,
        })
    }
}

async fn pool_view(app: &AppState, p: bcm_db::tenancy::Pool) -> Result<PoolView, ApiError> {
    let mut tx = app.inner.db.begin().await?;
    let q = bcm_db::batches::pool_policy_in_txn(&mut tx, p.id.as_str()).await?;
    tx.rollback().await.map_err(bcm_db::DbError::from)?;
    let max = bcm_db::tenant_leases::pool_max_leases(&app.inner.db, p.id.as_str()).await?;
    Ok(PoolView {
        max_dedicated_leases: max,
        ..PoolView::from_parts(p, q)?
    })
}

/// `GET /api/compute/admin/pools/{id}`.
#[utoipa::path(get, path = "/api/compute/admin/pools/{id}", operation_id = "getPool", tag = "admin",
    params(("id" = PoolId, Path)), responses((status = 200, body = PoolView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn get_pool(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<Json<PoolView>, ApiError> {
    who.require_admin()?;
    let id = parse::<PoolId>(&id)?;
    let pool = match bcm_db::tenancy::pool_fetch(&app.inner.db, &id).await {
        Ok(p) => p,
        Err(bcm_db::DbError::NotFound) => {
            return Err(ApiError::new(
                bcm_core::ErrorCode::NotFound,
                format!("pool {id} not found"),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Json(pool_view(&app, pool).await?))
}

/// Which pools to list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PoolsQuery {
    /// Only this tenant's pools.
    #[serde(default)]
    pub tenant_id: Option<TenantId>,
}

/// `GET /api/compute/admin/pools`.
#[utoipa::path(get, path = "/api/compute/admin/pools", operation_id = "listPools", tag = "admin", params(PoolsQuery),
    responses((status = 200, body = [PoolView]), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn list_pools(
    State(app): State<AppState>,
    who: Principal,
    crate::extract::Query(q): crate::extract::Query<PoolsQuery>,
) -> Result<Json<Vec<PoolView>>, ApiError> {
    who.require_admin()?;
    let pools =
        bcm_db::tenancy::pools_list(&app.inner.db, q.tenant_id.as_ref().map(TenantId::as_str))
            .await?;
    let mut out = Vec::with_capacity(pools.len());
    for p in pools {
        out.push(pool_view(&app, p).await?);
    }
    Ok(Json(out))
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

/// A site and its settings.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SiteView {
    pub id: SiteId,
    pub name: String,
    /// The upstream HTTP proxy `site.httpProxy` fetches catalog images
    /// through; absent: direct.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_proxy: Option<String>,
    /// Who set (or cleared) it last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_proxy_set_by: Option<String>,
}

async fn site_view(app: &AppState, id: &SiteId) -> Result<SiteView, ApiError> {
    let site = bcm_db::tenancy::site_fetch(&app.inner.db, id)
        .await?
        .ok_or_else(|| {
            ApiError::new(
                bcm_core::ErrorCode::NotFound,
                format!("site {id} not found"),
            )
        })?;
    Ok(SiteView {
        id: id.clone(),
        name: site.name,
        http_proxy: site.http_proxy,
        http_proxy_set_by: site.http_proxy_set_by,
    })
}

/// `GET /api/compute/admin/sites/{id}`.
#[utoipa::path(get, path = "/api/compute/admin/sites/{id}", operation_id = "getSite", tag = "admin",
    params(("id" = SiteId, Path)), responses((status = 200, body = SiteView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn get_site(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<Json<SiteView>, ApiError> {
    who.require_admin()?;
    let id = parse::<SiteId>(&id)?;
    Ok(Json(site_view(&app, &id).await?))
}

/// A site's upstream HTTP proxy.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpProxyRequest {
    /// `http://host:port` (no credentials, no path); `null` clears it.
    #[schema(max_length = 512, pattern = "^http://")]
    pub http_proxy: Option<String>,
}

/// `PUT /api/compute/admin/sites/{id}/httpProxy`: sets or clears the proxy
/// the site's cache fetches catalog images through (the next
/// `site.httpProxy` command carries it).
#[utoipa::path(put, path = "/api/compute/admin/sites/{id}/httpProxy", operation_id = "setSiteHttpProxy", tag = "admin", request_body = HttpProxyRequest,
    params(("id" = SiteId, Path)), responses((status = 200, body = SiteView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn put_site_http_proxy(
    State(app): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    Body(req): Body<HttpProxyRequest>,
) -> Result<Json<SiteView>, ApiError> {
    who.require_admin()?;
    let id = parse::<SiteId>(&id)?;
    if let Some(url) = &req.http_proxy {
        bcm_core::deploy::check_http_proxy(url).map_err(ApiError::invalid)?;
    }
    if !bcm_db::tenancy::site_set_http_proxy(
        &app.inner.db,
        &id,
        req.http_proxy.as_deref(),
        &who.name,
    )
    .await?
    {
        return Err(ApiError::new(
            bcm_core::ErrorCode::NotFound,
            format!("site {id} not found"),
        ));
    }
    tracing::info!(site = %id, proxy = req.http_proxy.as_deref().unwrap_or("none"), by = %who.name, "site HTTP proxy set");
    Ok(Json(site_view(&app, &id).await?))
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
    if req.max_dedicated_leases.is_some_and(|m| m > 1_000_000) {
        return Err(ApiError::invalid("maxDedicatedLeases must be 0 to 1000000"));
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
        deploy_profiles: req.deploy_profiles,
        release_wipe: req.release_wipe.unwrap_or_default().as_str().to_owned(),
        commission_wipe: req.commission_wipe.unwrap_or_default().as_str().to_owned(),
        adopt_acceptance: req.adopt_acceptance,
        erase_methods: req.erase_methods,
        unattested_release: req
            .unattested_release
            .unwrap_or_default()
            .as_str()
            .to_owned(),
    };
    check_pool_policy(&pool)?;
    app.inner
        .hardware
        .get(&pool.hardware_profile)
        .map_err(|e| ApiError::new(bcm_core::ErrorCode::InvalidConfig, e.to_string()))?;
    bcm_db::tenancy::pool_upsert(&app.inner.db, &pool)
        .await
        .map_err(|e| match e {
            bcm_db::DbError::Duplicate { .. } => ApiError::new(
                bcm_core::ErrorCode::Conflict,
                "the pool belongs to another tenant",
            ),
            other => other.into(),
        })?;
    bcm_db::tenant_leases::pool_set_max_leases(
        &app.inner.db,
        pool.id.as_str(),
        req.max_dedicated_leases,
    )
    .await?;
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

/// A configured hardware profile.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HardwareProfileView {
    pub name: String,
    pub description: String,
    pub drivers: bcm_core::hardware::Drivers,
    /// Whether a node whose enroll and pool name no profile gets this one.
    pub default: bool,
}

/// `GET /api/compute/hardwareProfiles`: the configured profiles (any
/// authenticated caller: they are the site's configuration, no secret).
#[utoipa::path(get, path = "/api/compute/hardwareProfiles", operation_id = "listHardwareProfiles", tag = "admin",
    responses((status = 200, body = [HardwareProfileView]), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn list_hardware_profiles(
    State(app): State<AppState>,
    _who: Principal,
) -> Json<Vec<HardwareProfileView>> {
    let a = &app.inner;
    Json(
        a.hardware
            .iter()
            .map(|(name, p)| HardwareProfileView {
                name: name.to_owned(),
                description: p.description.clone(),
                drivers: p.drivers,
                default: name == a.default_hardware_profile,
            })
            .collect(),
    )
}
