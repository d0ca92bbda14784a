//! Errors of the record, with constraint violations told apart so the edges
//! can map them (`CONFLICT`, `NOT_FOUND`) without reading SQL states.

/// An error of the db crate.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("not found")]
    NotFound,
    /// The row changed since it was read (version guard) or a lock wait
    /// timed out.
    #[error("the row was changed concurrently")]
    Stale,
    /// A unique constraint refused the write.
    #[error("already exists ({constraint})")]
    Duplicate { constraint: String },
    /// A foreign key refused the write.
    #[error("refers to a missing row ({constraint})")]
    MissingReference { constraint: String },
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// The value cannot be stored as given: a text or JSON value holding a
    /// NUL character (`\u0000`), or a character the database's encoding
    /// lacks. Retrying the same value fails the same way.
    #[error("the value cannot be stored: {0}")]
    Unstorable(String),
    #[error("migration failed: {0}")]
    Migrate(String),
    #[error("database: {0}")]
    Sqlx(sqlx::Error),
}

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::RowNotFound => return DbError::NotFound,
            // A stored value this code cannot read (an unknown status).
            sqlx::Error::ColumnDecode { index, source } => {
                return DbError::Corrupt(format!("column {index}: {source}"))
            }
            _ => {}
        }
        if let Some(db) = e.as_database_error() {
            let constraint = db.constraint().unwrap_or_default().to_owned();
            match db.code().as_deref() {
                Some("23505") => return DbError::Duplicate { constraint },
                Some("23503") => return DbError::MissingReference { constraint },
                // lock_not_available, serialization_failure
                Some("55P03") | Some("40001") | Some("40P01") => return DbError::Stale,
                // untranslatable_character, character_not_in_repertoire
                Some("22P05") | Some("22021") => {
                    return DbError::Unstorable(db.message().to_owned())
                }
                _ => {}
            }
        }
        DbError::Sqlx(e)
    }
}

impl DbError {
    /// Whether the database could not be reached at all (no connection, a
    /// server shutting down or starting up): an outage, not a fault of the
    /// operation.
    pub fn unreachable(&self) -> bool {
        match self {
            DbError::Sqlx(e) => Self::driver_unreachable(e),
            _ => false,
        }
    }

    /// [`DbError::unreachable`] of a driver error.
    pub(crate) fn driver_unreachable(e: &sqlx::Error) -> bool {
        match e {
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
            // connection_exception (08…), admin_shutdown, crash_shutdown,
            // cannot_connect_now (57P…)
            e => e
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c.starts_with("08") || c.starts_with("57P")),
        }
    }

    /// Whether retrying the same operation may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, DbError::Stale)
            || matches!(self, DbError::Sqlx(e) if matches!(e, sqlx::Error::PoolTimedOut | sqlx::Error::Io(_)))
    }
}
