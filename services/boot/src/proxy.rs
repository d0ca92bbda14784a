//! The site's forward proxy (`http_proxy` in the configuration), which the
//! ramdisk downloads images through when the boot VLAN has no other way
//! out. (The `site.httpProxy` command is the image cache's: `images.rs`.) It is not an open proxy: only
//! destinations (`host:port`) on the configured allowlist are reached;
//! anything else is 403 and a log line.
//!
//! - `GET http://host/path` (absolute form): fetched and streamed back;
//! - `CONNECT host:port`: a TCP tunnel (HTTPS downloads stay end-to-end
//!   encrypted and verified by the ramdisk).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt as _;
use hyper_util::rt::TokioIo;
use std::collections::HashSet;
use std::sync::Arc;

/// Who may be reached through the proxy.
#[derive(Debug, Clone)]
pub struct ProxyState {
    allow: Arc<HashSet<String>>,
    http: reqwest::Client,
}

impl ProxyState {
    /// `allow` names `host:port` destinations (`images.example:443`).
    pub fn new(allow: &[String]) -> Self {
        Self {
            allow: Arc::new(allow.iter().map(|a| a.to_ascii_lowercase()).collect()),
            http: reqwest::Client::builder()
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
        }
    }

    fn allowed(&self, authority: &str) -> bool {
        self.allow.contains(&authority.to_ascii_lowercase())
    }
}

/// The proxy as an axum service (every request lands here).
pub fn router(state: ProxyState) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(state)
}

fn refuse(status: StatusCode, why: String) -> Response {
    tracing::info!(%why, "HTTP proxy request refused");
    metrics::counter!("bcm_boot_proxy_requests_total", "outcome" => "refused").increment(1);
    (status, format!("{why}\n")).into_response()
}

async fn handle(State(s): State<ProxyState>, req: Request) -> Response {
    if req.method() == Method::CONNECT {
        return connect(s, req).await;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} is not proxied (GET, HEAD, CONNECT)", req.method()),
        );
    }
    let uri = req.uri().clone();
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "a proxy request names an absolute http:// URL".into(),
        );
    };
    if scheme != "http" {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("{scheme}:// goes through CONNECT"),
        );
    }
    let target = format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    );
    if !s.allowed(&target) {
        return refuse(
            StatusCode::FORBIDDEN,
            format!("{target} is not on the proxy's allowlist"),
        );
    }
    let mut upstream = s.http.request(req.method().clone(), uri.to_string());
    if let Some(range) = req.headers().get(axum::http::header::RANGE) {
        upstream = upstream.header(axum::http::header::RANGE, range);
    }
    match upstream.send().await {
        Ok(res) => {
            metrics::counter!("bcm_boot_proxy_requests_total", "outcome" => "ok").increment(1);
            tracing::info!(url = %uri, status = res.status().as_u16(), "proxied");
            let mut out = Response::builder().status(res.status().as_u16());
            for (k, v) in res.headers() {
                if k != axum::http::header::TRANSFER_ENCODING && k != axum::http::header::CONNECTION
                {
                    out = out.header(k.as_str(), v.as_bytes());
                }
            }
            let body = Body::from_stream(res.bytes_stream().map_err(std::io::Error::other));
            out.body(body)
                .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
        }
        Err(e) => refuse(StatusCode::BAD_GATEWAY, format!("{target}: {e}")),
    }
}

async fn connect(s: ProxyState, req: Request) -> Response {
    let Some(authority) = req.uri().authority().map(|a| a.to_string()) else {
        return refuse(StatusCode::BAD_REQUEST, "CONNECT names host:port".into());
    };
    if !s.allowed(&authority) {
        return refuse(
            StatusCode::FORBIDDEN,
            format!("{authority} is not on the proxy's allowlist"),
        );
    }
    let upstream = match tokio::net::TcpStream::connect(&authority).await {
        Ok(u) => u,
        Err(e) => return refuse(StatusCode::BAD_GATEWAY, format!("{authority}: {e}")),
    };
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                let mut upstream = upstream;
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
            Err(e) => tracing::warn!(error = %e, "CONNECT upgrade failed"),
        }
    });
    metrics::counter!("bcm_boot_proxy_requests_total", "outcome" => "tunnel").increment(1);
    tracing::info!(%authority, "CONNECT tunnel opened");
    StatusCode::OK.into_response()
}
