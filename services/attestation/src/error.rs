//! Errors of the attestation service and the API code each maps to.

use bcm_core::ErrorCode;

/// Why a join or a result was refused.
#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    #[error("unknown, used or expired join token")]
    BadToken,
    /// A rejoin whose certificate is not in force, is not the node's, or
    /// whose signature does not verify (which of them is not said).
    #[error("unknown, revoked or expired identity, or a signature that does not verify")]
    BadIdentity,
    #[error("a {purpose} join token cannot join an agent with role {role:?}")]
    WrongRole { purpose: String, role: String },
    #[error("{0}")]
    Invalid(String),
    #[error("no such command for this node")]
    NoSuchCommand,
    #[error("the result's signature was rejected: {0}")]
    Rejected(String),
    /// A rejoin with a valid signature that cannot be taken: out of the
    /// clock window, a replay, or an identity that does not rejoin.
    #[error("rejoin refused: {0}")]
    RejoinRefused(String),
    #[error("the CA cannot be used: {0}")]
    Config(String),
    #[error(transparent)]
    Pki(#[from] bcm_pki::PkiError),
    #[error(transparent)]
    Db(#[from] bcm_db::DbError),
}

impl AttestError {
    /// The API error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            AttestError::BadToken | AttestError::BadIdentity => ErrorCode::Unauthenticated,
            AttestError::WrongRole { .. }
            | AttestError::Rejected(_)
            | AttestError::RejoinRefused(_) => ErrorCode::Forbidden,
            AttestError::Invalid(_) => ErrorCode::InvalidArgument,
            AttestError::Pki(bcm_pki::PkiError::BadCsr | bcm_pki::PkiError::WrongKeyType(_)) => {
                ErrorCode::InvalidArgument
            }
            AttestError::NoSuchCommand => ErrorCode::NotFound,
            // A signed result holding NUL characters: refused as sent (it
            // cannot be changed without breaking its signature).
            AttestError::Db(bcm_db::DbError::Unstorable(_)) => ErrorCode::InvalidArgument,
            AttestError::Config(_) => ErrorCode::InvalidConfig,
            AttestError::Pki(_) | AttestError::Db(_) => ErrorCode::Internal,
        }
    }

    /// The message for the caller (internal details stay in the log).
    pub fn public_message(&self) -> String {
        match self.code() {
            ErrorCode::Internal => "internal error".to_owned(),
            _ => self.to_string(),
        }
    }
}
