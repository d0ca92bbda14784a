//! The error codes of the spec and the HTTP status each maps to.

crate::wire_enum! {
    /// An error code of the metal API. The wire form is SCREAMING_SNAKE_CASE.
    pub enum ErrorCode "error code" {
        /// The move is not legal from the node's provision state.
        InvalidState = "INVALID_STATE",
        /// A concurrent change won, or the resource exists already.
        Conflict = "CONFLICT",
        /// The control plane is not configured for the request.
        InvalidConfig = "INVALID_CONFIG",
        /// A release's wipe was not node-signed or failed read-back.
        UnverifiedWipe = "UNVERIFIED_WIPE",
        /// No such resource, or not visible to the caller.
        NotFound = "NOT_FOUND",
        /// The caller sees the resource but lacks the grant.
        Forbidden = "FORBIDDEN",
        /// The request is malformed.
        InvalidArgument = "INVALID_ARGUMENT",
        /// No or an unknown bearer token.
        Unauthenticated = "UNAUTHENTICATED",
        /// A dependency is down; retry later.
        Unavailable = "UNAVAILABLE",
        /// The caller is over its request rate; retry after the wait named.
        RateLimited = "RATE_LIMITED",
        /// A bug or an unexpected failure; the message says no more.
        Internal = "INTERNAL",
    }
}

impl ErrorCode {
    /// The HTTP status this code is answered with.
    pub const fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidState | ErrorCode::Conflict | ErrorCode::UnverifiedWipe => 409,
            // 400 means exactly "the request breaks the published schema";
            // a well-formed request this configuration cannot serve is 422.
            ErrorCode::InvalidArgument => 400,
            ErrorCode::InvalidConfig => 422,
            ErrorCode::NotFound => 404,
            ErrorCode::Forbidden => 403,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Unavailable => 503,
            ErrorCode::RateLimited => 429,
            ErrorCode::Internal => 500,
        }
    }

    /// Whether a caller may retry the same request unchanged.
    pub const fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Conflict | ErrorCode::Unavailable | ErrorCode::RateLimited
        )
    }
}
