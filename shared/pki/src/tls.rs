//! TLS of the control plane's HTTPS endpoints: a local CA and a server
//! certificate generated for local use (`bcm local-tls`, the all-in-one on
//! first run, compose's init-secrets), the rustls server configuration
//! from PEM files, and the client side — a reqwest client that trusts
//! exactly one pinned CA (agents, the CLI, tests), never the system's
//! roots. Files only; no sockets.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use crate::PkiError;

/// A CA and a server certificate signed by it, PEM.
#[derive(Clone)]
pub struct LocalTls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for LocalTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTls").finish_non_exhaustive()
    }
}

/// The files [`LocalTls::write_missing`] keeps in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalTlsFiles {
    /// The CA certificate clients pin (`ca.crt`).
    pub ca: PathBuf,
    /// The server's certificate (`api.crt`).
    pub cert: PathBuf,
    /// The server's key (`api.key`, mode 0600).
    pub key: PathBuf,
}

impl LocalTlsFiles {
    /// The file names in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            ca: dir.join("ca.crt"),
            cert: dir.join("api.crt"),
            key: dir.join("api.key"),
        }
    }
}

fn to_time(t: chrono::DateTime<chrono::Utc>) -> Result<::time::OffsetDateTime, PkiError> {
    ::time::OffsetDateTime::from_unix_timestamp(t.timestamp())
        .map_err(|e| PkiError::BadCert(e.to_string()))
}

impl LocalTls {
    /// A new CA (ECDSA P-256, ten years) and a server certificate for
    /// `names` (DNS names or IP addresses; two years).
    pub fn generate(names: &[String]) -> Result<Self, PkiError> {
        if names.is_empty() {
            return Err(PkiError::BadCert(
                "a server certificate needs at least one name".into(),
            ));
        }
        let now = chrono::Utc::now();
        let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name
            .push(DnType::CommonName, "bcm local TLS CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.not_before = to_time(now - chrono::Duration::hours(1))?;
        ca.not_after = to_time(now + chrono::Duration::days(3650))?;
        let ca_cert = ca.self_signed(&ca_key)?;

        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].as_str());
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => rcgen::Ia5String::try_from(n.as_str())
                    .map(SanType::DnsName)
                    .map_err(|e| PkiError::BadCert(format!("{n:?}: {e}"))),
            })
            .collect::<Result<_, _>>()?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = to_time(now - chrono::Duration::hours(1))?;
        params.not_after = to_time(now + chrono::Duration::days(730))?;
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &ca_cert, &ca_key)?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Writes a newly generated CA and server certificate for `names` into
    /// `dir`, unless its server certificate is there already (a second run
    /// keeps what clients pinned). The key is written 0600.
    pub fn write_missing(dir: &Path, names: &[String]) -> Result<LocalTlsFiles, PkiError> {
        let files = LocalTlsFiles::in_dir(dir);
        if files.cert.exists() && files.key.exists() && files.ca.exists() {
            return Ok(files);
        }
        let io = |e: std::io::Error| PkiError::Key(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(io)?;
        let tls = Self::generate(names)?;
        crate::join_key::write_private(&files.key, tls.key_pem.as_bytes()).map_err(io)?;
        std::fs::write(&files.cert, &tls.cert_pem).map_err(io)?;
        std::fs::write(&files.ca, &tls.ca_pem).map_err(io)?;
        Ok(files)
    }
}

/// How an HTTPS server is configured: PEM files, or plain HTTP only when
/// asked for by name (behind a proxy that terminates TLS).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// The server's certificate chain, PEM.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// The server's private key, PEM.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Serve plain HTTP instead (only behind a TLS-terminating proxy, or a
    /// test on loopback). Never the default.
    #[serde(default)]
    pub plain_http: bool,
}

/// What a server serves.
#[derive(Clone)]
pub enum Serving {
    /// HTTPS with this configuration.
    Tls(Arc<rustls::ServerConfig>),
    /// Plain HTTP, asked for by `plain_http = true`.
    Plain,
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Serving::Tls(_) => f.write_str("Tls"),
            Serving::Plain => f.write_str("Plain"),
        }
    }
}

impl ServerTlsConfig {
    /// Files, or `plain_http`; anything else (neither, or both) is a
    /// configuration error that says what to set.
    pub fn serving(&self) -> Result<Serving, PkiError> {
        match (&self.cert_file, &self.key_file, self.plain_http) {
            (Some(cert), Some(key), false) => {
                let read = |p: &PathBuf| {
                    std::fs::read_to_string(p)
                        .map_err(|e| PkiError::BadTls(format!("{}: {e}", p.display())))
                };
                Ok(Serving::Tls(server_config(&read(cert)?, &read(key)?)?))
            }
            (None, None, true) => Ok(Serving::Plain),
            (_, _, true) => Err(PkiError::BadTls(
                "plain_http = true serves no certificate; drop cert_file and key_file or plain_http"
                    .into(),
            )),
            _ => Err(PkiError::BadTls(
                "set cert_file and key_file (`bcm local-tls` writes a local CA and certificate), \
                 or plain_http = true behind a TLS-terminating proxy"
                    .into(),
            )),
        }
    }
}

/// A rustls server configuration (ring; TLS 1.2 and 1.3; HTTP/1.1 and h2).
pub fn server_config(cert_pem: &str, key_pem: &str) -> Result<Arc<rustls::ServerConfig>, PkiError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| PkiError::BadTls(format!("the certificate: {e}")))?;
    if certs.is_empty() {
        return Err(PkiError::BadTls(
            "the certificate file holds no certificate".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| PkiError::BadTls(format!("the key: {e}")))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| PkiError::BadTls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| PkiError::BadTls(format!("the certificate and key: {e}")))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A reqwest client builder that trusts exactly the CA of `ca_pem` (no
/// system roots): what an agent or the CLI pins.
pub fn pinned_client(ca_pem: &str) -> Result<reqwest::ClientBuilder, PkiError> {
    let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes())
        .map_err(|e| PkiError::BadTls(format!("the CA certificate: {e}")))?;
    Ok(reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca))
}

/// A reqwest client that trusts exactly the CA in the PEM file at `path`.
pub fn client_pinned_to_file(path: &Path) -> Result<reqwest::Client, PkiError> {
    let pem = std::fs::read_to_string(path)
        .map_err(|e| PkiError::BadTls(format!("{}: {e}", path.display())))?;
    pinned_client(&pem)?
        .build()
        .map_err(|e| PkiError::BadTls(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_bundle_chains_and_configures_a_server() {
        let tls = LocalTls::generate(&["localhost".into(), "127.0.0.1".into()]).expect("tls");
        server_config(&tls.cert_pem, &tls.key_pem).expect("server config");
        let _client = pinned_client(&tls.ca_pem)
            .expect("client")
            .build()
            .expect("build");
        // The key of another bundle does not go with this certificate.
        let other = LocalTls::generate(&["localhost".into()]).expect("other");
        assert!(server_config(&tls.cert_pem, &other.key_pem).is_err());
        assert!(server_config("not pem", &tls.key_pem).is_err());
    }

    #[test]
    fn a_server_serves_tls_or_plain_only_when_asked_by_name() {
        let dir = std::env::temp_dir().join(format!("bcm-tls-{}", std::process::id()));
        let files = LocalTls::write_missing(&dir, &["localhost".into()]).expect("write");
        let first = std::fs::read_to_string(&files.ca).expect("ca");
        // A second run keeps what clients pinned.
        LocalTls::write_missing(&dir, &["localhost".into()]).expect("again");
        assert_eq!(std::fs::read_to_string(&files.ca).expect("ca"), first);
        let tls = ServerTlsConfig {
            cert_file: Some(files.cert.clone()),
            key_file: Some(files.key.clone()),
            plain_http: false,
        };
        assert!(matches!(tls.serving(), Ok(Serving::Tls(_))));
        let plain = ServerTlsConfig {
            plain_http: true,
            ..Default::default()
        };
        assert!(matches!(plain.serving(), Ok(Serving::Plain)));
        // Neither, or both, is refused with what to set.
        let none = ServerTlsConfig::default().serving();
        assert!(matches!(none, Err(PkiError::BadTls(m)) if m.contains("plain_http")));
        let both = ServerTlsConfig {
            plain_http: true,
            ..tls
        };
        assert!(both.serving().is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
