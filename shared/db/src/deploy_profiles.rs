//! The tenant deploy profile catalog: immutable versions, stored as the
//! core's `DeployProfile` JSON. Storing the same version twice with the same
//! content is a no-op; with different content it is refused.

use crate::{Db, DbError, Tx};

/// Stores a profile version of `tenant`, published by `by`. Returns whether
/// it was stored now (`false`: the same content was already there). A
/// stored version with different content is [`DbError::Duplicate`]
/// (versions are immutable).
pub async fn deploy_profile_insert(
    db: &Db,
    tenant: &str,
    id: &str,
    version: i32,
    definition: &serde_json::Value,
    by: &str,
) -> Result<bool, DbError> {
    // When another writer inserts the same version at the same moment, the
    // insert waits for it and does nothing, but the statement's snapshot,
    // taken before that writer committed, does not see its row: no row at
    // all. The next statement's snapshot does.
    let mut stored: Option<(serde_json::Value, bool)> = None;
    for _ in 0..3 {
        stored = sqlx::query_as(
            "WITH ins AS (INSERT INTO deploy_profiles (tenant_id, id, version, definition, published_by) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (tenant_id, id, version) DO NOTHING RETURNING definition) \
             SELECT definition, true FROM ins UNION ALL \
             SELECT definition, false FROM deploy_profiles WHERE tenant_id = $1 AND id = $2 AND version = $3 LIMIT 1",
        )
        .bind(tenant)
        .bind(id)
        .bind(version)
        .bind(definition)
        .bind(by)
        .fetch_optional(db.pool())
        .await?;
        if stored.is_some() {
            break;
        }
    }
    let (stored, created) = stored.ok_or(DbError::Stale)?;
    if &stored != definition {
        return Err(DbError::Duplicate {
            constraint: "deploy_profiles_pkey".into(),
        });
    }
    Ok(created)
}

/// A stored profile version with who published it and when.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredDeployProfile {
    pub tenant_id: String,
    pub definition: serde_json::Value,
    pub published_by: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// One stored version, if it exists.
pub async fn deploy_profile_fetch(
    db: &Db,
    tenant: &str,
    id: &str,
    version: i32,
) -> Result<Option<StoredDeployProfile>, DbError> {
    Ok(sqlx::query_as(
        "SELECT tenant_id, definition, published_by, created_at FROM deploy_profiles \
         WHERE tenant_id = $1 AND id = $2 AND version = $3",
    )
    .bind(tenant)
    .bind(id)
    .bind(version)
    .fetch_optional(db.pool())
    .await?)
}

/// A tenant's stored versions, of one profile id or of all, by id then
/// version, at most `limit`.
pub async fn deploy_profiles_list(
    db: &Db,
    tenant: &str,
    id: Option<&str>,
    limit: i64,
) -> Result<Vec<StoredDeployProfile>, DbError> {
    Ok(sqlx::query_as(
        "SELECT tenant_id, definition, published_by, created_at FROM deploy_profiles \
         WHERE tenant_id = $1 AND ($2::text IS NULL OR id = $2) ORDER BY id, version LIMIT $3",
    )
    .bind(tenant)
    .bind(id)
    .bind(limit)
    .fetch_all(db.pool())
    .await?)
}

/// A tenant's profile version, if it exists.
pub async fn deploy_profile_fetch_in_txn(
    tx: &mut Tx<'_>,
    tenant: &str,
    id: &str,
    version: i32,
) -> Result<Option<bcm_core::deploy::DeployProfile>, DbError> {
    let stored: Option<serde_json::Value> = sqlx::query_scalar(
        "SELECT definition FROM deploy_profiles WHERE tenant_id = $1 AND id = $2 AND version = $3",
    )
    .bind(tenant)
    .bind(id)
    .bind(version)
    .fetch_optional(&mut **tx)
    .await?;
    stored
        .map(|v| {
            serde_json::from_value(v)
                .map_err(|e| DbError::Corrupt(format!("deploy profile {id} v{version}: {e}")))
        })
        .transpose()
}
