//! Rejoining with an identity: an installed OS's agent that kept its key
//! and certificate on disk comes back after a reboot (or a restart of its
//! process) without a token. It signs `{node, serial, signedAt, csr}` with
//! the key of a certificate in force (unrevoked, unexpired, of the node's
//! current epoch, of an installed OS's purpose: a ramdisk's identity dies
//! with its boot); a fresh signature opens a new session on that
//! certificate, and one that carries a CSR renews it: a new certificate of
//! the same node, purpose and epoch for the CSR's key (the old one stays in
//! force until it expires, so a renewal whose answer was lost strands
//! nothing: the agent signs again with the old key).
//!
//! Any answer can be lost: the API derives the session token from the
//! signature, so the same signed request asked again finds the session it
//! opened and gets the same answer (the same certificate, never a second
//! one). A signature older than the newest one this certificate made, or
//! outside the clock window, is refused: a captured request is no key.

use bcm_contracts::agent::{AgentPurpose, RejoinRequest};
use bcm_contracts::attest::{AttestRejoin, JoinGranted};
use bcm_db::agents::CertRow;
use bcm_db::Db;
use bcm_pki::{Ca, IssueRequest};
use chrono::{DateTime, Utc};
use ed25519_dalek::{Signature, VerifyingKey};

use crate::{AttestError, AttestationConfig};

/// How far a rejoin's `signedAt` may be from this service's clock.
pub const CLOCK_WINDOW_SECS: i64 = 300;

fn refused(why: impl std::fmt::Display) -> AttestError {
    AttestError::RejoinRefused(why.to_string())
}

/// Rejoins (and, with a CSR, renews) an agent's identity.
pub async fn rejoin(
    db: &Db,
    ca: &Ca,
    cfg: &AttestationConfig,
    req: &AttestRejoin,
) -> Result<JoinGranted, AttestError> {
    let session_hash = hex::decode(&req.session_hash)
        .ok()
        .filter(|b| b.len() == 32)
        .ok_or_else(|| AttestError::Invalid("sessionHash is not a hex SHA-256".into()))?;
    let signed_at: DateTime<Utc> = req
        .signed_at
        .parse()
        .map_err(|_| AttestError::Invalid("signedAt is not an RFC 3339 time".into()))?;
    let signature = base64_decode(&req.signature)
        .and_then(|b| Signature::from_slice(&b).ok())
        .ok_or_else(|| {
            AttestError::Invalid("signature is not a base64 ed25519 signature".into())
        })?;
    let now = Utc::now();
    let mut tx = db.begin().await?;
    let Some(cert) = bcm_db::agents::cert_in_force_in_txn(&mut tx, &req.cert_serial).await? else {
        return Err(AttestError::BadIdentity);
    };
    if cert.node_id != req.node_id {
        return Err(AttestError::BadIdentity);
    }
    if !matches!(
        AgentPurpose::parse(&cert.purpose),
        Ok(AgentPurpose::Provisioned | AgentPurpose::Node)
    ) {
        return Err(refused(format!(
            "a {} identity ends with its boot; it joins with a token",
            cert.purpose
        )));
    }
    let key = ca
        .check(&cert.cert_pem, now)
        .ok()
        .and_then(|c| <[u8; 32]>::try_from(c.public_key.as_slice()).ok())
        .and_then(|k| VerifyingKey::from_bytes(&k).ok())
        .ok_or(AttestError::BadIdentity)?;
    let input = RejoinRequest::signing_input(
        &req.node_id,
        &req.cert_serial,
        &req.signed_at,
        req.csr.as_deref(),
    );
    if key.verify_strict(&input, &signature).is_err() {
        tracing::warn!(node = %cert.node_id, serial = %cert.serial, "a rejoin whose signature does not verify: refused");
        return Err(AttestError::BadIdentity);
    }
    // The same signed request again (its answer was lost): the same answer.
    if let Some(serial) =
        bcm_db::agents::session_cert_of_hash_in_txn(&mut tx, &session_hash).await?
    {
        let granted = bcm_db::agents::cert_in_force_in_txn(&mut tx, &serial)
            .await?
            .filter(|c| c.node_id == cert.node_id)
            .ok_or(AttestError::BadIdentity)?;
        tracing::info!(node = %cert.node_id, serial = %granted.serial, "rejoin asked again: the same answer");
        return Ok(granted_of(ca, cfg, granted));
    }
    if (now - signed_at).num_seconds().abs() > CLOCK_WINDOW_SECS {
        return Err(refused(format!(
            "signedAt {} is more than {CLOCK_WINDOW_SECS} s from the control plane's clock",
            req.signed_at
        )));
    }
    if !bcm_db::agents::cert_mark_rejoin_in_txn(&mut tx, &cert.serial, signed_at).await? {
        return Err(refused(
            "this certificate signed a newer rejoin already (a replay?)",
        ));
    }
    let granted = match &req.csr {
        None => cert,
        Some(csr) => {
            let epoch = bcm_db::agents::epoch_in_txn(&mut tx, &cert.node_id).await?;
            let not_after = now + chrono::Duration::seconds(cfg.node_cert_ttl_secs as i64);
            let issued = ca.issue(&IssueRequest {
                csr_pem: csr,
                node_id: &cert.node_id,
                purpose: &cert.purpose,
                epoch: epoch as u32,
                not_before: now - chrono::Duration::minutes(5),
                not_after,
            })?;
            let renewed = CertRow {
                serial: issued.serial.clone(),
                node_id: cert.node_id.clone(),
                public_key: issued.public_key.clone(),
                cert_pem: issued.pem.clone(),
                not_before: now,
                not_after,
                revoked_at: None,
                purpose: cert.purpose.clone(),
                epoch,
            };
            bcm_db::agents::cert_insert_in_txn(&mut tx, &renewed).await?;
            bcm_db::agents::cert_mark_rejoin_in_txn(&mut tx, &renewed.serial, signed_at).await?;
            metrics::counter!("bcm_attest_renewals_total").increment(1);
            tracing::info!(node = %cert.node_id, old = %cert.serial, new = %renewed.serial, "node certificate renewed");
            renewed
        }
    };
    bcm_db::agents::session_insert_in_txn(
        &mut tx,
        &session_hash,
        &granted.node_id,
        &granted.serial,
        &granted.purpose,
        granted.not_after,
    )
    .await?;
    bcm_db::workflows::steps_wake_for_node_in_txn(&mut tx, &granted.node_id).await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    metrics::counter!("bcm_attest_rejoins_total").increment(1);
    tracing::info!(node = %granted.node_id, purpose = %granted.purpose, serial = %granted.serial, "agent rejoined with its identity");
    Ok(granted_of(ca, cfg, granted))
}

fn granted_of(ca: &Ca, cfg: &AttestationConfig, cert: CertRow) -> JoinGranted {
    JoinGranted {
        node_id: cert.node_id,
        cert_serial: cert.serial,
        certificate: cert.cert_pem,
        ca_certificate: ca.cert_pem().to_owned(),
        image_keys: cfg.image_keys.clone(),
    }
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}
