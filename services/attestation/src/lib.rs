//! The attestation service: the only process that holds the node CA's key.
//! It answers three requests over NATS (queue group `attestation`, so any
//! number of replicas share them): `attest.join` (consume a one-time join
//! token, issue a short-lived node certificate for the agent's CSR, open an
//! agent session), `attest.rejoin` (an installed OS's agent back with the
//! identity it kept: a fresh signature of a certificate in force opens a
//! session, and with a CSR renews the certificate) and `attest.result` (record an agent's result and verify
//! its signature against the STORED command row and a valid, unrevoked
//! certificate of the node, in one transaction that rolls back when it
//! does not verify). Join tokens are minted, and identities revoked, by
//! `bcm_metal::identity` in the transaction of whoever hands them out or
//! ends them.

pub mod adopt;
pub mod ca_store;
pub mod error;
pub mod join;
pub mod rejoin;
pub mod results;
pub mod service;
pub mod verify;

use serde::Deserialize;
use std::path::PathBuf;

pub use error::AttestError;
pub use service::{run, start};

/// Configuration of the attestation service.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttestationConfig {
    /// The CA certificate (PEM). With `ca_key_file`; both or neither.
    #[serde(default)]
    pub ca_cert_file: Option<PathBuf>,
    /// The CA's private key (PEM, PKCS#8).
    #[serde(default)]
    pub ca_key_file: Option<PathBuf>,
    /// Generate a CA when the files do not exist yet (and write them), or,
    /// without files, keep an ephemeral one in memory. For development.
    #[serde(default)]
    pub generate_ca: bool,
    /// Lifetime of a ramdisk's certificate.
    #[serde(default = "default_ramdisk_ttl")]
    pub ramdisk_cert_ttl_secs: u64,
    /// Lifetime of an installed OS's certificate.
    #[serde(default = "default_node_ttl")]
    pub node_cert_ttl_secs: u64,
    /// A join whose answer was lost may be retried with the same token and
    /// the same agent key for this long, and gets the same identity back.
    #[serde(default = "default_join_retry_window")]
    pub join_retry_window_secs: u64,
    /// ed25519 public keys (base64) trusted to sign image manifests; handed
    /// to agents when they join.
    #[serde(default)]
    pub image_keys: Vec<String>,
    /// Test-only: accept results whose signature does not verify.
    #[cfg(feature = "accept-ingested-attestation")]
    #[serde(default)]
    pub accept_ingested: bool,
}

fn default_ramdisk_ttl() -> u64 {
    12 * 3600
}

fn default_node_ttl() -> u64 {
    7 * 24 * 3600
}

fn default_join_retry_window() -> u64 {
    300
}

impl AttestationConfig {
    /// A development configuration: an ephemeral generated CA.
    pub fn ephemeral() -> Self {
        Self {
            ca_cert_file: None,
            ca_key_file: None,
            generate_ca: true,
            ramdisk_cert_ttl_secs: default_ramdisk_ttl(),
            node_cert_ttl_secs: default_node_ttl(),
            join_retry_window_secs: default_join_retry_window(),
            image_keys: vec![],
            #[cfg(feature = "accept-ingested-attestation")]
            accept_ingested: false,
        }
    }
}
