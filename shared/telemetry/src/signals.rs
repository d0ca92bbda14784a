//! The signals that stop a service: Ctrl-C (SIGINT), SIGTERM from a
//! supervisor (`docker stop`, systemd, Nomad, Kubernetes) and SIGHUP (the
//! terminal it ran in closed). Each cancels one token the service drains
//! on; none kills it mid-transaction. The drain is bounded ([`DRAIN`]).

use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGINT, SIGTERM or SIGHUP. Call it
/// inside the runtime, once, at start-up.
pub fn shutdown_token() -> CancellationToken {
    use tokio::signal::unix::{signal, SignalKind};
    let token = CancellationToken::new();
    let stop = token.clone();
    tokio::spawn(async move {
        let mut term = signal(SignalKind::terminate())
            .map_err(|e| tracing::warn!(error = %e, "no SIGTERM handler"))
            .ok();
        let mut hup = signal(SignalKind::hangup())
            .map_err(|e| tracing::warn!(error = %e, "no SIGHUP handler"))
            .ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
            _ = received(term.as_mut()) => tracing::info!("SIGTERM; stopping"),
            _ = received(hup.as_mut()) => tracing::info!("SIGHUP; stopping"),
        }
        stop.cancel();
    });
    token
}

/// Resolves when the signal arrives; never where it has no handler.
async fn received(s: Option<&mut tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// How long a service has, once told to stop, to finish what it holds
/// before it exits anyway. Every service resumes where it stopped (a kill
/// strands nothing), so the drain is a courtesy to work in flight, not a
/// condition of correctness; a database or a bus that went down first must
/// not hold the process.
pub const DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// The services' work in flight at a stop: each task, by name, given until
/// one shared deadline after the stop to end; what is still running then is
/// aborted and named in a log line.
pub struct Drain {
    tasks: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
}

impl Drain {
    /// Nothing to drain yet.
    pub fn new() -> Self {
        Self { tasks: Vec::new() }
    }

    /// A task to drain at the stop, by the name its log line gives.
    pub fn push(&mut self, name: &'static str, task: tokio::task::JoinHandle<()>) {
        self.tasks.push((name, task));
    }

    /// Waits for every task, at most `within` in all; aborts those still
    /// running then. The names of the tasks it aborted.
    pub async fn within(self, within: std::time::Duration) -> Vec<&'static str> {
        self.until(tokio::time::Instant::now() + within).await
    }

    /// Waits for every task until `deadline`; aborts those still running
    /// then. The names of the tasks it aborted.
    pub async fn until(self, deadline: tokio::time::Instant) -> Vec<&'static str> {
        let mut aborted = Vec::new();
        for (name, mut task) in self.tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                task.abort();
                aborted.push(name);
            }
        }
        if !aborted.is_empty() {
            tracing::warn!(
                tasks = ?aborted,
                "still running after the drain; stopped where they stood (they resume there at the next start)"
            );
        }
        aborted
    }
}

impl Default for Drain {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `work` to its end; once `stop` is cancelled, for at most `within`
/// more. `None` when the drain ran out first (the work is dropped where it
/// stood, with a log line naming `what`).
pub async fn drained<F: std::future::Future>(
    what: &str,
    stop: &CancellationToken,
    within: std::time::Duration,
    work: F,
) -> Option<F::Output> {
    tokio::pin!(work);
    tokio::select! {
        out = &mut work => return Some(out),
        _ = stop.cancelled() => {}
    }
    match tokio::time::timeout(within, work).await {
        Ok(out) => Some(out),
        Err(_) => {
            tracing::warn!(
                service = what,
                drain_secs = within.as_secs(),
                "still running after the drain; stopped where it stood (it resumes there at the next start)"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_task_that_ignores_the_stop_is_aborted_at_the_deadline_and_named() {
        let stop = CancellationToken::new();
        let mut drain = Drain::new();
        let s = stop.clone();
        drain.push(
            "heeds",
            tokio::spawn(async move {
                s.cancelled().await;
            }),
        );
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        drain.push(
            "stuck",
            tokio::spawn(async move {
                // Holds `tx` until aborted: dropping it tells the test.
                let _tx = tx;
                std::future::pending::<()>().await;
            }),
        );
        stop.cancel();
        let aborted = drain.within(Duration::from_millis(200)).await;
        assert_eq!(aborted, vec!["stuck"]);
        // The aborted task was dropped: its sender with it.
        let dropped = tokio::time::timeout(Duration::from_secs(10), rx).await;
        assert!(
            matches!(dropped, Ok(Err(_))),
            "the stuck task was not aborted"
        );
    }

    #[tokio::test]
    async fn the_deadline_is_shared_not_given_to_each_task() {
        const NAMES: [&str; 10] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let mut drain = Drain::new();
        for name in NAMES {
            drain.push(name, tokio::spawn(std::future::pending::<()>()));
        }
        let began = std::time::Instant::now();
        let aborted = drain.within(Duration::from_millis(500)).await;
        assert_eq!(aborted, NAMES.to_vec());
        // One deadline for all ten: a drain per task would take 5 s.
        assert!(
            began.elapsed() < Duration::from_secs(4),
            "{:?}",
            began.elapsed()
        );
    }

    #[tokio::test]
    async fn tasks_that_end_in_time_are_not_aborted() {
        let mut drain = Drain::new();
        drain.push(
            "slow",
            tokio::spawn(tokio::time::sleep(Duration::from_millis(20))),
        );
        drain.push("quick", tokio::spawn(async {}));
        // The deadline is far beyond what they take.
        assert!(drain.within(Duration::from_secs(30)).await.is_empty());
    }

    #[tokio::test]
    async fn drained_work_gets_the_drain_after_the_stop_not_before() {
        let stop = CancellationToken::new();
        // Before the stop, work runs as long as it takes.
        let long = drained("long", &stop, Duration::from_millis(10), async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            7
        });
        assert_eq!(long.await, Some(7));
        // After it, at most the drain.
        let s = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            s.cancel();
        });
        let stuck = drained(
            "stuck",
            &stop,
            Duration::from_millis(100),
            std::future::pending::<()>(),
        );
        assert_eq!(stuck.await, None);
    }

    #[tokio::test]
    async fn work_that_ends_within_the_drain_after_the_stop_is_waited_for() {
        let stop = CancellationToken::new();
        stop.cancel();
        // Stopped already; the work ends 50 ms later, well within the drain.
        let work = drained("finishing", &stop, Duration::from_secs(10), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            "done"
        });
        assert_eq!(work.await, Some("done"));
    }
}
