//! The metal domain's transactional operations, shared by the API and the
//! reconciler so a move is committed the same way wherever it is decided:
//! the node's guarded update, its authorization projection and its outbox
//! rows in the caller's transaction ([`moves`]); the start of a state's
//! workflow ([`workflows`]); outbox row building ([`outbox`]); the BMC a
//! command acts on and one-leaf BMC commands ([`bmc`]); join tokens and
//! revocation ([`identity`]); destructive batches: a verb's one-node batch,
//! approved by the pool's policy or awaiting approvers, a bulk's batch, and
//! what an approval that completes a quorum releases ([`batches`]); a
//! rescue's SSH access, kept while the node is in `rescue` ([`rescue`]).
//!
//! Legality stays in `bcm-core`; SQL stays in `bcm-db`; subjects in `bcm-bus`.

pub mod batches;
pub mod bmc;
pub mod identity;
pub mod moves;
pub mod outbox;
pub mod rescue;
pub mod tenant_root;
pub mod workflows;
