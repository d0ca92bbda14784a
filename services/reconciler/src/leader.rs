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
        let turn = async {
            match bcm_db::leases::lease_acquire(db, kind, 0, holder, ttl).await {
                Ok(true) => round().await,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, kind, "taking the lease failed"),
            }
        };
        // A turn under way at a stop gets a short grace to finish, not
        // the wait of a database gone away: a round cut short is left as
        // a kill would leave it, and every round is resumable.
        if bcm_telemetry::signals::drained(kind, shutdown, crate::shards::STOP_GRACE, turn)
            .await
            .is_none()
        {
            break;
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
    // Releasing the lease is a courtesy to the next leader: brief.
    let release = bcm_db::leases::lease_release(db, kind, 0, holder);
    if tokio::time::timeout(crate::shards::LEAVE_WITHIN, release)
        .await
        .is_err()
    {
        tracing::warn!(
            kind,
            "releasing the lease on shutdown took too long; it expires"
        );
    }
}
