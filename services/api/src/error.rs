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
#[serde(deny_unknown_fields)]
pub struct ApiErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

/// Every error an operation answers, documented once with its code's HTTP
/// status and the body. 400 means exactly that the request breaks the
/// published schema; a well-formed request is refused only with the other
/// statuses, for the reasons they name.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum ErrorResponses {
    /// `INVALID_ARGUMENT`: the request breaks the schema (a field, a value
    /// out of its pattern, length, range or set, an unknown field).
    #[response(status = 400)]
    InvalidArgument(ApiErrorBody),
    /// `UNAUTHENTICATED`: no bearer token, or one that is unknown, revoked
    /// or expired.
    #[response(status = 401)]
    Unauthenticated(ApiErrorBody),
    /// `FORBIDDEN`: the caller sees the resource but lacks the grant.
    #[response(status = 403)]
    Forbidden(ApiErrorBody),
    /// `NOT_FOUND`: no such node, pool, profile version or command, or not
    /// one the caller may see.
    #[response(status = 404)]
    NotFound(ApiErrorBody),
    /// `RATE_LIMITED`: the caller's principal is over its request rate;
    /// the message and `Retry-After` name the wait.
    #[response(status = 429, headers(("Retry-After" = u32, description = "Seconds to wait before asking again.")))]
    RateLimited(ApiErrorBody),
    /// `INVALID_STATE` (the move is not legal from the node's state),
    /// `CONFLICT` (a concurrent change won, or the resource exists) or
    /// `UNVERIFIED_WIPE`.
    #[response(status = 409)]
    Conflict(ApiErrorBody),
    /// `INVALID_CONFIG`: a well-formed request this configuration or this
    /// node cannot serve (a BMC driver without TLS or accounts, a password
    /// longer than the node's BMC stores, a node without a BMC).
    #[response(status = 422)]
    InvalidConfig(ApiErrorBody),
    /// `INTERNAL`: a bug; the message says no more (the server log does).
    #[response(status = 500)]
    Internal(ApiErrorBody),
    /// `UNAVAILABLE`: a dependency (the database, the attestation service)
    /// is down or saturated; retry, no sooner than `Retry-After` says.
    #[response(status = 503, headers(("Retry-After" = u32, description = "Seconds to wait, at least, before asking again.")))]
    Unavailable(ApiErrorBody),
}

/// An error answered to an API caller.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// The `Retry-After` answered with it, in seconds: the caller's wait
    /// for a `RATE_LIMITED`, and at least [`UNAVAILABLE_RETRY_AFTER_SECS`]
    /// for every `UNAVAILABLE`.
    pub retry_after_secs: Option<u64>,
}

/// The `Retry-After` of an `UNAVAILABLE` that names no other: long enough
/// that a fleet's agents turned away at once do not come straight back
/// into the queue that turned them away, short enough that an agent
/// (which honours at most 8 s, `bcm_contracts::agent::RETRY_AFTER_CAP`)
/// is heard again well inside the engine's silence limit.
pub const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 2;

impl ApiError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    /// The same error, asking the caller to wait `wait` (rounded up to a
    /// whole second, at least one) before it asks again.
    pub fn retry_after(self, wait: std::time::Duration) -> Self {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        Self {
            retry_after_secs: Some(secs.max(1)),
            ..self
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
        let retry_after = match (self.retry_after_secs, self.code) {
            (Some(secs), _) => Some(secs),
            (None, ErrorCode::Unavailable) => Some(UNAVAILABLE_RETRY_AFTER_SECS),
            (None, _) => None,
        };
        let mut response = (
            status,
            axum::Json(ApiErrorBody {
                code: self.code,
                message: self.message,
            }),
        )
            .into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
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
            DbError::Duplicate { constraint } if constraint == "node_macs_site_mac" => Self::new(
                ErrorCode::Conflict,
                "another node of the site already has one of these MACs (a MAC is unique within a site)",
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
            // An outage (no connection, a backend ended under a statement):
            // the caller retries.
            other if other.retryable() || other.unreachable() => {
                note_unavailable(chrono::Utc::now().timestamp(), &other);
                Self::new(
                    ErrorCode::Unavailable,
                    "the database is unavailable; retry later",
                )
            }
            other => Self::internal(other),
        }
    }
}

/// The database-unavailable answers' log: the first of each second, with
/// how many went unlogged since (a fleet's agents retry together, and a
/// line each buried the log: 213,961 in the N = 100,000 run). Every one is
/// counted in `bcm_api_errors_total{code="Unavailable"}`.
static UNAVAILABLE_LOG: crate::once_per_second::OncePerSecond =
    crate::once_per_second::OncePerSecond::new();

fn note_unavailable(second: i64, e: &DbError) {
    if let Some(unlogged) = UNAVAILABLE_LOG.due(second) {
        tracing::warn!(error = %e, unlogged, "database unavailable; answered 503 (retry)");
    }
}

impl From<bcm_seal::SealError> for ApiError {
    fn from(e: bcm_seal::SealError) -> Self {
        Self::new(ErrorCode::InvalidConfig, format!("sealing: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry_after(e: ApiError) -> Option<String> {
        e.into_response()
            .headers()
            .get(axum::http::header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap_or("not text").to_owned())
    }

    #[test]
    fn waits_are_answered_in_retry_after_and_nothing_else_carries_one() {
        let unavailable = ApiError::new(ErrorCode::Unavailable, "the database is away");
        assert_eq!(retry_after(unavailable).as_deref(), Some("2"));
        let limited = ApiError::new(ErrorCode::RateLimited, "slow down");
        let wait = std::time::Duration::from_millis(1_200);
        assert_eq!(
            retry_after(limited.clone().retry_after(wait)).as_deref(),
            Some("2"),
            "rounded up"
        );
        assert_eq!(
            retry_after(limited.retry_after(std::time::Duration::ZERO)).as_deref(),
            Some("1"),
            "never 0: the caller would come straight back"
        );
        assert_eq!(retry_after(ApiError::node_not_found("n")), None);
        assert_eq!(retry_after(ApiError::invalid("bad")), None);
    }
}
