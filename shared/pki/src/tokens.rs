//! One-time join tokens: random 256-bit secrets with a recognisable prefix.
//! Only their SHA-256 is ever stored.

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

/// The stored form of a token.
pub fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

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
