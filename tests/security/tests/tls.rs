//! TLS (issue 18, finding 5): the API serves HTTPS with rustls from a
//! certificate of a local CA (`bcm local-tls`); a client that pins that CA
//! is served, one that trusts anything else — the system's roots, another
//! CA — gets no answer, and plain HTTP on the HTTPS port gets none either.
//! Plain HTTP is served only when the configuration asks for it by name.

use bcm_pki::tls::{LocalTls, ServerTlsConfig, Serving};
use bcm_testkit::TestEnv;

/// The API served as HTTPS on a port of its own, with a certificate of a
/// local CA written for the test.
struct TlsApi {
    env: TestEnv,
    dir: std::path::PathBuf,
    files: bcm_pki::tls::LocalTlsFiles,
    addr: std::net::SocketAddr,
    stop: tokio_util::sync::CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl TlsApi {
    async fn start() -> TlsApi {
        let env = TestEnv::start().await.expect("env");
        let dir = std::env::temp_dir().join(format!("bcm-tls-test-{}", ulid::Ulid::new()));
        let files =
            LocalTls::write_missing(&dir, &["127.0.0.1".to_owned(), "localhost".to_owned()])
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
        TlsApi {
            env,
            dir,
            files,
            addr,
            stop,
            server,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.server.await;
        let _ = std::fs::remove_dir_all(&self.dir);
        self.env.stop();
    }
}

#[tokio::test]
async fn only_a_client_that_pins_the_ca_is_served_and_plain_http_gets_nothing() {
    let api = TlsApi::start().await;
    let (env, dir, files, addr) = (&api.env, &api.dir, &api.files, api.addr);
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

    api.stop().await;
}

/// Completes a TLS handshake with the API at `addr`, trusting the CA of
/// `ca_file` and offering `alpn`: the protocol the server chose, or the
/// handshake's error.
async fn handshake(
    addr: std::net::SocketAddr,
    ca_file: &std::path::Path,
    alpn: &[&[u8]],
) -> std::io::Result<Option<Vec<u8>>> {
    let pem = std::fs::read_to_string(ca_file)?;
    let mut roots = rustls::RootCertStore::empty();
    let der = rustls::pki_types::CertificateDer::from(
        base64_der(&pem).ok_or_else(|| std::io::Error::other("the CA is not PEM"))?,
    );
    roots.add(der).map_err(std::io::Error::other)?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(std::io::Error::other)?
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name =
        rustls::pki_types::ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(name, tcp)
        .await?;
    Ok(tls.get_ref().1.alpn_protocol().map(|p| p.to_vec()))
}

/// The DER of the first certificate of a PEM text.
fn base64_der(pem: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

/// The API serves HTTP/1.1 only (`connections.rs`: an HTTP/2 peer's PINGs
/// could keep an idle connection alive past its idle timeout): TLS's ALPN
/// offers nothing else. A client that offers both is given HTTP/1.1, one
/// that speaks only HTTP/2 is refused at the handshake, and one that
/// offers nothing is served HTTP/1.1 as ever.
#[tokio::test]
async fn alpn_agrees_on_http_1_1_only() {
    let api = TlsApi::start().await;
    let both = handshake(api.addr, &api.files.ca, &[b"h2", b"http/1.1"])
        .await
        .expect("offering h2 and http/1.1");
    assert_eq!(both.as_deref(), Some(&b"http/1.1"[..]));
    let h2_only = handshake(api.addr, &api.files.ca, &[b"h2"]).await;
    assert!(
        h2_only.is_err(),
        "an HTTP/2-only client was given {:?}",
        h2_only.map(|p| p.map(|p| String::from_utf8_lossy(&p).into_owned()))
    );
    let none = handshake(api.addr, &api.files.ca, &[])
        .await
        .expect("offering no protocol");
    assert_eq!(none, None);
    api.stop().await;
}
