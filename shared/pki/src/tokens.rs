//! One-time join tokens: random 256-bit secrets with a recognisable prefix;
//! agent session tokens, derived so that a join processed twice hands out
//! one token. Only their SHA-256 is ever stored.

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// The prefix of every join token.
pub const PREFIX: &str = "bcmj_";

/// A fresh join token and the hash to store.
pub fn mint() -> (String, Vec<u8>) {
    mint_prefixed(PREFIX)
}

/// A fresh 256-bit secret with `prefix` (e.g. `bcms_` for agent sessions)
/// and the hash to store.
pub fn mint_prefixed(prefix: &str) -> (String, Vec<u8>) {
    let mut raw = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut raw);
    let token = format!("{prefix}{}", hex::encode(raw));
    let hash = hash(&token);
    (token, hash)
}

/// A 256-bit secret with `prefix` derived from `key` and `parts`
/// (HMAC-SHA-256 over the length-prefixed parts), and the hash to store:
/// the same inputs give the same token, so an operation processed twice
/// (a retried join racing the orphaned first request) hands out one token,
/// and whoever holds either answer holds the live one.
pub fn derive_prefixed(prefix: &str, key: &[u8], parts: &[&[u8]]) -> (String, Vec<u8>) {
    let token = format!("{prefix}{}", hex::encode(hmac_parts(key, parts)));
    let hash = hash(&token);
    (token, hash)
}

/// HMAC-SHA-256 under `key` over the length-prefixed `parts` (so moving a
/// byte from one part to the next changes it).
pub fn hmac_parts(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    };
    for p in parts {
        mac.update(&(p.len() as u64).to_be_bytes());
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

/// The stored form of a token.
pub fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_tokens_are_stable_per_input_and_differ_otherwise() {
        let (a, ha) = derive_prefixed("bcms_", b"key", &[b"token", b"serial"]);
        let (b, hb) = derive_prefixed("bcms_", b"key", &[b"token", b"serial"]);
        assert_eq!((&a, &ha), (&b, &hb));
        assert!(a.starts_with("bcms_") && a.len() == 5 + 64, "{a}");
        assert_eq!(ha, hash(&a));
        for (key, parts) in [
            (&b"other"[..], [&b"token"[..], &b"serial"[..]]),
            (&b"key"[..], [&b"token"[..], &b"serial2"[..]]),
            // Length-prefixed: moving a byte between parts changes it.
            (&b"key"[..], [&b"tokens"[..], &b"erial"[..]]),
        ] {
            assert_ne!(derive_prefixed("bcms_", key, &parts).0, a);
        }
    }

    #[test]
    fn tokens_are_unique_and_hash_stably() {
        let (a, ha) = mint();
        let (b, hb) = mint();
        assert_ne!(a, b);
        assert_ne!(ha, hb);
        assert!(a.starts_with(PREFIX) && a.len() == PREFIX.len() + 64);
        assert_eq!(hash(&a), ha);
    }
}
