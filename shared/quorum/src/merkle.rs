//! The Merkle tree over a batch's leaves: SHA-256, leaves and inner nodes
//! domain-separated (a `0x00` and a `0x01` prefix, as RFC 6962 does, so an
//! inner node can never pass for a leaf), pairs hashed left to right, and
//! a level's odd last node carried up unchanged. A proof is the sibling
//! hashes from the leaf up; with the leaf's index and the leaf count it
//! rebuilds the root, so one node's inclusion is proven without the list.

use bcm_core::batch::Operation;
use bcm_core::WipeMode;
use sha2::{Digest, Sha256};

/// A SHA-256 value.
pub type Hash = [u8; 32];

/// The canonical bytes of a leaf `(nodeId, operation, wipe)`: one
/// `name=value` line each, in this order, `wipe=` empty when absent.
pub fn leaf_bytes(node_id: &str, op: Operation, wipe: Option<WipeMode>) -> Vec<u8> {
    format!(
        "bcm-leaf-v1\nnode={node_id}\noperation={op}\nwipe={}\n",
        wipe.map(|w| w.as_str()).unwrap_or("")
    )
    .into_bytes()
}

/// The hash of a leaf.
pub fn leaf_hash(node_id: &str, op: Operation, wipe: Option<WipeMode>) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(leaf_bytes(node_id, op, wipe));
    h.finalize().into()
}

fn inner(l: &Hash, r: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(l);
    h.update(r);
    h.finalize().into()
}

/// Every level of the tree, leaves first, root last (alone).
fn levels(leaves: &[Hash]) -> Vec<Vec<Hash>> {
    let mut out = vec![leaves.to_vec()];
    while out.last().is_some_and(|l| l.len() > 1) {
        let below = out.last().map(Vec::as_slice).unwrap_or_default();
        let up = below
            .chunks(2)
            .map(|p| match p {
                [l, r] => inner(l, r),
                [only] => *only,
                _ => unreachable!("chunks(2) yields one or two"),
            })
            .collect();
        out.push(up);
    }
    out
}

/// A built tree: its root and every leaf's proof.
pub struct Tree {
    levels: Vec<Vec<Hash>>,
}

impl Tree {
    /// Builds the tree over `leaves` (at least one).
    pub fn new(leaves: &[Hash]) -> Option<Self> {
        (!leaves.is_empty()).then(|| Self {
            levels: levels(leaves),
        })
    }

    /// The root.
    pub fn root(&self) -> Hash {
        self.levels
            .last()
            .and_then(|l| l.first())
            .copied()
            .unwrap_or_default()
    }

    /// The inclusion proof of leaf `index`: its siblings from the bottom
    /// up (a level where the node is carried up has none).
    pub fn proof(&self, index: usize) -> Vec<Hash> {
        let mut out = vec![];
        let mut i = index;
        for level in &self.levels[..self.levels.len().saturating_sub(1)] {
            let sibling = i ^ 1;
            if sibling < level.len() {
                out.push(level[sibling]);
            }
            i /= 2;
        }
        out
    }
}

/// Whether `leaf` at `index` of `count` leaves is under `root` by `proof`.
pub fn verify(leaf: Hash, index: u32, count: u32, proof: &[Hash], root: &Hash) -> bool {
    if count == 0 || index >= count {
        return false;
    }
    let (mut i, mut len, mut h) = (index as usize, count as usize, leaf);
    let mut siblings = proof.iter();
    while len > 1 {
        if i % 2 == 1 {
            let Some(s) = siblings.next() else {
                return false;
            };
            h = inner(s, &h);
        } else if i + 1 < len {
            let Some(s) = siblings.next() else {
                return false;
            };
            h = inner(&h, s);
        }
        i /= 2;
        len = len.div_ceil(2);
    }
    siblings.next().is_none() && &h == root
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn leaves(n: usize) -> Vec<Hash> {
        (0..n)
            .map(|i| {
                leaf_hash(
                    &format!("node_{i}"),
                    Operation::Undeploy,
                    Some(WipeMode::Quick),
                )
            })
            .collect()
    }

    proptest! {
        #[test]
        fn every_leaf_proves_its_inclusion_and_no_other(n in 1usize..300, pick in 0usize..300) {
            let l = leaves(n);
            let t = Tree::new(&l).expect("leaves");
            let i = pick % n;
            let p = t.proof(i);
            prop_assert!(verify(l[i], i as u32, n as u32, &p, &t.root()));
            // Another position, another leaf, a shorter proof or another
            // count fail.
            if n > 1 {
                let j = (i + 1) % n;
                prop_assert!(!verify(l[i], j as u32, n as u32, &p, &t.root()));
                prop_assert!(!verify(l[j], i as u32, n as u32, &p, &t.root()));
                prop_assert!(!verify(l[i], i as u32, n as u32, &p[..p.len() - 1], &t.root()));
            }
        }
    }

    #[test]
    fn a_leaf_names_node_operation_and_wipe() {
        let a = leaf_hash("node_a", Operation::Undeploy, Some(WipeMode::Quick));
        assert_ne!(
            a,
            leaf_hash("node_b", Operation::Undeploy, Some(WipeMode::Quick))
        );
        assert_ne!(
            a,
            leaf_hash("node_a", Operation::Retire, Some(WipeMode::Quick))
        );
        assert_ne!(
            a,
            leaf_hash("node_a", Operation::Undeploy, Some(WipeMode::SecureErase))
        );
        assert_ne!(a, leaf_hash("node_a", Operation::Undeploy, None));
        // A one-leaf tree's root is its leaf.
        assert!(verify(a, 0, 1, &[], &a));
        assert!(!verify(a, 1, 1, &[], &a));
    }
}
