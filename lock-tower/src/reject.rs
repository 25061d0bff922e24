//! What the client gets when the lock is not taken: [`Rejection`], the [`Reject`] trait,
//! [`DefaultReject`], and the `Retry-After` policy [`RetryAfter`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{header, HeaderValue, Response, StatusCode};
use lock_core::LockError;
use rand::Rng;

/// Why a request was not let through to the inner service, or why a handler or a
/// `#[distributed_lock]` method could not run under its lock.
///
/// The layer builds it for each failed acquire; handlers build it from a [`LockError`] with
/// `Rejection::from(error)` (or `?` into an error type that holds one), so a lock failure
/// answers the same from the layer, a handler or a locked service method. With the `axum`
/// feature it is an `IntoResponse`. A [`Reject`] turns it into a response. The default
/// responses ([`default_response`](Self::default_response)):
///
/// | variant | from | status | headers |
/// |---|---|---|---|
/// | [`Busy`](Self::Busy) | [`LockError::Busy`] | `409 Conflict` | `Retry-After` (see [`RetryAfter`]) |
/// | [`Full`](Self::Full) | [`LockError::Busy`] under [`Mode::Limit`](crate::Mode::Limit) | `429 Too Many Requests` | `Retry-After` |
/// | [`Unavailable`](Self::Unavailable) | [`LockError::Backend`], [`LockError::Tls`], [`LockError::NotReplicated`], [`LockError::ShutDown`] (the instance is stopping) | `503 Service Unavailable` | `Retry-After`: 1 or 2, at random |
/// | [`Lost`](Self::Lost) | [`LockError::Lost`] (a handler's lock ran out) | `503 Service Unavailable` | `Retry-After`: 1 or 2, at random |
/// | [`InvalidKey`](Self::InvalidKey) | [`LockError::InvalidKey`] | `400 Bad Request` | |
/// | [`MissingKey`](Self::MissingKey) | a header or query parameter key is absent ([`KeyAbsence::Request`](crate::KeyAbsence::Request)), or cannot be read: not UTF-8, a query parameter given twice ([`KeyAbsence::Unreadable`](crate::KeyAbsence::Unreadable)) | `400 Bad Request` | |
/// | [`MalformedKey`](Self::MalformedKey) | a typed extractor's value does not parse ([`KeyAbsence::Malformed`](crate::KeyAbsence::Malformed)) | `400 Bad Request` | |
/// | [`Misconfigured`](Self::Misconfigured) | a path parameter key is absent: the route has no such parameter ([`KeyAbsence::Route`](crate::KeyAbsence::Route)) | `500 Internal Server Error` | |
/// | [`NoRoute`](Self::NoRoute) | the request matched no route of the axum router (the layer applied with `Router::layer` also wraps the fallback) | `404 Not Found` | |
/// | [`Failed`](Self::Failed) | [`LockError::Config`], [`LockError::NotConfigured`], [`LockError::WrongType`], ... | `500 Internal Server Error` | |
///
/// each with a one-line `text/plain` body that does not reveal the lock key. The layer's
/// [`busy_status`](crate::DistributedLockLayer::busy_status) changes the status of `Busy`.
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// Another owner held the lock for the whole wait ([`LockError::Busy`]).
    Busy {
        /// The error.
        error: LockError,
        /// When the client should try again (the `Retry-After` header, in whole seconds
        /// rounded up); chosen by the [`RetryAfter`] policy.
        retry_after: Duration,
    },
    /// Every permit of the key's concurrency limit ([`Mode::Limit`](crate::Mode::Limit)) was
    /// taken for the whole wait ([`LockError::Busy`] of its semaphore).
    Full {
        /// The error.
        error: LockError,
        /// When the client should try again, as for [`Busy`](Self::Busy).
        retry_after: Duration,
    },
    /// Redis was unreachable, timed out or failed ([`LockError::Backend`], [`LockError::Tls`],
    /// [`LockError::NotReplicated`]) and the layer fails closed (the default; see
    /// [`fail_open`](crate::DistributedLockLayer::fail_open)), or the locker was shut down
    /// ([`LockError::ShutDown`]: the instance is stopping; another one serves the retry).
    Unavailable(LockError),
    /// The lock was lost while the work ran ([`LockError::Lost`]); only from handlers and
    /// locked methods, never from the layer's acquire.
    Lost(LockError),
    /// The extracted key is not a valid lock key ([`LockError::InvalidKey`]): empty, or longer
    /// than [`lock_core::MAX_KEY_LEN`].
    InvalidKey(LockError),
    /// The request lacks the value its key comes from (a header, a query parameter, what a
    /// closure extractor reads), or carries it in a form that names no one key (not UTF-8, a
    /// query parameter given twice): the client's fault. See [`MissingKey`](crate::MissingKey).
    MissingKey,
    /// The value its key comes from does not parse as the type of a typed extractor
    /// ([`KeyFrom::path_param_as`](crate::KeyFrom::path_param_as) and the like:
    /// `/skus/abc` for a `u64`): the client's fault. Never let through unlocked, whatever
    /// [`MissingKey`](crate::MissingKey) says.
    MalformedKey,
    /// The key extractor can never find a key on this route (an axum path parameter the route
    /// does not have): the server's configuration is wrong. See
    /// [`MissingKey`](crate::MissingKey).
    Misconfigured,
    /// The request matched no route: the layer, applied with axum's `Router::layer`, wraps
    /// the router's fallback too, where no route's key exists. Answered `404 Not Found` by the
    /// layer, not by the fallback: the layer cannot tell a fallback that answers from one that
    /// routes again (a router given as the fallback service) and would run a route unlocked.
    /// Apply the layer with `Router::route_layer` to leave unmatched requests to your own
    /// fallback. Under [`MissingKey::Pass`](crate::MissingKey::Pass) they pass unlocked.
    NoRoute,
    /// Any other lock failure: the Redis key holds a foreign value
    /// ([`LockError::WrongType`]), an out-of-range lease ([`LockError::Config`]), no locker
    /// for `#[distributed_lock]` ([`LockError::NotConfigured`]), ...
    Failed(LockError),
}

impl From<LockError> for Rejection {
    /// Sorts `error` as the layer does, with the default [`RetryAfter`] policy.
    fn from(error: LockError) -> Self {
        Self::from_error(error, &RetryAfter::default())
    }
}

impl Rejection {
    /// Sorts a lock error, choosing `Retry-After` for [`Busy`](Self::Busy) with `policy`. The
    /// one mapping used by the layer and by `From<LockError>`.
    pub fn from_error(error: LockError, policy: &RetryAfter) -> Self {
        match &error {
            LockError::Busy {
                waited, holder_ttl, ..
            } => {
                let retry_after = policy.choose(&BusyInfo {
                    holder_ttl: *holder_ttl,
                    waited: *waited,
                });
                Self::Busy { error, retry_after }
            }
            LockError::Lost { .. } => Self::Lost(error),
            LockError::InvalidKey { .. } => Self::InvalidKey(error),
            LockError::NotReplicated { .. } | LockError::ShutDown => Self::Unavailable(error),
            _ if error.is_backend() => Self::Unavailable(error),
            _ => Self::Failed(error),
        }
    }

    /// The same rejection for a request under a concurrency limit
    /// ([`Mode::Limit`](crate::Mode::Limit)): [`Busy`](Self::Busy) becomes
    /// [`Full`](Self::Full); the others stay.
    pub fn under_limit(self) -> Self {
        match self {
            Self::Busy { error, retry_after } => Self::Full { error, retry_after },
            other => other,
        }
    }

    /// The status code of the default response.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Busy { .. } => StatusCode::CONFLICT,
            Self::Full { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable(_) | Self::Lost(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::InvalidKey(_) | Self::MissingKey | Self::MalformedKey => StatusCode::BAD_REQUEST,
            Self::NoRoute => StatusCode::NOT_FOUND,
            Self::Misconfigured | Self::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The lock error behind the rejection (`None` for [`MissingKey`](Self::MissingKey),
    /// [`MalformedKey`](Self::MalformedKey), [`Misconfigured`](Self::Misconfigured) and
    /// [`NoRoute`](Self::NoRoute)).
    pub fn error(&self) -> Option<&LockError> {
        match self {
            Self::Busy { error, .. }
            | Self::Full { error, .. }
            | Self::Unavailable(error)
            | Self::Lost(error)
            | Self::InvalidKey(error)
            | Self::Failed(error) => Some(error),
            Self::MissingKey | Self::MalformedKey | Self::Misconfigured | Self::NoRoute => None,
        }
    }

    /// A short name of the variant, for logs and machine-readable bodies: `busy`, `full`,
    /// `unavailable`, `lost`, `invalid_key`, `missing_key`, `malformed_key`, `misconfigured`,
    /// `no_route`, `failed`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Busy { .. } => "busy",
            Self::Full { .. } => "full",
            Self::Unavailable(_) => "unavailable",
            Self::Lost(_) => "lost",
            Self::InvalidKey(_) => "invalid_key",
            Self::MissingKey => "missing_key",
            Self::MalformedKey => "malformed_key",
            Self::Misconfigured => "misconfigured",
            Self::NoRoute => "no_route",
            Self::Failed(_) => "failed",
        }
    }

    /// The value of the `Retry-After` header. For [`Busy`](Self::Busy) and
    /// [`Full`](Self::Full): the chosen delay in whole seconds, rounded up, at least 1 (the
    /// header has no finer unit) and at most [`MAX_RETRY_AFTER_SECS`]. For the `503` answers,
    /// [`Unavailable`](Self::Unavailable) and [`Lost`](Self::Lost): 1 or 2, drawn at random on
    /// each call, so that clients refused together by an outage do not all come back in the
    /// same second (and retry middleware that waits for a `Retry-After` retries at all).
    /// `None` for the other variants: retrying them does not help.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::Busy { retry_after, .. } | Self::Full { retry_after, .. } => {
                Some(ceil_secs(*retry_after))
            }
            Self::Unavailable(_) | Self::Lost(_) => {
                let unknown = BusyInfo {
                    holder_ttl: None,
                    waited: Duration::ZERO,
                };
                Some(ceil_secs(
                    RetryAfter::jittered(RETRY_AFTER_UNAVAILABLE).choose(&unknown),
                ))
            }
            _ => None,
        }
    }

    /// The one-line text of the default response body (ending in a newline), which never
    /// names the lock key: for responses of your own (a JSON error body) that must not reveal
    /// keys either.
    pub fn message(&self) -> &'static str {
        match self {
            Self::Busy { .. } => "the resource is locked by another request; retry later\n",
            Self::Full { .. } => "too many requests for this resource at once; retry later\n",
            Self::Unavailable(_) => "the lock service is unavailable; retry later\n",
            Self::Lost(_) => "the lock was lost before the work finished; retry later\n",
            Self::InvalidKey(_) => "the request does not name a valid lock key\n",
            Self::MissingKey => "the request does not name a lock key\n",
            Self::MalformedKey => {
                "the request names its lock key in a form this route does not accept\n"
            }
            Self::NoRoute => "no route matches the request\n",
            Self::Misconfigured | Self::Failed(_) => "the lock could not be taken\n",
        }
    }

    /// Sets the `Retry-After` header ([`retry_after_secs`](Self::retry_after_secs)) on
    /// `response`; for responses of your own (a JSON error body) that keep the default
    /// statuses and headers.
    pub fn set_headers<B>(&self, response: &mut Response<B>) {
        if let Some(secs) = self.retry_after_secs() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
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
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        self.set_headers(&mut response);
        response
    }
}

/// The base of the `Retry-After` of a `503` answer, jittered by half either way: Redis comes
/// back from a blip or a failover within seconds, and a client's own backoff does the rest.
const RETRY_AFTER_UNAVAILABLE: Duration = Duration::from_secs(1);

/// The largest `Retry-After` the layer sends, in seconds: 2^31 (about 68 years), the value
/// RFC 9111 (section 1.2.2) tells caches to use for any delta-seconds too large for them,
/// so a policy's absurd delay (`Duration::MAX`) reaches clients as a number they can hold.
pub const MAX_RETRY_AFTER_SECS: u64 = 1 << 31;

/// Whole seconds, rounded up, at least 1 and at most [`MAX_RETRY_AFTER_SECS`].
fn ceil_secs(d: Duration) -> u64 {
    // Saturating: `Duration::MAX` has `u64::MAX` whole seconds and a fraction.
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    secs.clamp(1, MAX_RETRY_AFTER_SECS)
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum::response::IntoResponse for Rejection {
    /// The [default response](Rejection::default_response). Server-side failures are logged
    /// here (the layer logs its own rejections), since the response body does not say what
    /// went wrong.
    fn into_response(self) -> axum::response::Response {
        match &self {
            Self::Failed(error) => tracing::error!(%error, "lock failed"),
            Self::Unavailable(error) | Self::Lost(error) => tracing::warn!(%error, "lock failed"),
            _ => {}
        }
        self.default_response()
    }
}

/// What is known when a lock was busy, for a [`RetryAfter`] policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BusyInfo {
    /// The holder's remaining lease at the last attempt, when Redis reported one. With the
    /// watchdog it is usually 20 to 30 s, however soon the holder will release.
    pub holder_ttl: Option<Duration>,
    /// How long the acquire waited.
    pub waited: Duration,
}

/// Chooses the `Retry-After` of a [busy](Rejection::Busy) rejection.
///
/// The default ([`RetryAfter::jittered`] of 1 s) is a uniformly random delay between 0.5 s and
/// 1.5 s, never more than the holder's remaining lease when Redis reported it: holders
/// usually release long before their lease runs out (with the watchdog the lease is
/// renewed to 30 s every 10 s, so it says nothing about when the key frees), and the jitter
/// keeps clients that were refused together from coming back together. The header carries
/// whole seconds (rounded up, at least 1, at most [`MAX_RETRY_AFTER_SECS`]), so the default
/// sends `1` or `2`.
///
/// Set it on the layer with [`DistributedLockLayer::retry_after`](crate::DistributedLockLayer::retry_after),
/// or pass it to [`Rejection::from_error`].
///
/// ```
/// use std::time::Duration;
/// use lock_tower::RetryAfter;
///
/// // 5 s, or the holder's lease when it ends sooner.
/// let policy = RetryAfter::from_fn(|busy| {
///     let five = Duration::from_secs(5);
///     busy.holder_ttl.map_or(five, |ttl| ttl.min(five))
/// });
/// # let _ = policy;
/// ```
#[derive(Clone)]
pub struct RetryAfter(Arc<dyn Fn(&BusyInfo) -> Duration + Send + Sync>);

impl RetryAfter {
    /// A random delay between half and one and a half times `base`, capped at the holder's
    /// remaining lease when known. Any `base`: one and a half times it saturates at
    /// `Duration::MAX`.
    pub fn jittered(base: Duration) -> Self {
        Self::from_fn(move |busy| {
            let low = base / 2;
            // Saturating: a base near `Duration::MAX` must not overflow.
            let high = base.saturating_add(base / 2);
            let chosen = if high > low {
                rand::rng().random_range(low..=high)
            } else {
                base
            };
            busy.holder_ttl.map_or(chosen, |ttl| chosen.min(ttl))
        })
    }

    /// Always `delay`.
    pub fn fixed(delay: Duration) -> Self {
        Self::from_fn(move |_| delay)
    }

    /// A policy of your own over what is known about the busy lock.
    pub fn from_fn<F>(choose: F) -> Self
    where
        F: Fn(&BusyInfo) -> Duration + Send + Sync + 'static,
    {
        Self(Arc::new(choose))
    }

    /// The delay for a busy lock.
    pub fn choose(&self, busy: &BusyInfo) -> Duration {
        (self.0)(busy)
    }
}

impl Default for RetryAfter {
    /// [`RetryAfter::jittered`] of 1 s.
    fn default() -> Self {
        Self::jittered(Duration::from_secs(1))
    }
}

impl fmt::Debug for RetryAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RetryAfter(..)")
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
///         Rejection::Busy { .. } => (StatusCode::TOO_MANY_REQUESTS, "busy, try again").into_response(),
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

    fn busy(holder_ttl: Option<Duration>) -> LockError {
        LockError::Busy {
            key: "k".into(),
            waited: Duration::ZERO,
            holder_ttl,
            holder: None,
        }
    }

    #[test]
    fn ceil_secs_rounds_up_to_at_least_one() {
        assert_eq!(ceil_secs(Duration::ZERO), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1000)), 1);
        assert_eq!(ceil_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ceil_secs(Duration::from_secs(29)), 29);
        assert_eq!(ceil_secs(Duration::from_secs(1 << 31)), 1 << 31);
        assert_eq!(ceil_secs(Duration::from_secs((1 << 31) + 1)), 1 << 31);
        assert_eq!(ceil_secs(Duration::MAX), MAX_RETRY_AFTER_SECS);
    }

    #[test]
    fn busy_gets_409_with_a_short_jittered_retry_after_not_the_holders_lease() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            // A watchdog holder: 25 s of lease left, which says nothing about its release.
            let rejection = Rejection::from(busy(Some(Duration::from_secs(25))));
            let Rejection::Busy { retry_after, .. } = rejection else {
                panic!("{rejection:?}");
            };
            assert!(
                (Duration::from_millis(500)..=Duration::from_millis(1500)).contains(&retry_after),
                "{retry_after:?}"
            );
            let response: Response<String> = DefaultReject.reject(rejection);
            assert_eq!(response.status(), StatusCode::CONFLICT);
            assert!(response.body().contains("locked"));
            seen.insert(
                response.headers()[header::RETRY_AFTER]
                    .to_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["1", "2"], "jittered");
    }

    #[test]
    fn retry_after_is_capped_at_a_short_holder_lease_and_at_least_one_second() {
        let rejection = Rejection::from(busy(Some(Duration::from_millis(200))));
        let Rejection::Busy { retry_after, .. } = &rejection else {
            panic!("{rejection:?}");
        };
        assert!(
            *retry_after <= Duration::from_millis(200),
            "{retry_after:?}"
        );
        assert_eq!(rejection.retry_after_secs(), Some(1));
        let unknown = Rejection::from(busy(None));
        assert!(matches!(unknown.retry_after_secs(), Some(1 | 2)));
    }

    #[test]
    fn a_retry_after_policy_sees_the_holder_ttl_and_the_wait() {
        let policy = RetryAfter::from_fn(|busy| busy.holder_ttl.unwrap_or_default() + busy.waited);
        let error = LockError::Busy {
            key: "k".into(),
            waited: Duration::from_secs(2),
            holder_ttl: Some(Duration::from_millis(2500)),
            holder: None,
        };
        let rejection = Rejection::from_error(error, &policy);
        assert_eq!(rejection.retry_after_secs(), Some(5));
        let response: Response<String> = rejection.default_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "5");
        let fixed = Rejection::from_error(busy(None), &RetryAfter::fixed(Duration::from_secs(7)));
        assert_eq!(fixed.retry_after_secs(), Some(7));
    }

    #[test]
    fn absurd_retry_after_policies_are_clamped_not_overflowed() {
        for policy in [
            RetryAfter::fixed(Duration::MAX),
            RetryAfter::jittered(Duration::MAX),
            RetryAfter::from_fn(|_| Duration::new(u64::MAX, 1)),
        ] {
            let rejection = Rejection::from_error(busy(None), &policy);
            assert_eq!(rejection.retry_after_secs(), Some(MAX_RETRY_AFTER_SECS));
            let response: Response<String> = rejection.default_response();
            assert_eq!(response.headers()[header::RETRY_AFTER], "2147483648");
        }
    }

    #[test]
    fn unavailable_and_lost_answers_carry_a_short_retry_after() {
        let unavailable = || {
            Rejection::from(LockError::NotReplicated {
                key: "k".into(),
                acked: 0,
                wanted: 1,
            })
        };
        let lost = || {
            Rejection::from(LockError::Lost {
                key: "k".into(),
                reason: lock_core::LostReason::Deleted,
            })
        };
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..100 {
            for rejection in [unavailable(), lost()] {
                let response: Response<String> = rejection.default_response();
                assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
                let header = response.headers().get(header::RETRY_AFTER);
                let value = header.map(|v| v.to_str().unwrap().to_owned());
                assert!(matches!(value.as_deref(), Some("1" | "2")), "{value:?}");
                seen.extend(value);
            }
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["1", "2"], "jittered");
    }

    #[test]
    fn lock_errors_are_sorted_into_statuses() {
        let invalid = Rejection::from(LockError::InvalidKey {
            key: String::new(),
            reason: lock_core::InvalidKeyReason::Empty,
        });
        assert!(matches!(invalid, Rejection::InvalidKey(_)));
        assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
        let lost = Rejection::from(LockError::Lost {
            key: "k".into(),
            reason: lock_core::LostReason::Unknown,
        });
        assert!(matches!(lost, Rejection::Lost(_)));
        assert_eq!(lost.status(), StatusCode::SERVICE_UNAVAILABLE);
        let unreplicated = Rejection::from(LockError::NotReplicated {
            key: "k".into(),
            acked: 0,
            wanted: 1,
        });
        assert_eq!(unreplicated.status(), StatusCode::SERVICE_UNAVAILABLE);
        // A stopping instance: the client retries, and another instance serves it.
        let stopping = Rejection::from(LockError::ShutDown);
        assert!(
            matches!(stopping, Rejection::Unavailable(_)),
            "{stopping:?}"
        );
        assert_eq!(stopping.status(), StatusCode::SERVICE_UNAVAILABLE);
        let unconfigured = Rejection::from(LockError::NotConfigured);
        assert!(matches!(unconfigured, Rejection::Failed(_)));
        assert_eq!(unconfigured.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(unconfigured.retry_after_secs(), None);
        assert_eq!(Rejection::MissingKey.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            Rejection::Misconfigured.status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert!(Rejection::MissingKey.error().is_none());
        assert_eq!(Rejection::MalformedKey.status(), StatusCode::BAD_REQUEST);
        assert_eq!(Rejection::MalformedKey.kind(), "malformed_key");
        assert!(Rejection::MalformedKey.error().is_none());
        assert_eq!(Rejection::NoRoute.status(), StatusCode::NOT_FOUND);
        assert_eq!(Rejection::NoRoute.kind(), "no_route");
        assert_eq!(Rejection::NoRoute.retry_after_secs(), None);
        assert!(Rejection::NoRoute.error().is_none());
    }

    /// Edge durations (zero, sub-second, the largest) and random ones of any size.
    fn durations() -> impl proptest::strategy::Strategy<Value = Duration> {
        use proptest::prelude::*;
        prop_oneof![
            proptest::sample::select(vec![
                Duration::ZERO,
                Duration::from_nanos(1),
                Duration::from_millis(999),
                Duration::from_secs(u64::MAX),
                Duration::MAX,
            ]),
            (any::<u64>(), 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
            (0..=u64::MAX / 2).prop_map(Duration::from_nanos),
        ]
    }

    proptest::proptest! {
        // Pure and quick: the default case count; no regression files in the tree.
        #![proptest_config(proptest::test_runner::Config {
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]

        /// Whatever the policy's base or delay and the holder's TTL, choosing the delay and
        /// writing the header never panics: the header is the delay in whole seconds, rounded
        /// up, at least 1, at most [`MAX_RETRY_AFTER_SECS`].
        #[test]
        fn retry_after_of_any_duration_is_a_header_never_a_panic(
            base in durations(),
            ttl in proptest::option::of(durations()),
            waited in durations(),
        ) {
            let ceil = |d: Duration| {
                let up = d.as_nanos().div_ceil(1_000_000_000).max(1);
                u64::try_from(up).unwrap_or(u64::MAX).min(MAX_RETRY_AFTER_SECS)
            };
            let info = BusyInfo { holder_ttl: ttl, waited };
            for policy in [
                RetryAfter::jittered(base),
                RetryAfter::fixed(base),
                RetryAfter::from_fn(move |_| base),
            ] {
                let chosen = policy.choose(&info);
                let error = LockError::Busy { key: "k".into(), waited, holder_ttl: ttl, holder: None };
                let rejection = Rejection::from_error(error, &policy);
                let Rejection::Busy { retry_after, .. } = &rejection else {
                    panic!("{rejection:?}");
                };
                // The jitter draws anew: compare each choice with its own header.
                let secs = rejection.retry_after_secs();
                proptest::prop_assert_eq!(secs, Some(ceil(*retry_after)));
                if let Some(ttl) = ttl {
                    proptest::prop_assert!(chosen <= ttl.max(base) && *retry_after <= ttl.max(base));
                }
                let response: Response<String> = rejection.default_response();
                let header = response.headers()[header::RETRY_AFTER].to_str().unwrap().to_owned();
                proptest::prop_assert_eq!(header, secs.unwrap().to_string());
            }
        }
    }
}
