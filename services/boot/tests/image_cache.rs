//! The site's image cache fetches the catalog through the site's upstream
//! HTTP proxy when one is set: Debian's tinyproxy here, whose log shows the
//! request and whose `Via` header the origin sees. An image is streamed,
//! checked against the catalog's sha256 and renamed into place only then;
//! one already cached is not fetched again; a wrong digest or a proxy that
//! is down leaves nothing behind. And the same through the control plane:
//! an image registered in the catalog, the site's proxy set through the
//! API, a pre-warm asked for over HTTP, the `site.httpProxy` command run by
//! the boot service and its outcome read back from the image's view.

mod support;

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
    origin_at("/images/os.raw", body).await
}

async fn origin_at(path: &str, body: Vec<u8>) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route(
            path,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prewarm_asked_of_the_api_is_cached_by_the_site_through_its_proxy() {
    let env = bcm_testkit::TestEnv::start().await.expect("env");
    let _engine = env.spawn_engine();
    let admin = env.admin_token.clone();
    let dir = support::Scratch::new("prewarm");
    let body: Vec<u8> = (0..2_000_000u32).map(|i| (i % 241) as u8).collect();
    let sha = hex::encode(Sha256::digest(&body));
    let (base, seen) = origin_at("/noble.raw", body.clone()).await;
    let url = format!("{base}/noble.raw");
    let proxy = Tinyproxy::start(&dir.0);
    let client_port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("port")
        .port();
    support::boot_files(&dir.0.join("boot"));
    let boot = support::Boot::start(&support::config(&env, &dir.0, client_port, "a")).await;

    let register = |name: &str, sha256: &str| {
        serde_json::json!({"tenantId": "a", "name": name, "url": url, "format": "raw",
            "sha256": sha256, "sizeBytes": body.len()})
    };
    let (s, b) = env
        .post(
            "/api/compute/images",
            Some(&admin),
            &register("noble", &sha),
        )
        .await
        .expect("register");
    assert_eq!(s, 201, "{b}");
    let (s, b) = env
        .put(
            "/api/compute/admin/sites/s1/httpProxy",
            Some(&admin),
            &serde_json::json!({"httpProxy": proxy.url}),
        )
        .await
        .expect("proxy");
    assert_eq!(s, 200, "{b}");
    let (s, asked) = env
        .post(
            "/api/compute/images/a/noble/prewarm",
            Some(&admin),
            &serde_json::json!({"siteId": "s1"}),
        )
        .await
        .expect("prewarm");
    assert_eq!(s, 202, "{asked}");
    let site = |name: &'static str| {
        let env = &env;
        let admin = admin.clone();
        move || {
            let admin = admin.clone();
            async move {
                let (_, v) = env
                    .get(&format!("/api/compute/images/a/{name}"), Some(&admin))
                    .await?;
                let s = v["sites"][0].clone();
                Ok(matches!(s["status"].as_str(), Some("succeeded" | "failed")).then_some(s))
            }
        }
    };
    let done = bcm_testkit::eventually(Duration::from_secs(30), site("noble"))
        .await
        .expect("the site answered");
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["via"], proxy.url.as_str(), "{done}");
    assert_eq!(
        std::fs::read(dir.0.join("cache/catalog/a/noble")).expect("cached"),
        body
    );
    let log = proxy.log();
    assert!(
        log.contains(&format!("GET {url}")),
        "the proxy's log shows the fetch: {log}"
    );
    assert!(seen.lock().expect("lock")[0].contains("tinyproxy"));

    // The boot service serves what it cached, byte for byte.
    let served = reqwest::get(format!(
        "http://{}/images/catalog/a/noble",
        boot.running.http
    ))
    .await
    .expect("get")
    .bytes()
    .await
    .expect("body");
    assert_eq!(served.as_ref(), body.as_slice());

    // A catalog digest the origin does not serve: the command fails,
    // saying so, and nothing is cached.
    let (s, b) = env
        .post(
            "/api/compute/images",
            Some(&admin),
            &register("noble-bad", &"0".repeat(64)),
        )
        .await
        .expect("register");
    assert_eq!(s, 201, "{b}");
    let (s, _) = env
        .post(
            "/api/compute/images/a/noble-bad/prewarm",
            Some(&admin),
            &serde_json::json!({"siteId": "s1"}),
        )
        .await
        .expect("prewarm");
    assert_eq!(s, 202);
    let failed = bcm_testkit::eventually(Duration::from_secs(30), site("noble-bad"))
        .await
        .expect("the site answered");
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|e| e.contains("is not the catalog's")),
        "{failed}"
    );
    assert!(!dir.0.join("cache/catalog/a/noble-bad").exists());
    drop(boot);
}
