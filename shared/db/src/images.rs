//! The image catalog: a tenant's images by name (URL, format, sha256,
//! size, signature, a raw image's block map), immutable once registered, and what each site's cache
//! made of them (the newest `site.httpProxy` command per site).

use bcm_core::deploy::{DataRange, ImageFormat, ImageRef};

use crate::{Db, DbError};

/// A registered image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredImage {
    pub tenant_id: String,
    pub name: String,
    pub image: ImageRef,
    pub registered_by: String,
    pub registered_at: chrono::DateTime<chrono::Utc>,
}

#[derive(sqlx::FromRow)]
struct ImageRow {
    tenant_id: String,
    name: String,
    url: String,
    format: String,
    sha256: String,
    size_bytes: i64,
    signature: Option<String>,
    data_ranges: Option<sqlx::types::Json<Vec<DataRange>>>,
    registered_by: String,
    registered_at: chrono::DateTime<chrono::Utc>,
}

const COLUMNS: &str =
    "tenant_id, name, url, format, sha256, size_bytes, signature, data_ranges, registered_by, registered_at";

impl TryFrom<ImageRow> for StoredImage {
    type Error = DbError;
    fn try_from(r: ImageRow) -> Result<Self, DbError> {
        let format = match r.format.as_str() {
            "raw" => ImageFormat::Raw,
            "qcow2" => ImageFormat::Qcow2,
            "iso" => ImageFormat::Iso,
            other => return Err(DbError::Corrupt(format!("image {} format {other}", r.name))),
        };
        Ok(StoredImage {
            image: ImageRef {
                url: r.url,
                format,
                sha256: r.sha256,
                size_bytes: u64::try_from(r.size_bytes)
                    .map_err(|_| DbError::Corrupt(format!("image {} size", r.name)))?,
                signature: r.signature,
                data_ranges: r.data_ranges.map(|j| j.0),
            },
            tenant_id: r.tenant_id,
            name: r.name,
            registered_by: r.registered_by,
            registered_at: r.registered_at,
        })
    }
}

fn format_str(f: ImageFormat) -> &'static str {
    match f {
        ImageFormat::Raw => "raw",
        ImageFormat::Qcow2 => "qcow2",
        ImageFormat::Iso => "iso",
    }
}

/// Registers `image` as `tenant`'s `name`, by `by`. Returns the stored row
/// and whether it was stored now (`false`: the same content was there). The
/// name with other content is [`DbError::Duplicate`] (immutable).
pub async fn image_register(
    db: &Db,
    tenant: &str,
    name: &str,
    image: &ImageRef,
    by: &str,
) -> Result<(StoredImage, bool), DbError> {
    let size = i64::try_from(image.size_bytes)
        .map_err(|_| DbError::Corrupt("image size beyond i64".into()))?;
    // As with deploy profiles: a racing insert of the same name is seen by
    // the next statement's snapshot.
    for _ in 0..3 {
        let created: Option<bool> = sqlx::query_scalar(
            "INSERT INTO images (tenant_id, name, url, format, sha256, size_bytes, signature, data_ranges, registered_by) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (tenant_id, name) DO NOTHING RETURNING true",
        )
        .bind(tenant)
        .bind(name)
        .bind(&image.url)
        .bind(format_str(image.format))
        .bind(&image.sha256)
        .bind(size)
        .bind(&image.signature)
        .bind(image.data_ranges.as_ref().map(sqlx::types::Json))
        .bind(by)
        .fetch_optional(db.pool())
        .await?;
        if let Some(stored) = image_fetch(db, tenant, name).await? {
            if stored.image != *image {
                return Err(DbError::Duplicate {
                    constraint: "images_pkey".into(),
                });
            }
            return Ok((stored, created.unwrap_or(false)));
        }
    }
    Err(DbError::Stale)
}

/// One image, if registered.
pub async fn image_fetch(
    db: &Db,
    tenant: &str,
    name: &str,
) -> Result<Option<StoredImage>, DbError> {
    let row: Option<ImageRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM images WHERE tenant_id = $1 AND name = $2"
    ))
    .bind(tenant)
    .bind(name)
    .fetch_optional(db.pool())
    .await?;
    row.map(StoredImage::try_from).transpose()
}

/// A tenant's images by name, at most `limit`.
pub async fn images_list(db: &Db, tenant: &str, limit: i64) -> Result<Vec<StoredImage>, DbError> {
    let rows: Vec<ImageRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM images WHERE tenant_id = $1 ORDER BY name LIMIT $2"
    ))
    .bind(tenant)
    .bind(limit)
    .fetch_all(db.pool())
    .await?;
    rows.into_iter().map(StoredImage::try_from).collect()
}

/// What a site's cache made of an image: the newest `site.httpProxy`
/// command for its path at that site.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct SiteCache {
    pub site_id: String,
    pub command_id: String,
    /// `pending`, `sent`, `succeeded` or `failed`.
    pub status: String,
    pub result: Option<serde_json::Value>,
    pub actor: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub completed_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Every site's newest `site.httpProxy` command for the cache path `path`.
pub async fn image_site_caches(db: &Db, path: &str) -> Result<Vec<SiteCache>, DbError> {
    Ok(sqlx::query_as(
        "SELECT DISTINCT ON (site_id) site_id, id AS command_id, status, result, actor, created_at, completed_at \
         FROM commands WHERE node_id IS NULL AND kind = 'site.httpProxy' AND params->'image'->>'path' = $1 \
         ORDER BY site_id, created_at DESC",
    )
    .bind(path)
    .fetch_all(db.pool())
    .await?)
}
