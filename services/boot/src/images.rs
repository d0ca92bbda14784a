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

/// Fetches every image not yet in `dir` with the right sha256, through
/// `proxy` (the site's upstream HTTP proxy, `http://host:port`) when the
/// site sets one. Each download streams to a `.partial` file while it is
/// hashed (an OS image never sits in memory) and is renamed into place only
/// when its sha256 is the catalog's.
pub async fn prewarm(
    dir: &Path,
    images: &[CatalogImage],
    proxy: Option<&str>,
) -> Result<(), BootError> {
    let client = client(proxy)?;
    for image in images {
        cache_one(
            dir,
            &client,
            &image.name,
            &image.url,
            &image.sha256,
            None,
            proxy,
        )
        .await?;
    }
    Ok(())
}

/// `site.httpProxy`: caches one catalog image under `dir` (its path,
/// sha256 and size checked), through `proxy` when set.
pub async fn cache(
    dir: &Path,
    image: &bcm_contracts::commands::CacheImage,
    proxy: Option<&str>,
) -> Result<bcm_contracts::outputs::ImageCached, BootError> {
    if !image.path.starts_with("catalog/") {
        return Err(BootError::Image(format!(
            "a catalog image lives under catalog/, not {:?}",
            image.path
        )));
    }
    if image.sha256.len() != 64 || !image.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BootError::Image(format!(
            "image {}: sha256 must be 64 hex digits",
            image.path
        )));
    }
    let client = client(proxy)?;
    let (sha256, size_bytes, via) = cache_one(
        dir,
        &client,
        &image.path,
        &image.url,
        &image.sha256,
        Some(image.size_bytes),
        proxy,
    )
    .await?;
    Ok(bcm_contracts::outputs::ImageCached {
        path: image.path.clone(),
        sha256,
        size_bytes,
        via,
    })
}

/// Makes `dir/name` hold the image of `url` with sha256 `want` (and
/// `size` bytes when given): kept when it is there already, else fetched to
/// a partial file of its own (two fetches of one image never share one)
/// and renamed into place. Its sha256, size and where it came from.
async fn cache_one(
    dir: &Path,
    client: &reqwest::Client,
    name: &str,
    url: &str,
    want: &str,
    size: Option<u64>,
    proxy: Option<&str>,
) -> Result<(String, u64, String), BootError> {
    let rel = safe_name(name)?;
    let want = want.to_ascii_lowercase();
    let target = dir.join(&rel);
    if file_sha256(&target).as_deref() == Some(want.as_str()) {
        tracing::info!(image = %name, "image cache: present");
        let len = std::fs::metadata(&target)?.len();
        return Ok((want, len, "cache".to_owned()));
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    static PARTIALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PARTIALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut partial = target.clone().into_os_string();
    partial.push(format!(".{}-{n}.partial", std::process::id()));
    let partial = PathBuf::from(partial);
    let (got, bytes) = match fetch_to(client, url, &partial).await {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    if got != want || size.is_some_and(|s| s != bytes) {
        let _ = std::fs::remove_file(&partial);
        return Err(BootError::Image(format!(
            "image {name}: sha256 {got} ({bytes} bytes) is not the catalog's {want}{}; not cached",
            size.map(|s| format!(" ({s} bytes)")).unwrap_or_default()
        )));
    }
    std::fs::rename(&partial, &target)?;
    let via = proxy.unwrap_or("direct").to_owned();
    tracing::info!(image = %name, bytes, via = %via, "image cache: fetched and verified");
    Ok((got, bytes, via))
}

/// The HTTP client of the cache: through `proxy` when set.
fn client(proxy: Option<&str>) -> Result<reqwest::Client, BootError> {
    let mut b = reqwest::Client::builder();
    if let Some(p) = proxy {
        if !p.starts_with("http://") {
            return Err(BootError::Image(format!(
                "upstream_proxy {p:?} must be an http:// proxy URL"
            )));
        }
        b = b.proxy(
            reqwest::Proxy::all(p)
                .map_err(|e| BootError::Image(format!("upstream_proxy {p:?}: {e}")))?,
        );
    } else {
        b = b.no_proxy();
    }
    b.build()
        .map_err(|e| BootError::Image(format!("image cache client: {e}")))
}

/// Streams `url` into `to` while hashing it; its sha256 and size.
async fn fetch_to(
    client: &reqwest::Client,
    url: &str,
    to: &Path,
) -> Result<(String, u64), BootError> {
    use futures::StreamExt as _;
    use tokio::io::AsyncWriteExt as _;
    let mut hasher = Sha256::new();
    let mut file = tokio::fs::File::create(to).await?;
    let mut n = 0u64;
    if let Some(path) = url.strip_prefix("file://") {
        let bytes = tokio::fs::read(path).await?;
        hasher.update(&bytes);
        file.write_all(&bytes).await?;
        n = bytes.len() as u64;
    } else if url.starts_with("http://") || url.starts_with("https://") {
        let fetch_err = |e: reqwest::Error| BootError::Image(format!("fetching {url}: {e}"));
        let res = client
            .get(url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(fetch_err)?;
        let mut body = res.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(fetch_err)?;
            hasher.update(&chunk);
            file.write_all(&chunk).await?;
            n += chunk.len() as u64;
        }
    } else {
        return Err(BootError::Image(format!(
            "image url {url:?} must be http(s):// or file://"
        )));
    }
    file.sync_all().await?;
    Ok((hex::encode(hasher.finalize()), n))
}
