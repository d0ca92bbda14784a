//! `metalctl image`: what an image publisher runs. `keygen` makes an
//! ed25519 signing key (the public half goes into the attestation service's
//! `image_keys`, which hands it to every joining agent); `sign` hashes an
//! image file and prints the signed image reference a deploy profile
//! carries. `bcd` refuses to write an image whose reference does not verify.

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
/// as a deploy profile's `image`).
pub fn sign(key_file: &Path, image: &Path, url: &str, format: &str) -> anyhow::Result<Value> {
    anyhow::ensure!(
        matches!(format, "raw" | "qcow2"),
        "--format must be raw or qcow2"
    );
    let key = load_key(key_file)?;
    let mut f =
        std::fs::File::open(image).with_context(|| format!("opening {}", image.display()))?;
    let (mut hasher, mut size, mut buf) = (Sha256::new(), 0u64, vec![0u8; 1 << 20]);
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    let sha256 = hex::encode(hasher.finalize());
    let signature = bcm_pki::image::sign_manifest(&key, url, format, size, &sha256);
    Ok(json!({
        "url": url, "format": format, "sha256": sha256, "sizeBytes": size, "signature": signature,
    }))
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
        let r = sign(&key, &img, "http://x/img.raw", "raw").expect("sign");
        assert_eq!(r["sizeBytes"], 8);
        let vk = bcm_pki::image::parse_public_key(&public).expect("public key");
        let check = |url: &str| {
            bcm_pki::image::verify_manifest(
                &[vk],
                r["signature"].as_str().unwrap_or_default(),
                url,
                "raw",
                8,
                r["sha256"].as_str().unwrap_or_default(),
            )
        };
        assert_eq!(check("http://x/img.raw"), Some(0));
        assert_eq!(check("http://y/img.raw"), None);
        assert!(sign(&key, &img, "http://x/img.raw", "vhd").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
