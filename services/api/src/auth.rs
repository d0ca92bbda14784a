//! Bearer tokens and principals. Tokens are stored as SHA-256 hashes; the
//! bootstrap admin token comes from configuration and is compared by hash.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use bcm_core::authz::{decide, decide_on_tenant, Action, Decision, Grant, Placement, Scope};
use bcm_core::ErrorCode;
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::AppState;

/// Who is calling, with what grants.
#[derive(Debug, Clone)]
pub struct Principal {
    pub name: String,
    pub grants: Vec<Grant>,
    /// The bootstrap admin: may manage tenants, sites, pools and tokens.
    pub admin: bool,
}

impl Principal {
    /// Checks `action` on a resource at `at`: `NOT_FOUND` when the caller
    /// sees nothing there, `FORBIDDEN` when it lacks the action.
    pub fn require(
        &self,
        action: Action,
        at: &Placement,
        what: impl FnOnce() -> String,
    ) -> Result<(), ApiError> {
        match decide(&self.grants, action, at) {
            Decision::Allow => Ok(()),
            Decision::Forbidden => Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("{} lacks {} on {}", self.name, action.as_str(), what()),
            )),
            Decision::NotFound => Err(ApiError::new(
                ErrorCode::NotFound,
                format!("{} not found", what()),
            )),
        }
    }

    /// Checks `action` on a resource of the whole `tenant` (its deploy
    /// profile catalog), answering as [`Principal::require`] does.
    pub fn require_on_tenant(
        &self,
        action: Action,
        tenant: &bcm_core::TenantId,
        what: impl FnOnce() -> String,
    ) -> Result<(), ApiError> {
        match decide_on_tenant(&self.grants, action, tenant) {
            Decision::Allow => Ok(()),
            Decision::Forbidden => Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("{} lacks {} on {}", self.name, action.as_str(), what()),
            )),
            Decision::NotFound => Err(ApiError::new(
                ErrorCode::NotFound,
                format!("{} not found", what()),
            )),
        }
    }

    /// Tenants and pools where the caller may read nodes; `None` for all.
    pub fn readable(&self) -> Option<(Vec<bcm_core::TenantId>, Vec<bcm_core::PoolId>)> {
        let mut tenants = vec![];
        let mut pools = vec![];
        for g in self.grants.iter().filter(|g| g.action == Action::NodesRead) {
            match &g.scope {
                Scope::Global => return None,
                Scope::Tenant(t) => tenants.push(t.clone()),
                Scope::Pool(p) => pools.push(p.clone()),
            }
        }
        Some((tenants, pools))
    }

    /// Refuses anyone but the bootstrap admin.
    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.admin {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("{} is not an administrator", self.name),
            ))
        }
    }
}

/// SHA-256 of a bearer secret.
pub fn token_hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// A new bearer secret, `bcm_` and 64 hex digits.
pub fn new_token_secret() -> String {
    let mut b = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    format!("bcm_{}", hex::encode(b))
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let who = Self::identify(parts, state).await?;
        match state.inner.limits.check(&who.name, who.admin) {
            Ok(()) => Ok(who),
            Err(wait) => {
                metrics::counter!("bcm_api_rate_limited_total").increment(1);
                Err(ApiError::new(
                    ErrorCode::RateLimited,
                    format!(
                        "{} is over its request rate; retry in {} ms",
                        who.name,
                        wait.as_millis().max(1)
                    ),
                )
                .retry_after(wait))
            }
        }
    }
}

impl Principal {
    /// The caller, from its bearer token.
    async fn identify(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let unauthenticated = |m: &str| ApiError::new(ErrorCode::Unauthenticated, m);
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| unauthenticated("missing bearer token (Authorization: Bearer …)"))?;
        let secret = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|s| !s.is_empty() && s.len() <= 256)
            .ok_or_else(|| {
                unauthenticated("malformed Authorization header; expected Bearer <token>")
            })?;
        let hash = token_hash(secret);
        if hash == state.inner.admin_token_hash {
            return Ok(Principal {
                name: "admin".to_owned(),
                grants: Action::ALL
                    .iter()
                    .map(|a| Grant {
                        action: *a,
                        scope: Scope::Global,
                    })
                    .collect(),
                admin: true,
            });
        }
        // A plain read: on the reads' pool, so that no request (a read
        // least of all) waits behind verbs holding the main pool.
        match bcm_db::tokens::api_token_fetch_live_by_hash(&state.inner.read_db, &hash).await {
            Ok(row) => {
                let grants: Vec<Grant> = serde_json::from_value(row.grants).map_err(|e| {
                    ApiError::internal(format!("token {} has bad grants: {e}", row.id))
                })?;
                Ok(Principal {
                    name: row.principal,
                    grants,
                    admin: false,
                })
            }
            Err(bcm_db::DbError::NotFound) => {
                Err(unauthenticated("unknown, expired or revoked token"))
            }
            Err(e) => Err(e.into()),
        }
    }
}
