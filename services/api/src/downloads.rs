//! What the control plane serves to machines: `bcd` for the installed OS,
//! at `GET /api/compute/downloads/bcd/{version}/{os}-{arch}`, with its
//! SHA-256 in the answer's `X-Checksum-Sha256` and `Repr-Digest` headers and
//! at the same path plus `.sha256`. Each configured file is read and hashed
//! once at start-up and served from memory, so the digest user data carries
//! (`bcdSha256`) is the digest of the bytes served, whatever later happens
//! to the file. Registering a version records its digest in Postgres; the
//! same version with other bytes is refused at start-up (a published
//! version is immutable). No credential is asked: a machine downloads bcd
//! before it has an identity, and the binary is no secret.

use std::collections::HashMap;
use std::path::PathBuf;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::ApiError;
use crate::extract::Path;
use crate::{AppState, StartError};

/// The largest file the API will hold in memory to serve.
const MAX_DOWNLOAD_BYTES: u64 = 512 << 20;

/// The operating systems and architectures a download may be built for.
const OSES: [&str; 1] = ["linux"];
const ARCHES: [&str; 2] = ["amd64", "arm64"];

/// The downloads this API serves.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownloadsConfig {
    /// `bcd` builds, one per version and platform.
    #[serde(default)]
    pub bcd: Vec<DownloadFile>,
}

/// One file to publish.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownloadFile {
    /// `1.2.3` and the like: 1-64 characters of A-Z, a-z, 0-9, `.`, `+`, `-`.
    pub version: String,
    #[serde(default = "linux")]
    pub os: String,
    /// `amd64` or `arm64`.
    pub arch: String,
    pub file: PathBuf,
}

fn linux() -> String {
    "linux".into()
}

/// A published file as served.
struct Published {
    bytes: Bytes,
    sha256: String,
}

/// The files this API serves, by name, version and `os-arch`.
#[derive(Default)]
pub struct Downloads {
    files: HashMap<(String, String, String), Published>,
}

/// A published download as the listing shows it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DownloadView {
    pub name: String,
    pub version: String,
    pub os: String,
    pub arch: String,
    pub sha256: String,
    pub size_bytes: i64,
    /// Where this API serves it (relative to the API's base URL).
    pub path: String,
}

fn is_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 64
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-'))
}

use bcm_contracts::downloads::path as path_of;

/// Reads, hashes and registers every configured file; an error names the
/// configuration key and the file.
pub async fn publish(db: &bcm_db::Db, cfg: &DownloadsConfig) -> Result<Downloads, StartError> {
    let mut out = Downloads::default();
    for (i, f) in cfg.bcd.iter().enumerate() {
        let key = format!("downloads.bcd[{i}]");
        let bad = |m: String| StartError::Config(format!("{key}: {m}"));
        if !is_version(&f.version) {
            return Err(bad(format!(
                "version {:?} must be 1-64 characters of A-Z, a-z, 0-9, '.', '+' or '-'",
                f.version
            )));
        }
        if !OSES.contains(&f.os.as_str()) {
            return Err(bad(format!("os {:?} must be one of {OSES:?}", f.os)));
        }
        if !ARCHES.contains(&f.arch.as_str()) {
            return Err(bad(format!("arch {:?} must be one of {ARCHES:?}", f.arch)));
        }
        let file = f.file.display();
        let size = tokio::fs::metadata(&f.file)
            .await
            .map_err(|e| bad(format!("file {file}: {e}")))?
            .len();
        if size == 0 || size > MAX_DOWNLOAD_BYTES {
            return Err(bad(format!(
                "file {file} is {size} bytes; a download is 1 byte to {MAX_DOWNLOAD_BYTES}"
            )));
        }
        let bytes = Bytes::from(
            tokio::fs::read(&f.file)
                .await
                .map_err(|e| bad(format!("file {file}: {e}")))?,
        );
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let row = bcm_db::downloads::Download {
            name: "bcd".into(),
            os: f.os.clone(),
            arch: f.arch.clone(),
            version: f.version.clone(),
            sha256: sha256.clone(),
            size_bytes: bytes.len() as i64,
        };
        match bcm_db::downloads::download_register(db, &row).await {
            Ok(()) => {}
            Err(bcm_db::DbError::Duplicate { .. }) => {
                return Err(bad(format!(
                    "bcd {} {}-{} is already published with other bytes than {file} (sha256 {sha256}); a published version is immutable: give this build a new version",
                    f.version, f.os, f.arch
                )))
            }
            Err(e) => return Err(e.into()),
        }
        tracing::info!(version = %f.version, platform = %format!("{}-{}", f.os, f.arch), %sha256, bytes = bytes.len(), "bcd published");
        out.files.insert(
            (
                "bcd".into(),
                f.version.clone(),
                format!("{}-{}", f.os, f.arch),
            ),
            Published { bytes, sha256 },
        );
    }
    Ok(out)
}

/// `GET /api/compute/downloads`: what is published (by any replica).
#[utoipa::path(get, path = "/api/compute/downloads", operation_id = "listDownloads", tag = "downloads",
    responses((status = 200, body = [DownloadView]), crate::error::ErrorResponses))]
pub async fn list(State(app): State<AppState>) -> Result<axum::Json<Vec<DownloadView>>, ApiError> {
    let rows = bcm_db::downloads::downloads_list(&app.inner.db).await?;
    Ok(axum::Json(
        rows.into_iter()
            .map(|d| DownloadView {
                path: path_of(&d.name, &d.version, &d.os, &d.arch),
                name: d.name,
                version: d.version,
                os: d.os,
                arch: d.arch,
                sha256: d.sha256,
                size_bytes: d.size_bytes,
            })
            .collect(),
    ))
}

/// `GET /api/compute/downloads/{name}/{version}/{platform}`: the file, or
/// with `.sha256` after the platform its digest in `sha256sum`'s format.
#[utoipa::path(get, path = "/api/compute/downloads/{name}/{version}/{platform}", operation_id = "getDownload", tag = "downloads",
    params(("name" = String, Path, description = "`bcd`"), ("version" = String, Path),
           ("platform" = String, Path, description = "`linux-amd64`, `linux-arm64`; with `.sha256` the digest")),
    responses((status = 200, description = "the file (octet-stream) with `X-Checksum-Sha256`, or its digest (text)", content_type = "application/octet-stream"),
              crate::error::ErrorResponses))]
pub async fn get(
    State(app): State<AppState>,
    Path((name, version, platform)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let (platform, digest_only) = match platform.strip_suffix(".sha256") {
        Some(p) => (p.to_owned(), true),
        None => (platform, false),
    };
    let Some(p) = app
        .inner
        .downloads
        .files
        .get(&(name.clone(), version.clone(), platform.clone()))
    else {
        return Err(ApiError::new(
            bcm_core::ErrorCode::NotFound,
            format!("no download {name} {version} {platform} is published here"),
        ));
    };
    if digest_only {
        return Ok((
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("{}  {name}\n", p.sha256),
        )
            .into_response());
    }
    let digest = base64::engine::general_purpose::STANDARD
        .encode(hex::decode(&p.sha256).unwrap_or_default());
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::CACHE_CONTROL,
                "public, max-age=31536000, immutable".to_owned(),
            ),
            (
                header::HeaderName::from_static("x-checksum-sha256"),
                p.sha256.clone(),
            ),
            (
                header::HeaderName::from_static("repr-digest"),
                format!("sha-256=:{digest}:"),
            ),
        ],
        p.bytes.clone(),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_plain_text() {
        for ok in ["0.3.0", "1.2.3-rc.1+build.5", "v2"] {
            assert!(is_version(ok), "{ok}");
        }
        for bad in ["", "../etc", "1 2", "a/b", &"9".repeat(65)] {
            assert!(!is_version(bad), "{bad}");
        }
    }
}
