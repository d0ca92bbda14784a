//! How long the API takes to answer its clients' requests, by route:
//! `bcm_api_request_seconds{route, method, status}`, from the request
//! routed to its response (TLS, the connection's wait for a slot and the
//! request head's parse come before). The route is its template
//! (`/api/compute/metal/nodes/{node_id}`), never the path a client sent,
//! so the labels stay few whatever the ids. The agent endpoints have
//! their own (`agent::measured`).

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

/// Times one routed request (a `route_layer`: only requests that matched
/// a route reach it, so the route is always known).
pub async fn measured(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = req.method().as_str().to_owned();
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    metrics::histogram!(
        "bcm_api_request_seconds",
        "route" => route,
        "method" => method,
        "status" => response.status().as_str().to_owned(),
    )
    .record(started.elapsed().as_secs_f64());
    response
}
