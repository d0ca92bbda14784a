//! The one way a service hears a Postgres `NOTIFY` channel: a task of its
//! own reads the channel as notifications arrive, whatever its owner is
//! doing, and hands each to a callback that only wakes someone.
//!
//! Why a task of its own: a `LISTEN` connection whose client stops reading
//! blocks its Postgres backend mid-transaction, sending notifications into
//! a full socket; that backend's snapshot then holds back every vacuum of
//! the database. (Measured: `bench-lifecycle --nodes 100000`, the relay
//! reading its listener only when idle, held the horizon 25 minutes; dead
//! rows piled up in every table and the lifecycle slowed from 38 to 8
//! nodes/s.)
//!
//! A lost connection is reported as [`Heard::Resumed`] once listening
//! again (commits meanwhile announced nothing, so the owner looks for
//! itself); while the database is away the reader tries again each second.
//! It ends when the pool is closed, or when its handle is dropped.

use std::time::Duration;

use sqlx::postgres::PgListener;

use crate::{Db, DbError};

/// What the reader heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard<'a> {
    /// A notification, with its payload.
    Notification(&'a str),
    /// Listening (again): notifications sent while not listening were
    /// missed.
    Resumed,
}

/// The reading task; dropping it stops the reading.
#[derive(Debug)]
pub struct ChannelReader {
    task: tokio::task::JoinHandle<()>,
}

impl ChannelReader {
    /// Waits until the reader ends (the pool closed).
    pub async fn ended(&mut self) {
        let _ = (&mut self.task).await;
    }
}

impl Drop for ChannelReader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long the reader waits before it listens again after an error.
const RELISTEN_AFTER: Duration = Duration::from_secs(1);

/// Reads `channel` from now on, calling `heard` for each notification and
/// each time it listens (the first time included). Listening when it
/// returns, unless the database could not be reached: then the reader
/// keeps trying in the background. `heard` runs on the reading task: it
/// must only wake someone, never wait.
pub async fn read_channel<F>(db: &Db, channel: &'static str, heard: F) -> ChannelReader
where
    F: Fn(Heard<'_>) + Send + Sync + 'static,
{
    let first = match listen(db, channel).await {
        Ok(listener) => {
            heard(Heard::Resumed);
            Some(listener)
        }
        Err(e) => {
            tracing::warn!(channel, error = %e, "cannot listen yet; trying again in the background");
            None
        }
    };
    let task = tokio::spawn(read(db.clone(), channel, first, heard));
    ChannelReader { task }
}

async fn read<F>(db: Db, channel: &'static str, mut first: Option<PgListener>, heard: F)
where
    F: Fn(Heard<'_>) + Send + Sync + 'static,
{
    while !db.is_closed() {
        let listening = match first.take() {
            Some(listener) => Ok(listener),
            None => listen(&db, channel)
                .await
                .inspect(|_| heard(Heard::Resumed)),
        };
        match listening {
            Ok(mut listener) => loop {
                match listener.try_recv().await {
                    Ok(Some(n)) => heard(Heard::Notification(n.payload())),
                    // The connection was lost, and sqlx has made it again
                    // and listens (its `eager_reconnect`, the default)
                    // before it says so: what was sent meanwhile was
                    // missed.
                    Ok(None) => heard(Heard::Resumed),
                    Err(sqlx::Error::PoolClosed) => return,
                    Err(e) => {
                        // The connection is left as it was: listen again
                        // on a new one.
                        tracing::warn!(channel, error = %e, "listener failed; listening again on a new connection");
                        break;
                    }
                }
            },
            Err(DbError::Sqlx(sqlx::Error::PoolClosed)) => return,
            Err(e) => tracing::debug!(channel, error = %e, "cannot listen yet"),
        }
        tokio::time::sleep(RELISTEN_AFTER).await;
    }
}

async fn listen(db: &Db, channel: &str) -> Result<PgListener, DbError> {
    let mut listener = PgListener::connect_with(db.pool()).await?;
    listener.listen(channel).await?;
    Ok(listener)
}
