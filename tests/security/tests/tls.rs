//! TLS (issue 18, finding 5): the API serves HTTPS with rustls from a
//! certificate of a local CA (`bcm local-tls`); a client that pins that CA
//! is served, one that trusts anything else — the system's roots, another
//! CA — gets no answer, and plain HTTP on the HTTPS port gets none either.
//! Plain HTTP is served only when the configuration asks for it by name.

use bcm_pki::tls::{LocalTls, ServerTlsConfig, Serving};
use bcm_testkit::TestEnv;

#[tokio::test]
async fn only_a_client_that_pins_the_ca_is_served_and_plain_http_gets_nothing() {
    let env = TestEnv::start().await.expect("env");
    let dir = std::env::temp_dir().join(format!("bcm-tls-test-{}", ulid::Ulid::new()));
    let files = LocalTls::write_missing(&dir, &["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("local TLS");
    let serving = ServerTlsConfig {
        cert_file: Some(files.cert.clone()),
        key_file: Some(files.key.clone()),
        plain_http: false,
    }
    .serving()
    .expect("serving");
    assert!(matches!(serving, Serving::Tls(_)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = env.child_token();
    let app = bcm_api::router(env.state.clone());
    let http = bcm_api::connections::HttpConfig::default();
    let s = stop.clone();
    let server =
        tokio::spawn(async move { bcm_api::serve(listener, app, serving, &http, s).await });
    let nodes = "/api/compute/metal/nodes?tenantId=a";

    // Pinned to the local CA, by IP address and by name.
    let pinned = bcm_pki::tls::client_pinned_to_file(&files.ca).expect("client");
    for host in [
        format!("127.0.0.1:{}", addr.port()),
        format!("localhost:{}", addr.port()),
    ] {
        let res = pinned
            .get(format!("https://{host}{nodes}"))
            .bearer_auth(&env.admin_token)
            .send()
            .await
            .unwrap_or_else(|e| panic!("https://{host}: {e}"));
        assert_eq!(res.status().as_u16(), 200, "https://{host}");
    }

    // Trusting the system's roots, or another CA: the handshake fails and
    // the token is never sent.
    let system = reqwest::Client::new();
    let other_dir = dir.join("other");
    let other = LocalTls::write_missing(&other_dir, &["127.0.0.1".to_owned()]).expect("other CA");
    let wrong = bcm_pki::tls::client_pinned_to_file(&other.ca).expect("client");
    for (what, client) in [("system roots", &system), ("another CA", &wrong)] {
        let res = client
            .get(format!("https://{addr}{nodes}"))
            .bearer_auth(&env.admin_token)
            .send()
            .await;
        assert!(res.is_err(), "{what}: served {:?}", res.map(|r| r.status()));
    }

    // Plain HTTP on the HTTPS port gets no answer.
    let plain = system
        .get(format!("http://{addr}{nodes}"))
        .bearer_auth(&env.admin_token)
        .send()
        .await;
    assert!(
        plain.as_ref().map_or(true, |r| r.status().as_u16() != 200),
        "plain HTTP was served: {:?}",
        plain.map(|r| r.status())
    );

    // A configuration that names neither certificate nor plain HTTP is
    // refused, saying what to set.
    let err = ServerTlsConfig::default()
        .serving()
        .expect_err("neither TLS nor plain_http");
    assert!(err.to_string().contains("plain_http"), "{err}");

    stop.cancel();
    let _ = server.await;
    let _ = std::fs::remove_dir_all(&dir);
    env.stop();
}
