//! Agent requests' session touches, gathered: every agent request begins
//! with the statement that marks its session alive (a poll's also takes its
//! commands: `bcm_db::commands::sessions_touch_and_take`), and the requests
//! that ask while earlier ones' statements run are served by one statement
//! together.
//!
//! A fleet's ramdisks each hold a long poll, asking again as each ends, and
//! beat every 10 s: 10,000 of them ask about 400 polls' first looks and
//! 1,000 heartbeats' touches a second. One statement (and, for a poll that
//! moves its mark, one commit) each was more than the agent pool served,
//! and they were turned away (`503`). Gathered, a request waits for at most
//! the statements already running ([`IN_FLIGHT`]) and costs a share of one.
//! The shared statement never waits for a row lock: a session another
//! transaction holds (being ended, say) is asked again on its own, waiting
//! for it, so one held session holds up none of the others. A request
//! whose client went away while it waited is left out, so nothing is taken
//! for an agent no longer listening.

use crate::error::ApiError;
use bcm_core::ErrorCode;
use bcm_db::agents::{LiveSession, TouchAsk};
use bcm_db::commands::{CommandRow, Touched};
use bcm_db::Db;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// At most this many statements of gathered touches run at once: the agent
/// pool keeps its other connections for a poll's later looks, authority
/// reads and the busy heartbeats' records.
pub const IN_FLIGHT: usize = 2;

/// At most this many requests are served by one statement.
pub const MOST_PER_STATEMENT: usize = 256;

/// What a touch found: the session (`None` where it is unknown, ended or
/// out of force) and the commands a poll took.
pub type Found = Option<(LiveSession, Vec<CommandRow>)>;

/// Why a touch has no answer: the API's error, and whether the database
/// was out of reach (the agent was turned away unheard).
#[derive(Debug, Clone)]
pub struct Failed {
    pub unreachable: bool,
    pub error: ApiError,
}

/// What a poll's touch takes: the (purpose, kind) pairs of what each
/// purpose runs, how many commands one poll is handed at most, and the
/// lease a taken command is sent under.
#[derive(Debug, Clone)]
pub struct Takes {
    pub runs: Vec<(String, String)>,
    pub limit: i64,
    pub lease_ms: u64,
}

/// One request's ask.
struct Ask {
    hash: Vec<u8>,
    alive_for_ms: u64,
    slack_ms: u64,
    takes_commands: bool,
    /// When it was asked: one still waiting for its statement after the
    /// agent pool's line (`agents.pool_wait_ms`) is turned away.
    asked_at: Instant,
    answer: oneshot::Sender<Result<Found, Failed>>,
}

/// The touches' queue (cheap to clone).
#[derive(Clone)]
pub struct Touches {
    asks: mpsc::UnboundedSender<Ask>,
    counts: Arc<Counts>,
}

/// How many touches were asked, how many statements served them together,
/// and how many were asked again on their own (their session busy).
#[derive(Debug, Default)]
struct Counts {
    asked: AtomicU64,
    statements: AtomicU64,
    alone: AtomicU64,
}

/// What serves the queue.
struct Gatherer {
    db: Db,
    takes: Takes,
    /// The longest an ask waits for its statement (the agent pool's line),
    /// and the longest a statement may run.
    line: Duration,
    counts: Arc<Counts>,
    /// Busy asks asked again on their own, at most [`IN_FLIGHT`] at once
    /// (each waits for a row lock on a connection of its own).
    alone: Semaphore,
}

impl Touches {
    /// Starts gathering touches on `db` (the agent pool, whose line is
    /// `line`: an ask waits at most that long for its statement).
    pub fn start(db: Db, takes: Takes, line: Duration) -> Touches {
        let (asks, queue) = mpsc::unbounded_channel();
        let counts = Arc::new(Counts::default());
        let gatherer = Arc::new(Gatherer {
            db,
            takes,
            line,
            counts: counts.clone(),
            alone: Semaphore::new(IN_FLIGHT),
        });
        tokio::spawn(gather(gatherer, queue));
        Touches { asks, counts }
    }

    /// The touch of a heartbeat or a result: the session of token hash
    /// `hash`, marked alive for `alive_for_ms` (less at most `slack_ms`).
    pub async fn touch(
        &self,
        hash: &[u8],
        alive_for_ms: u64,
        slack_ms: u64,
    ) -> Result<Option<LiveSession>, Failed> {
        Ok(self
            .ask(hash, alive_for_ms, slack_ms, false)
            .await?
            .map(|(session, _)| session))
    }

    /// A poll's first look: its touch, and the commands it takes.
    pub async fn poll(
        &self,
        hash: &[u8],
        alive_for_ms: u64,
        slack_ms: u64,
    ) -> Result<Found, Failed> {
        self.ask(hash, alive_for_ms, slack_ms, true).await
    }

    async fn ask(
        &self,
        hash: &[u8],
        alive_for_ms: u64,
        slack_ms: u64,
        takes_commands: bool,
    ) -> Result<Found, Failed> {
        let (answer, answered) = oneshot::channel();
        let ask = Ask {
            hash: hash.to_vec(),
            alive_for_ms,
            slack_ms,
            takes_commands,
            asked_at: Instant::now(),
            answer,
        };
        let stopped = || Failed {
            unreachable: false,
            error: ApiError::new(ErrorCode::Unavailable, "the API is stopping"),
        };
        self.asks.send(ask).map_err(|_| stopped())?;
        self.counts.asked.fetch_add(1, Ordering::Relaxed);
        answered.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// How many touches were asked since the start.
    pub fn asked(&self) -> u64 {
        self.counts.asked.load(Ordering::Relaxed)
    }

    /// How many statements served them together.
    pub fn statements(&self) -> u64 {
        self.counts.statements.load(Ordering::Relaxed)
    }

    /// How many were asked again on their own, their session busy.
    pub fn alone(&self) -> u64 {
        self.counts.alone.load(Ordering::Relaxed)
    }
}

/// The answer to an ask that waited longer than the agent pool's line, or
/// whose statement ran longer: turned away, as a request the pool had no
/// connection for in time.
fn turned_away() -> Failed {
    Failed {
        unreachable: true,
        error: ApiError::new(
            ErrorCode::Unavailable,
            "the agent endpoints' database connections are all busy; retry later",
        ),
    }
}

/// Takes the asks from `queue` as they come: each statement serves every
/// ask waiting when it starts (up to [`MOST_PER_STATEMENT`]), at most
/// [`IN_FLIGHT`] statements at once.
async fn gather(gatherer: Arc<Gatherer>, mut queue: mpsc::UnboundedReceiver<Ask>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = queue.recv().await else {
            return;
        };
        let mut asks = vec![first];
        while asks.len() < MOST_PER_STATEMENT {
            match queue.try_recv() {
                Ok(ask) => asks.push(ask),
                Err(_) => break,
            }
        }
        // A request whose client went away is not served: nothing is
        // taken for an agent that no longer listens. One that waited past
        // the line is turned away, as the pool's own wait would have.
        let mut waiting = Vec::with_capacity(asks.len());
        for ask in asks {
            if ask.answer.is_closed() {
                continue;
            }
            if ask.asked_at.elapsed() > gatherer.line {
                let _ = ask.answer.send(Err(turned_away()));
                continue;
            }
            waiting.push(ask);
        }
        if waiting.is_empty() {
            continue;
        }
        metrics::histogram!("bcm_api_agent_touches_per_statement").record(waiting.len() as f64);
        gatherer.counts.statements.fetch_add(1, Ordering::Relaxed);
        let gatherer = gatherer.clone();
        tokio::spawn(async move {
            gatherer.answer(waiting).await;
            drop(slot);
        });
    }
}

impl Gatherer {
    /// Runs one statement for `asks` and answers each; an ask whose session
    /// another transaction holds is asked again on its own, waiting for it,
    /// so it holds up none of the others.
    async fn answer(self: &Arc<Self>, asks: Vec<Ask>) {
        let found = match self.run(&asks, false).await {
            Ok(found) => found,
            Err(failed) => {
                for ask in asks {
                    let _ = ask.answer.send(Err(failed.clone()));
                }
                return;
            }
        };
        for (ask, found) in asks.into_iter().zip(found) {
            match found {
                Touched::Busy => {
                    let gatherer = self.clone();
                    tokio::spawn(async move { gatherer.answer_alone(ask).await });
                }
                // An answer nobody waits for any more: what it took is
                // offered again when its lease runs out.
                found => {
                    let _ = ask.answer.send(Ok(heard(found)));
                }
            }
        }
    }

    /// Asks a busy ask again on its own, waiting for its session's lock.
    async fn answer_alone(&self, ask: Ask) {
        let Ok(_slot) = self.alone.acquire().await else {
            return;
        };
        if ask.answer.is_closed() {
            return;
        }
        self.counts.alone.fetch_add(1, Ordering::Relaxed);
        let alone = self
            .run(std::slice::from_ref(&ask), true)
            .await
            .map(|mut found| found.pop().and_then(heard));
        let _ = ask.answer.send(alone);
    }

    /// One statement for `asks`, given at most the line's length to run.
    async fn run(&self, asks: &[Ask], wait_for_locks: bool) -> Result<Vec<Touched>, Failed> {
        let touches: Vec<TouchAsk<'_>> = asks
            .iter()
            .map(|a| TouchAsk {
                hash: &a.hash,
                alive_for_ms: a.alive_for_ms,
                slack_ms: a.slack_ms,
                takes_commands: a.takes_commands,
            })
            .collect();
        let runs: Vec<(&str, &str)> = self
            .takes
            .runs
            .iter()
            .map(|(p, k)| (p.as_str(), k.as_str()))
            .collect();
        let statement = bcm_db::commands::sessions_touch_and_take(
            &self.db,
            &touches,
            &runs,
            self.takes.limit,
            self.takes.lease_ms,
            wait_for_locks,
        );
        // The pool's own wait is inside the line; the rest bounds a
        // statement stuck behind a lock or a connection that hangs.
        match tokio::time::timeout(self.line * 2, statement).await {
            Ok(done) => done.map_err(|e| Failed {
                unreachable: e.unreachable(),
                error: ApiError::from(e),
            }),
            Err(_) => {
                tracing::warn!(asks = asks.len(), "a statement of agents' touches ran past twice the agent pool's line; its requests are answered 503");
                Err(turned_away())
            }
        }
    }
}

/// The session and the commands taken of what an ask found.
fn heard(found: Touched) -> Found {
    match found {
        Touched::Heard(session, taken) => Some((session, taken)),
        Touched::Unknown | Touched::Busy => None,
    }
}
