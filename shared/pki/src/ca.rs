//! The certificate authority of node certificates: generated for a dev
//! stack or loaded from configured PEM files, it turns an agent's CSR into a
//! short-lived certificate naming the node (CN) and the join purpose (OU),
//! and checks that a stored certificate chains to it and is in its
//! validity window. Agents build their CSR with [`csr_pem`].

use chrono::{DateTime, Utc};
use rand::RngCore;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SerialNumber,
};
use x509_parser::prelude::*;

use crate::PkiError;

/// The node CA: its certificate and signing key.
pub struct Ca {
    issuer: rcgen::Certificate,
    key: KeyPair,
    cert_pem: String,
    cert_der: Vec<u8>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// What to issue.
#[derive(Debug, Clone)]
pub struct IssueRequest<'a> {
    pub csr_pem: &'a str,
    pub node_id: &'a str,
    /// The join purpose (`discovery`, `provisioned`, `node`).
    pub purpose: &'a str,
    /// The node's identity epoch.
    pub epoch: u32,
    pub not_before: DateTime<Utc>,
    pub not_after: DateTime<Utc>,
}

/// An issued certificate.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    /// Hex of the certificate's serial number.
    pub serial: String,
    pub pem: String,
    /// The node's raw ed25519 public key (32 bytes).
    pub public_key: Vec<u8>,
}

/// What a certificate that chains to the CA says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedCert {
    pub serial: String,
    pub node_id: String,
    pub purpose: String,
    /// The identity epoch the certificate names (0 when it names none:
    /// issued before epochs).
    pub epoch: u32,
    pub public_key: Vec<u8>,
    /// The end of its validity window (an agent renews before it).
    pub not_after: DateTime<Utc>,
    /// The start of its validity window.
    pub not_before: DateTime<Utc>,
}

/// The URI a node certificate's subject alternative name holds: node,
/// purpose and epoch, as the CA alone can vouch for them.
pub fn identity_uri(node_id: &str, purpose: &str, epoch: u32) -> String {
    format!("urn:bcm:agent:{node_id}:{purpose}:epoch:{epoch}")
}

/// The epoch an identity URI names, if it is one for `node_id` and
/// `purpose`.
fn epoch_of_uri(uri: &str, node_id: &str, purpose: &str) -> Option<u32> {
    uri.strip_prefix("urn:bcm:agent:")?
        .strip_prefix(node_id)?
        .strip_prefix(':')?
        .strip_prefix(purpose)?
        .strip_prefix(":epoch:")?
        .parse()
        .ok()
}

fn to_time(t: DateTime<Utc>) -> Result<::time::OffsetDateTime, PkiError> {
    ::time::OffsetDateTime::from_unix_timestamp(t.timestamp())
        .map_err(|e| PkiError::BadCert(e.to_string()))
}

fn der_of_pem(pem: &str) -> Result<Vec<u8>, PkiError> {
    let (_, p) = parse_x509_pem(pem.as_bytes()).map_err(|e| PkiError::BadCert(e.to_string()))?;
    Ok(p.contents)
}

impl Ca {
    /// A new CA with an ed25519 key, valid for ten years.
    pub fn generate(common_name: &str) -> Result<Self, PkiError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = Utc::now();
        params.not_before = to_time(now - chrono::Duration::hours(1))?;
        params.not_after = to_time(now + chrono::Duration::days(3650))?;
        let cert = params.self_signed(&key)?;
        let pem = cert.pem();
        Self::from_pem(&pem, &key.serialize_pem())
    }

    /// The CA of a PEM certificate and its PEM (PKCS#8) key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| PkiError::BadCa(e.to_string()))?;
        let cert_der = der_of_pem(cert_pem).map_err(|e| PkiError::BadCa(e.to_string()))?;
        let (_, parsed) =
            X509Certificate::from_der(&cert_der).map_err(|e| PkiError::BadCa(e.to_string()))?;
        if parsed.public_key().raw != key.public_key_der().as_slice() {
            return Err(PkiError::BadCa(
                "the key is not the certificate's key".into(),
            ));
        }
        if !parsed.is_ca() {
            return Err(PkiError::BadCa("the certificate is not a CA".into()));
        }
        // rcgen signs with an issuer built from the same subject and key.
        let params = CertificateParams::from_ca_cert_der(&cert_der.clone().into())
            .map_err(|e| PkiError::BadCa(e.to_string()))?;
        let issuer = params.self_signed(&key)?;
        Ok(Self {
            issuer,
            key,
            cert_pem: cert_pem.to_owned(),
            cert_der,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA key, PEM (PKCS#8), for writing a generated CA to disk.
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A key for deriving agent session tokens
    /// ([`crate::tokens::derive_prefixed`]): SHA-256 over a label and the CA
    /// key, so every attestation process of one CA derives the same tokens
    /// and nobody without the CA key can.
    pub fn session_key(&self) -> [u8; 32] {
        use sha2::Digest as _;
        let mut h = sha2::Sha256::new();
        h.update(b"bcm agent session tokens v1\0");
        h.update(self.key.serialized_der());
        h.finalize().into()
    }

    /// Issues a node certificate for the CSR's (ed25519) key. The CSR's own
    /// subject and extensions are ignored: the CA decides what it says.
    pub fn issue(&self, req: &IssueRequest<'_>) -> Result<IssuedCert, PkiError> {
        let mut csr =
            CertificateSigningRequestParams::from_pem(req.csr_pem).map_err(|_| PkiError::BadCsr)?;
        if csr.public_key.algorithm() != &rcgen::PKCS_ED25519 {
            return Err(PkiError::WrongKeyType(format!(
                "{:?}",
                csr.public_key.algorithm()
            )));
        }
        let public_key = rcgen::PublicKeyData::der_bytes(&csr.public_key).to_vec();
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, req.node_id);
        params
            .distinguished_name
            .push(DnType::OrganizationalUnitName, req.purpose);
        let uri = identity_uri(req.node_id, req.purpose, req.epoch);
        params.subject_alt_names = vec![rcgen::SanType::URI(
            rcgen::Ia5String::try_from(uri).map_err(|e| PkiError::BadCert(e.to_string()))?,
        )];
        let mut serial = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut serial);
        // A positive INTEGER whose first byte is never zero: DER writes an
        // integer in its fewest bytes, so a leading zero (1 serial in 128
        // before) made the certificate's serial shorter than the one
        // recorded, and every look-up by the serial it presents missed.
        serial[0] = (serial[0] & 0x3f) | 0x40;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.not_before = to_time(req.not_before)?;
        params.not_after = to_time(req.not_after)?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        csr.params = params;
        let cert = csr.signed_by(&self.issuer, &self.key)?;
        Ok(IssuedCert {
            serial: hex::encode(serial),
            pem: cert.pem(),
            public_key,
        })
    }

    /// The public key (DER `SubjectPublicKeyInfo` bytes, as [`IssuedCert`]
    /// holds them) a CSR asks a certificate for: a retried join is the same
    /// agent only if its CSR holds the same key.
    pub fn csr_public_key(csr_pem: &str) -> Result<Vec<u8>, PkiError> {
        let csr =
            CertificateSigningRequestParams::from_pem(csr_pem).map_err(|_| PkiError::BadCsr)?;
        Ok(rcgen::PublicKeyData::der_bytes(&csr.public_key).to_vec())
    }

    /// Checks that `cert_pem` was issued by this CA and is valid at `at`.
    pub fn check(&self, cert_pem: &str, at: DateTime<Utc>) -> Result<CheckedCert, PkiError> {
        check_der(&self.cert_der, cert_pem, at)
    }
}

/// Checks that `cert_pem` was issued by the CA certificate `ca_pem` and is
/// valid at `at` (what an agent or an auditor can do without the CA key).
pub fn check_against(
    ca_pem: &str,
    cert_pem: &str,
    at: DateTime<Utc>,
) -> Result<CheckedCert, PkiError> {
    check_der(&der_of_pem(ca_pem)?, cert_pem, at)
}

fn check_der(ca_der: &[u8], cert_pem: &str, at: DateTime<Utc>) -> Result<CheckedCert, PkiError> {
    let der = der_of_pem(cert_pem)?;
    let (_, cert) =
        X509Certificate::from_der(&der).map_err(|e| PkiError::BadCert(e.to_string()))?;
    let (_, ca) = X509Certificate::from_der(ca_der).map_err(|e| PkiError::BadCa(e.to_string()))?;
    if cert.issuer() != ca.subject() {
        return Err(PkiError::NotIssuedByCa);
    }
    cert.verify_signature(Some(ca.public_key()))
        .map_err(|_| PkiError::NotIssuedByCa)?;
    let when =
        ASN1Time::from_timestamp(at.timestamp()).map_err(|e| PkiError::BadCert(e.to_string()))?;
    if !cert.validity().is_valid_at(when) {
        return Err(PkiError::OutsideValidity(crate::format_ts(at)));
    }
    let text = |it: Option<&AttributeTypeAndValue<'_>>| {
        it.and_then(|a| a.as_str().ok()).unwrap_or("").to_owned()
    };
    let node_id = text(cert.subject().iter_common_name().next());
    let purpose = text(cert.subject().iter_organizational_unit().next());
    let uris: Vec<&str> = match cert.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                GeneralName::URI(u) => Some(*u),
                _ => None,
            })
            .collect(),
        Ok(None) => vec![],
        Err(e) => return Err(PkiError::BadCert(e.to_string())),
    };
    let epoch = match uris.as_slice() {
        [] => 0,
        [one] => epoch_of_uri(one, &node_id, &purpose).ok_or_else(|| {
            PkiError::BadCert(format!("the identity {one:?} does not name the subject"))
        })?,
        _ => return Err(PkiError::BadCert("more than one identity".into())),
    };
    let checked = CheckedCert {
        serial: hex::encode(cert.raw_serial()),
        node_id,
        purpose,
        epoch,
        public_key: cert.public_key().subject_public_key.data.to_vec(),
        not_after: DateTime::from_timestamp(cert.validity().not_after.timestamp(), 0)
            .unwrap_or_default(),
        not_before: DateTime::from_timestamp(cert.validity().not_before.timestamp(), 0)
            .unwrap_or_default(),
    };
    Ok(checked)
}

/// An agent's CSR (PEM) for its ed25519 key; `name` is only a hint, the
/// CA names the certificate after the node the join token is for.
pub fn csr_pem(key: &ed25519_dalek::SigningKey, name: &str) -> Result<String, PkiError> {
    use ed25519_dalek::pkcs8::EncodePrivateKey;
    let der = key
        .to_pkcs8_der()
        .map_err(|e| PkiError::Key(e.to_string()))?;
    let kp = KeyPair::try_from(der.as_bytes()).map_err(|e| PkiError::Key(e.to_string()))?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, name);
    Ok(params.serialize_request(&kp)?.pem()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    fn req<'a>(csr: &'a str, node: &'a str) -> IssueRequest<'a> {
        let now = Utc::now();
        IssueRequest {
            csr_pem: csr,
            node_id: node,
            purpose: "discovery",
            epoch: 3,
            not_before: now - chrono::Duration::minutes(5),
            not_after: now + chrono::Duration::hours(1),
        }
    }

    #[test]
    fn issues_a_certificate_for_the_csr_key_that_checks() {
        let ca = Ca::generate("bcm test CA").expect("ca");
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let csr = csr_pem(&key, "whatever-the-agent-says").expect("csr");
        let issued = ca.issue(&req(&csr, "node_1")).expect("issue");
        assert_eq!(issued.public_key, key.verifying_key().to_bytes().to_vec());
        let checked = ca.check(&issued.pem, Utc::now()).expect("check");
        assert_eq!(checked.node_id, "node_1");
        assert_eq!(checked.purpose, "discovery");
        assert_eq!(checked.epoch, 3);
        assert_eq!(checked.serial, issued.serial);
        assert_eq!(checked.public_key, issued.public_key);
        // Outside its window it does not check.
        let later = Utc::now() + chrono::Duration::hours(2);
        assert!(matches!(
            ca.check(&issued.pem, later),
            Err(PkiError::OutsideValidity(_))
        ));
    }

    #[test]
    fn every_certificate_presents_the_serial_it_was_recorded_under() {
        let ca = Ca::generate("bcm test CA").expect("ca");
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let csr = csr_pem(&key, "n").expect("csr");
        // A serial drawn with a leading zero byte came back a byte shorter
        // (1 in 128): 600 issues see one with a chance of 99 %.
        for _ in 0..600 {
            let issued = ca.issue(&req(&csr, "node_1")).expect("issue");
            let checked = ca.check(&issued.pem, Utc::now()).expect("check");
            assert_eq!(checked.serial, issued.serial);
        }
    }

    #[test]
    fn another_ca_s_certificate_does_not_check() {
        let ca = Ca::generate("bcm test CA").expect("ca");
        let rogue = Ca::generate("bcm test CA").expect("rogue");
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let csr = csr_pem(&key, "n").expect("csr");
        let issued = rogue.issue(&req(&csr, "node_1")).expect("issue");
        assert!(matches!(
            ca.check(&issued.pem, Utc::now()),
            Err(PkiError::NotIssuedByCa)
        ));
    }

    #[test]
    fn a_tampered_csr_is_refused() {
        let ca = Ca::generate("bcm test CA").expect("ca");
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let csr = csr_pem(&key, "n").expect("csr");
        let der = der_of_csr(&csr);
        let mut bad = der.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1; // the signature's last byte
        let bad_pem = pem_of("CERTIFICATE REQUEST", &bad);
        assert!(matches!(
            ca.issue(&req(&bad_pem, "node_1")),
            Err(PkiError::BadCsr)
        ));
        assert!(matches!(
            ca.issue(&req("not a csr", "node_1")),
            Err(PkiError::BadCsr)
        ));
    }

    #[test]
    fn a_saved_ca_loads_and_a_mismatched_key_is_refused() {
        let ca = Ca::generate("bcm test CA").expect("ca");
        let loaded = Ca::from_pem(ca.cert_pem(), &ca.key_pem()).expect("load");
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let csr = csr_pem(&key, "n").expect("csr");
        let issued = loaded.issue(&req(&csr, "node_9")).expect("issue");
        ca.check(&issued.pem, Utc::now())
            .expect("issued by the same CA");
        let other = Ca::generate("other").expect("other");
        assert!(matches!(
            Ca::from_pem(ca.cert_pem(), &other.key_pem()),
            Err(PkiError::BadCa(_))
        ));
    }

    fn der_of_csr(pem: &str) -> Vec<u8> {
        use base64::Engine as _;
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .expect("base64")
    }

    fn pem_of(label: &str, der: &[u8]) -> String {
        use base64::Engine as _;
        let b = base64::engine::general_purpose::STANDARD.encode(der);
        let lines: Vec<&str> = b
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap_or(""))
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    }
}
