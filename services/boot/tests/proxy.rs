//! The site's forward proxy: allowlisted destinations are reached through the boot
//! service's forward proxy (absolute-form GET with Range, and CONNECT
//! tunnels, driven by reqwest and curl); anything else is 403.

mod support;

use std::process::Command;
use support::{Boot, Scratch};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowlisted_destinations_are_proxied() {
    let env = bcm_testkit::TestEnv::start().await.expect("env");
    let dir = Scratch::new("proxy");
    support::boot_files(&dir.0.join("boot"));
    let image: Vec<u8> = (0..(1 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::create_dir_all(dir.0.join("upstream")).expect("upstream");
    std::fs::write(dir.0.join("upstream/img.raw"), &image).expect("image");
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let up = upstream.local_addr().expect("addr");
    let serve = axum::Router::new()
        .fallback_service(tower_http::services::ServeDir::new(dir.0.join("upstream")));
    tokio::spawn(async move { axum::serve(upstream, serve).await });
    let elsewhere = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let other = elsewhere.local_addr().expect("addr");

    let mut cfg = support::config(&env, &dir.0, 9, "a");
    cfg.http_proxy = Some(bcm_boot::HttpProxyConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        allow: vec![up.to_string()],
    });
    let boot = Boot::start(&cfg).await;
    let proxy = format!("http://{}", boot.running.proxy.expect("proxy"));

    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(&proxy).expect("proxy"))
        .build()
        .expect("client");
    let got = client
        .get(format!("http://{up}/img.raw"))
        .send()
        .await
        .expect("through the proxy");
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.expect("body").to_vec(), image);
    let part = client
        .get(format!("http://{up}/img.raw"))
        .header("Range", "bytes=1000-1999")
        .send()
        .await
        .expect("range");
    assert_eq!(part.status(), 206);
    assert_eq!(
        part.bytes().await.expect("body").to_vec(),
        image[1000..2000].to_vec()
    );
    let refused = client
        .get(format!("http://{other}/anything"))
        .send()
        .await
        .expect("answered");
    assert_eq!(refused.status(), 403);

    // CONNECT tunnels (curl -p), allowed and not.
    let out = dir.0.join("tunnelled");
    let o = Command::new("curl")
        .args(["-sS", "--max-time", "20", "-p", "-x", &proxy, "-o"])
        .arg(&out)
        .arg(format!("http://{up}/img.raw"))
        .output()
        .expect("curl");
    assert!(o.status.success(), "{o:?}");
    assert_eq!(std::fs::read(&out).expect("read"), image);
    let o = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-p",
            "-x",
            &proxy,
            "-o",
            "/dev/null",
        ])
        .arg(format!("http://{other}/x"))
        .output()
        .expect("curl");
    assert!(!o.status.success(), "a CONNECT to {other} must be refused");
    assert!(String::from_utf8_lossy(&o.stderr).contains("403"), "{o:?}");
}
