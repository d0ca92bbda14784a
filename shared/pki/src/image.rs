//! Signed image manifests: what an image publisher signs (URL, format,
//! size, sha256, and a raw image's block map when it has one) and what
//! `bcd` checks against the keys the control plane trusts BEFORE it touches
//! a disk. Changing any field (a different sha256, a run moved) breaks the
//! signature. A manifest without a block map signs as it always did (v1).

use base64::Engine as _;
use ed25519_dalek::{Signer, SigningKey, Verifier, VerifyingKey};
use serde_json::json;

/// What a manifest signature covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManifestFields<'a> {
    pub url: &'a str,
    pub format: &'a str,
    pub size_bytes: u64,
    pub sha256: &'a str,
    /// A raw image's block map: each run's offset, length and sha256.
    pub data_ranges: Option<&'a [(u64, u64, &'a str)]>,
}

/// The bytes a manifest signature covers: v1 without a block map, v2 with
/// one (the runs as `[offset, length, sha256]`, in order).
pub fn manifest_input(m: &ManifestFields<'_>) -> Vec<u8> {
    let mut v =
        json!({ "url": m.url, "format": m.format, "sizeBytes": m.size_bytes, "sha256": m.sha256 });
    let mut input = match m.data_ranges {
        None => b"bcm-image-manifest-v1\n".to_vec(),
        Some(ranges) => {
            v["dataRanges"] = ranges
                .iter()
                .map(|(offset, length, sha)| json!([offset, length, sha]))
                .collect();
            b"bcm-image-manifest-v2\n".to_vec()
        }
    };
    input.extend_from_slice(crate::canonical_json(&v).as_bytes());
    input
}

/// Signs a manifest; the signature, base64.
pub fn sign_manifest(key: &SigningKey, m: &ManifestFields<'_>) -> String {
    let sig = key.sign(&manifest_input(m));
    base64::engine::general_purpose::STANDARD.encode(sig.to_bytes())
}

/// The index of the trusted key that signed the manifest, if any.
pub fn verify_manifest(
    keys: &[VerifyingKey],
    signature_b64: &str,
    m: &ManifestFields<'_>,
) -> Option<usize> {
    let sig = base64::engine::general_purpose::STANDARD
        .decode(signature_b64.as_bytes())
        .ok()
        .and_then(|b| ed25519_dalek::Signature::from_slice(&b).ok())?;
    let input = manifest_input(m);
    keys.iter().position(|k| k.verify(&input, &sig).is_ok())
}

/// Parses a base64 ed25519 public key.
pub fn parse_public_key(b64: &str) -> Option<VerifyingKey> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim().as_bytes())
        .ok()?;
    VerifyingKey::from_bytes(&<[u8; 32]>::try_from(bytes.as_slice()).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields<'a>(
        url: &'a str,
        format: &'a str,
        size_bytes: u64,
        sha256: &'a str,
        data_ranges: Option<&'a [(u64, u64, &'a str)]>,
    ) -> ManifestFields<'a> {
        ManifestFields {
            url,
            format,
            size_bytes,
            sha256,
            data_ranges,
        }
    }

    #[test]
    fn every_field_is_signed() {
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let keys = [key.verifying_key()];
        let sha = "a".repeat(64);
        let m = fields("http://i/x.raw", "raw", 10, &sha, None);
        let sig = sign_manifest(&key, &m);
        assert_eq!(verify_manifest(&keys, &sig, &m), Some(0));
        let other_sha = "b".repeat(64);
        for changed in [
            fields("http://i/y.raw", "raw", 10, &sha, None),
            fields("http://i/x.raw", "qcow2", 10, &sha, None),
            fields("http://i/x.raw", "raw", 11, &sha, None),
            fields("http://i/x.raw", "raw", 10, &other_sha, None),
            fields("http://i/x.raw", "raw", 10, &sha, Some(&[])),
        ] {
            assert_eq!(verify_manifest(&keys, &sig, &changed), None, "{changed:?}");
        }
        let other = SigningKey::generate(&mut rand::rngs::OsRng);
        assert_eq!(verify_manifest(&[other.verifying_key()], &sig, &m), None);
        assert_eq!(verify_manifest(&keys, "not base64!", &m), None);
        let b64 = base64::engine::general_purpose::STANDARD.encode(key.verifying_key().to_bytes());
        assert_eq!(parse_public_key(&b64), Some(key.verifying_key()));
    }

    #[test]
    fn every_run_of_a_block_map_is_signed() {
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let keys = [key.verifying_key()];
        let (sha, a, b) = ("a".repeat(64), "c".repeat(64), "d".repeat(64));
        let runs = [(0, 1 << 20, a.as_str()), (4 << 20, 1 << 20, b.as_str())];
        let m = fields("http://i/x.raw", "raw", 8 << 20, &sha, Some(&runs));
        let sig = sign_manifest(&key, &m);
        assert_eq!(verify_manifest(&keys, &sig, &m), Some(0));
        let changed: [&[(u64, u64, &str)]; 5] = [
            &[(0, 1 << 20, a.as_str())],
            &[(0, 1 << 20, a.as_str()), (5 << 20, 1 << 20, b.as_str())],
            &[(0, 1 << 20, a.as_str()), (4 << 20, 2 << 20, b.as_str())],
            &[(0, 1 << 20, b.as_str()), (4 << 20, 1 << 20, a.as_str())],
            &[(4 << 20, 1 << 20, b.as_str()), (0, 1 << 20, a.as_str())],
        ];
        for runs in changed {
            let m = fields("http://i/x.raw", "raw", 8 << 20, &sha, Some(runs));
            assert_eq!(verify_manifest(&keys, &sig, &m), None, "{runs:?}");
        }
        let without = fields("http://i/x.raw", "raw", 8 << 20, &sha, None);
        assert_eq!(
            verify_manifest(&keys, &sig, &without),
            None,
            "a block map cannot be dropped from a signed manifest"
        );
    }
}
