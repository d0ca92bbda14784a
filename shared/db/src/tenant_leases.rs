//! Dedicated-root leases (`tenant_root_leases`): a tenant's lease of a
//! whole machine, one open lease per node, and the refused requests with
//! their reasons. Which change a move makes is `bcm_core::dedicated`'s to
//! decide; this module only records it.

use bcm_core::dedicated::LeaseState;
use chrono::{DateTime, Utc};

use crate::{Db, DbError, Tx};

/// A stored lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub id: String,
    pub tenant_id: String,
    pub pool_id: String,
    pub node_id: String,
    pub deploy_profile: String,
    pub state: LeaseState,
    pub reason: Option<String>,
    pub requested_by: Option<String>,
    pub started_at: DateTime<Utc>,
    pub bound_at: Option<DateTime<Utc>>,
    pub ending_at: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct LeaseRow {
    id: String,
    tenant_id: String,
    pool_id: String,
    node_id: String,
    deploy_profile: String,
    state: String,
    reason: Option<String>,
    requested_by: Option<String>,
    started_at: DateTime<Utc>,
    bound_at: Option<DateTime<Utc>>,
    ending_at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, tenant_id, pool_id, node_id, deploy_profile, state, reason, requested_by, started_at, bound_at, ending_at, ended_at";

impl TryFrom<LeaseRow> for Lease {
    type Error = DbError;
    fn try_from(r: LeaseRow) -> Result<Self, DbError> {
        Ok(Lease {
            state: LeaseState::parse(&r.state)
                .ok_or_else(|| DbError::Corrupt(format!("lease {} state {}", r.id, r.state)))?,
            id: r.id,
            tenant_id: r.tenant_id,
            pool_id: r.pool_id,
            node_id: r.node_id,
            deploy_profile: r.deploy_profile,
            reason: r.reason,
            requested_by: r.requested_by,
            started_at: r.started_at,
            bound_at: r.bound_at,
            ending_at: r.ending_at,
            ended_at: r.ended_at,
        })
    }
}

/// A lease to record: opened (`leased`) or refused (with its reason).
#[derive(Debug, Clone)]
pub struct NewLease<'a> {
    pub id: &'a str,
    pub tenant_id: &'a str,
    pub pool_id: &'a str,
    pub node_id: &'a str,
    pub deploy_profile: &'a str,
    pub state: LeaseState,
    pub reason: Option<&'a str>,
    pub requested_by: Option<&'a str>,
}

/// Records a lease. A second open lease of a node is
/// [`DbError::Duplicate`].
pub async fn lease_insert_in_txn(tx: &mut Tx<'_>, l: &NewLease<'_>) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO tenant_root_leases (id, tenant_id, pool_id, node_id, deploy_profile, state, reason, requested_by, ended_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $6 = 'refused' THEN now() END)",
    )
    .bind(l.id)
    .bind(l.tenant_id)
    .bind(l.pool_id)
    .bind(l.node_id)
    .bind(l.deploy_profile)
    .bind(l.state.as_str())
    .bind(l.reason)
    .bind(l.requested_by)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The node's open lease, locked.
pub async fn lease_open_for_node_in_txn(
    tx: &mut Tx<'_>,
    node_id: &str,
) -> Result<Option<Lease>, DbError> {
    let row: Option<LeaseRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM tenant_root_leases WHERE node_id = $1 AND state IN ('leased', 'bound', 'ending') FOR UPDATE"
    ))
    .bind(node_id)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(Lease::try_from).transpose()
}

/// Moves a lease to `state`, stamping when it got there.
pub async fn lease_set_state_in_txn(
    tx: &mut Tx<'_>,
    id: &str,
    state: LeaseState,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE tenant_root_leases SET state = $2, \
         bound_at = CASE WHEN $2 = 'bound' THEN now() ELSE bound_at END, \
         ending_at = CASE WHEN $2 = 'ending' THEN now() ELSE ending_at END, \
         ended_at = CASE WHEN $2 = 'ended' THEN now() ELSE ended_at END \
         WHERE id = $1",
    )
    .bind(id)
    .bind(state.as_str())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// How many open leases a pool holds, and its policy's maximum, with the
/// pool's row locked so two admissions cannot both take the last place.
pub async fn pool_open_leases_in_txn(
    tx: &mut Tx<'_>,
    pool_id: &str,
) -> Result<(u64, Option<u32>), DbError> {
    let max: Option<Option<i32>> =
        sqlx::query_scalar("SELECT max_dedicated_leases FROM pools WHERE id = $1 FOR UPDATE")
            .bind(pool_id)
            .fetch_optional(&mut **tx)
            .await?;
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tenant_root_leases WHERE pool_id = $1 AND state IN ('leased', 'bound', 'ending')",
    )
    .bind(pool_id)
    .fetch_one(&mut **tx)
    .await?;
    Ok((held.max(0) as u64, max.flatten().map(|m| m.max(0) as u32)))
}

/// Sets a pool's `maxDedicatedLeases` (`None`: no limit).
pub async fn pool_set_max_leases(db: &Db, pool_id: &str, max: Option<u32>) -> Result<(), DbError> {
    sqlx::query("UPDATE pools SET max_dedicated_leases = $2 WHERE id = $1")
        .bind(pool_id)
        .bind(max.map(|m| m as i32))
        .execute(db.pool())
        .await?;
    Ok(())
}

/// A pool's `maxDedicatedLeases`.
pub async fn pool_max_leases(db: &Db, pool_id: &str) -> Result<Option<u32>, DbError> {
    let max: Option<Option<i32>> =
        sqlx::query_scalar("SELECT max_dedicated_leases FROM pools WHERE id = $1")
            .bind(pool_id)
            .fetch_optional(db.pool())
            .await?;
    Ok(max.flatten().map(|m| m.max(0) as u32))
}

/// A tenant's leases, newest first (at most `limit`).
pub async fn leases_of_tenant(db: &Db, tenant_id: &str, limit: i64) -> Result<Vec<Lease>, DbError> {
    let rows: Vec<LeaseRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM tenant_root_leases WHERE tenant_id = $1 ORDER BY started_at DESC, id DESC LIMIT $2"
    ))
    .bind(tenant_id)
    .bind(limit)
    .fetch_all(db.pool())
    .await?;
    rows.into_iter().map(Lease::try_from).collect()
}
