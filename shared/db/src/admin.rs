//! Database administration for harnesses and tools: creating a database on
//! a server.

use sqlx::Connection as _;

use crate::DbError;

/// Creates database `name` (a lowercase identifier) on the server `server_url`
/// points at, and returns the URL of the new database.
pub async fn database_create(server_url: &str, name: &str) -> Result<String, DbError> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(DbError::Corrupt(format!(
            "database name {name:?} is not a plain identifier"
        )));
    }
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
