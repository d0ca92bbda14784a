//! Published downloads (bcd for the installed OS): name, platform, version
//! and digest. A version is immutable; the latest registration of a
//! platform is the one user data names.

use crate::{Db, DbError, Tx};

/// One published file.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Download {
    pub name: String,
    pub os: String,
    pub arch: String,
    pub version: String,
    /// Lower-case hex SHA-256 of the file as served.
    pub sha256: String,
    pub size_bytes: i64,
}

/// Registers `d` (again) as its platform's latest. The same version with
/// another digest is [`DbError::Duplicate`]: a published version never
/// changes.
pub async fn download_register(db: &Db, d: &Download) -> Result<(), DbError> {
    let stored: Option<(String, i64)> = sqlx::query_as(
        "INSERT INTO downloads (name, os, arch, version, sha256, size_bytes) VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (name, os, arch, version) DO UPDATE SET registered_at = now() \
         WHERE downloads.sha256 = EXCLUDED.sha256 AND downloads.size_bytes = EXCLUDED.size_bytes \
         RETURNING sha256, size_bytes",
    )
    .bind(&d.name)
    .bind(&d.os)
    .bind(&d.arch)
    .bind(&d.version)
    .bind(&d.sha256)
    .bind(d.size_bytes)
    .fetch_optional(db.pool())
    .await?;
    match stored {
        Some(_) => Ok(()),
        None => Err(DbError::Duplicate {
            constraint: "downloads_pkey".into(),
        }),
    }
}

/// The latest registered version of `name` for `os`/`arch`.
pub async fn download_latest_in_txn(
    tx: &mut Tx<'_>,
    name: &str,
    os: &str,
    arch: &str,
) -> Result<Option<Download>, DbError> {
    Ok(sqlx::query_as(
        "SELECT name, os, arch, version, sha256, size_bytes FROM downloads \
         WHERE name = $1 AND os = $2 AND arch = $3 ORDER BY registered_at DESC, version DESC LIMIT 1",
    )
    .bind(name)
    .bind(os)
    .bind(arch)
    .fetch_optional(&mut **tx)
    .await?)
}

/// Every registered download, by name, platform and version.
pub async fn downloads_list(db: &Db) -> Result<Vec<Download>, DbError> {
    Ok(sqlx::query_as(
        "SELECT name, os, arch, version, sha256, size_bytes FROM downloads ORDER BY name, os, arch, version",
    )
    .fetch_all(db.pool())
    .await?)
}
