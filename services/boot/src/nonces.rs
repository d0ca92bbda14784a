//! Per-boot links: the proxy DHCP answer to an iPXE client names its script
//! as `/ipxe/<nonce>`, where the nonce is 128 random bits bound to the MAC
//! the answer was for and to the boot entry live at that moment (its node
//! and expiry). A nonce opens its script once and for a short while; a MAC
//! alone, a nonce used before, expired, or made for an entry that has since
//! been replaced, opens nothing. A lost script answer costs the machine a
//! new DHCP exchange (the step's retry power-cycles it), never a script
//! served twice.

use rand::RngCore;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::entries::{BootEntry, Mac};

/// How many links may be outstanding at once; past it the oldest go first.
pub const MAX_OUTSTANDING: usize = 65_536;

/// What a nonce was minted for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub mac: Mac,
    /// The entry's node and expiry when the link was made: a replaced
    /// entry does not honour an older link.
    pub node_id: Option<String>,
    pub entry_expires_at: u64,
    minted: Instant,
}

impl Grant {
    /// Whether `entry` is still the entry this link was made for.
    pub fn matches(&self, entry: &BootEntry) -> bool {
        entry.node_id == self.node_id && entry.expires_at == self.entry_expires_at
    }
}

/// The outstanding links of this process.
#[derive(Debug)]
pub struct Nonces {
    ttl: Duration,
    map: Mutex<HashMap<String, Grant>>,
}

impl Nonces {
    /// Links that live `ttl` after their DHCP answer.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// A fresh link for `mac`'s live `entry`.
    pub fn mint(&self, mac: Mac, entry: &BootEntry) -> String {
        let mut raw = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut raw);
        let nonce = hex::encode(raw);
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, g| now.duration_since(g.minted) < self.ttl);
        if map.len() >= MAX_OUTSTANDING {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, g)| g.minted)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(
            nonce.clone(),
            Grant {
                mac,
                node_id: entry.node_id.clone(),
                entry_expires_at: entry.expires_at,
                minted: now,
            },
        );
        nonce
    }

    /// Spends a link: its grant if it was outstanding and unexpired. Used
    /// or not, it is gone afterwards.
    pub fn redeem(&self, nonce: &str) -> Option<Grant> {
        let grant = self
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(nonce)?;
        (grant.minted.elapsed() < self.ttl).then_some(grant)
    }

    /// How many links are outstanding (expired ones included until the next
    /// mint sweeps them).
    pub fn outstanding(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(node: &str, expires_at: u64) -> BootEntry {
        BootEntry {
            node_id: Some(node.into()),
            kernel: "k".into(),
            initrd: "i".into(),
            cmdline: "c".into(),
            expires_at,
        }
    }

    #[test]
    fn a_link_opens_once_and_only_its_own_entry() {
        let nonces = Nonces::new(Duration::from_secs(60));
        let mac = Mac::parse("52:54:00:aa:00:01").expect("mac");
        let e = entry("node_a", 100);
        let n = nonces.mint(mac, &e);
        assert_eq!(n.len(), 32);
        assert_ne!(n, nonces.mint(mac, &e), "every answer gets its own link");
        let g = nonces.redeem(&n).expect("first use");
        assert_eq!(g.mac, mac);
        assert!(g.matches(&e));
        assert!(!g.matches(&entry("node_b", 100)), "another node's entry");
        assert!(!g.matches(&entry("node_a", 200)), "a replaced entry");
        assert_eq!(nonces.redeem(&n), None, "replayed");
        assert_eq!(nonces.redeem(&mac.to_string()), None, "a MAC is no link");
        assert_eq!(nonces.redeem(""), None);
    }

    #[test]
    fn links_expire() {
        let nonces = Nonces::new(Duration::from_millis(0));
        let mac = Mac::parse("52:54:00:aa:00:01").expect("mac");
        let n = nonces.mint(mac, &entry("node_a", 100));
        assert_eq!(nonces.redeem(&n), None);
    }
}
