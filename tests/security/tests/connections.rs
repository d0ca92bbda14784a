//! The API's connections (issue 24, what ended the N = 100,000 run): past
//! `api.http.max_connections` a new connection is not served until a held
//! one closes, and a connection that sends no complete request head for
//! `idle_timeout_secs` — idle after its answer, or sending its head a byte
//! at a time — is closed by the server. Raw TCP, so nothing in a client
//! library reconnects or pools behind the test's back.

use bcm_api::connections::HttpConfig;
use bcm_testkit::TestEnv;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ASK: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n";

/// Reads one answer's head and its `ok` body (keeping the connection).
async fn answered(c: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"ok") {
        let n = c.read(&mut buf).await.expect("read");
        assert!(
            n > 0,
            "closed before an answer: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Whether the server closes `c` (EOF or reset) within `within`.
async fn closed_within(c: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, c.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_cap_a_connection_waits_for_one_to_close_and_idle_ones_are_closed() {
    let env = TestEnv::start().await.expect("env");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = env.child_token();
    let http = HttpConfig {
        max_connections: 2,
        idle_timeout_secs: 3,
    };
    let app = bcm_api::router(env.state.clone());
    let s = stop.clone();
    let server = tokio::spawn(async move {
        bcm_api::serve(listener, app, bcm_pki::tls::Serving::Plain, &http, s).await
    });

    // Two connections, each answered and kept.
    let mut a = TcpStream::connect(addr).await.expect("a");
    a.write_all(ASK).await.expect("ask a");
    assert!(answered(&mut a).await.starts_with("HTTP/1.1 200"));
    let mut b = TcpStream::connect(addr).await.expect("b");
    b.write_all(ASK).await.expect("ask b");
    assert!(answered(&mut b).await.starts_with("HTTP/1.1 200"));
    let b_idle_since = std::time::Instant::now();
    // A third connects (the kernel's backlog takes it) but is not served
    // while both are held; a is asked again meanwhile and still is.
    let mut c = TcpStream::connect(addr).await.expect("c");
    c.write_all(ASK).await.expect("ask c");
    let mut buf = [0u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_millis(800), c.read(&mut buf))
            .await
            .is_err(),
        "served past the cap of 2"
    );
    a.write_all(ASK).await.expect("ask a again");
    assert!(answered(&mut a).await.starts_with("HTTP/1.1 200"));
    // One closes: the third is served.
    drop(a);
    assert!(
        tokio::time::timeout(Duration::from_secs(10), answered(&mut c))
            .await
            .expect("served once a slot was free")
            .starts_with("HTTP/1.1 200")
    );

    // b has sent nothing since its answer: closed after the idle timeout
    // (3 s from the server's end of its answer), not before.
    assert!(
        closed_within(&mut b, Duration::from_secs(15)).await,
        "an idle connection was kept past idle_timeout_secs"
    );
    let idle = b_idle_since.elapsed();
    assert!(
        idle >= Duration::from_secs(2),
        "closed after {idle:?} idle, before its timeout"
    );
    // c sends half a head and then nothing: closed too, and its slot
    // serves a new connection.
    c.write_all(b"GET /healthz HTTP/1.1\r\nHo")
        .await
        .expect("half");
    assert!(
        closed_within(&mut c, Duration::from_secs(10)).await,
        "a connection sending half a head was kept"
    );
    let mut d = TcpStream::connect(addr).await.expect("d");
    d.write_all(ASK).await.expect("ask d");
    assert!(
        tokio::time::timeout(Duration::from_secs(10), answered(&mut d))
            .await
            .expect("the closed connections' slots are free")
            .starts_with("HTTP/1.1 200")
    );

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    env.stop();
}
