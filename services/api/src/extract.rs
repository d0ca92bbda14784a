//! Request extractors whose rejections are API errors (`INVALID_ARGUMENT`
//! with the decoder's message) instead of axum's plain-text answers.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON body; unknown fields and bad values are `INVALID_ARGUMENT`.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        // Every body is a JSON object: serde would take an array for a
        // struct whose fields are positional, which no schema says.
        match axum::Json::<serde_json::Value>::from_request(req, state).await {
            Ok(axum::Json(v)) if v.is_object() => serde_json::from_value(v)
                .map(Body)
                .map_err(|e| ApiError::invalid(format!("the body does not fit its schema: {e}"))),
            Ok(_) => Err(ApiError::invalid("the body must be a JSON object")),
            Err(rejection) => Err(ApiError::invalid(rejection.body_text())),
        }
    }
}

/// A query string; unknown parameters and bad values are `INVALID_ARGUMENT`.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Query(v)),
            Err(rejection) => Err(ApiError::invalid(rejection.body_text())),
        }
    }
}

/// A path parameter; a malformed one is `INVALID_ARGUMENT`.
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(rejection) => Err(ApiError::invalid(rejection.body_text())),
        }
    }
}
