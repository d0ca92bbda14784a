//! The error codes of the spec and the HTTP status each maps to.

use serde::{Deserialize, Serialize};

/// An error code of the metal API. The wire form is SCREAMING_SNAKE_CASE.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// The move is not legal from the node's provision state.
    InvalidState,
    /// A concurrent change won, or the resource exists already.
    Conflict,
    /// The control plane is not configured for the request.
    InvalidConfig,
    /// A release's wipe was not node-signed or failed read-back.
    UnverifiedWipe,
    /// No such resource, or not visible to the caller.
    NotFound,
    /// The caller sees the resource but lacks the grant.
    Forbidden,
    /// The request is malformed.
    InvalidArgument,
    /// No or an unknown bearer token.
    Unauthenticated,
    /// A dependency is down; retry later.
    Unavailable,
    /// A bug or an unexpected failure; the message says no more.
    Internal,
}

impl ErrorCode {
    /// The HTTP status this code is answered with.
    pub const fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidState | ErrorCode::Conflict | ErrorCode::UnverifiedWipe => 409,
            ErrorCode::InvalidConfig | ErrorCode::InvalidArgument => 400,
            ErrorCode::NotFound => 404,
            ErrorCode::Forbidden => 403,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
        }
    }

    /// Whether a caller may retry the same request unchanged.
    pub const fn retryable(self) -> bool {
        matches!(self, ErrorCode::Conflict | ErrorCode::Unavailable)
    }
}
