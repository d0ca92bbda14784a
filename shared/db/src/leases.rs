//! Shard leases: each shard of a kind of work is owned by one worker until
//! its lease expires; workers heartbeat so each takes a fair share, and a
//! dead worker's shards move to the living when its leases expire.

use crate::{Db, DbError};

/// Records that `holder` is alive.
pub async fn worker_heartbeat(db: &Db, kind: &str, holder: &str) -> Result<(), DbError> {
    sqlx::query(
        "INSERT INTO workers (kind, holder, last_seen) VALUES ($1, $2, now()) \
         ON CONFLICT (kind, holder) DO UPDATE SET last_seen = now()",
    )
    .bind(kind)
    .bind(holder)
    .execute(db.pool())
    .await?;
    Ok(())
}

/// How many workers of `kind` were seen within `within`.
pub async fn workers_alive(
    db: &Db,
    kind: &str,
    within: std::time::Duration,
) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM workers WHERE kind = $1 AND last_seen > now() - make_interval(secs => $2)",
    )
    .bind(kind)
    .bind(within.as_secs_f64())
    .fetch_one(db.pool())
    .await?)
}

/// Takes or renews the lease on `shard` for `ttl`; true when `holder` owns it.
pub async fn lease_acquire(
    db: &Db,
    kind: &str,
    shard: i32,
    holder: &str,
    ttl: std::time::Duration,
) -> Result<bool, DbError> {
    let got: Option<String> = sqlx::query_scalar(
        "INSERT INTO shard_leases (kind, shard, holder, expires_at) VALUES ($1, $2, $3, now() + make_interval(secs => $4)) \
         ON CONFLICT (kind, shard) DO UPDATE SET holder = $3, expires_at = now() + make_interval(secs => $4) \
         WHERE shard_leases.holder = $3 OR shard_leases.expires_at < now() RETURNING holder",
    )
    .bind(kind)
    .bind(shard)
    .bind(holder)
    .bind(ttl.as_secs_f64())
    .fetch_optional(db.pool())
    .await?;
    Ok(got.is_some())
}

/// Gives up a lease.
pub async fn lease_release(db: &Db, kind: &str, shard: i32, holder: &str) -> Result<(), DbError> {
    sqlx::query("DELETE FROM shard_leases WHERE kind = $1 AND shard = $2 AND holder = $3")
        .bind(kind)
        .bind(shard)
        .bind(holder)
        .execute(db.pool())
        .await?;
    Ok(())
}

/// Gives up every lease and the heartbeat of `holder` (clean shutdown).
pub async fn worker_leave(db: &Db, kind: &str, holder: &str) -> Result<(), DbError> {
    sqlx::query("DELETE FROM shard_leases WHERE kind = $1 AND holder = $2")
        .bind(kind)
        .bind(holder)
        .execute(db.pool())
        .await?;
    sqlx::query("DELETE FROM workers WHERE kind = $1 AND holder = $2")
        .bind(kind)
        .bind(holder)
        .execute(db.pool())
        .await?;
    Ok(())
}

/// The shards `holder` owns now.
pub async fn leases_held(db: &Db, kind: &str, holder: &str) -> Result<Vec<i32>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT shard FROM shard_leases WHERE kind = $1 AND holder = $2 AND expires_at > now() ORDER BY shard",
    )
    .bind(kind)
    .bind(holder)
    .fetch_all(db.pool())
    .await?)
}

/// The live leases of a kind: `(shard, holder)` by shard.
pub async fn lease_holders(db: &Db, kind: &str) -> Result<Vec<(i32, String)>, DbError> {
    Ok(sqlx::query_as(
        "SELECT shard, holder FROM shard_leases WHERE kind = $1 AND expires_at > now() ORDER BY shard",
    )
    .bind(kind)
    .fetch_all(db.pool())
    .await?)
}
