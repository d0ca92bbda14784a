//! The Postgres record of Better Compute Metal. This crate owns the
//! connection pool, the migrations (applied at start-up) and one module of
//! queries per aggregate. No SQL exists outside it.
//!
//! Functions are named resource first (`node_fetch`, `outbox_insert_in_txn`);
//! an `_in_txn` function runs inside the caller's transaction, so a verb's
//! node update, authorization projection and outbox rows commit together.

pub mod admin;
pub mod agents;
pub mod batches;
pub mod commands;
pub mod deploy_profiles;
pub mod downloads;
pub mod error;
pub mod images;
pub mod leases;
pub mod listen;
pub mod nodes;
pub mod outbox;
pub mod secrets;
pub mod tenancy;
pub mod tenant_leases;
pub mod tokens;
pub mod workflows;

pub use error::DbError;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};
use std::str::FromStr;
use std::time::Duration;

/// A transaction on the record.
pub type Tx<'a> = Transaction<'a, Postgres>;

/// The migrations embedded in every binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// A migration that was changed after it landed (migrations are
/// append-only now; `tests/migrations.rs` holds every landed one to its
/// checksum): `(version, SHA-384 of the text that landed first, the
/// statement that brings a database that ran it to the current text)`.
/// Such a database has its recorded checksum updated after the statement
/// ran, in one transaction, so sqlx accepts it.
pub const EDITED_MIGRATIONS: &[(i64, &str, &str)] = &[(
    7,
    "82f0a3662fde2a5a4ece4464525dc5faa6ed0183f13f202fdf3896c771bd0209a41185f4ace2f58362a5f4eac8fce321",
    "ALTER TABLE pools ADD COLUMN IF NOT EXISTS accept_unsupported_diag BOOLEAN NOT NULL DEFAULT false",
)];

async fn repair_edited_migrations(pool: &PgPool) -> Result<(), DbError> {
    let applied: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !applied {
        return Ok(());
    }
    for (version, first, repair) in EDITED_MIGRATIONS {
        let Some(now) = MIGRATOR.iter().find(|m| m.version == *version) else {
            continue;
        };
        let mut tx = pool.begin().await?;
        let recorded: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT checksum FROM _sqlx_migrations WHERE version = $1 FOR UPDATE",
        )
        .bind(version)
        .fetch_optional(&mut *tx)
        .await?;
        if recorded.as_deref().map(hex_of).as_deref() == Some(*first) {
            sqlx::query(repair).execute(&mut *tx).await?;
            sqlx::query("UPDATE _sqlx_migrations SET checksum = $2 WHERE version = $1")
                .bind(version)
                .bind(now.checksum.as_ref())
                .execute(&mut *tx)
                .await?;
            tracing::warn!(
                version,
                "repaired a database that ran migration {version} before it was edited"
            );
        }
        tx.commit().await?;
    }
    Ok(())
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The record: a pool of connections to one Postgres database.
#[derive(Clone, Debug)]
pub struct Db {
    pool: PgPool,
    /// The pool's name in metrics (`main` unless [`Db::named`]).
    name: &'static str,
}

/// How long [`Db::connect`] waits for an unreachable Postgres.
pub const CONNECT_WAIT: Duration = Duration::from_secs(180);

/// How long a statement of a [`Db::connect_waiting`] pool waits for a
/// connection before [`DbError::retryable`] `PoolTimedOut`.
const ACQUIRE_WAIT: Duration = Duration::from_secs(10);

/// How a start-up waits out an outage of a peer it cannot work without:
/// 250 ms doubling to 5 s between tries. Give it [`until`] as its
/// `adjust`, for a deadline.
pub fn outage_backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(Duration::from_secs(5))
        .without_max_times()
}

/// A backon `adjust` that gives up rather than sleep past `give_up` (the
/// next try would start after it). backon's own `with_total_delay` counts
/// only the sleeps, and a try against a server that is down can itself
/// take seconds.
pub fn until<E>(
    give_up: std::time::Instant,
) -> impl FnMut(&E, Option<Duration>) -> Option<Duration> {
    move |_, pause| pause.filter(|p| std::time::Instant::now() + *p < give_up)
}

/// Whether a connection error is the server being away (down, restarting,
/// shutting down, failing over), which waiting can cure; a refusal
/// (authentication, a missing or dropped database, a protocol error) is not.
fn server_away(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => true,
        // 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now.
        sqlx::Error::Database(d) => {
            matches!(d.code().as_deref(), Some("57P01" | "57P02" | "57P03"))
        }
        _ => false,
    }
}

/// A connection held out of its pool ([`Db::hold_connection`]); returned
/// on drop.
pub struct HeldConnection(#[allow(dead_code)] sqlx::pool::PoolConnection<sqlx::Postgres>);

impl Db {
    /// Connects to `url` with at most `max_connections`.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, DbError> {
        Self::connect_waiting(url, max_connections, CONNECT_WAIT).await
    }

    /// [`Db::connect`], waiting up to `wait` (with backoff) while the
    /// server is unreachable or starting up: a service started during a
    /// Postgres outage or failover comes up when the database does, instead
    /// of exiting. A URL that does not parse, or a refusal that is not the
    /// server being away (authentication, a missing database), fails at once.
    pub async fn connect_waiting(
        url: &str,
        max_connections: u32,
        wait: Duration,
    ) -> Result<Self, DbError> {
        Self::connect_opts(
            PgConnectOptions::from_str(url)?,
            max_connections,
            ACQUIRE_WAIT,
            wait,
            true,
        )
        .await
    }

    /// A pool for reads alone: its transactions are read-only
    /// (`default_transaction_read_only`), so a write sent to it by mistake
    /// fails instead of taking locks. Readers then wait for one another
    /// only, never behind writers holding every connection of the main pool
    /// while they wait for row locks. Waits for the server like
    /// [`Db::connect_waiting`].
    pub async fn connect_read_only(
        url: &str,
        max_connections: u32,
        wait: Duration,
    ) -> Result<Self, DbError> {
        let opts =
            PgConnectOptions::from_str(url)?.options([("default_transaction_read_only", "on")]);
        Ok(
            Self::connect_opts(opts, max_connections, ACQUIRE_WAIT, wait, true)
                .await?
                .named("read"),
        )
    }

    /// A pool whose commits do not wait for the WAL to reach the disk
    /// (`synchronous_commit = off`): for writes a crash may lose without
    /// harm because they are hints or are redone — an agent session's
    /// touch (the agent's next request touches it again), a heartbeat's
    /// fact (the next heartbeat records it), a command's lease (lost, the
    /// command is offered again and the agent answers from its record).
    /// Never for a record of what happened: a state, a result, an event.
    /// Such a commit costs no disk flush, so a fleet's requests do not
    /// queue behind the WAL. Nor does a statement pay a ping of its
    /// connection before it (sqlx's `test_before_acquire`: a round trip
    /// holding the connection, a third of an agent request's): the ping
    /// as each use hands the connection back, which sqlx always makes,
    /// already drops a connection that broke while in use, so only one that dies idle (a
    /// Postgres restart, a terminated backend) fails the one statement
    /// that finds it — as an outage ([`DbError::unreachable`]), which the
    /// agent endpoints answer 503 and the agent retries.
    /// A statement waits up to `acquire_wait` for a connection (a fleet's
    /// requests wait in line rather than being turned away). Waits for the
    /// server like [`Db::connect_waiting`].
    pub async fn connect_for_hints(
        url: &str,
        max_connections: u32,
        acquire_wait: Duration,
        wait: Duration,
    ) -> Result<Self, DbError> {
        let opts = PgConnectOptions::from_str(url)?.options([("synchronous_commit", "off")]);
        Self::connect_opts(opts, max_connections, acquire_wait, wait, false).await
    }

    async fn connect_opts(
        opts: PgConnectOptions,
        max_connections: u32,
        acquire_wait: Duration,
        wait: Duration,
        ping_before_use: bool,
    ) -> Result<Self, DbError> {
        use backon::Retryable as _;
        let opts = opts.application_name("bcm");
        let connect = || {
            PgPoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(acquire_wait)
                // sqlx logs every acquire slower than 2 s at WARN: 8,233
                // lines in one N = 10,000 run. The waits are the pool's
                // histogram (`bcm_db_pool_wait_seconds`) and the
                // requests' (`bcm_api_agent_request_seconds`), and one
                // that runs out is an outage logged once a second.
                .acquire_slow_level(log::LevelFilter::Debug)
                .test_before_acquire(ping_before_use)
                .connect_with(opts.clone())
        };
        let pool = connect
            .retry(outage_backoff())
            .when(server_away)
            .adjust(until(std::time::Instant::now() + wait))
            .notify(|e, pause| tracing::warn!(error = %e, ?pause, "Postgres is not reachable yet; waiting"))
            .await?;
        Ok(Self { pool, name: "main" })
    }

    /// The most connections the pool opens.
    pub fn max_connections(&self) -> u32 {
        self.pool.options().get_max_connections()
    }

    /// The same pool, named `name` in its metrics (a service with two
    /// pools tells them apart: the API's `agent` pool from its `main`).
    pub fn named(self, name: &'static str) -> Self {
        Self { name, ..self }
    }

    /// Applies every pending migration. Safe to run from several processes
    /// at once (sqlx takes an advisory lock). A database that applied a
    /// migration which was edited after it landed is repaired first
    /// ([`EDITED_MIGRATIONS`]).
    pub async fn migrate(&self) -> Result<(), DbError> {
        repair_edited_migrations(&self.pool).await?;
        MIGRATOR.run(&self.pool).await.map_err(|e| match e {
            // The database went away under the migration: an outage the
            // caller may wait out ([`DbError::unreachable`]), not a bad
            // migration.
            sqlx::migrate::MigrateError::Execute(e)
            | sqlx::migrate::MigrateError::ExecuteMigration(e, _)
                if DbError::driver_unreachable(&e) =>
            {
                DbError::Sqlx(e)
            }
            e => DbError::Migrate(e.to_string()),
        })
    }

    /// Starts a transaction.
    pub async fn begin(&self) -> Result<Tx<'static>, DbError> {
        let asked = std::time::Instant::now();
        let tx = self.pool.begin().await?;
        // How long work waited for a connection of the pool (and its BEGIN,
        // well under a millisecond on a healthy database).
        self.waited(asked);
        Ok(tx)
    }

    /// Starts a transaction that waits at most `millis` for a row lock
    /// (`SET LOCAL lock_timeout`): a verb that would wait longer answers
    /// `CONFLICT` ([`DbError::Stale`]) instead of piling up. The bound is
    /// sent with the `BEGIN`, in the same round trip.
    pub async fn begin_with_lock_timeout(&self, millis: u32) -> Result<Tx<'static>, DbError> {
        // Postgres takes at most i32::MAX ms; a `SET` it refused would leave
        // the connection in an aborted transaction sqlx does not roll back.
        let millis = millis.min(i32::MAX as u32);
        let asked = std::time::Instant::now();
        let tx = self
            .pool
            .begin_with(format!("BEGIN; SET LOCAL lock_timeout = '{millis}ms'"))
            .await?;
        self.waited(asked);
        Ok(tx)
    }

    /// A connection of the pool for one statement outside a transaction,
    /// its wait measured as [`Db::begin`]'s is: the agent endpoints' hot
    /// statements, whose wait for the agent pool is the figure a fleet's
    /// storm shows in.
    pub(crate) async fn acquire(&self) -> Result<sqlx::pool::PoolConnection<Postgres>, DbError> {
        let asked = std::time::Instant::now();
        let conn = self.pool.acquire().await?;
        self.waited(asked);
        Ok(conn)
    }

    /// Records a wait for a connection that began at `asked`
    /// (`bcm_db_pool_wait_seconds`) and the pool's use.
    fn waited(&self, asked: std::time::Instant) {
        metrics::histogram!("bcm_db_pool_wait_seconds", "pool" => self.name)
            .record(asked.elapsed().as_secs_f64());
        let (size, idle) = (self.pool.size(), self.pool.num_idle() as u32);
        metrics::gauge!("bcm_db_pool_connections", "pool" => self.name, "state" => "idle")
            .set(idle as f64);
        metrics::gauge!("bcm_db_pool_connections", "pool" => self.name, "state" => "used")
            .set(size.saturating_sub(idle) as f64);
    }

    /// Checks the database answers.
    pub async fn ping(&self) -> Result<(), DbError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Takes one connection out of the pool until the returned guard is
    /// dropped, without giving access to it: how a test plays a flood that
    /// holds every connection of a pool.
    pub async fn hold_connection(&self) -> Result<HeldConnection, DbError> {
        Ok(HeldConnection(self.pool.acquire().await?))
    }

    /// The underlying pool, for the modules of this crate.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Whether [`Db::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.pool.is_closed()
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// A savepoint inside `tx`: rolled back on its own (or dropped) without
/// ending `tx`, committed into it otherwise.
pub async fn savepoint<'t>(tx: &'t mut Tx<'_>) -> Result<Tx<'t>, DbError> {
    use sqlx::Acquire as _;
    Ok(tx.begin().await?)
}

#[cfg(test)]
mod tests {
    use super::until;
    use std::time::{Duration, Instant};

    #[test]
    fn a_wait_gives_up_rather_than_sleep_past_its_deadline() {
        let mut soon = until::<()>(Instant::now() + Duration::from_secs(1));
        assert_eq!(
            soon(&(), Some(Duration::from_millis(250))),
            Some(Duration::from_millis(250))
        );
        assert_eq!(soon(&(), Some(Duration::from_secs(5))), None);
        assert_eq!(soon(&(), None), None, "the backoff itself ended");
        let mut now = until::<()>(Instant::now());
        assert_eq!(now(&(), Some(Duration::from_millis(1))), None);
    }
}
