//! The tenant deploy profile catalog over HTTP: publish, list, get. A
//! published version is immutable: publishing it again with the same
//! content answers the stored version, with other content `CONFLICT` (a
//! change is a new version). Publishing is `compute:profiles:publish` and
//! reading `compute:profiles:read`, each on the tenant (a global or tenant
//! grant; a pool grant does not reach a tenant's catalog). The publisher is
//! recorded with the version.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use bcm_core::authz::Action;
use bcm_core::deploy::{DeployProfile, DeployRole, ImageRef};
use bcm_core::{ErrorCode, TenantId};
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{Body, Path, Query};
use crate::AppState;

/// A profile version to publish.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PublishRequest {
    pub tenant_id: TenantId,
    /// 1-64 characters of a-z, 0-9, '.', '-' or '_'.
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9._-]{1,64}$")]
    pub id: String,
    #[serde(deserialize_with = "crate::whole_number::required")]
    #[schema(minimum = 1, maximum = 2147483647)]
    pub version: u32,
    /// `host` unless the profile leases the whole machine.
    #[serde(default)]
    pub role: Option<DeployRole>,
    /// The image given inline (URL, format, SHA-256, size, signature): one
    /// outside the catalog, never pre-warmed. Give this or `catalogImage`.
    #[serde(default)]
    pub image: Option<ImageRef>,
    /// A registered image of the tenant's catalog (`POST
    /// /api/compute/images`) by name; the profile keeps what it is now.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 64, pattern = "^[a-z0-9._-]{1,64}$")]
    pub catalog_image: Option<String>,
    /// A user data template (`userData` must use `{{ joinToken }}` and
    /// `{{ controlPlaneUrl }}` and no unknown placeholder: 400 otherwise) with `{{ nodeId }}`, `{{ joinToken }}`,
    /// `{{ controlPlaneUrl }}`, `{{ bcdUrl }}`, `{{ bcdSha256 }}`. Give this
    /// or `userDataTemplate`, not both; neither is `bcd-preinstalled`.
    #[serde(default)]
    #[schema(max_length = 65536)]
    pub user_data: Option<String>,
    /// A shipped template: `nocloud` (cloud-init NoCloud, installs bcd from
    /// the control plane), `autoinstall` (Ubuntu autoinstall, the same) or
    /// `bcd-preinstalled` (the image has bcd).
    #[serde(default)]
    pub user_data_template: Option<String>,
}

/// The longest user data template accepted.
const MAX_USER_DATA: usize = 64 << 10;

/// A stored profile version.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfileView {
    pub tenant_id: String,
    pub profile: DeployProfile,
    /// The principal that published it (`seed` for the configuration's).
    pub published_by: Option<String>,
    pub published_at: chrono::DateTime<chrono::Utc>,
}

impl ProfileView {
    fn from_row(row: bcm_db::deploy_profiles::StoredDeployProfile) -> Result<Self, ApiError> {
        Ok(Self {
            profile: serde_json::from_value(row.definition)
                .map_err(|e| ApiError::internal(format!("a stored deploy profile: {e}")))?,
            tenant_id: row.tenant_id,
            published_by: row.published_by,
            published_at: row.created_at,
        })
    }
}

/// `POST /api/compute/deployProfiles`: publishes a version (201), or
/// answers the stored one when it has the same content (200).
#[utoipa::path(post, path = "/api/compute/deployProfiles", operation_id = "publishDeployProfile", tag = "profiles", request_body = PublishRequest,
    responses((status = 201, body = ProfileView), (status = 200, body = ProfileView, description = "the same content was already published"),
              crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn publish(
    State(app): State<AppState>,
    who: Principal,
    Body(req): Body<PublishRequest>,
) -> Result<(StatusCode, Json<ProfileView>), ApiError> {
    who.require_on_tenant(Action::ProfilesPublish, &req.tenant_id, || {
        format!("tenant {}", req.tenant_id)
    })?;
    let user_data = match (req.user_data, req.user_data_template) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "give userData or userDataTemplate, not both",
            ))
        }
        (Some(text), None) => {
            if text.chars().count() > MAX_USER_DATA || text.contains('\0') {
                return Err(ApiError::invalid(format!(
                    "userData must be at most {MAX_USER_DATA} characters without NUL"
                )));
            }
            text
        }
        (None, Some(name)) => bcm_core::deploy::template(&name)
            .ok_or_else(|| {
                let names: Vec<&str> = bcm_core::deploy::TEMPLATES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect();
                ApiError::invalid(format!(
                    "userDataTemplate {name:?} is not shipped; one of {names:?}"
                ))
            })?
            .to_owned(),
        (None, None) => bcm_core::deploy::DEFAULT_USER_DATA.to_owned(),
    };
    // The request's own fields first: a bad one is INVALID_ARGUMENT
    // whatever the catalog holds.
    crate::verbs::check_profile_id("id", &req.id)?;
    if req.version == 0 || i32::try_from(req.version).is_err() {
        return Err(ApiError::invalid("version must be 1 to 2147483647"));
    }
    let (image, catalog_image) = match (req.image, req.catalog_image) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid("give image or catalogImage, not both"))
        }
        (None, None) => return Err(ApiError::invalid("give image or catalogImage")),
        (Some(image), None) => (image, None),
        (None, Some(name)) => {
            crate::verbs::check_profile_id("catalogImage", &name)?;
            let stored = bcm_db::images::image_fetch(&app.inner.db, req.tenant_id.as_str(), &name)
                .await?
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::NotFound,
                        format!("image {name} is not in tenant {}'s catalog", req.tenant_id),
                    )
                })?;
            (stored.image, Some(name))
        }
    };
    let profile = DeployProfile {
        id: req.id,
        version: req.version,
        role: req.role.unwrap_or(DeployRole::Host),
        image,
        catalog_image,
        user_data,
    };
    if i32::try_from(profile.version).is_err() {
        return Err(ApiError::invalid("version must be 1 to 2147483647"));
    }
    profile
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let definition = serde_json::to_value(&profile).map_err(ApiError::internal)?;
    let tenant = req.tenant_id.as_str();
    let (id, version) = (profile.id.as_str(), profile.version as i32);
    let created = match bcm_db::deploy_profiles::deploy_profile_insert(
        &app.inner.db,
        tenant,
        id,
        version,
        &definition,
        &who.name,
    )
    .await
    {
        Ok(created) => created,
        Err(bcm_db::DbError::Duplicate { .. }) => {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("deploy profile {id} v{version} of tenant {tenant} is published with other content; a published version is immutable: publish version {}", version.saturating_add(1)),
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
    let row = bcm_db::deploy_profiles::deploy_profile_fetch(&app.inner.db, tenant, id, version)
        .await?
        .ok_or_else(|| ApiError::internal("a published profile is gone"))?;
    if created {
        tracing::info!(tenant, profile = id, version, by = %who.name, "deploy profile published");
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(ProfileView::from_row(row)?)))
}

/// Which profiles to list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    pub tenant_id: TenantId,
    /// Only the versions of this profile id.
    #[serde(default)]
    #[param(pattern = "^[a-z0-9._-]{1,64}$")]
    pub id: Option<String>,
}

/// The most versions one listing returns.
const LIST_LIMIT: i64 = 1000;

/// `GET /api/compute/deployProfiles?tenantId=…[&id=…]`: a tenant's
/// versions, by id then version.
#[utoipa::path(get, path = "/api/compute/deployProfiles", operation_id = "listDeployProfiles", tag = "profiles", params(ListQuery),
    responses((status = 200, body = [ProfileView]), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn list(
    State(app): State<AppState>,
    who: Principal,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<ProfileView>>, ApiError> {
    who.require_on_tenant(Action::ProfilesRead, &q.tenant_id, || {
        format!("tenant {}", q.tenant_id)
    })?;
    if let Some(id) = &q.id {
        crate::verbs::check_profile_id("id", id)?;
    }
    let rows = bcm_db::deploy_profiles::deploy_profiles_list(
        &app.inner.db,
        q.tenant_id.as_str(),
        q.id.as_deref(),
        LIST_LIMIT,
    )
    .await?;
    Ok(Json(
        rows.into_iter()
            .map(ProfileView::from_row)
            .collect::<Result<_, _>>()?,
    ))
}

/// `GET /api/compute/deployProfiles/{tenantId}/{id}/{version}`.
#[utoipa::path(get, path = "/api/compute/deployProfiles/{tenantId}/{id}/{version}", operation_id = "getDeployProfile", tag = "profiles",
    params(("tenantId" = TenantId, Path), ("id" = String, Path, pattern = "^[a-z0-9._-]{1,64}$"),
           ("version" = u32, Path, minimum = 1, maximum = 2147483647)),
    responses((status = 200, body = ProfileView), crate::error::ErrorResponses), security(("bearer" = [])))]
pub async fn get(
    State(app): State<AppState>,
    who: Principal,
    Path((tenant, id, version)): Path<(String, String, String)>,
) -> Result<Json<ProfileView>, ApiError> {
    let tenant: TenantId = tenant
        .parse()
        .map_err(|e: bcm_core::IdError| ApiError::invalid(e.to_string()))?;
    who.require_on_tenant(Action::ProfilesRead, &tenant, || format!("tenant {tenant}"))?;
    let version: i32 = version
        .parse()
        .ok()
        .filter(|v| *v >= 1)
        .ok_or_else(|| ApiError::invalid("version must be 1 to 2147483647"))?;
    crate::verbs::check_profile_id("id", &id)?;
    let row =
        bcm_db::deploy_profiles::deploy_profile_fetch(&app.inner.db, tenant.as_str(), &id, version)
            .await?
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::NotFound,
                    format!("deploy profile {id} v{version} is not in tenant {tenant}'s catalog"),
                )
            })?;
    Ok(Json(ProfileView::from_row(row)?))
}
