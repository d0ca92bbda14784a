//! The end of a two-phase BMC password rotation, in the transaction that
//! records the `bmc.rotateCredentials` result: committed (the bmc service
//! logged in with the new password and returned the new credentials sealed:
//! they become the only ones on record), rolled back (the current password
//! still works: the pending one is forgotten) or unresolved (neither could
//! be confirmed: both stay, and the next rotation resumes with the pending
//! one). A result for a rotation that is no longer the node's changes
//! nothing. Nothing here can open a credential.

use base64::Engine as _;
use bcm_contracts::commands::SealedValue;
use bcm_contracts::events::RotationOutcome;
use bcm_contracts::outputs::{RotationReport, RotationStep};
use bcm_contracts::{CommandResult, Output};
use bcm_db::outbox::NewOutboxMessage;
use bcm_db::secrets::SealedSecretRow;
use bcm_db::{DbError, Tx};

use crate::engine::Ctx;

/// The new credentials a committed rotation returned, as a secret row to
/// store; `None` when they are not the node's or not decodable.
fn sealed_row(w: &SealedValue, node_id: &str) -> Option<SealedSecretRow> {
    if w.owner != node_id || w.key_id.is_empty() {
        return None;
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    Some(SealedSecretRow {
        id: format!("sec_{}", ulid::Ulid::new().to_string().to_lowercase()),
        owner: w.owner.clone(),
        purpose: "bmc-credentials".to_owned(),
        key_id: w.key_id.clone(),
        nonce: b64.decode(&w.nonce).ok()?,
        ciphertext: b64.decode(&w.ciphertext).ok()?,
    })
}

/// Applies a rotation result to the node (see the module doc).
pub async fn finish(
    tx: &mut Tx<'_>,
    ctx: &Ctx,
    node_id: &str,
    r: &CommandResult,
    events: &mut Vec<NewOutboxMessage>,
) -> Result<(), DbError> {
    let Ok(id) = node_id.parse::<bcm_core::NodeId>() else {
        return Ok(());
    };
    let node = bcm_db::nodes::node_fetch_for_update_in_txn(tx, &id).await?;
    if node.bmc_rotation_command_id.as_deref() != Some(r.command_id.as_str()) {
        tracing::warn!(node = %id, command = %r.command_id, "a rotation result for a rotation that is not the node's; ignored");
        return Ok(());
    }
    let mut next = node.clone();
    next.bmc_rotation_command_id = None;
    let mut forget: Vec<String> = vec![];
    let report = match &r.output {
        Some(Output::BmcRotateCredentials(report)) => Some(report),
        _ => None,
    };
    let said = report.map(|p| p.outcome);
    let sealed = report.and_then(|p: &RotationReport| p.sealed_credentials.as_ref());
    let (outcome, error) = match (r.ok, said) {
        (true, Some(RotationStep::Committed)) => {
            match sealed.and_then(|w| sealed_row(w, node_id)) {
                Some(row) => {
                    bcm_db::secrets::secret_insert_in_txn(tx, &row).await?;
                    forget.extend(node.bmc_secret_id.clone());
                    forget.extend(node.bmc_pending_secret_id.clone());
                    next.bmc_secret_id = Some(row.id);
                    next.bmc_pending_secret_id = None;
                    (RotationOutcome::Committed, None)
                }
                None => (
                    RotationOutcome::Unresolved,
                    Some("the rotation's result carried no usable sealed credentials".to_owned()),
                ),
            }
        }
        (false, Some(RotationStep::RolledBack)) => {
            forget.extend(node.bmc_pending_secret_id.clone());
            next.bmc_pending_secret_id = None;
            (RotationOutcome::RolledBack, r.error.clone())
        }
        _ => (
            RotationOutcome::Unresolved,
            Some(
                r.error
                    .clone()
                    .unwrap_or_else(|| "the rotation ended without an outcome".to_owned()),
            ),
        ),
    };
    next.version = bcm_db::nodes::node_update_guarded_in_txn(tx, &next).await?;
    for secret in forget {
        bcm_db::secrets::secret_delete_in_txn(tx, &secret).await?;
    }
    tracing::info!(node = %id, command = %r.command_id, outcome = ?outcome, "BMC password rotation ended");
    events.push(rotation_event(ctx, &next, outcome, &r.command_id, error));
    Ok(())
}

/// `node.credentials.rotation` of `node` as written (never a password).
fn rotation_event(
    ctx: &Ctx,
    node: &bcm_db::nodes::Node,
    outcome: RotationOutcome,
    command_id: &str,
    error: Option<String>,
) -> NewOutboxMessage {
    bcm_metal::outbox::event(
        ctx.bus.subjects(),
        node,
        bcm_contracts::events::NodeCredentialsRotation {
            node_id: node.id,
            tenant_id: node.tenant_id.clone(),
            outcome,
            command_id: command_id.to_owned(),
            error,
            version: node.version,
        },
    )
}

/// The purpose of a dedicated node's teardown password: recorded sealed by
/// the verb that started its release, before anything is sent, so a retry
/// resumes with the same one (never a second, unknown one).
pub const TEARDOWN_PURPOSE: &str = bcm_core::dedicated::TEARDOWN_PASSWORD_PURPOSE;

/// A dedicated teardown's `rotate-bmc-password` succeeded at the BMC: its
/// new credentials (returned sealed) become the node's only ones, the old
/// ones and the teardown password are forgotten, and
/// `node.credentials.rotation` says so. `Err` (the step then retries with
/// the same teardown password): the result carried no usable credentials.
pub async fn commit_teardown(
    tx: &mut Tx<'_>,
    ctx: &Ctx,
    node: &bcm_db::nodes::Node,
    command_id: &str,
    output: Option<&serde_json::Value>,
    events: &mut Vec<NewOutboxMessage>,
) -> Result<Result<(), String>, DbError> {
    let node_id = node.id.to_string();
    let report = output
        .and_then(|o| Output::decode(bcm_contracts::CommandKind::BmcRotateCredentials, o).ok());
    let row = match &report {
        Some(Output::BmcRotateCredentials(RotationReport {
            outcome: RotationStep::Committed,
            sealed_credentials: Some(sealed),
            ..
        })) => sealed_row(sealed, &node_id),
        _ => None,
    };
    let Some(row) = row else {
        return Ok(Err(
            "the rotation's result carried no usable sealed credentials".to_owned(),
        ));
    };
    bcm_db::secrets::secret_insert_in_txn(tx, &row).await?;
    let version = bcm_db::nodes::node_replace_bmc_secret_in_txn(tx, &node_id, &row.id).await?;
    bcm_db::secrets::secrets_delete_of_owner_in_txn(tx, &node_id, TEARDOWN_PURPOSE).await?;
    tracing::info!(node = %node.id, command = %command_id, "BMC password rotated at the dedicated teardown");
    let next = bcm_db::nodes::Node {
        version,
        ..node.clone()
    };
    events.push(rotation_event(
        ctx,
        &next,
        RotationOutcome::Committed,
        command_id,
        None,
    ));
    Ok(Ok(()))
}
