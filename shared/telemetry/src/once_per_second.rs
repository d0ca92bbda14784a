//! A gate that lets the first caller of each second through and counts
//! the others: what is done at most once a second however many requests
//! ask at once (recording that agents were turned away, logging an
//! outage's answers).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Lets one caller a second through; counts the others.
#[derive(Debug)]
pub struct OncePerSecond {
    second: AtomicI64,
    unlogged: AtomicU64,
}

impl Default for OncePerSecond {
    fn default() -> Self {
        Self::new()
    }
}

impl OncePerSecond {
    pub const fn new() -> Self {
        Self {
            second: AtomicI64::new(i64::MIN),
            unlogged: AtomicU64::new(0),
        }
    }

    /// `Some(callers let pass since the last)` for the first call of
    /// `second` (Unix time), `None` for the others and for an earlier
    /// second.
    pub fn due(&self, second: i64) -> Option<u64> {
        let last = self.second.load(Relaxed);
        if last < second
            && self
                .second
                .compare_exchange(last, second, Relaxed, Relaxed)
                .is_ok()
        {
            return Some(self.unlogged.swap(0, Relaxed));
        }
        self.unlogged.fetch_add(1, Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::OncePerSecond;

    #[test]
    fn an_outage_is_logged_once_a_second_with_how_many_went_unlogged() {
        let log = OncePerSecond::new();
        assert_eq!(log.due(10), Some(0), "the first");
        assert_eq!(log.due(10), None);
        assert_eq!(log.due(10), None);
        assert_eq!(log.due(9), None, "an earlier second is not new");
        assert_eq!(log.due(11), Some(3), "the next second says how many");
        assert_eq!(log.due(11), None);
        // Many threads in one second: exactly one logs.
        let log = std::sync::Arc::new(OncePerSecond::new());
        let logged: usize = (0..8)
            .map(|_| {
                let log = log.clone();
                std::thread::spawn(move || (0..1000).filter(|_| log.due(5).is_some()).count())
            })
            .map(|h| h.join().unwrap_or(0))
            .sum();
        assert_eq!(logged, 1);
        assert_eq!(log.due(6), Some(7_999));
    }
}
