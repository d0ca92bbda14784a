//! The pre-warmed image cache: every catalog image (ramdisk kernel and
//! initrd, OS images) is fetched once at start into the cache directory,
//! its sha256 checked while it streams, and only then renamed into place;
//! a file already there with the right sha256 is kept. HTTP serves the
//! directory (with Range support) so boots never wait on an upstream.

use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::path::{Component, Path, PathBuf};

use crate::BootError;

/// One image of the catalog.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub struct CatalogImage {
    /// The path under the cache (e.g. `ramdisk/vmlinuz`).
    pub name: String,
    /// Where to fetch it: `http(s)://…` or `file:///…`.
    pub url: String,
    /// Its sha256 (hex).
    pub sha256: String,
}

fn safe_name(name: &str) -> Result<PathBuf, BootError> {
    let p = Path::new(name);
    if name.is_empty() || p.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(BootError::Image(format!(
            "image name {name:?} must be a relative path without `..`"
        )));
    }
    Ok(p.to_owned())
}

/// The sha256 (hex) of a file, if it exists.
fn file_sha256(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    Some(hex::encode(Sha256::digest(&bytes)))
}

/// Fetches every image not yet in `dir` with the right sha256.
pub async fn prewarm(dir: &Path, images: &[CatalogImage]) -> Result<(), BootError> {
    for image in images {
        let name = safe_name(&image.name)?;
        let want = image.sha256.to_ascii_lowercase();
        let target = dir.join(&name);
        if file_sha256(&target).as_deref() == Some(want.as_str()) {
            tracing::info!(image = %image.name, "image cache: present");
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let bytes = fetch(&image.url).await?;
        let got = hex::encode(Sha256::digest(&bytes));
        if got != want {
            return Err(BootError::Image(format!(
                "image {}: sha256 {got} is not the catalog's {want}; not cached",
                image.name
            )));
        }
        let partial = target.with_extension("partial");
        std::fs::write(&partial, &bytes)?;
        std::fs::rename(&partial, &target)?;
        tracing::info!(image = %image.name, bytes = bytes.len(), "image cache: fetched and verified");
    }
    Ok(())
}

async fn fetch(url: &str) -> Result<Vec<u8>, BootError> {
    if let Some(path) = url.strip_prefix("file://") {
        return Ok(tokio::fs::read(path).await?);
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(BootError::Image(format!(
            "image url {url:?} must be http(s):// or file://"
        )));
    }
    let fetch_err = |e: reqwest::Error| BootError::Image(format!("fetching {url}: {e}"));
    let res = reqwest::get(url)
        .await
        .and_then(|r| r.error_for_status())
        .map_err(fetch_err)?;
    Ok(res.bytes().await.map_err(fetch_err)?.to_vec())
}
