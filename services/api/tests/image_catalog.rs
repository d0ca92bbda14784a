//! The image catalog and the sites' HTTP proxy, over HTTP: a registered
//! image never changes; registering, reading and pre-warming are decided
//! on the tenant; a deploy profile names a catalog image and keeps what it
//! was; a site's proxy is `http://host:port` and nothing else; a pre-warm
//! is a `site.httpProxy` command recorded with its requester and carrying
//! the site's proxy; garbage is refused and changes nothing. A raw image's
//! block map is stored with it and is part of its content; a bad one is
//! refused. (The command
//! run by a real boot service through a real proxy is
//! services/boot/tests/image_cache.rs.)

use bcm_testkit::{Options, TestEnv};
use serde_json::{json, Value};

const IMAGES: &str = "/api/compute/images";

fn image(name: &str, extra: Value) -> Value {
    let mut b = json!({
        "tenantId": "a", "name": name, "url": format!("http://images.invalid/{name}.qcow2"),
        "format": "qcow2", "sha256": "7e".repeat(32), "sizeBytes": 1u64 << 30,
        "signature": "c2lnbmVk"
    });
    if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    b
}

#[tokio::test]
async fn a_registered_image_is_immutable_and_read_on_its_tenant() {
    let env = TestEnv::start_with(Options::api_only()).await.expect("env");
    let admin = env.admin_token.clone();
    let (s, b) = env
        .post(IMAGES, Some(&admin), &image("noble", json!({})))
        .await
        .expect("register");
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["registeredBy"], "admin");
    assert_eq!(b["cachePath"], "catalog/a/noble");
    assert_eq!(b["image"]["format"], "qcow2");
    let (s, again) = env
        .post(IMAGES, Some(&admin), &image("noble", json!({})))
        .await
        .expect("again");
    assert_eq!(s, 200, "the same content answers the stored image: {again}");
    assert_eq!(again["registeredAt"], b["registeredAt"]);
    let (s, e) = env
        .post(
            IMAGES,
            Some(&admin),
            &image("noble", json!({"sha256": "7f".repeat(32)})),
        )
        .await
        .expect("changed");
    assert_eq!((s, e["code"].as_str()), (409, Some("CONFLICT")), "{e}");

    // Garbage is refused and stores nothing.
    for bad in [
        image("Noble", json!({})),
        image("noble2", json!({"url": "file:///etc/shadow"})),
        image("noble2", json!({"url": "http://user:pw@images.invalid/x"})),
        image("noble2", json!({"sha256": "XYZ"})),
        image("noble2", json!({"sizeBytes": 0})),
        image("noble2", json!({"sizeBytes": -1})),
        image("noble2", json!({"sizeBytes": 1.5})),
        image("noble2", json!({"format": "vmdk"})),
        image("noble2", json!({"signature": ""})),
        image("noble2", json!({"surprise": true})),
        json!({"tenantId": "a"}),
        json!([]),
    ] {
        let (s, e) = env.post(IMAGES, Some(&admin), &bad).await.expect("post");
        assert_eq!(
            (s, e["code"].as_str()),
            (400, Some("INVALID_ARGUMENT")),
            "{bad}: {e}"
        );
    }
    let (s, e) = env
        .post(IMAGES, Some(&admin), &image("x", json!({"tenantId": "zz"})))
        .await
        .expect("post");
    assert_eq!((s, e["code"].as_str()), (404, Some("NOT_FOUND")), "{e}");
    let (s, all) = env
        .get(&format!("{IMAGES}?tenantId=a"), Some(&admin))
        .await
        .expect("list");
    assert_eq!(s, 200);
    let names: Vec<&str> = all
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert_eq!(names, ["noble"], "garbage stored nothing");

    // Decided on the tenant: b's publisher sees nothing of a's catalog (as
    // if it did not exist); a's reader reads and may not register.
    let b_pub = env
        .token(
            "b-publisher",
            &[
                ("compute:profiles:publish", "tenant", "b"),
                ("compute:profiles:read", "tenant", "b"),
            ],
        )
        .await
        .expect("token");
    let (s, _) = env
        .get(&format!("{IMAGES}/a/noble"), Some(&b_pub))
        .await
        .expect("get");
    assert_eq!(s, 404);
    let (s, _) = env
        .get(&format!("{IMAGES}?tenantId=a"), Some(&b_pub))
        .await
        .expect("list");
    assert_eq!(s, 404);
    let (s, _) = env
        .post(IMAGES, Some(&b_pub), &image("theirs", json!({})))
        .await
        .expect("post");
    assert_eq!(s, 404);
    let reader = env
        .token("a-reader", &[("compute:profiles:read", "tenant", "a")])
        .await
        .expect("token");
    let (s, v) = env
        .get(&format!("{IMAGES}/a/noble"), Some(&reader))
        .await
        .expect("get");
    assert_eq!((s, v["name"].as_str()), (200, Some("noble")), "{v}");
    let (s, e) = env
        .post(IMAGES, Some(&reader), &image("mine", json!({})))
        .await
        .expect("post");
    assert_eq!((s, e["code"].as_str()), (403, Some("FORBIDDEN")), "{e}");
    let (s, mine) = env
        .post(
            IMAGES,
            Some(&b_pub),
            &image("theirs", json!({"tenantId": "b"})),
        )
        .await
        .expect("post");
    assert_eq!(s, 201, "{mine}");
    assert_eq!(mine["registeredBy"], "b-publisher");
    let (s, e) = env
        .get(&format!("{IMAGES}/a/nothing"), Some(&admin))
        .await
        .expect("get");
    assert_eq!((s, e["code"].as_str()), (404, Some("NOT_FOUND")));
}

#[tokio::test]
async fn a_raw_images_block_map_is_part_of_its_content_and_a_bad_one_is_refused() {
    let env = TestEnv::start_with(Options::api_only()).await.expect("env");
    let admin = env.admin_token.clone();
    const M: u64 = 1 << 20;
    let run = |offset: u64, length: u64| json!({"offset": offset, "length": length, "sha256": "ab".repeat(32)});
    let raw = |name: &str, ranges: Value| {
        image(
            name,
            json!({"format": "raw", "url": format!("http://images.invalid/{name}.raw"),
                   "sizeBytes": 8 * M + 10, "dataRanges": ranges}),
        )
    };
    let map = json!([run(0, 2 * M), run(4 * M, M), run(8 * M, 10)]);
    let (s, b) = env
        .post(IMAGES, Some(&admin), &raw("mapped", map.clone()))
        .await
        .expect("register");
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["image"]["dataRanges"], map);
    let (s, got) = env
        .get(&format!("{IMAGES}/a/mapped"), Some(&admin))
        .await
        .expect("get");
    assert_eq!((s, &got["image"]["dataRanges"]), (200, &map), "{got}");
    let (s, _) = env
        .post(IMAGES, Some(&admin), &raw("mapped", map.clone()))
        .await
        .expect("again");
    assert_eq!(s, 200, "the same map is the same content");
    let (s, e) = env
        .post(
            IMAGES,
            Some(&admin),
            &raw("mapped", json!([run(0, 2 * M), run(4 * M, M)])),
        )
        .await
        .expect("another map");
    assert_eq!((s, e["code"].as_str()), (409, Some("CONFLICT")), "{e}");

    let too_many: Vec<Value> = (0..4097u64).map(|i| run(i * 2 * M, M)).collect();
    let mut qcow = raw("bad", json!([run(0, M)]));
    qcow["format"] = json!("qcow2");
    for bad in [
        raw("bad", json!([run(1, M)])),
        raw("bad", json!([run(0, M + 1)])),
        raw("bad", json!([run(0, 9 * M)])),
        raw("bad", json!([run(4 * M, M), run(0, M)])),
        raw("bad", json!([run(0, 0)])),
        raw("bad", json!([{"offset": 0, "length": M, "sha256": "nope"}])),
        raw(
            "bad",
            json!([{"offset": -1, "length": M, "sha256": "ab".repeat(32)}]),
        ),
        raw("bad", json!([{"offset": 0, "length": M}])),
        raw(
            "bad",
            json!([{"offset": 0, "length": M, "sha256": "ab".repeat(32), "x": 1}]),
        ),
        raw("bad", json!({"offset": 0})),
        raw("bad", json!(Value::Array(too_many))),
        qcow,
    ] {
        let (s, e) = env.post(IMAGES, Some(&admin), &bad).await.expect("post");
        assert_eq!(
            (s, e["code"].as_str()),
            (400, Some("INVALID_ARGUMENT")),
            "{}: {e}",
            bad["dataRanges"]
        );
    }
    let (s, e) = env
        .get(&format!("{IMAGES}/a/bad"), Some(&admin))
        .await
        .expect("get");
    assert_eq!(
        (s, e["code"].as_str()),
        (404, Some("NOT_FOUND")),
        "nothing stored"
    );
}

#[tokio::test]
async fn a_profile_names_a_catalog_image_and_keeps_what_it_was() {
    let env = TestEnv::start_with(Options::api_only()).await.expect("env");
    let admin = env.admin_token.clone();
    let (s, img) = env
        .post(IMAGES, Some(&admin), &image("noble", json!({})))
        .await
        .expect("register");
    assert_eq!(s, 201, "{img}");
    let profile = |extra: Value| {
        let mut b = json!({"tenantId": "a", "id": "noble-host", "version": 1});
        if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        b
    };
    let (s, p) = env
        .post(
            "/api/compute/deployProfiles",
            Some(&admin),
            &profile(json!({"catalogImage": "noble"})),
        )
        .await
        .expect("publish");
    assert_eq!(s, 201, "{p}");
    assert_eq!(p["profile"]["catalogImage"], "noble");
    assert_eq!(p["profile"]["image"], img["image"], "the catalog's image");
    for (bad, code, status) in [
        (profile(json!({"catalogImage": "gone"})), "NOT_FOUND", 404),
        (
            profile(json!({"catalogImage": "Bad Name"})),
            "INVALID_ARGUMENT",
            400,
        ),
        (profile(json!({})), "INVALID_ARGUMENT", 400),
        (
            profile(json!({"catalogImage": "noble", "image": img["image"].clone()})),
            "INVALID_ARGUMENT",
            400,
        ),
    ] {
        let (s, e) = env
            .post("/api/compute/deployProfiles", Some(&admin), &bad)
            .await
            .expect("publish");
        assert_eq!((s, e["code"].as_str()), (status, Some(code)), "{bad}: {e}");
    }
    // Tenant b's catalog does not lend a's images.
    let (s, e) = env
        .post(
            "/api/compute/deployProfiles",
            Some(&admin),
            &json!({"tenantId": "b", "id": "x", "version": 1, "catalogImage": "noble"}),
        )
        .await
        .expect("publish");
    assert_eq!((s, e["code"].as_str()), (404, Some("NOT_FOUND")), "{e}");
}

#[tokio::test]
async fn a_prewarm_is_a_recorded_site_command_carrying_the_sites_proxy() {
    let env = TestEnv::start_with(Options::api_only()).await.expect("env");
    let admin = env.admin_token.clone();
    let (s, _) = env
        .post(IMAGES, Some(&admin), &image("noble", json!({})))
        .await
        .expect("register");
    assert_eq!(s, 201);

    // The site's proxy: http://host:port only; garbage changes nothing.
    let site = "/api/compute/admin/sites/s1";
    for bad in [
        json!({"httpProxy": "https://proxy:3128"}),
        json!({"httpProxy": "http://user:secret@proxy:3128"}),
        json!({"httpProxy": "http://proxy"}),
        json!({"httpProxy": "http://proxy:3128/x"}),
        json!({"httpProxy": 3128}),
        json!({"proxy": "http://proxy:3128"}),
    ] {
        let (s, e) = env
            .put(&format!("{site}/httpProxy"), Some(&admin), &bad)
            .await
            .expect("put");
        assert_eq!(
            (s, e["code"].as_str()),
            (400, Some("INVALID_ARGUMENT")),
            "{bad}: {e}"
        );
    }
    let (s, v) = env.get(site, Some(&admin)).await.expect("get");
    assert_eq!(s, 200, "{v}");
    assert!(v.get("httpProxy").is_none(), "{v}");
    let (s, v) = env
        .put(
            &format!("{site}/httpProxy"),
            Some(&admin),
            &json!({"httpProxy": "http://10.1.2.3:3128"}),
        )
        .await
        .expect("put");
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["httpProxy"], "http://10.1.2.3:3128");
    assert_eq!(v["httpProxySetBy"], "admin");
    let (s, e) = env
        .put(
            "/api/compute/admin/sites/nowhere/httpProxy",
            Some(&admin),
            &json!({"httpProxy": null}),
        )
        .await
        .expect("put");
    assert_eq!((s, e["code"].as_str()), (404, Some("NOT_FOUND")));
    let publisher = env
        .token(
            "a-publisher",
            &[
                ("compute:profiles:publish", "tenant", "a"),
                ("compute:profiles:read", "tenant", "a"),
            ],
        )
        .await
        .expect("token");
    let (s, _) = env
        .put(
            &format!("{site}/httpProxy"),
            Some(&publisher),
            &json!({"httpProxy": null}),
        )
        .await
        .expect("put");
    assert_eq!(s, 403, "the site's proxy is the administrator's");

    let prewarm = format!("{IMAGES}/a/noble/prewarm");
    let (s, ok) = env
        .post(&prewarm, Some(&publisher), &json!({"siteId": "s1"}))
        .await
        .expect("prewarm");
    assert_eq!(s, 202, "{ok}");
    assert_eq!(ok["upstreamProxy"], "http://10.1.2.3:3128");
    let id = ok["commandId"].as_str().expect("id").to_owned();
    let row = bcm_db::commands::command_fetch(&env.db, &id)
        .await
        .expect("recorded before it is sent");
    assert_eq!(row.kind, "site.httpProxy");
    assert_eq!(row.actor.as_deref(), Some("a-publisher"));
    assert_eq!(row.node_id, None);
    assert_eq!(row.params["upstreamProxy"], "http://10.1.2.3:3128");
    assert_eq!(row.params["image"]["path"], "catalog/a/noble");
    let (s, v) = env
        .get(&format!("{IMAGES}/a/noble"), Some(&publisher))
        .await
        .expect("get");
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["sites"][0]["siteId"], "s1", "{v}");
    assert_eq!(v["sites"][0]["commandId"], id.as_str());
    assert_eq!(v["sites"][0]["requestedBy"], "a-publisher");

    // A site the tenant has no pool in, an unknown image, garbage.
    let (s, e) = env
        .put(
            "/api/compute/admin/sites/s2",
            Some(&admin),
            &json!({"name": "Site 2"}),
        )
        .await
        .expect("site");
    assert_eq!(s, 204, "{e}");
    for (path, body, status) in [
        (prewarm.clone(), json!({"siteId": "s2"}), 404),
        (prewarm.clone(), json!({"siteId": "nowhere"}), 404),
        (
            format!("{IMAGES}/a/gone/prewarm"),
            json!({"siteId": "s1"}),
            404,
        ),
        (prewarm.clone(), json!({"siteId": "S 1"}), 400),
        (prewarm.clone(), json!({}), 400),
    ] {
        let (s, e) = env
            .post(&path, Some(&publisher), &body)
            .await
            .expect("post");
        assert_eq!(s, status, "{path} {body}: {e}");
    }
    let b_pub = env
        .token(
            "b-publisher",
            &[("compute:profiles:publish", "tenant", "b")],
        )
        .await
        .expect("token");
    let (s, _) = env
        .post(&prewarm, Some(&b_pub), &json!({"siteId": "s1"}))
        .await
        .expect("post");
    assert_eq!(s, 404, "another tenant's image does not exist for b");
    let reader = env
        .token("a-reader", &[("compute:profiles:read", "tenant", "a")])
        .await
        .expect("token");
    let (s, _) = env
        .post(&prewarm, Some(&reader), &json!({"siteId": "s1"}))
        .await
        .expect("post");
    assert_eq!(s, 403, "reading is not warming");
    let (_, v) = env
        .get(&format!("{IMAGES}/a/noble"), Some(&admin))
        .await
        .expect("get");
    assert_eq!(
        v["sites"].as_array().map(Vec::len),
        Some(1),
        "refused pre-warms recorded nothing: {v}"
    );
}
