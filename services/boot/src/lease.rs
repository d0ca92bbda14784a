//! One active boot server per site: a key in the site's JetStream KV lease
//! bucket, whose entries expire `ttl` after their last write (`max_age`).
//! The holder renews it every `ttl / 4` with a compare-and-set on its last
//! revision; a standby tries to create it every `ttl / 4` and succeeds only
//! once the holder's last write expired.
//!
//! A process answers DHCP only while [`Lease::is_active`]: until `ttl`
//! minus a margin after the start of its last successful renewal, measured
//! on its own monotonic clock. A holder that is paused (SIGSTOP), cut off
//! from NATS or slow therefore stops answering by itself before anyone else
//! can take the lease, and a resumed one does not answer before it has
//! renewed (which fails once another process holds the key).

use async_nats::jetstream::kv::{Store, UpdateErrorKind};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The key of the lease in its bucket.
pub const KEY: &str = "active";

/// This process's view of the lease.
#[derive(Debug)]
pub struct Lease {
    holder: String,
    ttl: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The revision of our last write, while we hold the key.
    revision: Option<u64>,
    /// Until when we may act as the holder.
    active_until: Option<Instant>,
}

impl Lease {
    pub fn new(holder: impl Into<String>, ttl: Duration) -> Self {
        Self {
            holder: holder.into(),
            ttl,
            state: Mutex::default(),
        }
    }

    /// Whether this process holds the lease now.
    pub fn is_active(&self) -> bool {
        self.lock().active_until.is_some_and(|t| Instant::now() < t)
    }

    /// This process's holder id.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long a successful write lets us act: the ttl less a margin for
    /// the server's expiry timer and our own renewal latency.
    fn grant(&self) -> Duration {
        self.ttl.mul_f64(0.8)
    }

    /// One renewal or acquisition attempt; true when we hold the lease
    /// after it.
    pub async fn tick(&self, kv: &Store) -> bool {
        let started = Instant::now();
        let revision = self.lock().revision;
        let value = bytes::Bytes::from(self.holder.clone());
        let outcome = match revision {
            Some(rev) => kv.update(KEY, value, rev).await.map_err(|e| {
                if e.kind() == UpdateErrorKind::WrongLastRevision {
                    "another process holds the lease".to_owned()
                } else {
                    e.to_string()
                }
            }),
            None => kv.create(KEY, value).await.map_err(|e| e.to_string()),
        };
        let mut st = self.lock();
        match outcome {
            Ok(rev) => {
                if revision.is_none() {
                    tracing::info!(holder = %self.holder, "took the site boot lease: answering DHCP");
                }
                st.revision = Some(rev);
                st.active_until = Some(started + self.grant());
                true
            }
            Err(why) => {
                if revision.is_some() {
                    tracing::warn!(holder = %self.holder, %why, "lost the site boot lease: not answering DHCP");
                    st.revision = None;
                    st.active_until = None;
                }
                false
            }
        }
    }

    /// Gives the lease up (on shutdown) so a standby takes over at once.
    pub async fn release(&self, kv: &Store) {
        let revision = {
            let mut st = self.lock();
            st.active_until = None;
            st.revision.take()
        };
        if let Some(rev) = revision {
            let _ = kv.delete_expect_revision(KEY, Some(rev)).await;
        }
    }
}

/// Renews or acquires the lease until `shutdown`, then releases it.
pub async fn run(lease: std::sync::Arc<Lease>, kv: Store, shutdown: CancellationToken) {
    let every = (lease.ttl / 4).max(Duration::from_millis(100));
    loop {
        lease.tick(&kv).await;
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
    lease.release(&kv).await;
}
