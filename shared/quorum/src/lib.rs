//! The destructive-batch quorum, with no I/O.
//!
//! A batch commits to its nodes with a Merkle root ([`merkle`]) over the
//! leaves `(nodeId, operation, wipe)`; its header (tenant, pool,
//! operation, wipe, the reason's hash, expiry, root, leaf count) has a
//! digest ([`digest`]); an approver signs the approval message of that
//! digest with an ed25519 key ([`approval_message`], [`sign`]). The
//! control plane builds batches ([`build`]) and checks approvals as they
//! arrive ([`verify_approval`]); every edge that runs a destructive
//! command checks the command's [`BatchAuthority`] itself against its own
//! trust anchor ([`Anchor::check`]): the leaf of this node proven under
//! the root, the command's kind covered by the operation, not expired,
//! and a quorum of signatures by keys the anchor names. A control plane
//! that is wrong or compromised cannot make an edge act outside what the
//! approvers signed.
//!
//! Every format here is spelled out so a tool in another language can
//! rebuild it: `name=value` lines, SHA-256, ed25519 over the message
//! bytes. The files it touches are an edge's anchor ([`anchor_from_file`])
//! and the local key files `bcm quorum-keys` writes ([`files`]).

pub mod files;
pub mod merkle;

use std::collections::BTreeSet;

use base64::Engine as _;
use bcm_contracts::batch::{ApprovalSignature, BatchAuthority, BatchHeader};
use bcm_core::batch::Operation;
use bcm_core::WipeMode;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub use merkle::Hash;

/// The canonical bytes of a batch header: one `name=value` line per field,
/// in this order.
pub fn header_bytes(h: &BatchHeader) -> Vec<u8> {
    format!(
        "bcm-batch-v1\nbatch={}\ntenant={}\npool={}\noperation={}\nwipe={}\nreason-sha256={}\nexpires-at={}\nroot={}\nleaves={}\n",
        h.batch_id,
        h.tenant_id,
        h.pool_id,
        h.operation,
        h.wipe.map(|w| w.as_str()).unwrap_or(""),
        h.reason_sha256,
        h.expires_at,
        h.root,
        h.leaf_count
    )
    .into_bytes()
}

/// The batch digest: SHA-256 of the header's canonical bytes.
pub fn digest(h: &BatchHeader) -> Hash {
    Sha256::digest(header_bytes(h)).into()
}

/// What an approver signs: a domain line and the digest in hex. The
/// digest covers the reason (by hash) and the expiry.
pub fn approval_message(h: &BatchHeader) -> Vec<u8> {
    format!("bcm-batch-approval-v1\n{}\n", hex::encode(digest(h))).into_bytes()
}

/// SHA-256 (hex) of a reason.
pub fn reason_sha256(reason: &str) -> String {
    hex::encode(Sha256::digest(reason.as_bytes()))
}

/// Signs a header's approval message; the signature in base64.
pub fn sign(key: &SigningKey, h: &BatchHeader) -> String {
    base64::engine::general_purpose::STANDARD.encode(key.sign(&approval_message(h)).to_bytes())
}

/// Reads an ed25519 public key from base64 (32 bytes).
pub fn public_key(b64: &str) -> Result<VerifyingKey, QuorumError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| QuorumError::BadKey("not base64".into()))?;
    let arr: [u8; 32] = bytes
        .try_into()
        .map_err(|_| QuorumError::BadKey("not 32 bytes".into()))?;
    let key = VerifyingKey::from_bytes(&arr).map_err(|e| QuorumError::BadKey(e.to_string()))?;
    if key.is_weak() {
        return Err(QuorumError::BadKey("a weak (small-order) key".into()));
    }
    Ok(key)
}

/// Reads an ed25519 signing key: a 32-byte seed in base64 or hex.
pub fn signing_key(text: &str) -> Result<SigningKey, QuorumError> {
    let t = text.trim();
    let bytes = hex::decode(t)
        .ok()
        .filter(|b| b.len() == 32)
        .or_else(|| base64::engine::general_purpose::STANDARD.decode(t).ok())
        .ok_or_else(|| QuorumError::BadKey("a key is 32 bytes in hex or base64".into()))?;
    let seed: [u8; 32] = bytes
        .try_into()
        .map_err(|_| QuorumError::BadKey("a key is 32 bytes".into()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// The approver id the control plane's policy key goes by in anchors,
/// unless the API is configured otherwise (`api.quorum.policy_approver_id`).
pub const POLICY_APPROVER_ID: &str = "policy";

/// The principal an approval by the policy key is recorded under: nobody,
/// so it never counts as a person toward a pool's quorum.
pub const POLICY_PRINCIPAL: &str = "policy";

/// The public key of a signing key, in base64.
pub fn public_key_b64(key: &SigningKey) -> String {
    base64::engine::general_purpose::STANDARD.encode(key.verifying_key().to_bytes())
}

/// Whether `signature` (base64) by `key` signs the header's approval
/// message.
pub fn signature_valid(key: &VerifyingKey, h: &BatchHeader, signature: &str) -> bool {
    let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(signature.trim()) else {
        return false;
    };
    let Ok(sig) = Signature::from_slice(&bytes) else {
        return false;
    };
    // Strict: no malleable signature and no small-order key passes.
    key.verify_strict(&approval_message(h), &sig).is_ok()
}

/// Why an approval or a command's authority is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuorumError {
    #[error("unreadable key: {0}")]
    BadKey(String),
    #[error("batch {batch} expired at {expires_at} (unix seconds)")]
    Expired { batch: String, expires_at: i64 },
    #[error("approver {0} is not known to this edge")]
    UnknownApprover(String),
    #[error("the signature of approver {0} does not sign this batch's digest")]
    BadSignature(String),
    #[error("approver {0} signed twice")]
    Duplicate(String),
    #[error("the command carries no batch authority")]
    Missing,
    #[error("node {node} is not leaf {index} of the batch's {leaves}: its proof does not reach the signed root")]
    NotIncluded {
        node: String,
        index: u32,
        leaves: u32,
    },
    #[error("the command is for no node")]
    NoNode,
    #[error("{0}")]
    NotCovered(String),
    #[error("{valid} valid approval(s); this edge needs {needed}")]
    TooFew { valid: usize, needed: usize },
    #[error("unreadable proof: {0}")]
    BadProof(String),
    #[error("this edge holds no quorum trust anchor, so it runs no destructive command")]
    NoAnchor,
}

impl QuorumError {
    /// The refusal as a command result's error: `FORBIDDEN: …`.
    pub fn refusal(&self) -> String {
        format!("FORBIDDEN: refused by the destructive-batch quorum: {self}")
    }
}

/// A built batch: the header's root and each node's proof, in order.
pub struct Built {
    pub root: String,
    pub proofs: Vec<Vec<String>>,
}

/// Builds the tree over `nodes` (in this order, at least one).
pub fn build(nodes: &[String], op: Operation, wipe: Option<WipeMode>) -> Option<Built> {
    let leaves: Vec<Hash> = nodes
        .iter()
        .map(|n| merkle::leaf_hash(n, op, wipe))
        .collect();
    let tree = merkle::Tree::new(&leaves)?;
    Some(Built {
        root: hex::encode(tree.root()),
        proofs: (0..nodes.len())
            .map(|i| tree.proof(i).iter().map(hex::encode).collect())
            .collect(),
    })
}

/// An approver key an edge trusts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnchorKey {
    pub id: String,
    /// ed25519, base64.
    pub public_key: String,
    /// The tenants whose batches this approver's signature counts for
    /// (empty: every tenant's). An approver registered with one tenant in
    /// the control plane is named with that tenant here, so the edge, not
    /// only the API, refuses its signature on another tenant's batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
}

impl AnchorKey {
    /// Whether this key's signature counts for a batch of `tenant`.
    pub fn serves(&self, tenant: &str) -> bool {
        self.tenants.is_empty() || self.tenants.iter().any(|t| t == tenant)
    }
}

/// An edge's trust anchor (a JSON file the site's operator places, never
/// sent by the control plane): the approvers' keys, how many distinct
/// approvers a batch needs here, and, where the site allows one-node
/// batches approved by the control plane's policy, the key that signs
/// those.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Anchor {
    pub approvers: Vec<AnchorKey>,
    /// Distinct approvers a batch of more than one leaf needs (at least 1).
    pub quorum: usize,
    /// The control plane's policy key: its one signature approves a
    /// one-leaf batch. Absent: every batch needs `quorum` approvers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_approver: Option<AnchorKey>,
}

impl Anchor {
    /// The anchor of `approvers` (named `approver-1`, `approver-2`, …) of
    /// whom `quorum` must sign, and of the control plane's policy key
    /// (named `policy`) where one-node batches may be approved by it.
    pub fn of(approvers: &[SigningKey], quorum: usize, policy: Option<&SigningKey>) -> Self {
        Anchor {
            approvers: approvers
                .iter()
                .enumerate()
                .map(|(i, k)| AnchorKey {
                    id: format!("approver-{}", i + 1),
                    public_key: public_key_b64(k),
                    tenants: vec![],
                })
                .collect(),
            quorum,
            auto_approver: policy.map(|k| AnchorKey {
                id: POLICY_APPROVER_ID.into(),
                public_key: public_key_b64(k),
                tenants: vec![],
            }),
        }
    }

    /// Reads an anchor from its JSON and checks every key.
    pub fn from_json(text: &str) -> Result<Self, QuorumError> {
        let a: Anchor = serde_json::from_str(text)
            .map_err(|e| QuorumError::BadKey(format!("trust anchor: {e}")))?;
        if a.quorum == 0 {
            return Err(QuorumError::BadKey(
                "trust anchor: quorum must be at least 1".into(),
            ));
        }
        let mut ids = BTreeSet::new();
        let mut keys = BTreeSet::new();
        for k in a.approvers.iter().chain(a.auto_approver.iter()) {
            let key = public_key(&k.public_key)
                .map_err(|e| QuorumError::BadKey(format!("trust anchor key {}: {e}", k.id)))?;
            // One person, one vote: an id or a key named twice would count twice.
            if !ids.insert(k.id.clone()) || !keys.insert(key.to_bytes()) {
                return Err(QuorumError::BadKey(format!(
                    "trust anchor names approver {} or its key twice",
                    k.id
                )));
            }
        }
        Ok(a)
    }

    /// The key of approver `id`, where it counts for `tenant`'s batches.
    fn key(&self, id: &str, tenant: &str) -> Option<VerifyingKey> {
        self.approvers
            .iter()
            .find(|k| k.id == id && k.serves(tenant))
            .and_then(|k| public_key(&k.public_key).ok())
    }

    /// Whether a destructive command of `kind` (with `command_wipe` for a
    /// `disk.wipe`, `command_power` for a `bmc.power`) for `node` may run
    /// at `now` (unix seconds) under `authority`.
    pub fn check(
        &self,
        authority: Option<&BatchAuthority>,
        node: Option<&str>,
        kind: &str,
        command_wipe: Option<WipeMode>,
        command_power: Option<bcm_core::PowerAction>,
        now: i64,
    ) -> Result<(), QuorumError> {
        let a = authority.ok_or(QuorumError::Missing)?;
        let node = node.ok_or(QuorumError::NoNode)?;
        let h = &a.header;
        if now >= h.expires_at {
            return Err(QuorumError::Expired {
                batch: h.batch_id.clone(),
                expires_at: h.expires_at,
            });
        }
        bcm_core::batch::allows(h.operation, h.wipe, kind, command_wipe, command_power)
            .map_err(QuorumError::NotCovered)?;
        let hex32 = |s: &str| -> Result<Hash, QuorumError> {
            hex::decode(s)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| QuorumError::BadProof(format!("{s:.16}… is not a SHA-256")))
        };
        let root = hex32(&h.root)?;
        let proof = a
            .proof
            .iter()
            .map(|p| hex32(p))
            .collect::<Result<Vec<_>, _>>()?;
        let leaf = merkle::leaf_hash(node, h.operation, h.wipe);
        if !merkle::verify(leaf, a.leaf_index, h.leaf_count, &proof, &root) {
            return Err(QuorumError::NotIncluded {
                node: node.to_owned(),
                index: a.leaf_index,
                leaves: h.leaf_count,
            });
        }
        let mut valid = BTreeSet::new();
        for s in &a.approvals {
            if let Some(auto) = &self.auto_approver {
                if s.approver_id == auto.id {
                    let ok = h.leaf_count == 1
                        && public_key(&auto.public_key)
                            .is_ok_and(|k| signature_valid(&k, h, &s.signature));
                    if ok {
                        return Ok(());
                    }
                    continue;
                }
            }
            if let Some(k) = self.key(&s.approver_id, &h.tenant_id) {
                if signature_valid(&k, h, &s.signature) {
                    valid.insert(s.approver_id.as_str());
                }
            }
        }
        if valid.len() >= self.quorum {
            Ok(())
        } else {
            Err(QuorumError::TooFew {
                valid: valid.len(),
                needed: self.quorum,
            })
        }
    }
}

/// The control plane's check of one approval as it arrives: the key is
/// the approver's registered one, the signature signs this header, the
/// batch has not expired and the approver has not signed it already.
pub fn verify_approval(
    h: &BatchHeader,
    key_b64: &str,
    approval: &ApprovalSignature,
    already: &[String],
    now: i64,
) -> Result<(), QuorumError> {
    if now >= h.expires_at {
        return Err(QuorumError::Expired {
            batch: h.batch_id.clone(),
            expires_at: h.expires_at,
        });
    }
    if already.contains(&approval.approver_id) {
        return Err(QuorumError::Duplicate(approval.approver_id.clone()));
    }
    let key = public_key(key_b64)?;
    if !signature_valid(&key, h, &approval.signature) {
        return Err(QuorumError::BadSignature(approval.approver_id.clone()));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

/// What an edge decides for a command it received: a command that is not
/// destructive needs nothing; a destructive one needs the edge's anchor
/// and a valid authority for its node (`NoAnchor` when this edge was given
/// no anchor: it refuses every destructive command rather than trust the
/// control plane).
pub fn check_command(
    anchor: Option<&Anchor>,
    kind: bcm_contracts::CommandKind,
    command: Option<&bcm_contracts::Command>,
    node: Option<&str>,
    authority: Option<&BatchAuthority>,
    now: i64,
) -> Result<(), QuorumError> {
    if !kind.destructive() {
        return Ok(());
    }
    let anchor = anchor.ok_or(QuorumError::NoAnchor)?;
    let (wipe, power) = match command {
        Some(bcm_contracts::Command::DiskWipe(p) | bcm_contracts::Command::NodeWipe(p)) => {
            (Some(p.mode), None)
        }
        Some(bcm_contracts::Command::BmcPower(p)) => (None, Some(p.action)),
        _ => (None, None),
    };
    anchor.check(authority, node, kind.as_str(), wipe, power, now)
}

/// Reads an anchor file.
pub fn anchor_from_file(path: &std::path::Path) -> Result<Anchor, QuorumError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| QuorumError::BadKey(format!("trust anchor {}: {e}", path.display())))?;
    Anchor::from_json(&text)
}

/// An anchor as a kernel command line carries it (`bcm.quorum=<value>`):
/// its compact JSON in unpadded URL-safe base64, one word.
pub fn anchor_cmdline_value(anchor: &Anchor) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(anchor).unwrap_or_default())
}

/// Reads the anchor a kernel command line carries (`bcm.quorum=`), if any.
pub fn anchor_from_cmdline(cmdline: &str) -> Option<Result<Anchor, QuorumError>> {
    let v = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("bcm.quorum="))?;
    Some(
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(v)
            .map_err(|_| QuorumError::BadKey("bcm.quorum= is not base64".into()))
            .and_then(|b| Anchor::from_json(&String::from_utf8_lossy(&b))),
    )
}
