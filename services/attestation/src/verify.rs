//! Verifying a node-signed result, without I/O: the signing input is
//! rebuilt from the STORED command row (id, node, kind, params, issue time)
//! and the stored result, and the signature must verify against a
//! certificate of that node that chains to the CA, is in its validity
//! window and is not revoked (the caller passes only the node's
//! certificates in force: unrevoked, of its current epoch), of a purpose
//! the command is for ([`CommandKind::run_by`]), and naming the epoch its
//! row says.

use bcm_contracts::agent::AgentPurpose;
use bcm_contracts::CommandKind;
use bcm_db::agents::CertRow;
use bcm_db::commands::CommandRow;
use bcm_pki::{Ca, SignedFacts};
use chrono::{DateTime, Utc};
use ed25519_dalek::{Signature, VerifyingKey};
use serde_json::Value;

/// Checks the stored row's signature; the serial of the certificate it
/// verified against, or why it did not.
pub fn verify_stored(
    ca: &Ca,
    cmd: &CommandRow,
    live_certs: &[CertRow],
    now: DateTime<Utc>,
) -> Result<String, String> {
    let node_id = cmd.node_id.as_deref().ok_or("the command has no node")?;
    let kind = CommandKind::parse(&cmd.kind).map_err(|e| e.to_string())?;
    let purposes = kind.run_by();
    if purposes.is_empty() {
        return Err(format!("a {kind} is no agent's command"));
    }
    let runs = |p: &str| AgentPurpose::parse(p).is_ok_and(|p| kind.is_run_by(p));
    let sig = cmd.signature.as_deref().ok_or("the result is not signed")?;
    let sig = Signature::from_slice(sig).map_err(|_| "not an ed25519 signature")?;
    let result = cmd.result.as_ref().ok_or("the command has no result")?;
    let ok = result.get("ok").and_then(Value::as_bool).unwrap_or(false);
    let null = Value::Null;
    let output = result.get("output").unwrap_or(&null);
    let error = result.get("error").and_then(Value::as_str);
    let finished_at: DateTime<Utc> = result
        .get("finishedAt")
        .and_then(Value::as_str)
        .and_then(|t| t.parse().ok())
        .ok_or("the result has no finishedAt")?;
    let input = bcm_pki::signing_input(&SignedFacts {
        command_id: &cmd.id,
        node_id,
        kind: &cmd.kind,
        params: &cmd.params,
        issued_at: cmd.created_at,
        ok,
        output,
        error,
        finished_at,
    });
    let mut why = format!("no valid, unrevoked certificate of node {node_id}");
    for cert in live_certs.iter().filter(|c| c.revoked_at.is_none()) {
        let checked = match ca.check(&cert.cert_pem, now) {
            Ok(c) => c,
            Err(e) => {
                why = format!("certificate {}: {e}", cert.serial);
                continue;
            }
        };
        if checked.node_id != node_id || cert.node_id != node_id {
            continue;
        }
        if !runs(&checked.purpose) || checked.purpose != cert.purpose {
            let wanted: Vec<&str> = purposes.iter().map(|p| p.as_str()).collect();
            why = format!(
                "certificate {} is a {} identity; a {kind} is answered only by a {} one",
                cert.serial,
                checked.purpose,
                wanted.join(" or ")
            );
            continue;
        }
        if i64::from(checked.epoch) != i64::from(cert.epoch) {
            why = format!(
                "certificate {} names epoch {}, not the epoch {} it is recorded in",
                cert.serial, checked.epoch, cert.epoch
            );
            continue;
        }
        let Some(key) = <[u8; 32]>::try_from(checked.public_key.as_slice())
            .ok()
            .and_then(|k| VerifyingKey::from_bytes(&k).ok())
        else {
            continue;
        };
        if key.verify_strict(&input, &sig).is_ok() {
            return Ok(cert.serial.clone());
        }
        why = format!(
            "the signature does not verify against certificate {} of node {node_id} \
             (made for another command, other parameters or another key?)",
            cert.serial
        );
    }
    Err(why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};
    use serde_json::json;

    struct Fixture {
        ca: Ca,
        cert: CertRow,
        cmd: CommandRow,
    }

    fn fixture() -> Fixture {
        let ca = Ca::generate("test").expect("ca");
        let key = SigningKey::generate(&mut rand_core());
        let csr = bcm_pki::csr_pem(&key, "n").expect("csr");
        let now = Utc::now();
        let issued = ca
            .issue(&bcm_pki::IssueRequest {
                csr_pem: &csr,
                node_id: "node_1",
                purpose: "discovery",
                epoch: 2,
                not_before: now - chrono::Duration::minutes(1),
                not_after: now + chrono::Duration::hours(1),
            })
            .expect("issue");
        let cert = CertRow {
            serial: issued.serial,
            node_id: "node_1".into(),
            public_key: issued.public_key,
            cert_pem: issued.pem,
            not_before: now,
            not_after: now + chrono::Duration::hours(1),
            revoked_at: None,
            purpose: "discovery".into(),
            epoch: 2,
        };
        let issued_at: DateTime<Utc> = "2026-11-30T10:00:00.123456Z".parse().expect("ts");
        let finished = "2026-11-30T10:01:00.654321Z";
        let params = json!({"mode": "quick", "verify": true});
        let output = json!({"disks": [{"serial": "S1", "outcome": "verified"}]});
        let input = bcm_pki::signing_input(&SignedFacts {
            command_id: "cmd_1",
            node_id: "node_1",
            kind: "disk.wipe",
            params: &params,
            issued_at,
            ok: true,
            output: &output,
            error: None,
            finished_at: finished.parse().expect("ts"),
        });
        let sig = key.sign(&input).to_bytes().to_vec();
        let cmd = CommandRow {
            id: "cmd_1".into(),
            node_id: Some("node_1".into()),
            site_id: Some("s1".into()),
            kind: "disk.wipe".into(),
            target: "ramdisk".into(),
            params,
            status: bcm_core::workflow::CommandStatus::Succeeded,
            result: Some(
                json!({"ok": true, "retryable": false, "output": output, "error": null, "finishedAt": finished}),
            ),
            signature: Some(sig),
            attested_by: None,
            created_at: issued_at,
            completed_at: None,
            actor: None,
            traceparent: None,
            batch_id: None,
        };
        Fixture { ca, cert, cmd }
    }

    fn rand_core() -> rand::rngs::OsRng {
        rand::rngs::OsRng
    }

    #[test]
    fn a_genuine_signature_verifies() {
        let f = fixture();
        assert_eq!(
            verify_stored(&f.ca, &f.cmd, std::slice::from_ref(&f.cert), Utc::now()),
            Ok(f.cert.serial.clone())
        );
    }

    #[test]
    fn forged_or_misplaced_signatures_do_not() {
        let f = fixture();
        let certs = [f.cert.clone()];
        // A forged signature (another key).
        let mut forged = f.cmd.clone();
        let other = SigningKey::generate(&mut rand_core());
        forged.signature = Some(other.sign(b"anything").to_bytes().to_vec());
        assert!(verify_stored(&f.ca, &forged, &certs, Utc::now()).is_err());
        // The same signature over another command row (id, params, output).
        let mut other_row = f.cmd.clone();
        other_row.id = "cmd_2".into();
        assert!(verify_stored(&f.ca, &other_row, &certs, Utc::now()).is_err());
        let mut other_params = f.cmd.clone();
        other_params.params = json!({"mode": "secure-erase", "verify": true});
        assert!(verify_stored(&f.ca, &other_params, &certs, Utc::now()).is_err());
        let mut other_output = f.cmd.clone();
        if let Some(r) = other_output.result.as_mut() {
            r["output"]["disks"][0]["outcome"] = json!("failed");
        }
        assert!(verify_stored(&f.ca, &other_output, &certs, Utc::now()).is_err());
        // Another node's certificate (same key, other node) does not count.
        let mut other_node = f.cert.clone();
        other_node.node_id = "node_2".into();
        assert!(verify_stored(&f.ca, &f.cmd, &[other_node], Utc::now()).is_err());
        // A revoked certificate does not count.
        let mut revoked = f.cert.clone();
        revoked.revoked_at = Some(Utc::now());
        assert!(verify_stored(&f.ca, &f.cmd, &[revoked], Utc::now()).is_err());
        // Nor a certificate of another purpose (an installed OS's key
        // answering a ramdisk command), however its row is labelled.
        let mut os = f.cert.clone();
        os.purpose = "provisioned".into();
        assert!(verify_stored(&f.ca, &f.cmd, &[os], Utc::now()).is_err());
        // Nor one whose row is of another epoch than the certificate names.
        let mut stale = f.cert.clone();
        stale.epoch = 3;
        assert!(verify_stored(&f.ca, &f.cmd, &[stale], Utc::now()).is_err());
        // Nor one from another CA.
        let rogue = Ca::generate("test").expect("rogue");
        assert!(verify_stored(&rogue, &f.cmd, &certs, Utc::now()).is_err());
        // Nor after the certificate expired.
        let later = Utc::now() + chrono::Duration::hours(2);
        assert!(verify_stored(&f.ca, &f.cmd, &certs, later).is_err());
        // An unsigned result is not verified.
        let mut unsigned = f.cmd.clone();
        unsigned.signature = None;
        assert!(verify_stored(&f.ca, &unsigned, &certs, Utc::now()).is_err());
    }
}
