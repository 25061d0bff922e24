//! What the client gets when the lock is not taken: [`Rejection`], the [`Reject`] trait and
//! [`DefaultReject`].

use std::time::Duration;

use http::{header, HeaderValue, Response, StatusCode};
use lock_core::LockError;

/// Why a request was not let through to the inner service.
///
/// A [`Reject`] turns it into a response. The default responses
/// ([`default_response`](Self::default_response)):
///
/// | variant | status | headers |
/// |---|---|---|
/// | [`Busy`](Self::Busy) | `409 Conflict` | `Retry-After` (see [`retry_after_secs`](Self::retry_after_secs)) |
/// | [`Unavailable`](Self::Unavailable) | `503 Service Unavailable` | |
/// | [`InvalidKey`](Self::InvalidKey) | `400 Bad Request` | |
/// | [`MissingKey`](Self::MissingKey) | `400 Bad Request` | |
/// | [`Failed`](Self::Failed) | `500 Internal Server Error` | |
///
/// each with a one-line `text/plain` body that does not reveal the lock key.
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// Another owner held the lock for the whole wait ([`LockError::Busy`]).
    Busy(LockError),
    /// Redis was unreachable, timed out or failed ([`LockError::Backend`]) and the layer
    /// fails closed (the default; see
    /// [`fail_open`](crate::DistributedLockLayer::fail_open)).
    Unavailable(LockError),
    /// The extracted key is not a valid lock key ([`LockError::InvalidKey`]): empty, or longer
    /// than [`lock_core::MAX_KEY_LEN`].
    InvalidKey(LockError),
    /// The request has no key and the layer is set to
    /// [`MissingKey::Reject`](crate::MissingKey::Reject).
    MissingKey,
    /// Any other lock failure: the Redis key holds a foreign value
    /// ([`LockError::WrongType`]), an out-of-range lease ([`LockError::Config`]), ...
    Failed(LockError),
}

impl Rejection {
    /// Sorts a failed acquire.
    pub(crate) fn from_error(error: LockError) -> Self {
        if error.is_busy() {
            Self::Busy(error)
        } else if error.is_backend() {
            Self::Unavailable(error)
        } else if matches!(error, LockError::InvalidKey { .. }) {
            Self::InvalidKey(error)
        } else {
            Self::Failed(error)
        }
    }

    /// The status code of the default response.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Busy(_) => StatusCode::CONFLICT,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::InvalidKey(_) | Self::MissingKey => StatusCode::BAD_REQUEST,
            Self::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The lock error behind the rejection (`None` for [`MissingKey`](Self::MissingKey)).
    pub fn error(&self) -> Option<&LockError> {
        match self {
            Self::Busy(e) | Self::Unavailable(e) | Self::InvalidKey(e) | Self::Failed(e) => Some(e),
            Self::MissingKey => None,
        }
    }

    /// For [`Busy`](Self::Busy): the value of the default `Retry-After` header, the holder's
    /// remaining lease ([`LockError::retry_after`]) in whole seconds, rounded up and at least
    /// 1; and 1 when the holder's lease is unknown (another request of this process is still
    /// acquiring the key, or Redis reported none). `None` for the other variants.
    ///
    /// The lease is an upper bound: a holder usually releases well before it runs out.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::Busy(error) => Some(error.retry_after().map_or(1, ceil_secs)),
            _ => None,
        }
    }

    /// The short text of the default response body.
    fn message(&self) -> &'static str {
        match self {
            Self::Busy(_) => "the resource is locked by another request; retry later\n",
            Self::Unavailable(_) => "the lock service is unavailable; retry later\n",
            Self::InvalidKey(_) => "the request does not name a valid lock key\n",
            Self::MissingKey => "the request does not name a lock key\n",
            Self::Failed(_) => "the lock could not be taken\n",
        }
    }

    /// The default response, for any body type that can be built from a `&'static str`
    /// (`axum::body::Body`, `String`, `http_body_util::Full<Bytes>`, ...).
    ///
    /// Use it in a custom [`Reject`] for the cases you do not customize.
    pub fn default_response<B>(self) -> Response<B>
    where
        B: From<&'static str>,
    {
        let mut response = Response::new(B::from(self.message()));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if let Some(secs) = self.retry_after_secs() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// Whole seconds, rounded up, at least 1.
fn ceil_secs(d: Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum::response::IntoResponse for Rejection {
    /// The [default response](Rejection::default_response).
    fn into_response(self) -> axum::response::Response {
        self.default_response()
    }
}

/// Turns a [`Rejection`] into the response sent to the client.
///
/// Implemented by [`DefaultReject`] and by every `Fn(Rejection) -> Response<B>` closure. The
/// layer never adds an error type: every lock failure becomes a response, so it works under
/// routers whose error type is `Infallible`.
///
/// # Examples
///
/// Answer contention with `429` and a JSON body, and keep the other defaults:
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum::http::StatusCode;
/// use axum::response::{IntoResponse, Response};
/// use lock_tower::{Reject, Rejection};
///
/// let reject = |rejection: Rejection| -> Response {
///     match rejection {
///         Rejection::Busy(_) => (StatusCode::TOO_MANY_REQUESTS, "busy, try again").into_response(),
///         other => other.into_response(), // the default response
///     }
/// };
/// let response = reject.reject(Rejection::MissingKey);
/// assert_eq!(response.status(), StatusCode::BAD_REQUEST);
/// // DistributedLockLayer::new(locker, key).reject_with(reject)
/// # }
/// ```
pub trait Reject<B> {
    /// The response for `rejection`.
    fn reject(&self, rejection: Rejection) -> Response<B>;
}

impl<B, F> Reject<B> for F
where
    F: Fn(Rejection) -> Response<B>,
{
    fn reject(&self, rejection: Rejection) -> Response<B> {
        self(rejection)
    }
}

/// The default [`Reject`]: [`Rejection::default_response`], for response bodies that
/// implement `From<&'static str>`.
///
/// With a body type that does not (`http_body_util::Empty`, boxed bodies), configure a
/// [`Reject`] with [`reject_with`](crate::DistributedLockLayer::reject_with).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultReject;

impl<B> Reject<B> for DefaultReject
where
    B: From<&'static str>,
{
    fn reject(&self, rejection: Rejection) -> Response<B> {
        rejection.default_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_secs_rounds_up_to_at_least_one() {
        assert_eq!(ceil_secs(Duration::ZERO), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ceil_secs(Duration::from_secs(29)), 29);
    }

    #[test]
    fn busy_gets_409_with_retry_after() {
        let busy = Rejection::from_error(LockError::Busy {
            key: "k".into(),
            waited: Duration::ZERO,
            holder_ttl: Some(Duration::from_millis(2500)),
        });
        let response: Response<String> = DefaultReject.reject(busy);
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::RETRY_AFTER], "3");
        assert!(response.body().contains("locked"));
    }

    #[test]
    fn busy_without_ttl_retries_after_one_second() {
        let busy = Rejection::Busy(LockError::Busy {
            key: "k".into(),
            waited: Duration::ZERO,
            holder_ttl: None,
        });
        let response: Response<String> = busy.default_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn other_errors_are_sorted() {
        let invalid = Rejection::from_error(LockError::InvalidKey {
            key: String::new(),
            reason: lock_core::InvalidKeyReason::Empty,
        });
        assert!(matches!(invalid, Rejection::InvalidKey(_)));
        assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
        let lost = Rejection::from_error(LockError::Lost { key: "k".into() });
        assert!(matches!(lost, Rejection::Failed(_)));
        assert_eq!(lost.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(Rejection::MissingKey.status(), StatusCode::BAD_REQUEST);
        assert!(Rejection::MissingKey.error().is_none());
    }
}
