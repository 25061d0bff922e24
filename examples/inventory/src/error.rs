//! Errors as the client sees them: a status and `{"error", "message"}`, one mapping for the
//! handlers, the macro and the layer's rejections.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lock_core::LockError;
use lock_tower::Rejection;
use serde::{Deserialize, Serialize};

use crate::db::DbError;

/// Why a request failed, for programs: an [`AppError`], or the kind of a lock-tower
/// [`Rejection`] (`busy`: the lock stayed held for the whole wait, `409` with `Retry-After`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)] // the variants are named for what they say
pub enum ErrorCode {
    NotFound,
    SoldOut,
    StaleFence,
    LockLost,
    Busy,
    Full,
    LockUnavailable,
    InvalidKey,
    MalformedKey,
    MissingKey,
    Internal,
}

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, for programs.
    pub error: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
}

/// The error of a handler.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppError {
    /// No such SKU (`404`).
    #[error("sku {0} does not exist")]
    NotFound(i64),
    /// The stock is 0 (`409`).
    #[error("sku {0} is sold out")]
    SoldOut(i64),
    /// The fenced write was refused (`409`).
    #[error("stale fencing token {fence} for sku {sku}: a later lock holder has written")]
    StaleFence {
        /// The SKU.
        sku: i64,
        /// Our (stale) token.
        fence: u64,
    },
    /// The lock was found lost before the write (`503`).
    #[error("lock `{0}` was lost before the write")]
    LockLost(String),
    /// Taking the lock failed: answered as the layer answers its rejections.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The database failed (`500`).
    #[error(transparent)]
    Db(#[from] DbError),
}

impl AppError {
    /// The status and code of an error that is not a lock error.
    pub fn code(&self) -> (StatusCode, ErrorCode) {
        match self {
            Self::NotFound(_) => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
            Self::SoldOut(_) => (StatusCode::CONFLICT, ErrorCode::SoldOut),
            Self::StaleFence { .. } => (StatusCode::CONFLICT, ErrorCode::StaleFence),
            Self::LockLost(_) => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::LockLost),
            Self::Lock(_) | Self::Db(_) => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
        }
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        if let Self::Lock(error) = self {
            return lock_response(Rejection::from(error));
        }
        let (status, error) = self.code();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        let message = self.to_string();
        (status, Json(ErrorBody { error, message })).into_response()
    }
}

/// A lock failure, from the layer or a handler: lock-tower's status, `Retry-After` and
/// key-free message (a key can name a customer), in the handlers' JSON shape.
pub fn lock_response(rejection: Rejection) -> Response {
    let error = match &rejection {
        Rejection::Busy { .. } => ErrorCode::Busy,
        Rejection::Full { .. } => ErrorCode::Full,
        Rejection::Unavailable(_) => ErrorCode::LockUnavailable,
        Rejection::Lost(_) => ErrorCode::LockLost,
        Rejection::InvalidKey(_) => ErrorCode::InvalidKey,
        Rejection::MissingKey => ErrorCode::MissingKey,
        Rejection::MalformedKey => ErrorCode::MalformedKey,
        _ => ErrorCode::Internal,
    };
    match (&rejection, rejection.error()) {
        // lock-tower logged it at error level, once per route: not again on every request.
        (Rejection::Misconfigured, _) => {}
        // The log may name the key; the response does not.
        (_, Some(e)) if rejection.status().is_server_error() => {
            tracing::error!(error = %e, kind = rejection.kind(), "lock failed");
        }
        _ => {}
    }
    let message = rejection.message().trim_end().to_owned();
    let mut response = (rejection.status(), Json(ErrorBody { error, message })).into_response();
    rejection.set_headers(&mut response);
    response
}
