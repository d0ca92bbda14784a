//! The Redfish client never hands the BMC's credentials to another host
//! (issue 18, finding 6). A BMC on loopback that answers a session login
//! with a 307 to another host, one whose links name another host, and one
//! that redirects an authenticated read there: in each, the other host
//! (a real HTTP server on another port) records every request it gets,
//! and gets none; the driver fails with a non-retryable error that says
//! why.

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bcm_bmc::driver::{Driver, DriverSettings};
use bcm_bmc::error::BmcError;
use bcm_core::BmcDriver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PASSWORD: &str = "hunter2-not-for-you";

/// What the other host received: one line per request.
type Seen = Arc<Mutex<Vec<String>>>;

async fn serve(router: Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    port
}

/// The other host: answers everything, records everything.
async fn recorder() -> (u16, Seen) {
    let seen: Seen = Arc::default();
    let kept = seen.clone();
    let port = serve(Router::new().fallback(
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let kept = kept.clone();
            async move {
                kept.lock().unwrap_or_else(|p| p.into_inner()).push(format!(
                    "{method} {uri} {headers:?} {}",
                    String::from_utf8_lossy(&body)
                ));
                (
                    StatusCode::CREATED,
                    [("X-Auth-Token", "stolen")],
                    r#"{"Members": []}"#,
                )
            }
        },
    ))
    .await;
    (port, seen)
}

#[derive(Clone, Copy)]
enum Trick {
    /// The session login is answered 307 to the other host.
    LoginRedirected,
    /// No session service (basic auth); the Systems link is absolute.
    LinkElsewhere,
    /// A real session; the authenticated read of Systems is redirected.
    ReadRedirected,
}

async fn bmc(trick: Trick, other: u16) -> u16 {
    let elsewhere = format!("http://127.0.0.1:{other}");
    serve(Router::new().fallback(move |method: Method, uri: Uri| {
        let elsewhere = elsewhere.clone();
        async move {
            let path = uri.path().to_owned();
            let json = |v: serde_json::Value| -> Response {
                ([("Content-Type", "application/json")], v.to_string()).into_response()
            };
            let moved = |code: StatusCode, to: String| -> Response {
                (code, [("Location", to)]).into_response()
            };
            match (trick, method, path.as_str()) {
                (Trick::LinkElsewhere, Method::GET, "/redfish/v1/" | "/redfish/v1") => {
                    json(serde_json::json!({
                        "RedfishVersion": "1.6.0",
                        "Systems": {"@odata.id": format!("{elsewhere}/redfish/v1/Systems")},
                    }))
                }
                (_, Method::GET, "/redfish/v1/" | "/redfish/v1") => json(serde_json::json!({
                    "RedfishVersion": "1.6.0",
                    "Systems": {"@odata.id": "/redfish/v1/Systems"},
                    "SessionService": {"@odata.id": "/redfish/v1/SessionService"},
                    "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}},
                })),
                (Trick::LoginRedirected, Method::POST, "/redfish/v1/SessionService/Sessions") => {
                    moved(
                        StatusCode::TEMPORARY_REDIRECT,
                        format!("{elsewhere}/redfish/v1/SessionService/Sessions"),
                    )
                }
                (_, Method::POST, "/redfish/v1/SessionService/Sessions") => (
                    StatusCode::CREATED,
                    [
                        ("X-Auth-Token", "the-session-token"),
                        ("Location", "/redfish/v1/SessionService/Sessions/1"),
                    ],
                    "{}",
                )
                    .into_response(),
                (Trick::ReadRedirected, Method::GET, "/redfish/v1/Systems") => {
                    moved(StatusCode::FOUND, format!("{elsewhere}/redfish/v1/Systems"))
                }
                _ => StatusCode::NOT_FOUND.into_response(),
            }
        }
    }))
    .await
}

#[tokio::test]
async fn no_credential_reaches_another_host() {
    for (name, trick) in [
        ("a session login redirected", Trick::LoginRedirected),
        ("a link to another host", Trick::LinkElsewhere),
        ("an authenticated read redirected", Trick::ReadRedirected),
    ] {
        let (other, seen) = recorder().await;
        let port = bmc(trick, other).await;
        let mut settings = DriverSettings::default();
        settings.redfish.backoff = Duration::from_millis(10);
        let driver = Driver::open(
            BmcDriver::Redfish,
            &format!("http://127.0.0.1:{port}"),
            "admin".to_owned().into(),
            PASSWORD.to_owned().into(),
            &settings,
            None,
        )
        .expect("driver");
        let err = driver.verify().await.expect_err(name);
        assert!(
            matches!(&err, BmcError::Invalid(m) if m.contains("another host")),
            "{name}: {err:?}"
        );
        assert!(!err.retryable(), "{name}: retrying would be refused again");
        let got = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert!(got.is_empty(), "{name}: the other host received {got:?}");
        driver.close().await;
    }
}
