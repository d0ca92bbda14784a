//! Joining: a one-time token and a CSR become a node certificate and an
//! agent session, in one transaction (a refused join spends no token).

use bcm_contracts::agent::{AgentPresence, AgentRole, JoinRequest, JoinResponse, PresenceEvent};
use bcm_db::agents::{CertRow, TokenScope};
use bcm_db::Db;
use bcm_pki::{Ca, IssueRequest};
use chrono::Utc;

use crate::{AttestError, AttestationConfig};

/// The agent role a token purpose admits.
pub fn role_of(purpose: &str) -> Option<AgentRole> {
    match purpose {
        "discovery" => Some(AgentRole::Ramdisk),
        "provisioned" | "node" => Some(AgentRole::Node),
        _ => None,
    }
}

/// Joins an agent.
pub async fn join(
    db: &Db,
    subjects: &bcm_bus::Subjects,
    ca: &Ca,
    cfg: &AttestationConfig,
    req: &JoinRequest,
) -> Result<JoinResponse, AttestError> {
    let mut tx = db.begin().await?;
    let (purpose, scope) =
        bcm_db::agents::join_token_consume_in_txn(&mut tx, &bcm_pki::tokens::hash(&req.token))
            .await?
            .ok_or(AttestError::BadToken)?;
    if role_of(&purpose) != Some(req.role) {
        return Err(AttestError::WrongRole {
            purpose,
            role: req.role.as_str().to_owned(),
        });
    }
    let node_id = match scope {
        TokenScope::Node(n) => n,
        TokenScope::Pool(pool) => {
            crate::adopt::create_node_in_txn(db, &mut tx, subjects, &pool).await?
        }
    };
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
        not_before: now - chrono::Duration::minutes(5),
        not_after,
    })?;
    bcm_db::agents::cert_insert_in_txn(
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
        },
    )
    .await?;
    let (session, session_hash) = bcm_pki::tokens::mint_prefixed("bcms_");
    bcm_db::agents::session_insert_in_txn(
        &mut tx,
        &session_hash,
        &node_id,
        &issued.serial,
        &purpose,
        not_after,
    )
    .await?;
    bcm_db::agents::node_fact_upsert_in_txn(
        &mut tx,
        &node_id,
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
    bcm_db::workflows::steps_wake_for_node_in_txn(&mut tx, &node_id).await?;
    tx.commit().await.map_err(bcm_db::DbError::from)?;
    tracing::info!(node = %node_id, %purpose, serial = %issued.serial, "agent joined");
    Ok(JoinResponse {
        node_id,
        session_token: session,
        cert_serial: issued.serial,
        certificate: issued.pem,
        ca_certificate: ca.cert_pem().to_owned(),
        image_keys: cfg.image_keys.clone(),
    })
}
