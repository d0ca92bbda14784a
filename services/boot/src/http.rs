//! The boot service over HTTP:
//! - `GET /ipxe/{nonce}`: the iPXE script (`#!ipxe`, `kernel` with its
//!   command line, `initrd`, `boot`) behind a per-boot link a DHCP answer
//!   named ([`crate::nonces`]), once; a MAC, an unknown, used or expired
//!   link, or one whose entry was replaced or has died, gets 404 and
//!   nothing of any entry (iPXE then falls through to the next boot
//!   device);
//! - `GET /boot/{file}`: the iPXE builds for UEFI HTTP boot (the same files
//!   and the same path checks as TFTP);
//! - `GET /images/{path}`: the pre-warmed image cache, with Range support;
//! - `GET /healthz`: whether this process holds the site lease.

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use std::path::PathBuf;
use std::sync::Arc;

use crate::dhcp::ProxyConfig;
use crate::entries::{BootEntry, Entries, Mac};
use crate::lease::Lease;
use crate::nonces::Nonces;
use crate::tftp::RootHandler;

/// What the handlers share.
#[derive(Clone)]
pub struct HttpState {
    pub entries: Arc<Entries>,
    pub nonces: Arc<Nonces>,
    /// The site's join key: reveals the command line's join references.
    pub join_key: Option<bcm_pki::JoinKey>,
    /// The site's quorum anchor as `bcm.quorum=` carries it.
    pub quorum_anchor: Option<String>,
    pub lease: Arc<Lease>,
    pub proxy: ProxyConfig,
    pub boot_files: RootHandler,
    pub image_cache: PathBuf,
}

/// The size of the image cache's reads and body chunks.
const IMAGE_CHUNK: usize = 1 << 20;

/// The router.
pub fn router(state: HttpState) -> Router {
    // 1 MiB reads (the default is 64 KiB): an image is hundreds of MiB
    // to GiBs, streamed by one client per machine.
    let images =
        tower_http::services::ServeDir::new(&state.image_cache).with_buf_chunk_size(IMAGE_CHUNK);
    Router::new()
        .route("/ipxe/{nonce}", get(script))
        .route("/boot/{file}", get(boot_file))
        .route("/healthz", get(health))
        .nest_service("/images", images)
        .with_state(state)
}

/// A URL for a kernel or initrd: kept when absolute, else in the cache.
fn artifact_url(proxy: &ProxyConfig, path: &str) -> String {
    if path.starts_with("http://") || path.starts_with("https://") {
        path.to_owned()
    } else {
        format!(
            "http://{}:{}/images/{}",
            proxy.server_ip,
            proxy.http_port,
            path.trim_start_matches('/')
        )
    }
}

/// The iPXE script of an entry, its join references revealed under the
/// site's `join_key`. `initrd=<name>` is what the EFI stub needs to find
/// the initrd iPXE hands it.
pub fn render(
    proxy: &ProxyConfig,
    join_key: Option<&bcm_pki::JoinKey>,
    quorum_anchor: Option<&str>,
    mac: &Mac,
    e: &BootEntry,
) -> String {
    // The anchor is the site's, never the control plane's: a `bcm.quorum=`
    // the entry carries is dropped.
    let mut cmdline: Vec<&str> = e
        .cmdline
        .split_whitespace()
        .filter(|w| !w.starts_with("bcm.quorum=") && !w.starts_with("bcm.cache="))
        .collect();
    let anchor = quorum_anchor.map(|a| format!("bcm.quorum={a}"));
    if let Some(a) = &anchor {
        cmdline.push(a);
    }
    // The image cache the ramdisk fetches catalog images from first: this
    // boot server's.
    let cache = format!("bcm.cache={}", artifact_url(proxy, ""));
    cmdline.push(&cache);
    let cmdline = cmdline.join(" ");
    let initrd_name = e
        .initrd
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("initrd");
    format!(
        "#!ipxe\necho Better Compute Metal: {mac} boots {node}\nkernel {kernel} initrd={initrd_name} {cmdline}\ninitrd {initrd}\nboot\n",
        node = e.node_id.as_deref().unwrap_or("its boot entry"),
        kernel = artifact_url(proxy, &e.kernel),
        initrd = artifact_url(proxy, &e.initrd),
        cmdline = match join_key {
            Some(k) => k.reveal(&cmdline),
            None => cmdline,
        },
    )
}

fn ipxe(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}

async fn script(State(s): State<HttpState>, UrlPath(nonce): UrlPath<String>) -> Response {
    let granted = s.nonces.redeem(&nonce).and_then(|g| {
        s.entries
            .live(&g.mac)
            .filter(|e| g.matches(e))
            .map(|e| (g.mac, e))
    });
    match granted {
        Some((mac, e)) => {
            tracing::info!(%mac, node = e.node_id.as_deref().unwrap_or(""), "iPXE script served");
            metrics::counter!("bcm_boot_scripts_total", "outcome" => "entry").increment(1);
            ipxe(render(
                &s.proxy,
                s.join_key.as_ref(),
                s.quorum_anchor.as_deref(),
                &mac,
                &e,
            ))
        }
        None => {
            // The nonce is not logged: it names nothing worth keeping.
            tracing::info!("an iPXE script was asked for with an unknown, used or expired link");
            metrics::counter!("bcm_boot_scripts_total", "outcome" => "refused").increment(1);
            (
                StatusCode::NOT_FOUND,
                "#!ipxe\necho Better Compute Metal: this boot link is unknown, used or expired; booting the next device\nexit\n",
            )
                .into_response()
        }
    }
}

async fn boot_file(State(s): State<HttpState>, UrlPath(file): UrlPath<String>) -> Response {
    match s.boot_files.read(std::path::Path::new(&file)) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/efi")], bytes.to_vec()).into_response(),
        Err(async_tftp::packet::Error::PermissionDenied) => {
            (StatusCode::FORBIDDEN, "outside the boot files\n").into_response()
        }
        Err(_) => (StatusCode::NOT_FOUND, "no such boot file\n").into_response(),
    }
}

async fn health(State(s): State<HttpState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "active": s.lease.is_active(),
        "holder": s.lease.holder(),
        "entries": s.entries.len(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The site's anchor goes on every ramdisk's command line, and one the
    /// control plane wrote into the entry is dropped: the anchor is the
    /// site's, never the control plane's.
    #[test]
    fn the_script_carries_the_sites_anchor_and_never_the_entrys() {
        let proxy = ProxyConfig {
            server_ip: std::net::Ipv4Addr::LOCALHOST,
            http_port: 8081,
            bios_file: "undionly.kpxe".into(),
            uefi_x64_file: "ipxe.efi".into(),
            uefi_arm64_file: "ipxe-arm64.efi".into(),
            client_port: 68,
        };
        let entry = BootEntry {
            node_id: Some("node_1".into()),
            kernel: "ramdisk/vmlinuz".into(),
            initrd: "ramdisk/initrd.img".into(),
            cmdline: "console=ttyS0 bcm.quorum=forged bcm.node=node_1".into(),
            expires_at: u64::MAX,
        };
        let mac = Mac::parse("52:54:00:aa:00:01").expect("mac");
        let script = render(&proxy, None, Some("sitesown"), &mac, &entry);
        assert!(
            script.contains("bcm.node=node_1 bcm.quorum=sitesown bcm.cache=http://"),
            "{script}"
        );
        assert!(!script.contains("forged"), "{script}");
        let without = render(&proxy, None, None, &mac, &entry);
        assert!(!without.contains("bcm.quorum="), "{without}");
    }
}
