//! What `bcd ramdisk` keeps across a restart of its own process (a crash,
//! an init system restarting it) in a directory on the machine — `/run/bcd`
//! in the ramdisk: tmpfs, gone with the boot, as the ramdisk's identity
//! should be — and what `bcd node` keeps on the installed OS's disk
//! (`/var/lib/bcd`): its identity, key and certificate in one file, that
//! it rejoins with after every boot. The ramdisk keeps its key (before it joins, so a join retried after a restart
//! holds the same key and gets the same identity back) and its session,
//! and per command id that it began and the result it posted. A command is
//! then run at most once by this machine even when bcd dies mid-run (it is
//! answered as interrupted, retryably, not run again), and a repeat is
//! answered from the record. Files are written whole (a temporary file
//! renamed over) and readable by root only; one that does not read is
//! ignored with a log line.

use bcm_contracts::agent::{AgentResult, JoinResponse};
use ed25519_dalek::SigningKey;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// An identity as kept on disk.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct KeptIdentity {
    /// The ed25519 secret key, hex.
    key: String,
    joined: JoinResponse,
}

/// The agent's durable state (or none: every record is then forgotten).
#[derive(Debug, Clone, Default)]
pub struct AgentState {
    dir: Option<PathBuf>,
}

/// A command id as a file name: ids are `cmd_<ulid>`; anything else is
/// hex-encoded, so no id names a path outside the directory.
fn file_name(id: &str) -> String {
    if !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        id.to_owned()
    } else {
        format!("x{}", hex::encode(id.as_bytes()))
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    // Synced again under its new name, then its directory: a power cut (a
    // BMC's power cycle) must not lose the rename, and on FAT (an
    // installed disk's boot partition) the new directory entry gets the
    // file's size and first cluster only when the file itself is written
    // back — synced as the temporary file, it would come back empty.
    std::fs::File::open(path)?.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl AgentState {
    /// State kept in `dir` (created 0700), or nowhere.
    pub fn open(dir: Option<PathBuf>) -> std::io::Result<Self> {
        if let Some(d) = &dir {
            for sub in [d.clone(), d.join("begun"), d.join("results")] {
                std::fs::create_dir_all(&sub)?;
                std::fs::set_permissions(
                    &sub,
                    std::os::unix::fs::PermissionsExt::from_mode(0o700),
                )?;
            }
        }
        Ok(Self { dir })
    }

    fn read<T: serde::de::DeserializeOwned>(&self, rel: &str) -> Option<T> {
        let path = self.dir.as_ref()?.join(rel);
        let bytes = std::fs::read(&path).ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "ignoring a state file that does not read");
                None
            }
        }
    }

    fn write<T: serde::Serialize>(&self, rel: &str, v: &T) -> std::io::Result<()> {
        let Some(d) = &self.dir else {
            return Ok(());
        };
        let bytes = serde_json::to_vec(v).map_err(std::io::Error::other)?;
        write_private(&d.join(rel), &bytes)
    }

    /// The kept key, if any.
    pub fn key(&self) -> Option<SigningKey> {
        let hex_key: String = self.read("key.json")?;
        let bytes = hex::decode(hex_key).ok()?;
        Some(SigningKey::from_bytes(
            &<[u8; 32]>::try_from(bytes.as_slice()).ok()?,
        ))
    }

    /// Keeps the key (before the join that uses it).
    pub fn save_key(&self, key: &SigningKey) -> std::io::Result<()> {
        self.write("key.json", &hex::encode(key.to_bytes()))
    }

    /// The kept session, if joined.
    pub fn session(&self) -> Option<JoinResponse> {
        self.read("session.json")
    }

    /// Keeps the session a join answered with.
    pub fn save_session(&self, joined: &JoinResponse) -> std::io::Result<()> {
        self.write("session.json", joined)
    }

    /// Forgets the session (the control plane ended it).
    pub fn forget_session(&self) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_file(d.join("session.json"));
            let _ = std::fs::remove_file(d.join("key.json"));
        }
    }

    /// An installed OS's kept identity (`bcd node`'s state directory on its
    /// disk): the key and the answer it holds a certificate by, in one
    /// file, so a renewal that dies half-way leaves the old pair or the
    /// new one, never a key with another key's certificate.
    pub fn identity(&self) -> Option<(SigningKey, JoinResponse)> {
        let kept: KeptIdentity = self.read("identity.json")?;
        let bytes = hex::decode(&kept.key).ok()?;
        let key = SigningKey::from_bytes(&<[u8; 32]>::try_from(bytes.as_slice()).ok()?);
        Some((key, kept.joined))
    }

    /// Keeps an identity (after a join, a rejoin or a renewal).
    pub fn save_identity(&self, key: &SigningKey, joined: &JoinResponse) -> std::io::Result<()> {
        self.write(
            "identity.json",
            &KeptIdentity {
                key: hex::encode(key.to_bytes()),
                joined: joined.clone(),
            },
        )
    }

    /// Records that command `id` begins: false if it had begun before.
    /// Without a directory every command begins.
    pub fn begin(&self, id: &str) -> std::io::Result<bool> {
        let Some(d) = &self.dir else {
            return Ok(true);
        };
        match std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(d.join("begun").join(file_name(id)))
        {
            Ok(f) => {
                f.sync_all()?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The result posted for command `id`, if it ran.
    pub fn result(&self, id: &str) -> Option<AgentResult> {
        self.read(&format!("results/{}", file_name(id)))
    }

    /// Keeps a command's result (before it is posted).
    pub fn save_result(&self, r: &AgentResult) -> std::io::Result<()> {
        self.write(&format!("results/{}", file_name(&r.command_id)), r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("bcd-state-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    fn result(id: &str) -> AgentResult {
        AgentResult {
            command_id: id.to_owned(),
            ok: true,
            retryable: false,
            output: serde_json::json!({}),
            error: None,
            finished_at: chrono::Utc::now(),
            signature: None,
        }
    }

    #[test]
    fn a_command_begins_once_and_its_result_outlives_the_process() {
        let d = dir();
        let s = AgentState::open(Some(d.clone())).expect("open");
        assert!(s.begin("cmd_01abc").expect("begin"));
        assert!(!s.begin("cmd_01abc").expect("again"), "begun once");
        s.save_result(&result("cmd_01abc")).expect("save");
        // A new process on the same directory.
        let again = AgentState::open(Some(d.clone())).expect("reopen");
        assert!(!again.begin("cmd_01abc").expect("begin"));
        let kept = again
            .result("cmd_01abc")
            .expect("the result outlives the process");
        assert_eq!((kept.command_id.as_str(), kept.ok), ("cmd_01abc", true));
        assert!(again.result("cmd_other").is_none());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_key_and_session_are_kept_private_and_garbage_is_ignored() {
        let d = dir();
        let s = AgentState::open(Some(d.clone())).expect("open");
        assert!(s.key().is_none());
        let key = SigningKey::from_bytes(&[7u8; 32]);
        s.save_key(&key).expect("key");
        assert_eq!(s.key().map(|k| k.to_bytes()), Some(key.to_bytes()));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(d.join("key.json"))
                .expect("meta")
                .permissions(),
        );
        assert_eq!(mode & 0o077, 0, "readable by root only");
        std::fs::write(d.join("session.json"), b"{not json").expect("garbage");
        assert!(s.session().is_none());
        std::fs::write(d.join("key.json"), b"\"zz\"").expect("garbage");
        assert!(s.key().is_none());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_command_id_never_names_a_path_outside_the_directory() {
        assert_eq!(file_name("cmd_01abc"), "cmd_01abc");
        assert_eq!(
            file_name("../../etc/passwd"),
            format!("x{}", hex::encode("../../etc/passwd"))
        );
        assert!(!file_name("").is_empty());
    }

    #[test]
    fn without_a_directory_nothing_is_kept_and_everything_begins() {
        let s = AgentState::open(None).expect("open");
        assert!(s.begin("cmd_1").expect("begin"));
        assert!(s.begin("cmd_1").expect("begin"));
        s.save_result(&result("cmd_1")).expect("save");
        assert!(s.result("cmd_1").is_none());
    }
}
