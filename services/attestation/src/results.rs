//! Recording an agent's result: written to the command row (the UPDATE
//! returns the row as stored), and (when signed) verified against that
//! stored row in the same transaction;
//! a signature that does not verify rolls everything back and is refused.
//! A repeated post of an answered command changes nothing.

use base64::Engine as _;
use bcm_contracts::agent::{AgentPurpose, AgentResult};
use bcm_contracts::attest::{AttestResult, ResultRecorded};
use bcm_contracts::commands::Family;
use bcm_contracts::{CommandKind, Output};
use bcm_db::Db;
use bcm_pki::Ca;
use chrono::Utc;

use crate::{AttestError, AttestationConfig};

/// Records (and verifies) a result.
pub async fn record(
    db: &Db,
    ca: &Ca,
    cfg: &AttestationConfig,
    req: &AttestResult,
) -> Result<ResultRecorded, AttestError> {
    let r = &req.result;
    let signature = r
        .signature
        .as_deref()
        .map(|s| {
            base64::engine::general_purpose::STANDARD
                .decode(s.as_bytes())
                .map_err(|_| AttestError::Invalid("signature is not base64".into()))
        })
        .transpose()?;
    let body = serde_json::json!({
        "ok": r.ok,
        "retryable": r.retryable,
        "output": r.output,
        "error": r.error,
        "finishedAt": bcm_pki::format_ts(r.finished_at),
    });
    let mut tx = db.begin().await?;
    // One statement writes the result and hands back the row as stored.
    let stored = bcm_db::commands::command_complete_returning_in_txn(
        &mut tx,
        &r.command_id,
        &req.node_id,
        r.ok,
        &body,
        signature.as_deref(),
    )
    .await?;
    let Some(cmd) = stored else {
        // Not this node's, unknown, or answered already (a repeat post).
        return match bcm_db::commands::command_fetch_in_txn(&mut tx, &r.command_id).await {
            Ok(c) if c.node_id.as_deref() == Some(req.node_id.as_str()) => Ok(ResultRecorded {
                recorded: false,
                attested_by: c.attested_by,
            }),
            Ok(_) | Err(bcm_db::DbError::NotFound) => Err(AttestError::NoSuchCommand),
            Err(e) => Err(e.into()),
        };
    };
    check_contract(&cmd, r)?;
    // The node's certificates in force, read once: the session's own must
    // be among them, and a signature is verified against them.
    let mut certs = bcm_db::agents::certs_live_of_node_in_txn(&mut tx, &req.node_id).await?;
    check_identity(&cmd, &certs, &req.node_id, &req.cert_serial)?;
    let attested_by = if signature.is_some() {
        // The session's own certificate first: it is the one that signed.
        certs.sort_by_key(|c| c.serial != req.cert_serial);
        let serial = match crate::verify::verify_stored(ca, &cmd, &certs, Utc::now()) {
            Ok(serial) => serial,
            #[cfg(feature = "accept-ingested-attestation")]
            Err(why) if cfg.accept_ingested => {
                tracing::warn!(command = %cmd.id, %why, "accepting an unverified signature (test-only bypass)");
                "ingested".to_owned()
            }
            Err(why) => {
                tracing::warn!(command = %cmd.id, node = %req.node_id, %why, "result signature rejected");
                return Err(AttestError::Rejected(why));
            }
        };
        Some(serial)
    } else {
        None
    };
    // Only the test-only bypass reads the configuration.
    #[cfg(not(feature = "accept-ingested-attestation"))]
    let _ = cfg;
    // The node record shows only an inventory whose signature verified.
    if cmd.kind == CommandKind::Inventory.as_str() && r.ok && attested_by.is_some() {
        bcm_db::agents::node_fact_upsert_in_txn(&mut tx, &req.node_id, "inventory", &r.output)
            .await?;
    }
    bcm_db::commands::command_attest_and_wake_in_txn(&mut tx, &cmd.id, attested_by.as_deref())
        .await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    Ok(ResultRecorded {
        recorded: true,
        attested_by,
    })
}

/// The session's identity answers for the command: its certificate is
/// among the node's certificates in force (`live`: unrevoked, in their
/// validity window, of the node's current epoch) and of the purpose the
/// command is for. Checked for every result, signed or not, in the
/// transaction that records it.
fn check_identity(
    cmd: &bcm_db::commands::CommandRow,
    live: &[bcm_db::agents::CertRow],
    node_id: &str,
    cert_serial: &str,
) -> Result<(), AttestError> {
    let cert = live
        .iter()
        .find(|c| c.serial == cert_serial && c.node_id == node_id)
        .ok_or_else(|| {
            AttestError::Rejected(format!(
                "certificate {cert_serial} is revoked, expired or of an ended epoch (not in force for node {node_id})"
            ))
        })?;
    let runs = CommandKind::parse(&cmd.kind)
        .is_ok_and(|k| AgentPurpose::parse(&cert.purpose).is_ok_and(|p| k.is_run_by(p)));
    if cmd.node_id.as_deref() != Some(cert.node_id.as_str()) || !runs {
        return Err(AttestError::Rejected(format!(
            "command {} is not for a {} identity of node {}",
            cmd.id, cert.purpose, cert.node_id
        )));
    }
    Ok(())
}

/// An agent answers only the commands agents run, with the output their
/// kind's contract says; anything else is refused (and the transaction that
/// wrote it rolls back).
fn check_contract(cmd: &bcm_db::commands::CommandRow, r: &AgentResult) -> Result<(), AttestError> {
    let kind = CommandKind::parse(&cmd.kind)
        .map_err(|e| AttestError::Invalid(format!("command {}: {e}", cmd.id)))?;
    if kind.family() != Family::Agent {
        return Err(AttestError::Invalid(format!(
            "command {} is a {kind}, which no agent answers",
            cmd.id
        )));
    }
    Output::decode_result(kind, r.ok, &r.output)
        .map(|_| ())
        .map_err(|e| AttestError::Invalid(format!("the result breaks its contract: {e}")))
}
