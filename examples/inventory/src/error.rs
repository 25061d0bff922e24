//! Errors as the client sees them: the service's own as a status and `{"error", "message"}`;
//! a lock that could not be had as lock-tower answers it from the layer too (`409` with
//! `Retry-After` when busy, `503` when Redis is down), never naming the key.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lock_core::LockError;
use lock_tower::Rejection;
use serde::{Deserialize, Serialize};

use crate::db::DbError;

/// The JSON body of the service's own errors: what went wrong for programs
/// ([`AppError::code`]) and for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // the summary says what each field is
pub struct ErrorBody {
    pub error: String,
    pub message: String,
}

/// The error of a handler.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppError {
    /// No such SKU (`404 not_found`).
    #[error("sku {0} does not exist")]
    NotFound(i64),
    /// The stock is 0 (`409 sold_out`).
    #[error("sku {0} is sold out")]
    SoldOut(i64),
    /// Taking the lock failed: answered by lock-tower's [`Rejection`].
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The database refused a stale fencing token (`409 stale_fence`) or failed (`500`).
    #[error(transparent)]
    Db(#[from] DbError),
}

impl AppError {
    /// The status and code of the answer, but for [`Lock`](Self::Lock).
    pub fn code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::SoldOut(_) => (StatusCode::CONFLICT, "sold_out"),
            Self::Db(DbError::StaleFence { .. }) => (StatusCode::CONFLICT, "stale_fence"),
            Self::Lock(_) | Self::Db(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        if let Self::Lock(error) = self {
            return Rejection::from(error).into_response();
        }
        let (status, error) = self.code();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        }
        let (error, message) = (error.to_owned(), self.to_string());
        (status, Json(ErrorBody { error, message })).into_response()
    }
}
