//! Local key files for a site and its approvers, as `bcm quorum-keys`
//! writes them where no key management of your own issues them: the
//! control plane's policy key (`policy.key`), approver keys
//! (`approver-<n>.key`), each a 32-byte ed25519 seed in hex, mode 0600, and
//! the site's trust anchor naming their public keys (`anchor.json`). A file
//! that exists is kept.

use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;

use crate::{signing_key, Anchor};

/// What was written (or found).
pub struct Written {
    pub policy_key: PathBuf,
    pub approver_keys: Vec<PathBuf>,
    pub anchor: PathBuf,
}

fn key_file(path: &Path) -> std::io::Result<SigningKey> {
    if let Ok(text) = std::fs::read_to_string(path) {
        return signing_key(&text).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        });
    }
    let key = SigningKey::generate(&mut rand_core::OsRng);
    write_private(path, &hex::encode(key.to_bytes()))?;
    Ok(key)
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        o.mode(0o600);
    }
    o.open(path)?.write_all(text.as_bytes())
}

/// Writes the policy key, `approvers` approver keys and an anchor that
/// needs `quorum` of them (and takes the policy key for one-node batches)
/// into `dir`, keeping what is there.
pub fn write_missing(dir: &Path, approvers: usize, quorum: usize) -> std::io::Result<Written> {
    std::fs::create_dir_all(dir)?;
    let policy_key = dir.join("policy.key");
    let policy = key_file(&policy_key)?;
    let mut approver_keys = vec![];
    let mut keys = vec![];
    for n in 1..=approvers {
        let path = dir.join(format!("approver-{n}.key"));
        keys.push(key_file(&path)?);
        approver_keys.push(path);
    }
    let anchor = dir.join("anchor.json");
    if !anchor.exists() {
        let a = Anchor::of(&keys, quorum.max(1), Some(&policy));
        let text = serde_json::to_string_pretty(&a).map_err(std::io::Error::other)?;
        std::fs::write(&anchor, text + "\n")?;
    }
    Ok(Written {
        policy_key,
        approver_keys,
        anchor,
    })
}
