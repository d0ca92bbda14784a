//! The tenant deploy profile catalog: immutable versions, stored as the
//! core's `DeployProfile` JSON. Storing the same version twice with the same
//! content is a no-op; with different content it is refused.

use crate::{Db, DbError, Tx};

/// Stores a profile version of `tenant`. A stored version with different
/// content is [`DbError::Duplicate`] (versions are immutable).
pub async fn deploy_profile_insert(
    db: &Db,
    tenant: &str,
    id: &str,
    version: i32,
    definition: &serde_json::Value,
) -> Result<(), DbError> {
    // When another writer inserts the same version at the same moment, the
    // insert waits for it and does nothing, but the statement's snapshot,
    // taken before that writer committed, does not see its row: no row at
    // all. The next statement's snapshot does.
    let mut stored: Option<serde_json::Value> = None;
    for _ in 0..3 {
        stored = sqlx::query_scalar(
            "WITH ins AS (INSERT INTO deploy_profiles (tenant_id, id, version, definition) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant_id, id, version) DO NOTHING RETURNING definition) \
             SELECT definition FROM ins UNION ALL \
             SELECT definition FROM deploy_profiles WHERE tenant_id = $1 AND id = $2 AND version = $3 LIMIT 1",
        )
        .bind(tenant)
        .bind(id)
        .bind(version)
        .bind(definition)
        .fetch_optional(db.pool())
        .await?;
        if stored.is_some() {
            break;
        }
    }
    let stored = stored.ok_or(DbError::Stale)?;
    if &stored != definition {
        return Err(DbError::Duplicate {
            constraint: "deploy_profiles_pkey".into(),
        });
    }
    Ok(())
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

/// Every profile version of a tenant, by id then version.
pub async fn deploy_profiles_of_tenant(
    db: &Db,
    tenant: &str,
) -> Result<Vec<serde_json::Value>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT definition FROM deploy_profiles WHERE tenant_id = $1 ORDER BY id, version",
    )
    .bind(tenant)
    .fetch_all(db.pool())
    .await?)
}
