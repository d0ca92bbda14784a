//! The image catalog over HTTP: register, list, get, and pre-warm into a
//! site's cache. A registered name is immutable: registering it again with
//! the same content answers the stored image, with other content
//! `CONFLICT`. Registering and pre-warming are `compute:profiles:publish`
//! and reading `compute:profiles:read` on the tenant (the catalog is what
//! deploy profiles name). A pre-warm is a `site.httpProxy` command to the
//! site, recorded with its requester before it is sent; it carries the
//! site's upstream HTTP proxy when the site sets one
//! (`PUT /api/compute/admin/sites/{id}/httpProxy`). An image's view shows
//! what each site's cache made of it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use bcm_contracts::commands::{CacheImage, Command, HttpProxyParams};
use bcm_contracts::CommandEnvelope;
use bcm_core::authz::Action;
use bcm_core::deploy::{DataRange, ImageFormat, ImageRef};
use bcm_core::{ErrorCode, SiteId, TenantId};
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{Body, Path, Query};
use crate::AppState;

/// An image to register.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterImageRequest {
    pub tenant_id: TenantId,
    /// 1-64 characters of a-z, 0-9, '.', '-' or '_'.
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9._-]{1,64}$")]
    pub name: String,
    /// Where it is fetched from: `http(s)://`, with no credentials.
    #[schema(pattern = "^https?://", max_length = 2048)]
    pub url: String,
    pub format: ImageFormat,
    /// Lower-case hex SHA-256 of the image as served.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub sha256: String,
    #[serde(deserialize_with = "crate::whole_number::required")]
    #[schema(minimum = 1)]
    pub size_bytes: u64,
    /// The publisher's ed25519 signature (base64) over the manifest.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 1024)]
    pub signature: Option<String>,
    /// A raw image's block map (what `metalctl image sign` prints).
    #[serde(default)]
    #[schema(max_items = 4096)]
    pub data_ranges: Option<Vec<DataRange>>,
}

/// What a site's cache made of an image: its newest `site.httpProxy`.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SiteCacheView {
    pub site_id: String,
    pub command_id: String,
    /// `pending` or `sent` (asked), `succeeded` (cached and verified) or
    /// `failed`.
    pub status: String,
    pub requested_by: Option<String>,
    pub requested_at: chrono::DateTime<chrono::Utc>,
    pub completed_at: Option<chrono::DateTime<chrono::Utc>>,
    /// How it came: the proxy's URL, `direct`, or `cache` (there already).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<bcm_db::images::SiteCache> for SiteCacheView {
    fn from(c: bcm_db::images::SiteCache) -> Self {
        let field = |name: &str| {
            c.result
                .as_ref()
                .and_then(|r| r.pointer(name))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        Self {
            via: field("/output/via"),
            error: field("/error"),
            site_id: c.site_id,
            command_id: c.command_id,
            status: c.status,
            requested_by: c.actor,
            requested_at: c.created_at,
            completed_at: c.completed_at,
        }
    }
}

/// A registered image.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageView {
    pub tenant_id: String,
    pub name: String,
    pub image: ImageRef,
    /// The path it has in a site's cache (served at `/images/<path>`).
    pub cache_path: String,
    pub registered_by: String,
    pub registered_at: chrono::DateTime<chrono::Utc>,
    /// Each site's cache (one image's view only; absent in a listing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sites: Option<Vec<SiteCacheView>>,
}

use bcm_contracts::commands::catalog_cache_path as cache_path;

impl ImageView {
    fn from_row(row: bcm_db::images::StoredImage, sites: Option<Vec<SiteCacheView>>) -> Self {
        Self {
            cache_path: cache_path(&row.tenant_id, &row.name),
            tenant_id: row.tenant_id,
            name: row.name,
            image: row.image,
            registered_by: row.registered_by,
            registered_at: row.registered_at,
            sites,
        }
    }
}

/// `POST /api/compute/images`: registers an image (201), or answers the
/// stored one when it has the same content (200).
#[utoipa::path(post, path = "/api/compute/images", operation_id = "registerImage", tag = "profiles", request_body = RegisterImageRequest,
    responses((status = 201, body = ImageView), (status = 200, body = ImageView, description = "the same content was already registered"),
              crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn register(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<RegisterImageRequest>,
) -> Result<(StatusCode, Json<ImageView>), ApiError> {
    who.require_on_tenant(Action::ProfilesPublish, &req.tenant_id, || {
        format!("tenant {}", req.tenant_id)
    })?;
    crate::verbs::check_profile_id("name", &req.name)?;
    let image = ImageRef {
        url: req.url,
        format: req.format,
        sha256: req.sha256,
        size_bytes: req.size_bytes,
        signature: req.signature,
        data_ranges: req.data_ranges,
    };
    image
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    if i64::try_from(image.size_bytes).is_err() {
        return Err(ApiError::invalid("sizeBytes is beyond 2^63-1"));
    }
    let tenant = req.tenant_id.as_str();
    let (row, created) = match bcm_db::images::image_register(
        &app.inner.db,
        tenant,
        &req.name,
        &image,
        &who.name,
    )
    .await
    {
        Ok(r) => r,
        Err(bcm_db::DbError::Duplicate { .. }) => {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!(
                    "image {} of tenant {tenant} is registered with other content; a registered image is immutable: register it under a new name",
                    req.name
                ),
            ))
        }
        Err(bcm_db::DbError::MissingReference { .. }) => {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!("tenant {tenant} not found"),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    if created {
        tracing::info!(tenant, image = %row.name, by = %who.name, "image registered");
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(ImageView::from_row(row, None))))
}

/// Whose images to list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    pub tenant_id: TenantId,
}

/// The most images one listing returns.
const LIST_LIMIT: i64 = 1000;

/// `GET /api/compute/images?tenantId=…`: a tenant's images by name.
#[utoipa::path(get, path = "/api/compute/images", operation_id = "listImages", tag = "profiles", params(ListQuery),
    responses((status = 200, body = [ImageView]), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn list(
    State(app): State<AppState>,
    who: Principal,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<ImageView>>, ApiError> {
    who.require_on_tenant(Action::ProfilesRead, &q.tenant_id, || {
        format!("tenant {}", q.tenant_id)
    })?;
    let rows = bcm_db::images::images_list(&app.inner.db, q.tenant_id.as_str(), LIST_LIMIT).await?;
    Ok(Json(
        rows.into_iter()
            .map(|r| ImageView::from_row(r, None))
            .collect(),
    ))
}

/// The tenant and image of a path, checked, with the caller's right to
/// `action` on the tenant.
async fn stored(
    app: &AppState,
    who: &Principal,
    action: Action,
    tenant: &str,
    name: &str,
) -> Result<bcm_db::images::StoredImage, ApiError> {
    let tenant: TenantId = tenant
        .parse()
        .map_err(|e: bcm_core::IdError| ApiError::invalid(e.to_string()))?;
    who.require_on_tenant(action, &tenant, || format!("tenant {tenant}"))?;
    crate::verbs::check_profile_id("name", name)?;
    bcm_db::images::image_fetch(&app.inner.db, tenant.as_str(), name)
        .await?
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!("image {name} is not in tenant {tenant}'s catalog"),
            )
        })
}

/// `GET /api/compute/images/{tenantId}/{name}`: the image and each site's
/// cache of it.
#[utoipa::path(get, path = "/api/compute/images/{tenantId}/{name}", operation_id = "getImage", tag = "profiles",
    params(("tenantId" = TenantId, Path), ("name" = String, Path, pattern = "^[a-z0-9._-]{1,64}$")),
    responses((status = 200, body = ImageView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn get(
    State(app): State<AppState>,
    who: Principal,
    Path((tenant, name)): Path<(String, String)>,
) -> Result<Json<ImageView>, ApiError> {
    let row = stored(&app, &who, Action::ProfilesRead, &tenant, &name).await?;
    let sites =
        bcm_db::images::image_site_caches(&app.inner.db, &cache_path(&row.tenant_id, &row.name))
            .await?
            .into_iter()
            .map(SiteCacheView::from)
            .collect();
    Ok(Json(ImageView::from_row(row, Some(sites))))
}

/// Where to pre-warm an image.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrewarmRequest {
    /// A site where the tenant has a pool.
    pub site_id: SiteId,
}

/// A pre-warm on its way to the site.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrewarmAccepted {
    /// The `site.httpProxy` command (the image's view shows its outcome).
    pub command_id: String,
    pub site_id: SiteId,
    pub cache_path: String,
    /// The site's upstream HTTP proxy it goes through, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_proxy: Option<String>,
}

/// How long a pre-warm may wait to reach its site: later, the site
/// refuses it unrun.
const PREWARM_TTL: chrono::Duration = chrono::Duration::minutes(15);

/// `POST /api/compute/images/{tenantId}/{name}/prewarm`: asks the site's
/// boot service to fetch the image into its cache (202).
#[utoipa::path(post, path = "/api/compute/images/{tenantId}/{name}/prewarm", operation_id = "prewarmImage", tag = "profiles",
    params(("tenantId" = TenantId, Path), ("name" = String, Path, pattern = "^[a-z0-9._-]{1,64}$")),
    request_body = PrewarmRequest,
    responses((status = 202, body = PrewarmAccepted), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn prewarm(
    State(app): State<AppState>,
    who: Principal,
    Path((tenant, name)): Path<(String, String)>,
    Body(req): Body<PrewarmRequest>,
) -> Result<(StatusCode, Json<PrewarmAccepted>), ApiError> {
    let row = stored(&app, &who, Action::ProfilesPublish, &tenant, &name).await?;
    let db = &app.inner.db;
    // A tenant warms only the caches of sites it has machines in.
    let site = bcm_db::tenancy::site_fetch(db, &req.site_id).await?;
    let in_site = bcm_db::tenancy::tenant_in_site(db, &row.tenant_id, req.site_id.as_str()).await?;
    let Some(site) = site.filter(|_| in_site) else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "tenant {} has no pool in site {}",
                row.tenant_id, req.site_id
            ),
        ));
    };
    let path = cache_path(&row.tenant_id, &row.name);
    let now = chrono::Utc::now();
    let cmd = CommandEnvelope {
        command_id: bcm_core::CommandId::generate().to_string(),
        site_id: req.site_id.clone(),
        node_id: None,
        command: Command::SiteHttpProxy(HttpProxyParams {
            image: CacheImage {
                path: path.clone(),
                url: row.image.url.clone(),
                sha256: row.image.sha256.clone(),
                size_bytes: row.image.size_bytes,
            },
            upstream_proxy: site.http_proxy.clone(),
        }),
        issued_at: now,
        deadline: Some(now + PREWARM_TTL),
        authority: None,
    };
    let mut tx = db.begin().await?;
    bcm_db::commands::command_insert_in_txn(
        &mut tx,
        &bcm_db::commands::NewCommand {
            id: cmd.command_id.clone(),
            idempotency_key: format!("prewarm/{}", cmd.command_id),
            workflow_id: None,
            step_idx: None,
            attempt: 1,
            node_id: None,
            site_id: Some(req.site_id.to_string()),
            kind: cmd.kind().as_str().to_owned(),
            target: "site".to_owned(),
            params: cmd.command.params_json(),
            actor: Some(who.name.clone()),
            traceparent: bcm_bus::current_traceparent(),
            batch_id: None,
        },
    )
    .await?;
    let row_out = bcm_metal::outbox::site_command(app.inner.bus.subjects(), &cmd);
    bcm_metal::outbox::write_in_txn(&mut tx, vec![row_out]).await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    tracing::info!(image = %path, site = %req.site_id, by = %who.name, command = %cmd.command_id, "image pre-warm asked");
    Ok((
        StatusCode::ACCEPTED,
        Json(PrewarmAccepted {
            command_id: cmd.command_id,
            site_id: req.site_id,
            cache_path: path,
            upstream_proxy: site.http_proxy,
        }),
    ))
}
