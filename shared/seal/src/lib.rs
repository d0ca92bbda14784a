//! Sealing secrets at rest: XChaCha20-Poly1305 under keys that carry an id,
//! so keys rotate without re-sealing in one go. A sealed value is bound to
//! its owner through the associated data (for BMC credentials, the node id),
//! so a ciphertext copied onto another row does not open.
//!
//! Plaintext only exists as [`secrecy`] types, whose `Debug` prints
//! `[REDACTED]`; nothing here logs.

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretBox, SecretString};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Errors of sealing and opening.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("sealing key {0:?} is not configured")]
    UnknownKey(String),
    #[error("sealing key {id:?} is invalid: {why}")]
    BadKey { id: String, why: &'static str },
    #[error("no sealing key is configured")]
    NoKeys,
    #[error("the sealed value does not open with key {0:?} (tampered, or bound to another owner)")]
    Open(String),
    #[error("the sealed value is not valid JSON of the expected shape")]
    Shape,
}

/// A sealed value as it is stored.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    pub key_id: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealed")
            .field("key_id", &self.key_id)
            .field("len", &self.ciphertext.len())
            .finish()
    }
}

/// A sealing key as configured: an id and 32 bytes in base64.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    pub id: String,
    pub key: SecretString,
}

impl std::fmt::Debug for KeyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyConfig")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl KeyConfig {
    /// A fresh random key with the given id, for development set-ups.
    pub fn generate(id: &str) -> Self {
        let mut key = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut key);
        Self {
            id: id.to_owned(),
            key: base64::engine::general_purpose::STANDARD.encode(key).into(),
        }
    }
}

/// Seals with the active key and opens with any configured key.
pub struct Sealer {
    keys: BTreeMap<String, XChaCha20Poly1305>,
    active: String,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("keys", &self.keys.keys().collect::<Vec<_>>())
            .field("active", &self.active)
            .finish()
    }
}

impl Sealer {
    /// Builds a sealer from configured keys; the first one seals.
    pub fn new(keys: &[KeyConfig]) -> Result<Self, SealError> {
        let active = keys.first().ok_or(SealError::NoKeys)?.id.clone();
        let mut map = BTreeMap::new();
        for k in keys {
            let bad = |why| SealError::BadKey {
                id: k.id.clone(),
                why,
            };
            if k.id.is_empty() || k.id.len() > 64 {
                return Err(bad("the id must be 1-64 characters"));
            }
            let raw = SecretBox::new(Box::new(
                base64::engine::general_purpose::STANDARD
                    .decode(k.key.expose_secret())
                    .map_err(|_| bad("not base64"))?,
            ));
            if raw.expose_secret().len() != 32 {
                return Err(bad("must be 32 bytes"));
            }
            let cipher = XChaCha20Poly1305::new_from_slice(raw.expose_secret())
                .map_err(|_| bad("must be 32 bytes"))?;
            map.insert(k.id.clone(), cipher);
        }
        Ok(Self { keys: map, active })
    }

    /// The id of the key new values are sealed with.
    pub fn active_key_id(&self) -> &str {
        &self.active
    }

    /// Seals `plaintext`, bound to `owner` (associated data).
    pub fn seal(&self, plaintext: &[u8], owner: &str) -> Result<Sealed, SealError> {
        let cipher = self
            .keys
            .get(&self.active)
            .ok_or_else(|| SealError::UnknownKey(self.active.clone()))?;
        let mut nonce = [0u8; 24];
        rand::thread_rng().fill_bytes(&mut nonce);
        let ciphertext = cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: owner.as_bytes(),
                },
            )
            .map_err(|_| SealError::Open(self.active.clone()))?;
        Ok(Sealed {
            key_id: self.active.clone(),
            nonce: nonce.to_vec(),
            ciphertext,
        })
    }

    /// Opens a sealed value bound to `owner`.
    pub fn open(&self, sealed: &Sealed, owner: &str) -> Result<SecretBox<Vec<u8>>, SealError> {
        let cipher = self
            .keys
            .get(&sealed.key_id)
            .ok_or_else(|| SealError::UnknownKey(sealed.key_id.clone()))?;
        if sealed.nonce.len() != 24 {
            return Err(SealError::Open(sealed.key_id.clone()));
        }
        cipher
            .decrypt(
                XNonce::from_slice(&sealed.nonce),
                Payload {
                    msg: &sealed.ciphertext,
                    aad: owner.as_bytes(),
                },
            )
            .map(|p| SecretBox::new(Box::new(p)))
            .map_err(|_| SealError::Open(sealed.key_id.clone()))
    }

    /// Seals BMC credentials for `owner`.
    pub fn seal_credentials(
        &self,
        creds: &BmcCredentials,
        owner: &str,
    ) -> Result<Sealed, SealError> {
        let wire = CredentialsWire {
            username: creds.username.expose_secret(),
            password: creds.password.expose_secret(),
        };
        let json = SecretBox::new(Box::new(serde_json_bytes(&wire)));
        self.seal(json.expose_secret(), owner)
    }

    /// Opens BMC credentials sealed for `owner`.
    pub fn open_credentials(
        &self,
        sealed: &Sealed,
        owner: &str,
    ) -> Result<BmcCredentials, SealError> {
        let plain = self.open(sealed, owner)?;
        let wire: CredentialsOwned =
            serde_json::from_slice(plain.expose_secret()).map_err(|_| SealError::Shape)?;
        Ok(BmcCredentials {
            username: wire.username.into(),
            password: wire.password.into(),
        })
    }
}

/// A fresh random BMC password of `len` (at least 12) letters and digits
/// with at least one lowercase letter, uppercase letter and digit: what a
/// rotation sets when the caller chose none. Letters and digits only, so
/// every BMC and tool takes it unchanged.
pub fn generate_password(len: usize) -> SecretString {
    use rand::seq::SliceRandom;
    const LOWER: &[u8] = b"abcdefghijkmnopqrstuvwxyz";
    const UPPER: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZ";
    const DIGIT: &[u8] = b"23456789";
    let len = len.max(12);
    let mut rng = rand::thread_rng();
    let all: Vec<u8> = [LOWER, UPPER, DIGIT].concat();
    let mut chars: Vec<u8> = [LOWER, UPPER, DIGIT]
        .iter()
        .filter_map(|set| set.choose(&mut rng).copied())
        .collect();
    while chars.len() < len {
        if let Some(c) = all.choose(&mut rng) {
            chars.push(*c);
        }
    }
    chars.shuffle(&mut rng);
    String::from_utf8(chars).unwrap_or_default().into()
}

/// A BMC's username and password. Both redact in `Debug`.
#[derive(Debug, Clone, Deserialize)]
pub struct BmcCredentials {
    pub username: SecretString,
    pub password: SecretString,
}

#[derive(Serialize)]
struct CredentialsWire<'a> {
    username: &'a str,
    password: &'a str,
}

#[derive(Deserialize)]
struct CredentialsOwned {
    username: String,
    password: String,
}

fn serde_json_bytes(wire: &CredentialsWire<'_>) -> Vec<u8> {
    // Serializing two strings cannot fail.
    serde_json::to_vec(wire).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_round_trip_and_binding() {
        let sealer = Sealer::new(&[KeyConfig::generate("k1")]).expect("sealer");
        let creds = BmcCredentials {
            username: "admin".into(),
            password: "hunter2-secret".into(),
        };
        let sealed = sealer.seal_credentials(&creds, "node_a").expect("seal");
        assert!(!sealed.ciphertext.windows(6).any(|w| w == b"hunter"));
        let back = sealer.open_credentials(&sealed, "node_a").expect("open");
        assert_eq!(back.password.expose_secret(), "hunter2-secret");
        assert!(
            sealer.open_credentials(&sealed, "node_b").is_err(),
            "bound to its owner"
        );
        assert!(!format!("{back:?}").contains("hunter2"), "Debug redacts");
        assert!(!format!("{sealed:?}").contains("hunter2"));
    }

    #[test]
    fn generated_passwords_mix_classes_and_differ() {
        let a = generate_password(16);
        let b = generate_password(16);
        let a = a.expose_secret();
        assert_eq!(a.len(), 16);
        assert_ne!(a, b.expose_secret());
        assert!(a.chars().any(|c| c.is_ascii_lowercase()));
        assert!(a.chars().any(|c| c.is_ascii_uppercase()));
        assert!(a.chars().any(|c| c.is_ascii_digit()));
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn rotation_opens_old_keys_and_seals_with_the_first() {
        let old = KeyConfig::generate("old");
        let sealed = Sealer::new(std::slice::from_ref(&old))
            .expect("old")
            .seal(b"x", "o")
            .expect("seal");
        let rotated = Sealer::new(&[KeyConfig::generate("new"), old]).expect("rotated");
        assert_eq!(
            rotated.open(&sealed, "o").expect("open").expose_secret(),
            b"x"
        );
        assert_eq!(rotated.seal(b"y", "o").expect("seal").key_id, "new");
        assert!(matches!(Sealer::new(&[]), Err(SealError::NoKeys)));
        let short = KeyConfig {
            id: "s".into(),
            key: "AAAA".to_owned().into(),
        };
        assert!(matches!(
            Sealer::new(&[short]),
            Err(SealError::BadKey { .. })
        ));
    }
}
