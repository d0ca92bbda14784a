//! The node PKI, without I/O. The attestation service holds a [`Ca`] and
//! issues short-lived X.509 node certificates from agents' CSRs; agents make
//! their CSR with [`csr_pem`] from a key that never leaves their memory;
//! anyone can rebuild the canonical [`signing_input`] of a node-signed
//! result; join tokens are minted here and stored only as hashes.

pub mod ca;
pub mod image;
pub mod join_key;
pub mod signing;
pub mod tls;
pub mod tokens;

pub use ca::{csr_pem, Ca, CheckedCert, IssueRequest, IssuedCert};
pub use join_key::{JoinKey, JoinKeyConfig};
pub use signing::{canonical_json, format_ts, signed_result, signing_input, SignedFacts};

/// What can go wrong in the PKI.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("the certificate signing request is malformed or its signature does not verify")]
    BadCsr,
    #[error("the certificate signing request is for a {0} key; node keys are ed25519")]
    WrongKeyType(String),
    #[error("the CA certificate and key are malformed or do not match: {0}")]
    BadCa(String),
    #[error("the certificate is malformed: {0}")]
    BadCert(String),
    #[error("the certificate was not issued by this CA")]
    NotIssuedByCa,
    #[error("the certificate is not valid at {0}")]
    OutsideValidity(String),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("key encoding failed: {0}")]
    Key(String),
    #[error("TLS: {0}")]
    BadTls(String),
}
