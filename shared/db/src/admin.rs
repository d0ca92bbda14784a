//! Database administration for harnesses and tools: creating and dropping a
//! database on a server.

use sqlx::Connection as _;

use crate::DbError;

/// Creates database `name` (a lowercase identifier) on the server `server_url`
/// points at, and returns the URL of the new database.
pub async fn database_create(server_url: &str, name: &str) -> Result<String, DbError> {
    plain_identifier(name)?;
    let mut conn = sqlx::PgConnection::connect(server_url).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    let base = server_url.split('?').next().unwrap_or(server_url);
    let cut = base
        .rfind('/')
        .filter(|i| *i > "postgres://".len())
        .unwrap_or(base.len());
    Ok(format!("{}/{name}", &base[..cut]))
}

/// Drops database `name` on the server at `server_url`, closing its
/// connections first. For throwaway databases (a benchmark's) only.
pub async fn database_drop(server_url: &str, name: &str) -> Result<(), DbError> {
    plain_identifier(name)?;
    let mut conn = sqlx::PgConnection::connect(server_url).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(())
}

/// Terminates every connection to database `name` on the server at
/// `server_url` but this one (`pg_terminate_backend`), as a database
/// restart or failover would; returns how many. For harnesses that test
/// how a service lives through an outage.
pub async fn connections_terminate(server_url: &str, name: &str) -> Result<u64, DbError> {
    plain_identifier(name)?;
    let mut conn = sqlx::PgConnection::connect(server_url).await?;
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(name)
    .fetch_one(&mut conn)
    .await?;
    conn.close().await?;
    Ok(u64::try_from(ended).unwrap_or(0))
}

fn plain_identifier(name: &str) -> Result<(), DbError> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(DbError::Corrupt(format!(
            "database name {name:?} is not a plain identifier"
        )));
    }
    Ok(())
}

/// Transactions committed in the current database so far
/// (`pg_stat_database.xact_commit`; statistics lag by up to a second).
pub async fn commit_count(db: &crate::Db) -> Result<i64, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(db.pool())
    .await?)
}

/// The transaction id Postgres will assign next. Only a transaction that
/// writes is assigned one (a read, or a read-only transaction, is not), so
/// its advance over a run counts the transactions that wrote, where
/// [`commit_count`] counts every one.
pub async fn next_transaction_id(db: &crate::Db) -> Result<i64, DbError> {
    Ok(
        sqlx::query_scalar("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
            .fetch_one(db.pool())
            .await?,
    )
}

/// Whether this pool's connection to the server is TLS
/// (`pg_stat_ssl` of the session).
pub async fn connection_uses_tls(db: &crate::Db) -> Result<bool, DbError> {
    Ok(
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(db.pool())
            .await?,
    )
}

/// Forces fresh statistics for [`commit_count`].
pub async fn stats_refresh(db: &crate::Db) -> Result<(), DbError> {
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(db.pool())
        .await?;
    Ok(())
}

/// Runs `sql` as it is (several statements allowed). For harnesses that
/// damage or shape a throwaway database on purpose; nothing a service runs
/// calls it.
pub async fn execute_raw(db: &crate::Db, sql: &str) -> Result<(), DbError> {
    sqlx::raw_sql(sql).execute(db.pool()).await?;
    Ok(())
}

/// The tables of the public schema, sorted.
pub async fn tables(db: &crate::Db) -> Result<Vec<String>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await?)
}

/// The columns of `table`, sorted.
pub async fn columns(db: &crate::Db, table: &str) -> Result<Vec<String>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns WHERE table_schema = 'public' AND table_name = $1 ORDER BY 1",
    )
    .bind(table)
    .fetch_all(db.pool())
    .await?)
}
