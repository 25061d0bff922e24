//! [`DistributedLockLayer`]: the configuration of the middleware.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use lock_core::{ConfigError, Locker, OnLost};
use tower_layer::Layer;

use crate::mode::ByMethod;
use crate::reject::{BusyInfo, DefaultReject, RetryAfter};
use crate::service::{DistributedLockService, LoggedRoutes};

/// What to do with a request whose key extractor returns `None`.
///
/// The layer fails closed by default: a request it cannot name a lock for does not reach the
/// handler unlocked. Whatever this says, a request that carries the value its key comes from
/// in a form that cannot be read ([`KeyAbsence::Unreadable`](crate::KeyAbsence::Unreadable):
/// not UTF-8, a query parameter given twice) or parsed
/// ([`KeyAbsence::Malformed`](crate::KeyAbsence::Malformed)) is rejected with `400 Bad
/// Request`: passing it unlocked would let a client skip the lock of a key it does name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Reject it (the default), according to the extractor's
    /// [`absence`](crate::KeyExtractor::absence): the client's fault (a missing header or
    /// query parameter) with [`Rejection::MissingKey`](crate::Rejection::MissingKey), `400 Bad
    /// Request`; the server's (a path parameter the route does not have) with
    /// [`Rejection::Misconfigured`](crate::Rejection::Misconfigured), `500`, logged at error
    /// level the first time on each route.
    #[default]
    Reject,
    /// Pass it to the inner service without a lock (logged at debug level) when the request
    /// lacks the value ([`KeyAbsence::Request`](crate::KeyAbsence::Request)) or the route has
    /// none ([`KeyAbsence::Route`](crate::KeyAbsence::Route)). An explicit opt-in for routes
    /// where some requests need no lock.
    Pass,
}

/// How long the lock of a request is held.
///
/// At the end of the hold, the release is confirmed by Redis before the response head (or
/// the end of the body) is passed on. In both cases the lock is released at once, in the
/// background (by dropping the [`LockGuard`](lock_core::LockGuard)), when the response future
/// or the body is dropped early: client disconnect, timeout, or a panic in the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HoldUntil {
    /// Until the inner service's response future completes (for axum: the handler has
    /// returned its response). The default. The response body is sent without the lock,
    /// which is what you want when the handler builds the whole body (`Json`, `String`, ...)
    /// and a slow client must not hold a hot key.
    #[default]
    Response,
    /// Until the response body has been sent to its end, errored, or was dropped. Use it
    /// when the body streams work done under the lock. The lock then also lasts as long as
    /// the client takes to read the body.
    ///
    /// A response with no body to send (the answer to a `HEAD`, a `1xx`, `204` or `304`
    /// status, a body known to be empty) is released as with [`Response`](Self::Response),
    /// before it is passed on: hyper drops such a body without polling it, so its end would
    /// come only after the response went out. If the lock is lost while the body streams,
    /// the body ends with the lock-lost error rather than sending on unlocked (see
    /// [`LockedBody`](crate::LockedBody)).
    BodyEnd,
}

/// The longest a request holds its lock unless the layer says otherwise
/// ([`DistributedLockLayer::max_hold`]): one minute.
///
/// The lock is taken before the handler reads the request body, so without a bound a client
/// that sends its headers and then nothing (or, under [`HoldUntil::BodyEnd`], stops reading
/// the response) would keep the key locked for as long as its connection stays open. Put
/// body and response timeouts in front of the layer as well (tower-http's
/// `RequestBodyTimeoutLayer` and `TimeoutLayer`); this bound is the last line.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(60);

/// Settings shared by the layer, the service and each response future.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) wait: Duration,
    pub(crate) lease: Option<Duration>,
    pub(crate) max_hold: Duration,
    pub(crate) on_lost: OnLost,
    pub(crate) missing_key: MissingKey,
    pub(crate) fail_open: bool,
    pub(crate) hold_until: HoldUntil,
    /// The status of a busy answer built with the default `409`.
    pub(crate) busy_status: StatusCode,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            wait: Duration::ZERO,
            lease: None,
            max_hold: DEFAULT_MAX_HOLD,
            on_lost: OnLost::Abort,
            missing_key: MissingKey::Reject,
            fail_open: false,
            hold_until: HoldUntil::Response,
            busy_status: StatusCode::CONFLICT,
        }
    }
}

/// A [`Layer`] that takes a distributed lock per request key (or keys), before calling the
/// inner service, and holds it until the response is done.
///
/// `K` is the [`KeyExtractor`](crate::KeyExtractor), `R` the [`Reject`](crate::Reject) that
/// builds the responses of rejected requests, `M` the [`ChooseMode`](crate::ChooseMode) that
/// decides between the read and the exclusive lock. See the [crate docs](crate) for the
/// behaviour.
///
/// | setting | default |
/// |---|---|
/// | [`mode`](Self::mode) | [`ByMethod`]: `GET`, `HEAD`, `OPTIONS`, `TRACE` take the read lock, other methods the exclusive lock (several keys: always exclusive) |
/// | [`wait`](Self::wait) | zero: try once and answer `409` when busy |
/// | [`lease`](Self::lease) | none: the locker's watchdog lease, renewed while held |
/// | [`max_hold`](Self::max_hold) | [`DEFAULT_MAX_HOLD`]: one minute, then the lock ends in Redis and the request is answered [lost](crate::Rejection::Lost) |
/// | [`on_lost`](Self::on_lost) | [`OnLost::Abort`]: a lock lost while the handler runs stops the handler |
/// | [`on_missing_key`](Self::on_missing_key) | [`MissingKey::Reject`]: `400`, or `500` for a path parameter the route lacks |
/// | [`fail_open`](Self::fail_open) | off: `503` when Redis is unavailable |
/// | [`hold_until`](Self::hold_until) | [`HoldUntil::Response`] |
/// | [`reject_with`](Self::reject_with) | [`DefaultReject`] |
/// | [`retry_after`](Self::retry_after) | 0.5 to 1.5 s, random, at most the holder's lease ([`RetryAfter::default`]) |
/// | [`busy_status`](Self::busy_status) | `409 Conflict` |
pub struct DistributedLockLayer<K, R = DefaultReject, M = ByMethod> {
    pub(crate) locker: Locker,
    pub(crate) key: Arc<K>,
    pub(crate) mode: Arc<M>,
    pub(crate) reject: Arc<R>,
    pub(crate) retry_after: RetryAfter,
    pub(crate) settings: Settings,
    pub(crate) misconfigured: Arc<LoggedRoutes>,
}

impl<K> DistributedLockLayer<K> {
    /// Locks, on `locker`, the key that `key` extracts from each request, with the defaults
    /// above.
    pub fn new(locker: Locker, key: K) -> Self {
        Self {
            locker,
            key: Arc::new(key),
            mode: Arc::new(ByMethod),
            reject: Arc::new(DefaultReject),
            retry_after: RetryAfter::default(),
            settings: Settings::default(),
            misconfigured: Arc::default(),
        }
    }

    /// At most `max` requests per key at once across every instance sharing the locker's
    /// Redis: the distributed counterpart of tower's `ConcurrencyLimitLayer`, which limits one
    /// process. The same layer with [`Mode::Limit`](crate::Mode::Limit) for every request:
    /// each request holds one permit of the key's semaphore; one that finds them all taken
    /// for the whole [`wait`](Self::wait) (zero by default) gets `429 Too Many Requests` with
    /// `Retry-After` ([`Rejection::Full`](crate::Rejection::Full)). Permits expire with their
    /// lease, so requests of a crashed instance give theirs back.
    ///
    /// ```no_run
    /// use axum::{routing::post, Router};
    /// use lock_core::ConfigError;
    /// use lock_tower::{DistributedLockLayer, KeyFrom};
    /// # fn app(locker: lock_core::Locker) -> Result<Router, ConfigError> {
    /// // At most 3 exports per tenant at a time, whatever instance they reach.
    /// let limit = DistributedLockLayer::concurrency_limit(
    ///     locker,
    ///     KeyFrom::path_param_as::<u64>("tenant").prefix("exports:"),
    ///     3,
    /// )?;
    /// Ok(Router::new()
    ///     .route("/tenants/{tenant}/export", post(|| async { "exported" }))
    ///     .route_layer(limit))
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::Permits`] for `max` 0, a limit that admits no request: refused here,
    /// where the route is built, rather than answering every request `500`. The same error
    /// that lock-core gives a semaphore of 0 permits.
    pub fn concurrency_limit(
        locker: Locker,
        key: K,
        max: u32,
    ) -> Result<DistributedLockLayer<K, DefaultReject, crate::Mode>, ConfigError> {
        if max == 0 {
            return Err(ConfigError::Permits {
                permits: max,
                wanted: 1,
            });
        }
        Ok(Self::new(locker, key).mode(crate::Mode::Limit(max)))
    }
}

impl<K, R, M> DistributedLockLayer<K, R, M> {
    /// Chooses per request between the read lock and the exclusive lock: a [`Mode`](crate::Mode)
    /// for every request, or any [`ChooseMode`](crate::ChooseMode), e.g. a closure
    /// `Fn(&Request<B>) -> Mode`. Default [`ByMethod`]: safe methods (`GET`, `HEAD`,
    /// `OPTIONS`, `TRACE`) read, the others are exclusive. Requests with several keys are
    /// locked exclusively whatever the mode.
    ///
    /// Before read locks existed the layer took the exclusive lock for every request;
    /// `.mode(Mode::Exclusive)` keeps that.
    ///
    /// ```
    /// # fn layer(locker: lock_core::Locker) {
    /// use lock_tower::{DistributedLockLayer, KeyFrom, Mode};
    ///
    /// // Every request alone, GETs too (a GET that refreshes a cache under the lock).
    /// let exclusive = DistributedLockLayer::new(locker.clone(), KeyFrom::header("x-report"))
    ///     .mode(Mode::Exclusive);
    /// // Reads share the lock unless the client asks for a rebuild.
    /// let custom = DistributedLockLayer::new(locker, KeyFrom::header("x-report")).mode(
    ///     |req: &http::Request<String>| {
    ///         if req.headers().contains_key("x-rebuild") { Mode::Exclusive } else { Mode::Read }
    ///     },
    /// );
    /// # let _ = (exclusive, custom);
    /// # }
    /// ```
    pub fn mode<M2>(self, mode: M2) -> DistributedLockLayer<K, R, M2> {
        DistributedLockLayer {
            locker: self.locker,
            key: self.key,
            mode: Arc::new(mode),
            reject: self.reject,
            retry_after: self.retry_after,
            settings: self.settings,
            misconfigured: self.misconfigured,
        }
    }

    /// The longest time a request waits for its lock before it is rejected as
    /// [busy](crate::Rejection::Busy). Default `Duration::ZERO`: fail fast. Any value; a wait
    /// beyond 100 years has no deadline (see `lock_core::Acquire::wait`).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.settings.wait = wait;
        self
    }

    /// A fixed lease instead of the watchdog: the lock expires `lease` after it was taken even
    /// if the request is still running. Without it (the default), the locker's watchdog
    /// renews the lock for as long as the request holds it. From 1 ms to 365 days
    /// (`lock_core::MAX_LEASE`); a lease outside that range fails every request's acquire
    /// with `ConfigError::OutOfRange`, answered as [`Rejection::Failed`](crate::Rejection::Failed)
    /// (`500`).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = Some(lease);
        self
    }

    /// The longest a request holds its lock: [`DEFAULT_MAX_HOLD`] (one minute) unless set
    /// here. The lock's key then ends in Redis whatever the request is doing (see
    /// `lock_core::Acquire::max_hold`), so a silent client, a client that stops reading a
    /// [`BodyEnd`](HoldUntil::BodyEnd) response, or a stuck handler cannot keep a key locked.
    /// The request learns it as a lost lock: under [`OnLost::Abort`] (the default) the
    /// handler is stopped and the request answered with
    /// [`Rejection::Lost`](crate::Rejection::Lost); a streaming body ends with the lock-lost
    /// error. Any value: zero ends every lock at once, beyond 100 years (`Duration::MAX`) is
    /// no limit. Ignored with a fixed [`lease`](Self::lease), which ends the lock by itself.
    ///
    /// ```
    /// use std::time::Duration;
    /// # fn layer(locker: lock_core::Locker) {
    /// use lock_tower::{DistributedLockLayer, KeyFrom};
    ///
    /// // A report takes minutes: allow ten.
    /// let layer = DistributedLockLayer::new(locker, KeyFrom::path_param("report"))
    ///     .max_hold(Duration::from_secs(600));
    /// # let _ = layer;
    /// # }
    /// ```
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.settings.max_hold = max;
        self
    }

    /// What happens when the lock is lost while the handler runs (it reached its
    /// [`max_hold`](Self::max_hold), a fixed lease ran out, Redis lost the key).
    /// [`OnLost::Abort`] (the default, as the `#[distributed_lock]` macro's): the handler's
    /// future is dropped at once and the request is answered with
    /// [`Rejection::Lost`](crate::Rejection::Lost) (`503`), so nothing it does after the loss
    /// runs unlocked. [`OnLost::Continue`]: the handler finishes and its response is sent; it
    /// can watch the lock itself with [`HeldLock::is_held`](crate::HeldLock::is_held) and
    /// [`HeldLock::lost`](crate::HeldLock::lost). Either way a body held
    /// until its end ([`HoldUntil::BodyEnd`]) ends with the lock-lost error.
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.settings.on_lost = on_lost;
        self
    }

    /// What to do with a request that has no key. Default [`MissingKey::Reject`].
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.settings.missing_key = missing;
        self
    }

    /// When Redis is unreachable or fails, pass the request to the inner service without a
    /// lock (with a `tracing` warning) instead of rejecting it with
    /// [`Rejection::Unavailable`](crate::Rejection::Unavailable) (`503`, the default: fail
    /// closed). Only for work where availability matters more than exclusion.
    pub fn fail_open(mut self) -> Self {
        self.settings.fail_open = true;
        self
    }

    /// How long the lock is held. Default [`HoldUntil::Response`].
    pub fn hold_until(mut self, hold: HoldUntil) -> Self {
        self.settings.hold_until = hold;
        self
    }

    /// Chooses the `Retry-After` of [busy](crate::Rejection::Busy) rejections from what is
    /// known (the holder's remaining lease, how long the request waited). The header carries
    /// whole seconds, rounded up, at least 1 and at most
    /// [`MAX_RETRY_AFTER_SECS`](crate::MAX_RETRY_AFTER_SECS) (a longer delay, up to
    /// `Duration::MAX`, is clamped). Default: [`RetryAfter::default`].
    ///
    /// ```
    /// use std::time::Duration;
    /// # fn layer(locker: lock_core::Locker) {
    /// use lock_tower::{DistributedLockLayer, KeyFrom};
    ///
    /// let layer = DistributedLockLayer::new(locker, KeyFrom::header("x-account"))
    ///     .retry_after(|busy: &lock_tower::BusyInfo| busy.waited.max(Duration::from_secs(2)));
    /// # let _ = layer;
    /// # }
    /// ```
    pub fn retry_after<F>(mut self, choose: F) -> Self
    where
        F: Fn(&BusyInfo) -> Duration + Send + Sync + 'static,
    {
        self.retry_after = RetryAfter::from_fn(choose);
        self
    }

    /// The status of [busy](crate::Rejection::Busy) answers, `409 Conflict` by default. They
    /// carry `Retry-After` whatever the status.
    ///
    /// `409` says what happened (another request holds the resource), but many clients' retry
    /// middleware retries only `429 Too Many Requests` and `503 Service Unavailable`, honouring
    /// `Retry-After`: choose one of those for them. `429` reads as "slow down", `503` as "the
    /// service cannot serve it now", which is the better fit when the answer is about a shared
    /// job rather than the client's own rate.
    ///
    /// It applies to busy answers built with the default status: those of
    /// [`DefaultReject`], and of a [`reject_with`](Self::reject_with) function that passes
    /// busy rejections on to [`Rejection::default_response`](crate::Rejection::default_response)
    /// (or `into_response`). A function that builds its own busy answer with another status
    /// keeps it. A [concurrency limit](Self::concurrency_limit)'s full answer stays `429`.
    ///
    /// ```
    /// # fn layer(locker: lock_core::Locker) {
    /// use http::StatusCode;
    /// use lock_tower::{DistributedLockLayer, KeyFrom};
    ///
    /// let layer = DistributedLockLayer::new(locker, KeyFrom::path_param("sku"))
    ///     .busy_status(StatusCode::TOO_MANY_REQUESTS);
    /// # let _ = layer;
    /// # }
    /// ```
    pub fn busy_status(mut self, status: StatusCode) -> Self {
        self.settings.busy_status = status;
        self
    }

    /// Builds the responses of rejected requests with `reject`: a
    /// [`Reject`](crate::Reject), e.g. a closure `Fn(Rejection) -> Response<B>`.
    pub fn reject_with<R2>(self, reject: R2) -> DistributedLockLayer<K, R2, M> {
        DistributedLockLayer {
            locker: self.locker,
            key: self.key,
            mode: self.mode,
            reject: Arc::new(reject),
            retry_after: self.retry_after,
            settings: self.settings,
            misconfigured: self.misconfigured,
        }
    }
}

impl<S, K, R, M> Layer<S> for DistributedLockLayer<K, R, M> {
    type Service = DistributedLockService<S, K, R, M>;

    fn layer(&self, inner: S) -> Self::Service {
        DistributedLockService::from_layer(inner, self)
    }
}

impl<K, R, M> Clone for DistributedLockLayer<K, R, M> {
    fn clone(&self) -> Self {
        Self {
            locker: self.locker.clone(),
            key: self.key.clone(),
            mode: self.mode.clone(),
            reject: self.reject.clone(),
            retry_after: self.retry_after.clone(),
            settings: self.settings,
            misconfigured: self.misconfigured.clone(),
        }
    }
}

impl<K, R, M> fmt::Debug for DistributedLockLayer<K, R, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedLockLayer")
            .field("locker", &self.locker)
            .field("key", &std::any::type_name::<K>())
            .field("mode", &std::any::type_name::<M>())
            .field("reject", &std::any::type_name::<R>())
            .field("settings", &self.settings)
            .finish()
    }
}
