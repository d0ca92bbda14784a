//! The one mapping from every crate's errors to API errors: a code of the
//! spec, its HTTP status and a message for people. Internal details are
//! logged, never returned.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bcm_core::{ErrorCode, MoveError};
use bcm_db::DbError;
use serde::{Deserialize, Serialize};

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

/// An error answered to an API caller.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `INVALID_ARGUMENT`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// `NOT_FOUND` for a node.
    pub fn node_not_found(id: impl std::fmt::Display) -> Self {
        Self::new(ErrorCode::NotFound, format!("node {id} not found"))
    }

    /// `INTERNAL`; the cause is logged, not returned.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(%cause, "internal error");
        Self::new(ErrorCode::Internal, "internal error; see the server log")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        metrics::counter!("bcm_api_errors_total", "code" => format!("{:?}", self.code))
            .increment(1);
        (
            status,
            axum::Json(ApiErrorBody {
                code: self.code,
                message: self.message,
            }),
        )
            .into_response()
    }
}

impl From<MoveError> for ApiError {
    fn from(e: MoveError) -> Self {
        Self::new(e.code(), e.to_string())
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::NotFound => Self::new(ErrorCode::NotFound, "not found"),
            DbError::Stale => Self::new(
                ErrorCode::Conflict,
                "the node was changed concurrently; read it again and retry",
            ),
            DbError::Duplicate { constraint } if constraint == "nodes_site_bmc" => Self::new(
                ErrorCode::Conflict,
                "a node with this BMC address is already enrolled in the site",
            ),
            DbError::Duplicate { constraint } => Self::new(
                ErrorCode::Conflict,
                format!("already exists ({constraint})"),
            ),
            DbError::MissingReference { constraint } => Self::new(
                ErrorCode::NotFound,
                format!("a referenced resource does not exist ({constraint})"),
            ),
            DbError::Unstorable(why) => Self::new(
                ErrorCode::InvalidArgument,
                format!("the request holds a value that cannot be stored ({why}); NUL characters are not accepted"),
            ),
            other if other.retryable() => {
                tracing::warn!(error = %other, "database unavailable");
                Self::new(
                    ErrorCode::Unavailable,
                    "the database is unavailable; retry later",
                )
            }
            other => Self::internal(other),
        }
    }
}

impl From<bcm_seal::SealError> for ApiError {
    fn from(e: bcm_seal::SealError) -> Self {
        Self::new(ErrorCode::InvalidConfig, format!("sealing: {e}"))
    }
}
