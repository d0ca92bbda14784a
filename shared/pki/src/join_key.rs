//! Join references: what commands, the outbox, the bus and the boot
//! service's entry bucket carry in place of a join token. A reference
//! (`bcmjref_<id>`) names a join token without holding it; the token is
//! derived from the reference's id under a key ([`JoinKey`]) that only the
//! party delivering the token to the machine holds:
//! - the control plane holds the master key (it stores the token's hash
//!   when it mints the reference, and reveals the references in the user
//!   data it hands an agent);
//! - each site's boot service holds its site key (derived from the master
//!   for that site alone), and reveals the reference on the kernel command
//!   line of the iPXE script it serves behind a one-time link.
//!
//! A dump of the database, a copy of a stream or a log line therefore holds
//! no token, and one site's boot service cannot make another site's.

use crate::tokens::hmac_parts as hmac;
use base64::Engine as _;
use rand::RngCore;
use std::path::{Path, PathBuf};

/// The prefix of a join reference.
pub const REF_PREFIX: &str = "bcmjref_";
/// The length of a reference's id (a lowercase ULID).
pub const REF_ID_LEN: usize = 26;

/// A 256-bit key join tokens are derived under. `Debug` prints nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinKey([u8; 32]);

impl std::fmt::Debug for JoinKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JoinKey([REDACTED])")
    }
}

/// Why a join key cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum JoinKeyError {
    #[error("join key file {path}: {why}")]
    File { path: PathBuf, why: String },
    #[error("a join key is 32 bytes in base64")]
    Malformed,
    #[error("a join reference names no token this key can make: {0}")]
    NoKey(String),
}

impl JoinKey {
    /// A fresh random key.
    pub fn generate() -> JoinKey {
        let mut raw = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut raw);
        JoinKey(raw)
    }

    /// From its text form: 32 bytes in standard base64 (surrounding
    /// whitespace ignored).
    pub fn from_text(text: &str) -> Result<JoinKey, JoinKeyError> {
        base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .map(JoinKey)
            .ok_or(JoinKeyError::Malformed)
    }

    /// Its text form (what a key file holds).
    pub fn to_text(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.0)
    }

    /// Reads a key file.
    pub fn load(path: &Path) -> Result<JoinKey, JoinKeyError> {
        let text = std::fs::read_to_string(path).map_err(|e| JoinKeyError::File {
            path: path.to_owned(),
            why: e.to_string(),
        })?;
        JoinKey::from_text(&text).map_err(|e| JoinKeyError::File {
            path: path.to_owned(),
            why: e.to_string(),
        })
    }

    /// The key of `site`, derived from this (master) key: what that site's
    /// boot service holds. Another site's key does not follow from it.
    pub fn for_site(&self, site: &str) -> JoinKey {
        JoinKey(hmac(&self.0, &[b"bcm join key of site", site.as_bytes()]))
    }

    /// The join token a reference's `id` stands for under this (site)
    /// key, and the hash to store.
    pub fn token(&self, id: &str) -> (String, Vec<u8>) {
        crate::tokens::derive_prefixed(
            crate::tokens::PREFIX,
            &self.0,
            &[b"join token", id.as_bytes()],
        )
    }

    /// The bearer token of the session a join with `join_token` and `csr`
    /// opens, and its hash: derived under this (master) key, so every
    /// answer to one join (a retry with the same token and CSR) hands out
    /// the same token, and the attestation service, which stores only the
    /// hash, never sees it.
    pub fn session_token(&self, join_token: &str, csr: &str) -> (String, Vec<u8>) {
        let key = hmac(&self.0, &[b"bcm agent session key"]);
        crate::tokens::derive_prefixed("bcms_", &key, &[join_token.as_bytes(), csr.as_bytes()])
    }

    /// `text` with every join reference replaced by its token.
    pub fn reveal(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() + 64);
        let mut rest = text;
        while let Some(at) = rest.find(REF_PREFIX) {
            out.push_str(&rest[..at]);
            let after = &rest[at + REF_PREFIX.len()..];
            match ref_id(after) {
                Some(id) => {
                    out.push_str(&self.token(id).0);
                    rest = &after[REF_ID_LEN..];
                }
                None => {
                    out.push_str(REF_PREFIX);
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        out
    }
}

/// The id at the start of `s`, if it is one: 26 lowercase letters and
/// digits, not followed by another.
fn ref_id(s: &str) -> Option<&str> {
    let id = s.get(..REF_ID_LEN)?;
    let ok = id
        .bytes()
        .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
        && !s[REF_ID_LEN..]
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    ok.then_some(id)
}

/// Where a service finds its join key: a file (`join_key.file`, written by
/// `bcm nats-auth`), or a key handed over in process (the all-in-one, tests).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinKeyConfig {
    #[serde(default)]
    pub file: Option<PathBuf>,
    #[serde(skip)]
    pub key: Option<JoinKey>,
}

impl JoinKeyConfig {
    /// A key handed over in process.
    pub fn with_key(key: JoinKey) -> Self {
        Self {
            file: None,
            key: Some(key),
        }
    }

    /// Whether a key is configured at all.
    pub fn is_set(&self) -> bool {
        self.file.is_some() || self.key.is_some()
    }

    /// The key: the one handed over, else the file's; `None` when neither
    /// is configured.
    pub fn resolve(&self) -> Result<Option<JoinKey>, JoinKeyError> {
        match (&self.key, &self.file) {
            (Some(k), _) => Ok(Some(k.clone())),
            (None, Some(path)) => JoinKey::load(path).map(Some),
            (None, None) => Ok(None),
        }
    }
}

/// Writes the control plane's join key (`DIR/join.key`, made once and
/// kept) and each site's (`DIR/join-<site>.key`, derived from it), 0600.
pub fn write_keys(dir: &Path, sites: &[&str]) -> Result<(), JoinKeyError> {
    let io = |path: &Path, e: std::io::Error| JoinKeyError::File {
        path: path.to_owned(),
        why: e.to_string(),
    };
    let write = |path: &Path, key: &JoinKey| -> std::io::Result<()> {
        write_private(path, format!("{}\n", key.to_text()).as_bytes())
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let master_path = dir.join("join.key");
    let master = if master_path.exists() {
        JoinKey::load(&master_path)?
    } else {
        let k = JoinKey::generate();
        write(&master_path, &k).map_err(|e| io(&master_path, e))?;
        k
    };
    for site in sites {
        let path = dir.join(format!("join-{site}.key"));
        write(&path, &master.for_site(site)).map_err(|e| io(&path, e))?;
    }
    Ok(())
}

/// The reference for `id` (a lowercase ULID).
pub fn reference(id: &str) -> String {
    format!("{REF_PREFIX}{id}")
}

/// The references `text` holds (each once, in order of appearance).
pub fn references(text: &str) -> Vec<String> {
    let mut found: Vec<String> = vec![];
    let mut rest = text;
    while let Some(at) = rest.find(REF_PREFIX) {
        let after = &rest[at + REF_PREFIX.len()..];
        match ref_id(after) {
            Some(id) => {
                let r = reference(id);
                if !found.contains(&r) {
                    found.push(r);
                }
                rest = &after[REF_ID_LEN..];
            }
            None => rest = after,
        }
    }
    found
}

impl JoinKey {
    /// The tokens of every reference in `text`, by reference (what the API
    /// hands an agent beside a command's parameters).
    pub fn tokens_for(&self, text: &str) -> std::collections::BTreeMap<String, String> {
        references(text)
            .into_iter()
            .map(|r| {
                let token = self.token(&r[REF_PREFIX.len()..]).0;
                (r, token)
            })
            .collect()
    }
}

/// `text` with each reference that `tokens` names replaced by its token
/// (what an agent does with the user data it writes); references it does
/// not name stay as they are.
pub fn substitute(text: &str, tokens: &std::collections::BTreeMap<String, String>) -> String {
    tokens
        .iter()
        .filter(|(r, _)| r.starts_with(REF_PREFIX))
        .fold(text.to_owned(), |t, (r, token)| {
            t.replace(r.as_str(), token)
        })
}

/// Whether `text` holds a join reference.
pub fn has_reference(text: &str) -> bool {
    let mut rest = text;
    while let Some(at) = rest.find(REF_PREFIX) {
        let after = &rest[at + REF_PREFIX.len()..];
        if ref_id(after).is_some() {
            return true;
        }
        rest = after;
    }
    false
}

/// Writes a secret file readable by its owner alone (0600 on unix).
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    opts.mode(0o600);
    opts.open(path)?.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "01m8vas69nesyspnmz6e8an39q";

    #[test]
    fn site_keys_differ_and_tokens_follow_only_from_their_key() {
        let master = JoinKey::generate();
        let (a, b) = (master.for_site("a"), master.for_site("b"));
        assert_ne!(a, b);
        assert_eq!(a, master.for_site("a"));
        let (ta, ha) = a.token(ID);
        assert!(ta.starts_with(crate::tokens::PREFIX), "{ta}");
        assert_eq!(ha, crate::tokens::hash(&ta));
        assert_eq!(a.token(ID), (ta.clone(), ha));
        assert_ne!(b.token(ID).0, ta, "site b cannot make site a's token");
        assert_ne!(master.token(ID).0, ta);
        assert_ne!(a.token("01m8vas69nesyspnmz6e8an39r").0, ta);
    }

    #[test]
    fn references_are_revealed_in_place_and_nothing_else_is() {
        let key = JoinKey::generate().for_site("s1");
        let r = reference(ID);
        let text = format!("console=ttyS0 bcm.join={r} bcm.api=http://x");
        assert!(has_reference(&text));
        let shown = key.reveal(&text);
        assert_eq!(
            shown,
            format!(
                "console=ttyS0 bcm.join={} bcm.api=http://x",
                key.token(ID).0
            )
        );
        assert!(!has_reference(&shown));
        // Twice, at the edges, in YAML.
        let yaml = format!("{r}\njoin: \"{r}\"");
        let shown = key.reveal(&yaml);
        assert_eq!(shown.matches(&key.token(ID).0).count(), 2, "{shown}");
        // Not references: too short, too long, upper case, the bare prefix.
        for plain in [
            format!("{REF_PREFIX}01m8vas"),
            format!("{REF_PREFIX}{ID}x"),
            format!("{REF_PREFIX}{}", ID.to_uppercase()),
            REF_PREFIX.to_owned(),
            "bcm.join=".to_owned(),
            format!("{REF_PREFIX}é{ID}"),
        ] {
            assert!(!has_reference(&plain), "{plain}");
            assert_eq!(key.reveal(&plain), plain);
        }
    }

    #[test]
    fn an_agent_substitutes_what_it_was_handed() {
        let key = JoinKey::generate().for_site("s1");
        let other = "01m8vas69nesyspnmz6e8an39r";
        let text = format!(
            "a: {}\nb: {}\nc: {}",
            reference(ID),
            reference(other),
            reference(ID)
        );
        assert_eq!(references(&text), vec![reference(ID), reference(other)]);
        let tokens = key.tokens_for(&text);
        assert_eq!(tokens.len(), 2);
        assert_eq!(substitute(&text, &tokens), key.reveal(&text));
        let mut one = tokens.clone();
        one.remove(&reference(other));
        let partly = substitute(&text, &one);
        assert!(partly.contains(&reference(other)) && !partly.contains(&reference(ID)));
        // A map that names something other than a reference changes nothing.
        let mut odd = std::collections::BTreeMap::new();
        odd.insert("a:".to_owned(), "x".to_owned());
        assert_eq!(substitute(&text, &odd), text);
    }

    #[test]
    fn written_keys_are_private_kept_and_derived() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("bcm-join-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_keys(&dir, &["a", "b"]).expect("written");
        let master = JoinKey::load(&dir.join("join.key")).expect("master");
        for site in ["a", "b"] {
            let path = dir.join(format!("join-{site}.key"));
            assert_eq!(JoinKey::load(&path).expect("site"), master.for_site(site));
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{site}");
        }
        write_keys(&dir, &["a"]).expect("again");
        assert_eq!(JoinKey::load(&dir.join("join.key")).expect("kept"), master);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn keys_round_trip_as_text_and_refuse_garbage() {
        let k = JoinKey::generate();
        assert_eq!(
            JoinKey::from_text(&format!(" {}\n", k.to_text())).ok(),
            Some(k.clone())
        );
        assert!(!format!("{k:?}").contains(&k.to_text()));
        for bad in ["", "not base64!", "AAAA", &"A".repeat(100)] {
            assert!(JoinKey::from_text(bad).is_err(), "{bad}");
        }
    }
}
