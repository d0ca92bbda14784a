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
pub async fn sealed_in_txn(tx: &mut Tx<'_>, secret_id: &str) -> Result<SealedValue, DbError> {
    let s = bcm_db::secrets::secret_fetch_in_txn(tx, secret_id).await?;
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(SealedValue {
        key_id: s.key_id,
        nonce: b64.encode(&s.nonce),
        ciphertext: b64.encode(&s.ciphertext),
        owner: s.owner,
    })
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
