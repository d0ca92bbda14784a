//! Boot entries: per-MAC kernel, initrd and kernel command line (carrying
//! the one-time join token and the control plane URL) with an expiry.
//! `site.bootEntry.set`/`clear` commands write them to the site's JetStream
//! KV bucket, so every boot process of the site (the active one and its
//! standbys) sees the same entries; each process keeps a local copy fed by a
//! watch on the bucket. Only a MAC with a live (unexpired) entry is
//! answered; expired entries are ignored at once and removed by a sweep.

use bcm_contracts::commands::BootEntrySpec;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// An Ethernet MAC address; shown as `aa:bb:cc:dd:ee:ff`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mac([u8; 6]);

impl Mac {
    /// From six bytes (a DHCP `chaddr`).
    pub fn from_bytes(b: &[u8]) -> Option<Mac> {
        <[u8; 6]>::try_from(b).ok().map(Mac)
    }

    /// Parses `aa:bb:cc:dd:ee:ff`, `aa-bb-…` or `aabbccddeeff` (any case).
    pub fn parse(s: &str) -> Option<Mac> {
        let hex: String = s.chars().filter(|c| *c != ':' && *c != '-').collect();
        if hex.len() != 12 {
            return None;
        }
        let raw = hex::decode(hex).ok()?;
        Mac::from_bytes(&raw)
    }

    /// The KV key: twelve lowercase hex digits.
    pub fn key(&self) -> String {
        hex::encode(self.0)
    }

    /// The raw bytes.
    pub fn bytes(&self) -> [u8; 6] {
        self.0
    }
}

impl std::fmt::Display for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl std::fmt::Debug for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// What a MAC boots while its entry lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootEntry {
    /// The node the entry was made for (logs and scripts only).
    #[serde(default)]
    pub node_id: Option<String>,
    /// Kernel and initrd: a path in the image cache or an http(s) URL.
    pub kernel: String,
    pub initrd: String,
    /// The kernel command line (join token, control plane URL).
    pub cmdline: String,
    /// Seconds since the Unix epoch after which the entry is dead.
    pub expires_at: u64,
}

/// Seconds since the Unix epoch now.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl BootEntry {
    /// Whether the entry still lives at `now` (seconds since the epoch).
    pub fn live_at(&self, now: u64) -> bool {
        now < self.expires_at
    }
}

/// Why a `site.bootEntry.*` command cannot be applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EntryError {
    #[error("site.bootEntry: {0}")]
    Invalid(String),
}

/// The longest entry lifetime accepted (a day).
pub const MAX_TTL_SECS: u64 = 24 * 3600;

fn no_control(field: &str, v: &str, max: usize) -> Result<(), EntryError> {
    if v.is_empty() || v.len() > max || v.chars().any(char::is_control) {
        return Err(EntryError::Invalid(format!(
            "{field} must be 1-{max} printable characters"
        )));
    }
    Ok(())
}

/// The MACs and the entry a `site.bootEntry.set` command asks for, checked:
/// 1–64 MACs, printable kernel, initrd and command line of bounded length,
/// a lifetime of 1 s to a day.
pub fn entry_of(
    spec: &BootEntrySpec,
    node_id: Option<String>,
    now: u64,
) -> Result<(Vec<Mac>, BootEntry), EntryError> {
    let macs = macs_of(&spec.macs)?;
    no_control("kernel", &spec.kernel, 1024)?;
    no_control("initrd", &spec.initrd, 1024)?;
    no_control("cmdline", &spec.cmdline, 4096)?;
    let ttl = spec.expires_in_secs;
    if ttl == 0 || ttl > MAX_TTL_SECS {
        return Err(EntryError::Invalid(format!(
            "expiresInSecs must be 1-{MAX_TTL_SECS}"
        )));
    }
    Ok((
        macs,
        BootEntry {
            node_id,
            kernel: spec.kernel.clone(),
            initrd: spec.initrd.clone(),
            cmdline: spec.cmdline.clone(),
            expires_at: now + ttl,
        },
    ))
}

/// Whether `existing` (the stored entry of a MAC, if any) stops `node`
/// from setting or clearing that MAC's entry at `now`: a live entry made
/// for another node is that node's until it expires or is cleared. A MAC
/// is unique within a site; a conflicting entry is refused, never
/// overwritten.
pub fn held_by_other(existing: Option<&BootEntry>, node: Option<&str>, now: u64) -> bool {
    existing.is_some_and(|e| e.live_at(now) && e.node_id.as_deref() != node)
}

/// The MACs of a `site.bootEntry.*` command, checked: 1–64 MAC addresses.
pub fn macs_of(list: &[String]) -> Result<Vec<Mac>, EntryError> {
    if list.is_empty() || list.len() > 64 {
        return Err(EntryError::Invalid("macs must name 1-64 MACs".into()));
    }
    list.iter()
        .map(|m| {
            Mac::parse(m).ok_or_else(|| EntryError::Invalid(format!("{m:?} is not a MAC address")))
        })
        .collect()
}

/// This process's copy of the site's entries.
#[derive(Debug, Default)]
pub struct Entries {
    map: RwLock<HashMap<Mac, BootEntry>>,
}

impl Entries {
    /// The live entry of `mac`, if any.
    pub fn live(&self, mac: &Mac) -> Option<BootEntry> {
        let now = now_secs();
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(mac)
            .filter(|e| e.live_at(now))
            .cloned()
    }

    /// Records (or replaces) an entry.
    pub fn put(&self, mac: Mac, e: BootEntry) {
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(mac, e);
    }

    /// Forgets an entry.
    pub fn remove(&self, mac: &Mac) {
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(mac);
    }

    /// The MACs whose entries expired (for the sweep).
    pub fn expired(&self) -> Vec<Mac> {
        let now = now_secs();
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, e)| !e.live_at(now))
            .map(|(m, _)| *m)
            .collect()
    }

    /// How many entries (live or not) this copy holds.
    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether the copy is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_in_every_usual_spelling() {
        let m = Mac::parse("52:54:00:AA:00:01").expect("colons");
        assert_eq!(m.to_string(), "52:54:00:aa:00:01");
        assert_eq!(Mac::parse("52-54-00-aa-00-01"), Some(m));
        assert_eq!(Mac::parse("525400aa0001"), Some(m));
        assert_eq!(m.key(), "525400aa0001");
        assert_eq!(Mac::parse("52:54:00:aa:00"), None);
        assert_eq!(Mac::parse("zz:54:00:aa:00:01"), None);
    }

    #[test]
    fn set_commands_are_checked_and_expire() {
        let spec = |macs: &[&str], cmdline: &str, ttl: u64| BootEntrySpec {
            macs: macs.iter().map(|m| m.to_string()).collect(),
            kernel: "ramdisk/vmlinuz".into(),
            initrd: "ramdisk/initrd.img".into(),
            cmdline: cmdline.into(),
            expires_in_secs: ttl,
        };
        let (macs, e) = entry_of(
            &spec(&["52:54:00:aa:00:01"], "bcm.join=abc", 600),
            Some("node_x".into()),
            1000,
        )
        .expect("valid");
        assert_eq!(macs.len(), 1);
        assert_eq!(e.expires_at, 1600);
        assert!(e.live_at(1599) && !e.live_at(1600));
        let m = "52:54:00:aa:00:01";
        let too_many: Vec<String> = (0..65).map(|i| format!("52:54:00:aa:00:{i:02x}")).collect();
        let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
        for bad in [
            spec(&[], "c", 1),
            spec(&["x"], "c", 1),
            spec(&too_many, "c", 1),
            spec(&[m], "c\nboot", 1),
            spec(&[m], "", 1),
            spec(&[m], "c", 0),
            spec(&[m], "c", MAX_TTL_SECS + 1),
        ] {
            assert!(entry_of(&bad, None, 0).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_live_entry_of_another_node_is_held() {
        let e = |node: Option<&str>, expires_at| BootEntry {
            node_id: node.map(str::to_owned),
            kernel: "k".into(),
            initrd: "i".into(),
            cmdline: "c".into(),
            expires_at,
        };
        let a = e(Some("node_a"), 100);
        assert!(held_by_other(Some(&a), Some("node_b"), 50));
        assert!(held_by_other(Some(&a), None, 50));
        assert!(!held_by_other(Some(&a), Some("node_a"), 50), "its own");
        assert!(!held_by_other(Some(&a), Some("node_b"), 100), "expired");
        assert!(!held_by_other(None, Some("node_b"), 50), "no entry");
        assert!(held_by_other(Some(&e(None, 100)), Some("node_b"), 50));
    }

    #[test]
    fn only_live_entries_are_found() {
        let entries = Entries::default();
        let m = Mac::parse("52:54:00:aa:00:01").expect("mac");
        let e = BootEntry {
            node_id: None,
            kernel: "k".into(),
            initrd: "i".into(),
            cmdline: "c".into(),
            expires_at: now_secs() + 60,
        };
        entries.put(m, e.clone());
        assert_eq!(entries.live(&m), Some(e.clone()));
        entries.put(
            m,
            BootEntry {
                expires_at: now_secs() - 1,
                ..e
            },
        );
        assert_eq!(entries.live(&m), None);
        assert_eq!(entries.expired(), vec![m]);
    }
}
