//! Periodic duties one reconciler at a time leads (the power sync, the
//! stall watch): a Postgres lease of the duty's kind, taken or renewed
//! before each round, so a killed leader's duty moves to another worker
//! once its lease runs out; released on shutdown.

use bcm_db::Db;
use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Runs `round` every `every` while this worker holds the `kind` lease
/// (lifetime `ttl`), until `shutdown`.
pub async fn lead<F, Fut>(
    db: &Db,
    kind: &str,
    holder: &str,
    ttl: Duration,
    every: Duration,
    shutdown: &CancellationToken,
    mut round: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    while !shutdown.is_cancelled() {
        match bcm_db::leases::lease_acquire(db, kind, 0, holder, ttl).await {
            Ok(true) => round().await,
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, kind, "taking the lease failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
    let _ = bcm_db::leases::lease_release(db, kind, 0, holder).await;
}
