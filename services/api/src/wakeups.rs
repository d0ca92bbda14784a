//! Wakes the long polls of one node's agents when a command for that node
//! is written (Postgres `NOTIFY`, forwarded here), and only those.
//!
//! A wake-up costs one map lookup whatever the number of agents polling:
//! a broadcast to every poll cost each of 10,000 polls a look at every
//! wake-up, and a poll that fell behind re-read the database, so a fleet in
//! its ramdisk swamped the agent pool. A poll's first look (the statement
//! that touches its session and takes its commands) names its node, so the
//! poll registers after it, with the time that look began: the wake-ups of
//! the last moments are kept, and one for its node since then wakes it at
//! once, so a command written between its look and its wait still wakes it.
//! When the listener reconnects (wake-ups may have been missed) every poll
//! is woken to look again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;
use tokio::sync::watch;

/// How many recent wake-ups are kept for polls registering after their
/// first look (a few seconds' worth at a fleet's busiest).
const RECENT_WAKEUPS: usize = 4096;

/// The polls waiting, by node id.
#[derive(Default)]
pub struct AgentWakeups {
    waiting: Mutex<HashMap<String, Waiter>>,
    recent: Mutex<RecentWakeups>,
}

/// The latest wake-ups, oldest first, and what is no longer known.
#[derive(Default)]
struct RecentWakeups {
    log: VecDeque<(Instant, String)>,
    /// The newest wake-up dropped from the log: since when it is complete.
    forgotten_at: Option<Instant>,
    /// When every poll was last woken.
    all_at: Option<Instant>,
}

impl RecentWakeups {
    fn note(&mut self, node: &str, at: Instant) {
        if self.log.len() >= RECENT_WAKEUPS {
            if let Some((t, _)) = self.log.pop_front() {
                self.forgotten_at = Some(t);
            }
        }
        self.log.push_back((at, node.to_owned()));
    }

    /// Whether `node` was (or may have been) woken at or after `since`.
    fn woken_since(&self, node: &str, since: Instant) -> bool {
        self.all_at.is_some_and(|t| t >= since)
            || self.forgotten_at.is_some_and(|t| t >= since)
            || self
                .log
                .iter()
                .rev()
                .take_while(|(t, _)| *t >= since)
                .any(|(_, n)| n == node)
    }
}

/// One node's polls: a counter their receivers watch, and how many hold it.
struct Waiter {
    tx: watch::Sender<u64>,
    polls: usize,
}

impl AgentWakeups {
    fn waiting(&self) -> MutexGuard<'_, HashMap<String, Waiter>> {
        // Nothing here can leave the map half-changed: a poisoned lock's
        // map is still whole.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn recent(&self) -> MutexGuard<'_, RecentWakeups> {
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A poll of `node` whose first look began at `looked_at` starts
    /// waiting: woken at once if its node was woken since.
    pub fn register_since(self: &Arc<Self>, node: &str, looked_at: Instant) -> Registration {
        // Registered first, then the log read: a wake-up is logged before
        // it is sent, so each one is either in the log or sent to this
        // registration.
        let mut registration = self.register(node);
        if self.recent().woken_since(node, looked_at) {
            registration.rx.mark_changed();
        }
        registration
    }

    /// A poll of `node` starts waiting; call before looking for commands.
    pub fn register(self: &Arc<Self>, node: &str) -> Registration {
        let mut waiting = self.waiting();
        let waiter = waiting.entry(node.to_owned()).or_insert_with(|| Waiter {
            tx: watch::channel(0).0,
            polls: 0,
        });
        waiter.polls += 1;
        let mut rx = waiter.tx.subscribe();
        rx.mark_unchanged();
        Registration {
            owner: self.clone(),
            node: node.to_owned(),
            rx,
        }
    }

    /// A command for `node` was written: its polls look again.
    pub fn wake(&self, node: &str) {
        self.recent().note(node, Instant::now());
        if let Some(w) = self.waiting().get(node) {
            w.tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wake-ups may have been missed: every poll looks again.
    pub fn wake_all(&self) {
        self.recent().all_at = Some(Instant::now());
        for w in self.waiting().values() {
            w.tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// How many nodes have a poll waiting.
    #[cfg(test)]
    fn nodes_waiting(&self) -> usize {
        self.waiting().len()
    }
}

/// A waiting poll; dropping it stops the waiting.
pub struct Registration {
    owner: Arc<AgentWakeups>,
    node: String,
    rx: watch::Receiver<u64>,
}

impl Registration {
    /// Returns once the node was woken after the registration or the last
    /// return (at once if that already happened).
    pub async fn woken(&mut self) {
        // The sender lives as long as this registration holds its count.
        let _ = self.rx.changed().await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut waiting = self.owner.waiting();
        if let Some(w) = waiting.get_mut(&self.node) {
            w.polls = w.polls.saturating_sub(1);
            if w.polls == 0 {
                waiting.remove(&self.node);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn woken_within(r: &mut Registration, ms: u64) -> bool {
        tokio::time::timeout(Duration::from_millis(ms), r.woken())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn only_the_nodes_polls_wake() {
        let w = Arc::new(AgentWakeups::default());
        let mut a = w.register("node_a");
        let mut b = w.register("node_b");
        w.wake("node_a");
        assert!(woken_within(&mut a, 100).await);
        assert!(
            !woken_within(&mut b, 50).await,
            "another node's poll slept on"
        );
        assert!(!woken_within(&mut a, 50).await, "one wake-up wakes once");
    }

    #[tokio::test]
    async fn a_wake_up_before_the_wait_is_not_lost() {
        let w = Arc::new(AgentWakeups::default());
        let mut a = w.register("node_a");
        // The poll looks at the database here; the command lands now.
        w.wake("node_a");
        assert!(woken_within(&mut a, 100).await);
    }

    #[tokio::test]
    async fn a_wake_up_between_the_first_look_and_the_registration_is_not_lost() {
        let w = Arc::new(AgentWakeups::default());
        w.wake("node_a");
        let looked_at = Instant::now();
        // The first look runs here; a command for node_a lands meanwhile.
        w.wake("node_b");
        w.wake("node_a");
        let mut a = w.register_since("node_a", looked_at);
        assert!(woken_within(&mut a, 100).await, "woken since the look");
        assert!(!woken_within(&mut a, 50).await, "once");
        // A node woken only before the look is not woken again.
        let looked_at = Instant::now();
        w.wake("node_b");
        let mut a = w.register_since("node_a", looked_at);
        assert!(!woken_within(&mut a, 50).await, "another node's wake-up");
        w.wake("node_a");
        assert!(woken_within(&mut a, 100).await, "and later ones as before");
    }

    #[tokio::test]
    async fn a_poll_whose_wake_ups_may_have_been_forgotten_looks_again() {
        let w = Arc::new(AgentWakeups::default());
        let looked_at = Instant::now();
        for n in 0..RECENT_WAKEUPS + 1 {
            w.wake(&format!("node_{n}"));
        }
        assert_eq!(w.recent().log.len(), RECENT_WAKEUPS, "the log is bounded");
        let mut a = w.register_since("node_x", looked_at);
        assert!(
            woken_within(&mut a, 100).await,
            "the log lost what it had since the look"
        );
        let looked_at = Instant::now();
        w.wake_all();
        let mut b = w.register_since("node_y", looked_at);
        assert!(
            woken_within(&mut b, 100).await,
            "every poll woken since the look"
        );
        let mut c = w.register_since("node_y", Instant::now());
        assert!(!woken_within(&mut c, 50).await, "nothing since");
    }

    #[tokio::test]
    async fn two_polls_of_one_node_both_wake_and_the_map_empties() {
        let w = Arc::new(AgentWakeups::default());
        let mut a1 = w.register("node_a");
        let mut a2 = w.register("node_a");
        assert_eq!(w.nodes_waiting(), 1);
        w.wake("node_a");
        assert!(woken_within(&mut a1, 100).await);
        assert!(woken_within(&mut a2, 100).await);
        drop(a1);
        assert_eq!(w.nodes_waiting(), 1, "the second poll still waits");
        drop(a2);
        assert_eq!(w.nodes_waiting(), 0);
        // Nobody waits: a wake-up is a no-op, and a later poll is not woken by it.
        w.wake("node_a");
        let mut a3 = w.register("node_a");
        assert!(!woken_within(&mut a3, 50).await);
    }

    #[tokio::test]
    async fn wake_all_wakes_every_poll() {
        let w = Arc::new(AgentWakeups::default());
        let mut a = w.register("node_a");
        let mut b = w.register("node_b");
        w.wake_all();
        assert!(woken_within(&mut a, 100).await);
        assert!(woken_within(&mut b, 100).await);
    }
}
