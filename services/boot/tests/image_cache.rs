//! The site's image cache fetches the catalog through the site's upstream
//! HTTP proxy when one is set: Debian's tinyproxy here, whose log shows the
//! request and whose `Via` header the origin sees. An image is streamed,
//! checked against the catalog's sha256 and renamed into place only then;
//! one already cached is not fetched again; a wrong digest or a proxy that
//! is down leaves nothing behind.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::get;
use bcm_boot::images::{prewarm, CatalogImage};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The `Via` header of every request the origin served (empty: direct).
type Seen = Arc<Mutex<Vec<String>>>;

async fn origin(body: Vec<u8>) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route(
            "/images/os.raw",
            get(
                |State((seen, body)): State<(Seen, Arc<Vec<u8>>)>, headers: HeaderMap| async move {
                    let via = headers
                        .get("via")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    seen.lock().expect("lock").push(via);
                    body.as_ref().clone()
                },
            ),
        )
        .with_state((seen.clone(), Arc::new(body)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

struct Tinyproxy {
    child: Child,
    log: PathBuf,
    url: String,
}

impl Tinyproxy {
    fn start(dir: &Path) -> Tinyproxy {
        let exe = std::env::var("BCM_TINYPROXY").unwrap_or_else(|_| "tinyproxy".into());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let log = dir.join("tinyproxy.log");
        std::fs::write(&log, "").expect("log");
        let conf = dir.join("tinyproxy.conf");
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 30\nLogFile \"{}\"\nLogLevel Info\nMaxClients 16\nAllow 127.0.0.1\n",
                log.display()
            ),
        )
        .expect("conf");
        let child = Command::new(&exe)
            .args(["-d", "-c"])
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{exe}: {e} (tests/peers/install.sh installs tinyproxy)"));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "tinyproxy did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Tinyproxy {
            child,
            log,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_fetches_through_the_sites_proxy_and_keeps_only_verified_images() {
    let dir = std::env::temp_dir().join(format!("bcm-image-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let sha = hex::encode(Sha256::digest(&body));
    let (base, seen) = origin(body.clone()).await;
    let url = format!("{base}/images/os.raw");
    let proxy = Tinyproxy::start(&dir);
    let cache = dir.join("cache");
    let image = |sha256: &str| CatalogImage {
        name: "os/os.raw".into(),
        url: url.clone(),
        sha256: sha256.into(),
    };

    prewarm(&cache, &[image(&sha)], Some(&proxy.url))
        .await
        .expect("fetched through the proxy");
    assert_eq!(
        std::fs::read(cache.join("os/os.raw")).expect("cached"),
        body
    );
    assert!(!cache.join("os/os.partial").exists());
    let log = proxy.log();
    assert!(
        log.contains(&format!("GET {url}")),
        "the proxy's log shows the fetch: {log}"
    );
    let via = seen.lock().expect("lock").clone();
    assert_eq!(via.len(), 1);
    assert!(
        via[0].contains("tinyproxy"),
        "the origin saw the proxy: {via:?}"
    );

    // Cached and verified: not fetched again.
    prewarm(&cache, &[image(&sha)], Some(&proxy.url))
        .await
        .expect("present");
    assert_eq!(seen.lock().expect("lock").len(), 1);

    // A digest that does not match leaves nothing behind.
    let other = dir.join("other");
    let err = prewarm(&other, &[image(&"0".repeat(64))], Some(&proxy.url))
        .await
        .expect_err("wrong digest");
    assert!(err.to_string().contains("is not the catalog's"), "{err}");
    assert!(!other.join("os/os.raw").exists() && !other.join("os/os.partial").exists());

    // No proxy set: the cache goes direct (no Via).
    let direct = dir.join("direct");
    prewarm(&direct, &[image(&sha)], None)
        .await
        .expect("direct");
    assert_eq!(
        seen.lock().expect("lock").last().map(String::as_str),
        Some("")
    );

    // A proxy that is down: the fetch fails, saying which URL.
    let down_url = proxy.url.clone();
    drop(proxy);
    let err = prewarm(&dir.join("down"), &[image(&sha)], Some(&down_url))
        .await
        .expect_err("proxy down");
    assert!(err.to_string().contains(&url), "{err}");
    let err = prewarm(
        &dir.join("bad"),
        &[image(&sha)],
        Some("socks5://127.0.0.1:1"),
    )
    .await
    .expect_err("not an http proxy");
    assert!(err.to_string().contains("upstream_proxy"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
