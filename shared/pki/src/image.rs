//! Signed image manifests: what an image publisher signs (URL, format,
//! size, sha256) and what `bcd` checks against the keys the control plane
//! trusts BEFORE it touches a disk. Changing any field (a different
//! sha256, say) breaks the signature.

use base64::Engine as _;
use ed25519_dalek::{Signer, SigningKey, Verifier, VerifyingKey};
use serde_json::json;

/// The bytes a manifest signature covers.
pub fn manifest_input(url: &str, format: &str, size_bytes: u64, sha256: &str) -> Vec<u8> {
    let v = json!({ "url": url, "format": format, "sizeBytes": size_bytes, "sha256": sha256 });
    let mut input = b"bcm-image-manifest-v1\n".to_vec();
    input.extend_from_slice(crate::canonical_json(&v).as_bytes());
    input
}

/// Signs a manifest; the signature, base64.
pub fn sign_manifest(
    key: &SigningKey,
    url: &str,
    format: &str,
    size_bytes: u64,
    sha256: &str,
) -> String {
    let sig = key.sign(&manifest_input(url, format, size_bytes, sha256));
    base64::engine::general_purpose::STANDARD.encode(sig.to_bytes())
}

/// The index of the trusted key that signed the manifest, if any.
pub fn verify_manifest(
    keys: &[VerifyingKey],
    signature_b64: &str,
    url: &str,
    format: &str,
    size_bytes: u64,
    sha256: &str,
) -> Option<usize> {
    let sig = base64::engine::general_purpose::STANDARD
        .decode(signature_b64.as_bytes())
        .ok()
        .and_then(|b| ed25519_dalek::Signature::from_slice(&b).ok())?;
    let input = manifest_input(url, format, size_bytes, sha256);
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

    #[test]
    fn every_field_is_signed() {
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let keys = [key.verifying_key()];
        let sha = "a".repeat(64);
        let sig = sign_manifest(&key, "http://i/x.raw", "raw", 10, &sha);
        assert_eq!(
            verify_manifest(&keys, &sig, "http://i/x.raw", "raw", 10, &sha),
            Some(0)
        );
        assert_eq!(
            verify_manifest(&keys, &sig, "http://i/y.raw", "raw", 10, &sha),
            None
        );
        assert_eq!(
            verify_manifest(&keys, &sig, "http://i/x.raw", "qcow2", 10, &sha),
            None
        );
        assert_eq!(
            verify_manifest(&keys, &sig, "http://i/x.raw", "raw", 11, &sha),
            None
        );
        assert_eq!(
            verify_manifest(&keys, &sig, "http://i/x.raw", "raw", 10, &"b".repeat(64)),
            None
        );
        let other = SigningKey::generate(&mut rand::rngs::OsRng);
        assert_eq!(
            verify_manifest(
                &[other.verifying_key()],
                &sig,
                "http://i/x.raw",
                "raw",
                10,
                &sha
            ),
            None
        );
        assert_eq!(
            verify_manifest(&keys, "not base64!", "http://i/x.raw", "raw", 10, &sha),
            None
        );
        let b64 = base64::engine::general_purpose::STANDARD.encode(key.verifying_key().to_bytes());
        assert_eq!(parse_public_key(&b64), Some(key.verifying_key()));
    }
}
