//! Boot entries: per-MAC kernel, initrd and kernel command line (carrying
//! the one-time join token and the control plane URL) with an expiry.
//! `site.bootEntry.set`/`clear` commands write them to the site's JetStream
//! KV bucket, so every boot process of the site (the active one and its
//! standbys) sees the same entries; each process keeps a local copy fed by a
//! watch on the bucket. Only a MAC with a live (unexpired) entry is
//! answered; expired entries are ignored at once and removed by a sweep.

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

/// The MACs and the entry of a `site.bootEntry.set` command's parameters
/// (`{"bootEntry": {macs, kernel, initrd, cmdline, expiresInSecs}}`).
pub fn parse_set(
    params: &serde_json::Value,
    node_id: Option<String>,
    now: u64,
) -> Result<(Vec<Mac>, BootEntry), EntryError> {
    let e = params
        .get("bootEntry")
        .ok_or_else(|| EntryError::Invalid("no bootEntry".into()))?;
    let macs = parse_macs(e.get("macs"))?;
    let field = |name: &str, max: usize| -> Result<String, EntryError> {
        let v = e
            .get(name)
            .and_then(|v| v.as_str())
            .ok_or_else(|| EntryError::Invalid(format!("no {name}")))?;
        no_control(name, v, max)?;
        Ok(v.to_owned())
    };
    let ttl = e
        .get("expiresInSecs")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| EntryError::Invalid("expiresInSecs must be a positive number".into()))?;
    if ttl == 0 || ttl > MAX_TTL_SECS {
        return Err(EntryError::Invalid(format!(
            "expiresInSecs must be 1-{MAX_TTL_SECS}"
        )));
    }
    Ok((
        macs,
        BootEntry {
            node_id,
            kernel: field("kernel", 1024)?,
            initrd: field("initrd", 1024)?,
            cmdline: field("cmdline", 4096)?,
            expires_at: now + ttl,
        },
    ))
}

/// The MACs of a `site.bootEntry.clear` command (`{"macs": [...]}`).
pub fn parse_clear(params: &serde_json::Value) -> Result<Vec<Mac>, EntryError> {
    parse_macs(params.get("macs"))
}

fn parse_macs(v: Option<&serde_json::Value>) -> Result<Vec<Mac>, EntryError> {
    let list = v
        .and_then(|v| v.as_array())
        .ok_or_else(|| EntryError::Invalid("macs must be a list".into()))?;
    if list.is_empty() || list.len() > 64 {
        return Err(EntryError::Invalid("macs must name 1-64 MACs".into()));
    }
    list.iter()
        .map(|m| {
            m.as_str()
                .and_then(Mac::parse)
                .ok_or_else(|| EntryError::Invalid(format!("{m} is not a MAC address")))
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
    use serde_json::json;

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
        let p = json!({"bootEntry": {"macs": ["52:54:00:aa:00:01"], "kernel": "ramdisk/vmlinuz",
            "initrd": "ramdisk/initrd.img", "cmdline": "bcm.join=abc", "expiresInSecs": 600}});
        let (macs, e) = parse_set(&p, Some("node_x".into()), 1000).expect("valid");
        assert_eq!(macs.len(), 1);
        assert_eq!(e.expires_at, 1600);
        assert!(e.live_at(1599) && !e.live_at(1600));
        for bad in [
            json!({}),
            json!({"bootEntry": {"macs": [], "kernel": "k", "initrd": "i", "cmdline": "c", "expiresInSecs": 1}}),
            json!({"bootEntry": {"macs": ["x"], "kernel": "k", "initrd": "i", "cmdline": "c", "expiresInSecs": 1}}),
            json!({"bootEntry": {"macs": ["52:54:00:aa:00:01"], "kernel": "k", "initrd": "i", "cmdline": "c\nboot", "expiresInSecs": 1}}),
            json!({"bootEntry": {"macs": ["52:54:00:aa:00:01"], "kernel": "k", "initrd": "i", "cmdline": "c", "expiresInSecs": 0}}),
        ] {
            assert!(parse_set(&bad, None, 0).is_err(), "{bad}");
        }
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
