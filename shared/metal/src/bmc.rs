//! The BMC a command acts on, as every `bmc.*` command carries it (driver,
//! address, TLS policy, the node's credentials still sealed: only the bmc
//! service opens them), and one-leaf BMC commands outside workflows
//! (`metal.power`, the power sync, a password rotation).

use base64::Engine as _;
use bcm_contracts::commands::{BmcTarget, Command, SealedValue};
use bcm_contracts::CommandEnvelope;
use bcm_core::hardware::Concern;
use bcm_db::nodes::Node;
use bcm_db::{DbError, Tx};

/// The node's BMC as a command for `concern` carries it: the driver its
/// hardware profile binds to that concern (`power` for power actions and
/// reads, `management` for the rest).
pub async fn target_in_txn(
    tx: &mut Tx<'_>,
    node: &Node,
    concern: Concern,
) -> Result<BmcTarget, DbError> {
    let sealed_credentials = match &node.bmc_secret_id {
        Some(id) => Some(sealed_in_txn(tx, id).await?),
        None => None,
    };
    let drivers = node.drivers();
    Ok(BmcTarget {
        driver: match concern {
            Concern::Power => drivers.power,
            _ => drivers.management,
        },
        address: node.bmc_address.clone(),
        tls: node.bmc_tls.clone(),
        sealed_credentials,
    })
}

/// A stored sealed value as a command carries it (binary fields in base64).
///
/// Read through [`SealedCopies`]: every `bmc.*` command carries its node's
/// credentials, and a stored sealed value never changes (a new credential
/// is a new row with a new id), so each is read from the database once per
/// process, not once per command.
pub async fn sealed_in_txn(tx: &mut Tx<'_>, secret_id: &str) -> Result<SealedValue, DbError> {
    if let Some(v) = SEALED_COPIES.get(secret_id) {
        return Ok(v);
    }
    let s = bcm_db::secrets::secret_fetch_in_txn(tx, secret_id).await?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let v = SealedValue {
        key_id: s.key_id,
        nonce: b64.encode(&s.nonce),
        ciphertext: b64.encode(&s.ciphertext),
        owner: s.owner,
    };
    SEALED_COPIES.put(secret_id, &v);
    Ok(v)
}

/// This process's copies of sealed values, by id.
static SEALED_COPIES: SealedCopies = SealedCopies::new(SealedCopies::CAPACITY);

/// Copies of stored sealed values by id, still sealed (the ciphertext as
/// stored: only the bmc service opens it). A copy is what reading its row
/// gives for as long as the row exists: `sealed_secrets` rows are inserted
/// and deleted, never updated, and their ids are never reused. What a copy
/// adds is a read of a row deleted since: a node read (without its lock)
/// just before its credential is replaced carries the old one, as it did
/// before when its secret was read before the replacement committed, where
/// it now does so also after (the BMC refuses the old password and the
/// command fails, to be retried with the node read again).
/// Bounded: when full, one copy (whichever the map yields first) makes
/// room, so memory stays flat in the fleet's size.
pub struct SealedCopies {
    copies: std::sync::Mutex<Option<std::collections::HashMap<String, SealedValue>>>,
    capacity: usize,
}

impl SealedCopies {
    /// How many copies a process keeps (about 250 bytes each: 4 MiB).
    pub const CAPACITY: usize = 16_384;

    /// An empty set holding at most `capacity` copies.
    pub const fn new(capacity: usize) -> Self {
        SealedCopies {
            copies: std::sync::Mutex::new(None),
            capacity,
        }
    }

    /// The copy of `id`, if held.
    pub fn get(&self, id: &str) -> Option<SealedValue> {
        let copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        copies.as_ref().and_then(|c| c.get(id)).cloned()
    }

    /// Keeps a copy of `id` (dropping another first when the set is full).
    pub fn put(&self, id: &str, value: &SealedValue) {
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        let copies = copies.get_or_insert_with(Default::default);
        if copies.len() >= self.capacity && !copies.contains_key(id) {
            if let Some(other) = copies.keys().next().cloned() {
                copies.remove(&other);
            }
        }
        copies.insert(id.to_owned(), value.clone());
    }

    /// How many copies are held.
    pub fn len(&self) -> usize {
        let copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        copies.as_ref().map_or(0, |c| c.len())
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How long a one-leaf BMC command (a power verb, a power read, a
/// rotation) may wait to reach its site: later, the site refuses it unrun.
pub const LEAF_COMMAND_TTL: chrono::Duration = chrono::Duration::minutes(15);

/// Records a one-leaf BMC command for `node` (not part of a workflow) and
/// returns it with its outbox message, for the caller's transaction: the
/// row exists before the command is sent, and only if the caller commits.
/// `command` builds the command from the node's BMC as `concern` binds it;
/// `actor` is the principal whose verb it is (none for the control
/// plane's own).
#[allow(clippy::too_many_arguments)]
pub async fn leaf_command_in_txn(
    tx: &mut Tx<'_>,
    subjects: &bcm_bus::Subjects,
    node: &Node,
    concern: Concern,
    purpose: &str,
    actor: Option<&str>,
    authority: Option<bcm_contracts::batch::BatchAuthority>,
    command: impl FnOnce(BmcTarget) -> Command,
) -> Result<(CommandEnvelope, bcm_db::outbox::NewOutboxMessage), DbError> {
    let now = chrono::Utc::now();
    let cmd = CommandEnvelope {
        command_id: bcm_core::CommandId::generate().to_string(),
        site_id: node.site_id.clone(),
        node_id: Some(node.id),
        command: command(target_in_txn(tx, node, concern).await?),
        issued_at: now,
        deadline: Some(now + LEAF_COMMAND_TTL),
        authority,
    };
    bcm_db::commands::command_insert_in_txn(
        tx,
        &bcm_db::commands::NewCommand {
            id: cmd.command_id.clone(),
            idempotency_key: format!("{purpose}/{}", cmd.command_id),
            workflow_id: None,
            step_idx: None,
            attempt: 1,
            node_id: Some(node.id.to_string()),
            site_id: Some(node.site_id.to_string()),
            kind: cmd.kind().as_str().to_owned(),
            target: "site".to_owned(),
            params: cmd.command.params_json(),
            actor: actor.map(str::to_owned),
            traceparent: bcm_bus::current_traceparent(),
            batch_id: cmd.authority.as_ref().map(|a| a.header.batch_id.clone()),
        },
    )
    .await?;
    let row = crate::outbox::command(subjects, node, &cmd);
    Ok((cmd, row))
}

#[cfg(test)]
mod tests {
    use super::SealedCopies;
    use bcm_contracts::commands::SealedValue;

    fn value(n: usize) -> SealedValue {
        SealedValue {
            key_id: "k1".into(),
            nonce: format!("nonce{n}"),
            ciphertext: format!("ct{n}"),
            owner: format!("node{n}"),
        }
    }

    #[test]
    fn a_copy_is_found_by_its_id_and_the_set_never_outgrows_its_capacity() {
        let copies = SealedCopies::new(3);
        assert!(copies.is_empty());
        assert_eq!(copies.get("sec_1"), None);
        for n in 0..3 {
            copies.put(&format!("sec_{n}"), &value(n));
        }
        assert_eq!(copies.get("sec_1"), Some(value(1)));
        assert_eq!(copies.get("sec_9"), None);
        // Putting one already held does not empty the set.
        copies.put("sec_2", &value(2));
        assert_eq!(copies.len(), 3);
        // A fourth makes room by dropping one of the three.
        copies.put("sec_3", &value(3));
        assert_eq!(copies.len(), 3);
        assert_eq!(copies.get("sec_3"), Some(value(3)));
        let kept = (0..3)
            .filter(|n| copies.get(&format!("sec_{n}")).is_some())
            .count();
        assert_eq!(kept, 2);
        for n in 0..1000 {
            copies.put(&format!("x{n}"), &value(n));
            assert!(copies.len() <= 3);
        }
    }
}
