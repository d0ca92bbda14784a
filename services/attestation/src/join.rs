//! Joining: a one-time token and a CSR become a node certificate and an
//! agent session, in one transaction (a refused join spends no token).
//!
//! The answer to a join can be lost after its transaction committed (the
//! API dies, the connection drops). The agent then retries with the same
//! token and CSR: within `join_retry_window_secs`, a spent token whose
//! certificate holds the CSR's key answers with that same certificate and
//! session, never a second identity and never a refusal. Any other key is
//! refused as for any spent token.
//!
//! No token reaches this service: the API forwards the join token's hash
//! and the hash of the session's bearer token, which the API derives from
//! the join token and the CSR under the control plane's join key, so every
//! answer to one join carries the same token. A join can be processed twice
//! with both answers delivered — the agent gave up on a slow first request
//! and retried, and the first, still queued, is processed after the retry —
//! and a token minted anew for the second would end the session the agent
//! holds from the first.

use bcm_contracts::agent::{AgentPresence, AgentPurpose, AgentRole, PresenceEvent};
use bcm_contracts::attest::{AttestJoin, JoinGranted};
use bcm_db::agents::{CertRow, TokenScope};
use bcm_db::Db;
use bcm_pki::{Ca, IssueRequest};
use chrono::Utc;

use crate::{AttestError, AttestationConfig};

/// The agent role a token purpose admits.
pub fn role_of(purpose: &str) -> Option<AgentRole> {
    AgentPurpose::parse(purpose).ok().map(AgentPurpose::role)
}

/// A 64-digit hex SHA-256 from the bus, decoded.
fn digest(what: &str, hex_text: &str) -> Result<Vec<u8>, AttestError> {
    hex::decode(hex_text)
        .ok()
        .filter(|b| b.len() == 32)
        .ok_or_else(|| AttestError::Invalid(format!("{what} is not a hex SHA-256")))
}

/// Whether a join made its node (an adopt) or joined an existing one.
enum TokenKind {
    Node,
    Adopt,
}

/// Joins an agent.
pub async fn join(
    db: &Db,
    subjects: &bcm_bus::Subjects,
    ca: &Ca,
    cfg: &AttestationConfig,
    req: &AttestJoin,
) -> Result<JoinGranted, AttestError> {
    let token_hash = digest("tokenHash", &req.token_hash)?;
    let session_hash = digest("sessionHash", &req.session_hash)?;
    let mut tx = db.begin().await?;
    let Some((purpose, scope)) =
        bcm_db::agents::join_token_consume_in_txn(&mut tx, &token_hash).await?
    else {
        return rejoin(tx, ca, cfg, req, &token_hash, &session_hash).await;
    };
    if role_of(&purpose) != Some(req.role) {
        return Err(AttestError::WrongRole {
            purpose,
            role: req.role.as_str().to_owned(),
        });
    }
    let (node_id, kind) = match scope {
        TokenScope::Node(n) => (n, TokenKind::Node),
        TokenScope::Pool(pool) => (
            crate::adopt::create_node_in_txn(db, &mut tx, subjects, &pool).await?,
            TokenKind::Adopt,
        ),
    };
    // The certificate names the node's identity epoch as this transaction
    // reads it: a release committed meanwhile leaves it out of force.
    let epoch = bcm_db::agents::epoch_in_txn(&mut tx, &node_id).await?;
    let now = Utc::now();
    let life = if purpose == "discovery" {
        cfg.ramdisk_cert_ttl_secs
    } else {
        cfg.node_cert_ttl_secs
    };
    let not_after = now + chrono::Duration::seconds(life as i64);
    let issued = ca.issue(&IssueRequest {
        csr_pem: &req.csr,
        node_id: &node_id,
        purpose: &purpose,
        epoch: epoch as u32,
        not_before: now - chrono::Duration::minutes(5),
        not_after,
    })?;
    bcm_db::agents::join_record_in_txn(
        &mut tx,
        &CertRow {
            serial: issued.serial.clone(),
            node_id: node_id.clone(),
            public_key: issued.public_key.clone(),
            cert_pem: issued.pem.clone(),
            not_before: now,
            not_after,
            revoked_at: None,
            purpose: purpose.clone(),
            epoch,
        },
        &token_hash,
        &session_hash,
        &format!("agent:{purpose}"),
        &serde_json::to_value(AgentPresence {
            role: req.role,
            event: PresenceEvent::Join,
            cert_serial: Some(issued.serial.clone()),
            hostname: req.hostname.clone(),
        })
        .unwrap_or_default(),
    )
    .await?;
    // An adopting machine's own report, which the pool's acceptance checks
    // read (the ramdisk reports its inventory as a command's result).
    if let (Some(inv), TokenKind::Adopt) = (&req.inventory, &kind) {
        bcm_db::agents::node_fact_upsert_in_txn(
            &mut tx,
            &node_id,
            "inventory",
            &serde_json::to_value(inv).unwrap_or_default(),
        )
        .await?;
    }
    bcm_db::workflows::steps_wake_for_node_in_txn(&mut tx, &node_id).await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    tracing::info!(node = %node_id, %purpose, serial = %issued.serial, "agent joined");
    Ok(JoinGranted {
        node_id,
        cert_serial: issued.serial,
        certificate: issued.pem,
        ca_certificate: ca.cert_pem().to_owned(),
        image_keys: cfg.image_keys.clone(),
    })
}

/// A join with a token already spent: the retry of a join whose answer was
/// lost (same token, same key, soon after) gets its identity back;
/// anything else is a bad token.
async fn rejoin(
    mut tx: bcm_db::Tx<'_>,
    ca: &Ca,
    cfg: &AttestationConfig,
    req: &AttestJoin,
    token_hash: &[u8],
    session_hash: &[u8],
) -> Result<JoinGranted, AttestError> {
    let Some((purpose, cert)) = bcm_db::agents::join_token_spent_recently_in_txn(
        &mut tx,
        token_hash,
        cfg.join_retry_window_secs,
    )
    .await?
    else {
        return Err(AttestError::BadToken);
    };
    if role_of(&purpose) != Some(req.role) {
        return Err(AttestError::WrongRole {
            purpose,
            role: req.role.as_str().to_owned(),
        });
    }
    if Ca::csr_public_key(&req.csr)? != cert.public_key {
        tracing::warn!(node = %cert.node_id, serial = %cert.serial, "a spent join token presented with another key: refused");
        return Err(AttestError::BadToken);
    }
    // The same token as the first answer's (the API derives it from the
    // same join token and CSR); a session opened before is re-keyed to it.
    if !bcm_db::agents::session_rekey_in_txn(&mut tx, &cert.serial, session_hash).await? {
        return Err(AttestError::BadToken);
    }
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    metrics::counter!("bcm_attest_joins_retried_total").increment(1);
    tracing::info!(node = %cert.node_id, %purpose, serial = %cert.serial, "agent join retried: the same identity again");
    Ok(JoinGranted {
        node_id: cert.node_id,
        cert_serial: cert.serial,
        certificate: cert.cert_pem,
        ca_certificate: ca.cert_pem().to_owned(),
        image_keys: cfg.image_keys.clone(),
    })
}
