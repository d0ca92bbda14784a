//! `deploy.image` onto a real loop device from a real HTTP server: a qcow2
//! made by qemu-img lands byte-identical to `qemu-img convert -O raw`, and
//! so does a raw image; a tampered image is refused and what was written is
//! zeroed; a manifest with a wrong sha256, one signed by an unknown key and
//! an unsigned one are refused before the disk is touched; a disk that
//! drops its writes fails the read-back in either format. A raw image with
//! a signed block map fetches only its runs (HTTP ranges from `tower-http`'s
//! file server, the site cache's) and lands the same; a changed run, a
//! server answering another range and a block map changed after signing are
//! refused; a server that ignores ranges streams the image whole.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bcm_bcd::disks;
use bcm_bcd::image::{self, DataRange, DeployOptions, Format, ImageError, Manifest};
use ed25519_dalek::SigningKey;
use sha2::{Digest, Sha256};
use support::*;

type Files = Arc<std::sync::Mutex<HashMap<String, Vec<u8>>>>;

/// Serves `app` on a loopback port, on a thread (and runtime) of its own:
/// its base URL.
fn serve_app(app: axum::Router) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let _ = tx.send(format!("http://{}", l.local_addr().expect("addr")));
            let _ = axum::serve(l, app).await;
        });
    });
    rx.recv().expect("server")
}

/// A plain HTTP server of in-memory files (no ranges).
fn serve(files: Files) -> String {
    serve_app(axum::Router::new().route(
        "/{name}",
        axum::routing::get(
            move |axum::extract::Path(name): axum::extract::Path<String>| {
                let files = files.clone();
                async move {
                    let body = files.lock().ok().and_then(|f| f.get(&name).cloned());
                    match body {
                        Some(b) => (axum::http::StatusCode::OK, b),
                        None => (axum::http::StatusCode::NOT_FOUND, vec![]),
                    }
                }
            },
        ),
    ))
}

fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// A 96 MiB raw image: random data at a few places, zeros elsewhere.
fn make_raw(path: &Path) {
    sparse(path, 96 << 20);
    let p = path.to_str().expect("path");
    for (seek, count) in [(0, 2), (17, 3), (50, 1), (95, 1)] {
        ok(
            "dd",
            &[
                "if=/dev/urandom",
                &format!("of={p}"),
                "bs=1M",
                &format!("seek={seek}"),
                &format!("count={count}"),
                "conv=notrunc",
                "status=none",
            ],
        );
    }
}

fn manifest(key: &SigningKey, url: &str, format: Format, bytes: &[u8]) -> Manifest {
    let fmt = match format {
        Format::Raw => "raw",
        Format::Qcow2 => "qcow2",
        Format::Iso => "iso",
    };
    let sha = sha(bytes);
    Manifest {
        url: url.to_owned(),
        format,
        size_bytes: bytes.len() as u64,
        signature: Some(bcm_pki::image::sign_manifest(
            key,
            &bcm_pki::image::ManifestFields {
                url,
                format: fmt,
                size_bytes: bytes.len() as u64,
                sha256: &sha,
                data_ranges: None,
            },
        )),
        sha256: sha,
        data_ranges: None,
    }
}

/// The runs of 1 MiB chunks of `bytes` that are not all zeros.
fn runs_of(bytes: &[u8]) -> Vec<DataRange> {
    let mut runs: Vec<DataRange> = Vec::new();
    for (i, chunk) in bytes.chunks(1 << 20).enumerate() {
        if chunk.iter().all(|b| *b == 0) {
            continue;
        }
        let offset = (i as u64) << 20;
        match runs.last_mut() {
            Some(r) if r.offset + r.length == offset => r.length += chunk.len() as u64,
            _ => runs.push(DataRange {
                offset,
                length: chunk.len() as u64,
                sha256: String::new(),
            }),
        }
    }
    for r in &mut runs {
        r.sha256 = sha(&bytes[r.offset as usize..(r.offset + r.length) as usize]);
    }
    runs
}

/// A raw image's manifest with its block map, signed with the runs given.
fn mapped_manifest(key: &SigningKey, url: &str, bytes: &[u8], runs: Vec<DataRange>) -> Manifest {
    let mut m = manifest(key, url, Format::Raw, bytes);
    let signed: Vec<(u64, u64, &str)> = runs
        .iter()
        .map(|r| (r.offset, r.length, r.sha256.as_str()))
        .collect();
    m.signature = Some(bcm_pki::image::sign_manifest(
        key,
        &bcm_pki::image::ManifestFields {
            url,
            format: "raw",
            size_bytes: m.size_bytes,
            sha256: &m.sha256,
            data_ranges: Some(&signed),
        },
    ));
    m.data_ranges = Some(runs);
    m
}

/// `tower-http`'s file server (the site cache's, with Range support) over
/// `dir`, and `/lying/<mode>/<name>`, a server whose range answers are
/// wrong in one way: `other` answers any range with the file's first MiB,
/// `short` and `long` send a byte less or more than the range,
/// `total` names another file size, `whole-later` answers the range at 0
/// and then the whole file with `200`.
fn serve_dir(dir: &Path) -> String {
    let root = dir.to_owned();
    let lying_root = root.clone();
    serve_app(
        axum::Router::new()
            .route(
                "/lying/{mode}/{name}",
                axum::routing::get(
                    move |axum::extract::Path((mode, name)): axum::extract::Path<(String, String)>,
                          headers: axum::http::HeaderMap| {
                        let path = lying_root.join(name);
                        async move { lie(&mode, &std::fs::read(path).unwrap_or_default(), &headers) }
                    },
                ),
            )
            .fallback_service(tower_http::services::ServeDir::new(root)),
    )
}

struct Target {
    _dir: Scratch,
    file: std::path::PathBuf,
    disk: LoopDisk,
}

/// A 128 MiB loop disk full of junk (so unallocated ranges must be zeroed).
fn target(name: &str) -> Target {
    let dir = Scratch::new(name);
    let file = dir.0.join("target.img");
    let junk: Vec<u8> = (0..(128u32 << 20)).map(|i| (i % 251) as u8 | 1).collect();
    std::fs::write(&file, junk).expect("junk");
    let disk = LoopDisk::attach(&file);
    Target {
        _dir: dir,
        file,
        disk,
    }
}

fn deploy(
    m: &Manifest,
    keys: &[ed25519_dalek::VerifyingKey],
    t: &Target,
) -> Result<image::DeployReport, ImageError> {
    let d = disks::describe(&t.disk.dev).expect("describe");
    image::deploy(m, keys, &d, &DeployOptions::default(), &mut |_, _| {})
}

/// A raw image (`make_raw`) and its qcow2 (`qemu-img convert`), both
/// served over HTTP as `image.raw` and `image.qcow2`: the server's base
/// URL and the two files' bytes.
struct Images {
    base: String,
    raw: Vec<u8>,
    qcow: Vec<u8>,
}

fn raw_and_qcow2(dir: &Scratch) -> Images {
    let raw = dir.0.join("image.raw");
    make_raw(&raw);
    let qcow = dir.0.join("image.qcow2");
    ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "qcow2",
            raw.to_str().unwrap_or_default(),
            qcow.to_str().unwrap_or_default(),
        ],
    );
    let files: Files = Default::default();
    let images = Images {
        base: String::new(),
        raw: std::fs::read(&raw).expect("raw"),
        qcow: std::fs::read(&qcow).expect("qcow2"),
    };
    {
        let mut f = files.lock().expect("files");
        f.insert("image.raw".into(), images.raw.clone());
        f.insert("image.qcow2".into(), images.qcow.clone());
    }
    Images {
        base: serve(files),
        ..images
    }
}

/// A wrong answer to a range request (see [`serve_dir`]).
fn lie(
    mode: &str,
    file: &[u8],
    headers: &axum::http::HeaderMap,
) -> (axum::http::StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let range = headers
        .get(axum::http::header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
        .unwrap_or((0, file.len().saturating_sub(1)));
    let (from, to) = match mode {
        "other" => (0, (1 << 20) - 1),
        _ => range,
    };
    let mut total = file.len();
    let mut body = file
        .get(from..=to.min(file.len().saturating_sub(1)))
        .unwrap_or_default()
        .to_vec();
    match mode {
        "short" => {
            body.pop();
        }
        "long" => body.push(7),
        "total" => total += 1,
        "whole-later" if from > 0 => {
            return (
                axum::http::StatusCode::OK,
                Default::default(),
                file.to_vec(),
            );
        }
        _ => {}
    }
    let mut h = axum::http::HeaderMap::new();
    if let Ok(v) = format!("bytes {from}-{to}/{total}").parse() {
        h.insert(axum::http::header::CONTENT_RANGE, v);
    }
    (axum::http::StatusCode::PARTIAL_CONTENT, h, body)
}

#[test]
fn qcow2_and_raw_images_land_byte_identical_to_qemu_img_convert() {
    let dir = Scratch::new("img");
    let images = raw_and_qcow2(&dir);
    let qcow = dir.0.join("image.qcow2");
    let expected = dir.0.join("expected.raw");
    ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "qcow2",
            "-O",
            "raw",
            qcow.to_str().unwrap_or_default(),
            expected.to_str().unwrap_or_default(),
        ],
    );
    let expected = std::fs::read(&expected).expect("expected");
    let (base, qbytes, rbytes) = (&images.base, &images.qcow, &images.raw);
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let keys = [key.verifying_key()];

    for (name, format, bytes) in [
        ("image.qcow2", Format::Qcow2, &qbytes),
        ("image.raw", Format::Raw, &rbytes),
    ] {
        let t = target(&format!("t-{name}"));
        let m = manifest(&key, &format!("{base}/{name}"), format, bytes);
        let report = deploy(&m, &keys, &t).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(report.virtual_size_bytes, expected.len() as u64, "{name}");
        assert_eq!(report.image_sha256, m.sha256);
        let on_disk = std::fs::read(&t.file).expect("target");
        assert!(
            on_disk[..expected.len()] == expected[..],
            "{name}: the target differs from qemu-img convert -O raw"
        );
        assert_eq!(report.target_sha256, sha(&expected), "{name}");
        // Past the image, the disk is untouched.
        assert_eq!(on_disk[expected.len()], (expected.len() % 251) as u8 | 1);
    }
}

#[test]
fn tampered_images_and_bad_manifests_are_refused() {
    let dir = Scratch::new("bad");
    let raw = dir.0.join("image.raw");
    make_raw(&raw);
    let qcow = dir.0.join("image.qcow2");
    ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "qcow2",
            raw.to_str().unwrap_or_default(),
            qcow.to_str().unwrap_or_default(),
        ],
    );
    let good = std::fs::read(&qcow).expect("qcow2");
    // Tampered: one byte of the last data cluster flipped after signing.
    let mut tampered = good.clone();
    let at = tampered.len() - 4096;
    tampered[at] ^= 0x55;
    let files: Files = Default::default();
    files
        .lock()
        .expect("files")
        .insert("good.qcow2".into(), good.clone());
    files
        .lock()
        .expect("files")
        .insert("tampered.qcow2".into(), tampered);
    let base = serve(files);
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let keys = [key.verifying_key()];

    // Tampered image under the genuine manifest: refused after streaming,
    // and every byte written is zeroed again.
    let t = target("tampered");
    let mut m = manifest(
        &key,
        &format!("{base}/tampered.qcow2"),
        Format::Qcow2,
        &good,
    );
    let err = deploy(&m, &keys, &t).expect_err("tampered");
    assert!(matches!(err, ImageError::Rejected(..)), "{err}");
    assert!(err.to_string().contains("sha256"), "{err}");
    let on_disk = std::fs::read(&t.file).expect("target");
    assert!(
        on_disk[..2 << 20].iter().all(|b| *b == 0),
        "what was written is zeroed"
    );
    drop(t);

    // The other refusals happen before the disk is opened.
    let t = target("manifests");
    let before = sha(&std::fs::read(&t.file).expect("target"));
    m.url = format!("{base}/good.qcow2");
    let mut wrong_sha = manifest(&key, &m.url, Format::Qcow2, &good);
    wrong_sha.sha256 = "0".repeat(64);
    let rogue = SigningKey::generate(&mut rand::rngs::OsRng);
    let unknown = manifest(&rogue, &m.url, Format::Qcow2, &good);
    let mut unsigned = manifest(&key, &m.url, Format::Qcow2, &good);
    unsigned.signature = None;
    // A signed installer ISO is an agentless pool's, never streamed.
    let iso = manifest(&key, &m.url, Format::Iso, &good);
    for (what, bad) in [
        ("wrong sha256", wrong_sha),
        ("unknown key", unknown),
        ("unsigned", unsigned),
        ("an iso", iso),
    ] {
        let err = deploy(&bad, &keys, &t).expect_err(what);
        assert!(
            matches!(
                err,
                ImageError::Untrusted | ImageError::Unsigned | ImageError::NotADiskImage
            ),
            "{what}: {err}"
        );
        assert!(
            err.to_string().contains("nothing was written"),
            "{what}: {err}"
        );
    }
    assert_eq!(
        sha(&std::fs::read(&t.file).expect("target")),
        before,
        "the disk was not touched"
    );
}

/// A catalog image comes from the boot server's cache when it has it (the
/// report names the source), from the manifest's URL when it does not, and
/// a cache serving other bytes is refused like any tampered image.
#[test]
fn a_catalog_image_comes_from_the_sites_cache_first() {
    let dir = Scratch::new("cache");
    let raw = dir.0.join("image.raw");
    make_raw(&raw);
    let good = std::fs::read(&raw).expect("raw");
    let files: Files = Default::default();
    files
        .lock()
        .expect("files")
        .insert("origin.raw".into(), good.clone());
    files
        .lock()
        .expect("files")
        .insert("cached.raw".into(), good.clone());
    let mut bad = good.clone();
    bad[100] ^= 0x55;
    files.lock().expect("files").insert("stale.raw".into(), bad);
    let base = serve(files);
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let keys = [key.verifying_key()];
    let m = manifest(&key, &format!("{base}/origin.raw"), Format::Raw, &good);
    let with_cache = |url: &str| DeployOptions {
        cached_url: Some(url.to_owned()),
        ..Default::default()
    };
    let run = |opts: &DeployOptions, name: &str| {
        let t = target(name);
        let d = disks::describe(&t.disk.dev).expect("describe");
        (image::deploy(&m, &keys, &d, opts, &mut |_, _| {}), t)
    };

    let (r, _t) = run(&with_cache(&format!("{base}/cached.raw")), "from-cache");
    let r = r.expect("deployed from the cache");
    assert_eq!(
        r.source.as_deref(),
        Some(format!("{base}/cached.raw").as_str())
    );
    assert_eq!(r.image_sha256, sha(&good));

    let (r, _t) = run(&with_cache(&format!("{base}/missing.raw")), "not-cached");
    let r = r.expect("deployed from the origin");
    assert_eq!(
        r.source.as_deref(),
        Some(format!("{base}/origin.raw").as_str())
    );

    let (r, _t) = run(&with_cache("http://127.0.0.1:9/nothing"), "cache-down");
    assert_eq!(
        r.expect("deployed from the origin").source.as_deref(),
        Some(format!("{base}/origin.raw").as_str())
    );

    let (r, _t) = run(&with_cache(&format!("{base}/stale.raw")), "stale-cache");
    let err = r.expect_err("the manifest refuses other bytes");
    assert!(matches!(err, ImageError::Rejected(..)), "{err}");
}

#[test]
fn a_disk_that_drops_writes_fails_the_read_back_whatever_the_format() {
    // The read-back is what proves the target holds the image (a raw
    // image's target sha256 is the stream's once it passes): a disk that
    // acknowledges writes and keeps none must fail it.
    let dir = Scratch::new("img-liar");
    let images = raw_and_qcow2(&dir);
    let (base, rbytes, qbytes) = (&images.base, &images.raw, &images.qcow);
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let keys = [key.verifying_key()];
    for (name, format, bytes) in [
        ("image.raw", Format::Raw, &rbytes),
        ("image.qcow2", Format::Qcow2, &qbytes),
    ] {
        let backing = dir.0.join(format!("backing-{name}"));
        let junk: Vec<u8> = (0..(128u32 << 20)).map(|i| (i % 251) as u8 | 1).collect();
        std::fs::write(&backing, &junk).expect("junk");
        let liar = LyingDisk::mount(&backing, &dir.0.join(format!("mnt-{name}")));
        let d = disks::describe(&liar.file).expect("describe");
        let m = manifest(&key, &format!("{base}/{name}"), format, bytes);
        let got = image::deploy(&m, &keys, &d, &DeployOptions::default(), &mut |_, _| {});
        match got {
            Err(ImageError::Rejected(why, _)) => assert!(
                why.contains("read-back of the target differs from what was written at offset 0"),
                "{name}: {why}"
            ),
            other => panic!("{name}: a disk that kept nothing passed: {other:?}"),
        }
        drop(liar);
        assert!(
            std::fs::read(&backing).expect("backing") == junk,
            "{name}: the lying disk kept a write"
        );
    }
}

#[test]
fn a_block_mapped_raw_image_fetches_only_its_runs_and_lands_the_same() {
    let dir = Scratch::new("bmap");
    let served = dir.0.join("served");
    std::fs::create_dir_all(&served).expect("dir");
    let raw = served.join("image.raw");
    make_raw(&raw);
    // A tail past the last whole MiB: the last run ends with the image.
    let mut bytes = std::fs::read(&raw).expect("raw");
    bytes.extend((0..300u32).map(|i| (i % 13) as u8 + 1));
    std::fs::write(&raw, &bytes).expect("tail");
    let runs = runs_of(&bytes);
    assert_eq!(runs.len(), 4, "make_raw writes four runs: {runs:?}");
    assert_eq!(runs[3].length, (1 << 20) + 300);
    let data: u64 = runs.iter().map(|r| r.length).sum();
    assert_eq!(data, (7 << 20) + 300);
    let ranged = serve_dir(&served);
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let keys = [key.verifying_key()];

    // From a server with ranges: the runs only, each checked.
    let m = mapped_manifest(&key, &format!("{ranged}/image.raw"), &bytes, runs.clone());
    let t = target("bmap-ranged");
    let r = deploy(&m, &keys, &t).expect("deployed by its runs");
    assert_eq!(r.data_ranges_checked, Some(4));
    assert_eq!(r.bytes_downloaded, data, "only the runs travel");
    assert_eq!(r.source.as_deref(), Some(m.url.as_str()));
    let on_disk = std::fs::read(&t.file).expect("target");
    assert!(
        on_disk[..bytes.len()] == bytes[..],
        "the target is the image, zeros included (the junk between the runs is zeroed)"
    );
    assert_eq!(on_disk[bytes.len()], (bytes.len() % 251) as u8 | 1);
    drop(t);

    // From a server that ignores ranges: the whole image, hashed whole.
    let files: Files = Default::default();
    files
        .lock()
        .expect("files")
        .insert("image.raw".into(), bytes.clone());
    let plain = serve(files);
    let m_plain = mapped_manifest(&key, &format!("{plain}/image.raw"), &bytes, runs.clone());
    let t = target("bmap-plain");
    let r = deploy(&m_plain, &keys, &t).expect("deployed whole");
    assert_eq!(r.data_ranges_checked, None);
    assert_eq!(r.bytes_downloaded, bytes.len() as u64);
    assert!(std::fs::read(&t.file).expect("target")[..bytes.len()] == bytes[..]);
    drop(t);

    // A block map changed after signing: refused before the disk is touched.
    let t = target("bmap-forged");
    let before = sha(&std::fs::read(&t.file).expect("target"));
    let mut forged = m.clone();
    if let Some(r) = forged.data_ranges.as_mut().and_then(|r| r.last_mut()) {
        r.offset -= 1 << 20;
    }
    let err = deploy(&forged, &keys, &t).expect_err("a forged block map");
    assert!(matches!(err, ImageError::Untrusted), "{err}");
    assert_eq!(sha(&std::fs::read(&t.file).expect("target")), before);
    drop(t);

    // Servers answering a range wrongly: refused, what was written zeroed.
    for (mode, why) in [
        ("other", "Content-Range"),
        ("total", "Content-Range"),
        ("short", "shorter than the block map's"),
        ("long", "longer than the block map's"),
        ("whole-later", "HTTP 200"),
    ] {
        let lying = mapped_manifest(
            &key,
            &format!("{ranged}/lying/{mode}/image.raw"),
            &bytes,
            runs.clone(),
        );
        let t = target(&format!("bmap-lying-{mode}"));
        let err = deploy(&lying, &keys, &t).expect_err(mode);
        match &err {
            ImageError::Rejected(why_not, _) => assert!(why_not.contains(why), "{mode}: {why_not}"),
            other => panic!("{mode}: {other}"),
        }
        assert_nothing_of_the_image_left(&t, &runs, mode);
    }

    // A signed block map that leaves out data the image has: streamed whole
    // (the server ignores ranges), the data outside the map is refused.
    let mut partial = runs.clone();
    partial.remove(2);
    let m_partial = mapped_manifest(&key, &format!("{plain}/image.raw"), &bytes, partial);
    let t = target("bmap-partial");
    let err = deploy(&m_partial, &keys, &t).expect_err("data outside the map");
    match &err {
        ImageError::Rejected(why, _) => assert!(
            why.contains(&format!("data at {}, outside every run", 50u64 << 20)),
            "{why}"
        ),
        other => panic!("{other}"),
    }
    drop(t);

    // A run changed on the server after signing: refused, what was written zeroed.
    let mut changed = bytes.clone();
    changed[(17 << 20) + 4096] ^= 0x55;
    std::fs::write(&raw, &changed).expect("tamper");
    let t = target("bmap-tampered");
    let err = deploy(&m, &keys, &t).expect_err("a changed run");
    match &err {
        ImageError::Rejected(why, _) => assert!(
            why.contains("run 1 at 17825792") && why.contains("sha256"),
            "{why}"
        ),
        other => panic!("{other}"),
    }
    assert_nothing_of_the_image_left(&t, &runs, "a changed run");
}

/// Every MiB of the runs on the target is zeros (written, then zeroed
/// again) or the target's junk (never written): nothing of the image stays.
fn assert_nothing_of_the_image_left(t: &Target, runs: &[DataRange], what: &str) {
    let on_disk = std::fs::read(&t.file).expect("target");
    for run in runs {
        let (from, to) = (run.offset as usize, (run.offset + run.length) as usize);
        for (i, piece) in on_disk[from..to].chunks(1 << 20).enumerate() {
            let at = from + (i << 20);
            let zeroed = piece.iter().all(|b| *b == 0);
            let junk = piece
                .iter()
                .enumerate()
                .all(|(j, b)| *b == ((at + j) % 251) as u8 | 1);
            assert!(
                zeroed || junk,
                "{what}: the image's MiB at {at} was left on the target"
            );
        }
    }
}

#[test]
fn a_bad_run_fails_the_deploy_before_the_rest_of_the_image_is_fetched() {
    // Ten runs of 1 MiB, a MiB apart; the first changed on the server after
    // signing. The hashing thread is at most its four 1 MiB buffers behind
    // the stream, so the first run's digest is checked before the seventh
    // run is asked for: the last runs never travel.
    let dir = Scratch::new("bmap-early");
    let served = dir.0.join("served");
    std::fs::create_dir_all(&served).expect("dir");
    let mut bytes = vec![0u8; 20 << 20];
    for (i, b) in bytes.iter_mut().enumerate() {
        if (i >> 20) % 2 == 0 {
            *b = (i % 253) as u8 | 1;
        }
    }
    let runs = runs_of(&bytes);
    assert_eq!(runs.len(), 10);
    let mut changed = bytes.clone();
    changed[4096] ^= 0x55;
    std::fs::write(served.join("image.raw"), &changed).expect("image");
    let base = serve_dir(&served);
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let m = mapped_manifest(&key, &format!("{base}/image.raw"), &bytes, runs.clone());
    let t = target("bmap-early-target");
    let d = disks::describe(&t.disk.dev).expect("describe");
    let mut fetched = 0u64;
    let got = image::deploy(
        &m,
        &[key.verifying_key()],
        &d,
        &DeployOptions::default(),
        &mut |done, _| fetched = fetched.max(done),
    );
    match got {
        Err(ImageError::Rejected(why, _)) => {
            assert!(why.contains("run 0 at 0+1048576: sha256"), "{why}")
        }
        other => panic!("a changed first run passed: {other:?}"),
    }
    assert!(
        fetched <= 7 << 20,
        "{fetched} bytes were fetched after the first run was known to be bad"
    );
    assert_nothing_of_the_image_left(&t, &runs, "a changed first run");
}
