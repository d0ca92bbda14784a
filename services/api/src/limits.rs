//! Per-principal request limits: a token bucket per API-token principal
//! (`rate_limit.requests_per_second`, refilled continuously, holding at most
//! `rate_limit.burst`). A principal past its bucket is answered
//! `RATE_LIMITED` (429) with the wait, before its request does any work
//! beyond finding its principal; other principals are not slowed by it. The bootstrap admin is
//! the operator's break-glass identity and is not limited unless
//! `rate_limit.admin` says so. No limiter crate is in this build's registry,
//! so the bucket is written here; it is small and pure.

use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The limits of the API's principals.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Sustained requests per second per principal; 0 turns limits off.
    #[serde(default = "default_rate")]
    pub requests_per_second: f64,
    /// Requests a principal may make at once after being idle.
    #[serde(default = "default_burst")]
    pub burst: u32,
    /// Whether the bootstrap admin is limited too.
    #[serde(default)]
    pub admin: bool,
}

fn default_rate() -> f64 {
    50.0
}
fn default_burst() -> u32 {
    200
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            requests_per_second: default_rate(),
            burst: default_burst(),
            admin: false,
        }
    }
}

/// One principal's bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket at `now`.
    pub fn full(burst: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(burst),
            at: now,
        }
    }

    /// Takes one request at `now`: `Ok` with the bucket after it, or the
    /// wait until one is allowed.
    pub fn take(self, now: Instant, rate: f64, burst: u32) -> Result<Bucket, Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        let tokens = (self.tokens + elapsed * rate).min(f64::from(burst));
        if tokens >= 1.0 {
            Ok(Bucket {
                tokens: tokens - 1.0,
                at: now,
            })
        } else {
            Err(Duration::from_secs_f64((1.0 - tokens) / rate))
        }
    }
}

/// The buckets of this API process.
#[derive(Debug)]
pub struct Limits {
    cfg: RateLimitConfig,
    buckets: Mutex<HashMap<String, Bucket>>,
}

/// How many principals' buckets are kept before idle ones are dropped
/// (a dropped bucket was full anyway once idle long enough).
const MAX_BUCKETS: usize = 10_000;

impl Limits {
    pub fn new(cfg: RateLimitConfig) -> Self {
        Self {
            cfg,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `principal` (the admin when `admin`) may make a request now;
    /// else how long it must wait.
    pub fn check(&self, principal: &str, admin: bool) -> Result<(), Duration> {
        let rate = self.cfg.requests_per_second;
        if rate <= 0.0 || (admin && !self.cfg.admin) {
            return Ok(());
        }
        let burst = self.cfg.burst.max(1);
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(principal) {
            // Idle long enough to be full again: forgetting them changes
            // nothing.
            let refill = Duration::from_secs_f64(f64::from(burst) / rate);
            buckets.retain(|_, b| now.saturating_duration_since(b.at) < refill);
        }
        let bucket = buckets
            .get(principal)
            .copied()
            .unwrap_or_else(|| Bucket::full(burst, now));
        let after = bucket.take(now, rate, burst)?;
        buckets.insert(principal.to_owned(), after);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::full(3, t0);
        for _ in 0..3 {
            b = b.take(t0, 2.0, 3).expect("within the burst");
        }
        let wait = b.take(t0, 2.0, 3).expect_err("past the burst");
        assert!(
            wait > Duration::from_millis(490) && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        // Half a second later one more (2 per second).
        let t1 = t0 + Duration::from_millis(500);
        b = b.take(t1, 2.0, 3).expect("refilled one");
        assert!(b.take(t1, 2.0, 3).is_err());
        // Idle for long: full again, never more than the burst.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            b = b.take(t2, 2.0, 3).expect("full");
        }
        assert!(b.take(t2, 2.0, 3).is_err());
    }

    #[test]
    fn principals_have_their_own_buckets_and_the_admin_is_exempt_by_default() {
        let limits = Limits::new(RateLimitConfig {
            requests_per_second: 1.0,
            burst: 2,
            admin: false,
        });
        assert!(limits.check("alice", false).is_ok());
        assert!(limits.check("alice", false).is_ok());
        assert!(limits.check("alice", false).is_err());
        assert!(
            limits.check("bob", false).is_ok(),
            "bob is not slowed by alice"
        );
        for _ in 0..10 {
            assert!(limits.check("admin", true).is_ok());
        }
        let strict = Limits::new(RateLimitConfig {
            requests_per_second: 1.0,
            burst: 1,
            admin: true,
        });
        assert!(strict.check("admin", true).is_ok());
        assert!(strict.check("admin", true).is_err());
        let off = Limits::new(RateLimitConfig {
            requests_per_second: 0.0,
            burst: 1,
            admin: true,
        });
        for _ in 0..10 {
            assert!(off.check("alice", false).is_ok());
        }
    }
}
