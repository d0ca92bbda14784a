//! `metalctl image`: what an image publisher runs. `keygen` makes an
//! ed25519 signing key (the public half goes into the attestation service's
//! `image_keys`, which hands it to every joining agent); `sign` hashes an
//! image file and prints the signed image reference a deploy profile
//! carries, with a raw image's block map (its runs of data, each with its
//! sha256) when the image has runs of zeros to leave out. `bcd` refuses to
//! write an image whose reference does not verify.

use anyhow::Context as _;
use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::io::Read as _;
use std::path::Path;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Writes a new private key (base64 seed, mode 0600) to `key_file`, which
/// must not exist; returns the public key (base64).
pub fn keygen(key_file: &Path) -> anyhow::Result<String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(key_file)
        .with_context(|| format!("creating {}", key_file.display()))?;
    if let Err(e) = writeln!(f, "{}", B64.encode(key.to_bytes())).and_then(|()| f.sync_all()) {
        // No half-written key left behind to block the next try.
        let _ = std::fs::remove_file(key_file);
        return Err(e).with_context(|| format!("writing {}", key_file.display()));
    }
    Ok(B64.encode(key.verifying_key().to_bytes()))
}

fn load_key(key_file: &Path) -> anyhow::Result<ed25519_dalek::SigningKey> {
    let text = std::fs::read_to_string(key_file)
        .with_context(|| format!("reading {}", key_file.display()))?;
    let bytes = B64
        .decode(text.trim())
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
        .with_context(|| {
            format!(
                "{} is not a base64 ed25519 key (metalctl image keygen)",
                key_file.display()
            )
        })?;
    Ok(ed25519_dalek::SigningKey::from_bytes(&bytes))
}

/// Hashes `image` and signs its manifest: the image reference (camelCase,
/// as a deploy profile's `image`). A raw image gets a block map when
/// `block_map` is set and some of its 1 MiB chunks are all zeros.
pub fn sign(
    key_file: &Path,
    image: &Path,
    url: &str,
    format: &str,
    block_map: bool,
) -> anyhow::Result<Value> {
    anyhow::ensure!(
        matches!(format, "raw" | "qcow2"),
        "--format must be raw or qcow2"
    );
    let key = load_key(key_file)?;
    let f = std::fs::File::open(image).with_context(|| format!("opening {}", image.display()))?;
    let scan = scan(f).with_context(|| format!("reading {}", image.display()))?;
    let mapped =
        block_map && format == "raw" && scan.runs.iter().map(|r| r.1).sum::<u64>() < scan.size;
    if mapped && scan.runs.len() > MAX_DATA_RANGES {
        eprintln!(
            "{} has {} runs of data, more than a block map lists ({MAX_DATA_RANGES}): signed without one; machines will stream it whole",
            image.display(),
            scan.runs.len()
        );
    }
    let ranges: Option<Vec<(u64, u64, String)>> =
        (mapped && scan.runs.len() <= MAX_DATA_RANGES).then_some(scan.runs);
    let signed: Option<Vec<(u64, u64, &str)>> = ranges
        .as_ref()
        .map(|r| r.iter().map(|(o, l, s)| (*o, *l, s.as_str())).collect());
    let signature = bcm_pki::image::sign_manifest(
        &key,
        &bcm_pki::image::ManifestFields {
            url,
            format,
            size_bytes: scan.size,
            sha256: &scan.sha256,
            data_ranges: signed.as_deref(),
        },
    );
    let mut r = json!({
        "url": url, "format": format, "sha256": scan.sha256, "sizeBytes": scan.size, "signature": signature,
    });
    if let Some(ranges) = ranges {
        r["dataRanges"] = ranges
            .iter()
            .map(|(offset, length, sha256)| json!({"offset": offset, "length": length, "sha256": sha256}))
            .collect();
    }
    Ok(r)
}

use bcm_core::deploy::{DATA_RANGE_ALIGN, MAX_DATA_RANGES};

/// An image file read once: its size, its sha256, and its runs of 1 MiB
/// chunks that are not all zeros (offset, length, sha256).
struct Scan {
    size: u64,
    sha256: String,
    runs: Vec<(u64, u64, String)>,
}

fn scan(mut f: std::fs::File) -> std::io::Result<Scan> {
    let mut whole = Sha256::new();
    let mut run: Option<(u64, u64, Sha256)> = None;
    let mut runs = Vec::new();
    let (mut size, mut buf) = (0u64, vec![0u8; DATA_RANGE_ALIGN as usize]);
    loop {
        let mut n = 0;
        while n < buf.len() {
            match f.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(got) => n += got,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        whole.update(chunk);
        if chunk.iter().all(|b| *b == 0) {
            if let Some((o, l, h)) = run.take() {
                runs.push((o, l, hex::encode(h.finalize())));
            }
        } else {
            let (_, len, h) = run.get_or_insert_with(|| (size, 0, Sha256::new()));
            h.update(chunk);
            *len += n as u64;
        }
        size += n as u64;
        if n < buf.len() {
            break;
        }
    }
    if let Some((o, l, h)) = run.take() {
        runs.push((o, l, hex::encode(h.finalize())));
    }
    Ok(Scan {
        size,
        sha256: hex::encode(whole.finalize()),
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_reference_verifies_with_the_public_key_and_only_as_signed() {
        let dir = std::env::temp_dir().join(format!("metalctl-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (key, img) = (dir.join("k"), dir.join("img"));
        let _ = std::fs::remove_file(&key);
        std::fs::write(&img, b"an image").expect("img");
        let public = keygen(&key).expect("keygen");
        assert!(
            keygen(&key).is_err(),
            "an existing key is never overwritten"
        );
        let r = sign(&key, &img, "http://x/img.raw", "raw", true).expect("sign");
        assert_eq!(r["sizeBytes"], 8);
        assert!(r.get("dataRanges").is_none(), "no zeros, no block map: {r}");
        let vk = bcm_pki::image::parse_public_key(&public).expect("public key");
        let check = |url: &str| {
            bcm_pki::image::verify_manifest(
                &[vk],
                r["signature"].as_str().unwrap_or_default(),
                &bcm_pki::image::ManifestFields {
                    url,
                    format: "raw",
                    size_bytes: 8,
                    sha256: r["sha256"].as_str().unwrap_or_default(),
                    data_ranges: None,
                },
            )
        };
        assert_eq!(check("http://x/img.raw"), Some(0));
        assert_eq!(check("http://y/img.raw"), None);
        assert!(sign(&key, &img, "http://x/img.raw", "vhd", true).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_raw_image_with_zeros_gets_a_block_map_of_its_data_that_validates_and_verifies() {
        const M: usize = DATA_RANGE_ALIGN as usize;
        let dir = std::env::temp_dir().join(format!("metalctl-bmap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (key, img) = (dir.join("k"), dir.join("img"));
        let _ = std::fs::remove_file(&key);
        let public = keygen(&key).expect("keygen");
        // data 0..2 MiB, zeros 2..4, data 4..5 (one byte set), zeros, a tail of 100 bytes.
        let mut bytes = vec![0u8; 7 * M + 100];
        bytes[..2 * M].fill(7);
        bytes[4 * M + 12_345] = 1;
        bytes[7 * M + 99] = 9;
        std::fs::write(&img, &bytes).expect("img");
        let r = sign(&key, &img, "http://x/img.raw", "raw", true).expect("sign");
        let image: bcm_core::deploy::ImageRef =
            serde_json::from_value(r.clone()).expect("a deploy profile's image reference");
        assert_eq!(image.validate(), Ok(()));
        let ranges = image.data_ranges.clone().expect("a block map");
        let sha = |b: &[u8]| hex::encode(Sha256::digest(b));
        let want: Vec<(u64, u64, String)> = vec![
            (0, 2 * M as u64, sha(&bytes[..2 * M])),
            (4 * M as u64, M as u64, sha(&bytes[4 * M..5 * M])),
            (7 * M as u64, 100, sha(&bytes[7 * M..])),
        ];
        let got: Vec<(u64, u64, String)> = ranges
            .iter()
            .map(|d| (d.offset, d.length, d.sha256.clone()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(image.sha256, sha(&bytes));
        let vk = bcm_pki::image::parse_public_key(&public).expect("public key");
        let runs: Vec<(u64, u64, &str)> =
            got.iter().map(|(o, l, s)| (*o, *l, s.as_str())).collect();
        let fields = bcm_pki::image::ManifestFields {
            url: "http://x/img.raw",
            format: "raw",
            size_bytes: bytes.len() as u64,
            sha256: &image.sha256,
            data_ranges: Some(&runs),
        };
        let sig = image.signature.clone().unwrap_or_default();
        assert_eq!(
            bcm_pki::image::verify_manifest(&[vk], &sig, &fields),
            Some(0)
        );
        let without = sign(&key, &img, "http://x/img.raw", "raw", false).expect("sign");
        assert!(without.get("dataRanges").is_none());
        let qcow = sign(&key, &img, "http://x/img.qcow2", "qcow2", true).expect("sign");
        assert!(
            qcow.get("dataRanges").is_none(),
            "a block map is a raw image's"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
