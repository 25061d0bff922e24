//! [`DistributedLockService`]: the middleware's [`Service`] implementation.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Request, Response};
use lock_core::Locker;
use tower_service::Service;

use crate::acquire::Acquiring;
use crate::body::LockedBody;
use crate::future::ResponseFuture;
use crate::key::{KeyAbsence, KeyExtractor};
use crate::layer::{DistributedLockLayer, MissingKey, Settings};
use crate::mode::{ByMethod, ChooseMode};
use crate::reject::{DefaultReject, Reject, Rejection, RetryAfter};

/// Takes a distributed lock per request key (or keys), then calls the inner service; built by
/// [`DistributedLockLayer`].
///
/// The key is extracted and the acquire started in [`call`](Service::call), not in
/// `poll_ready` (the key is only known with the request). `poll_ready` is the inner
/// service's: readiness and back-pressure are passed through unchanged. `call` moves the
/// inner service that was driven to readiness into the response future (it is called once the
/// lock is held) and keeps a fresh clone for the next request, so the inner service must be
/// `Clone` (axum's routes and `tower::util::BoxCloneService` are).
pub struct DistributedLockService<S, K, R = DefaultReject, M = ByMethod> {
    inner: S,
    locker: Locker,
    key: Arc<K>,
    mode: Arc<M>,
    reject: Arc<R>,
    retry_after: RetryAfter,
    settings: Settings,
    /// The routes whose misconfiguration (no key ever) was logged, shared by every service of
    /// the layer: once per route, not once per request.
    misconfigured: Arc<LoggedRoutes>,
}

impl<S, K> DistributedLockService<S, K> {
    /// Wraps `inner` with the default settings of [`DistributedLockLayer`].
    pub fn new(inner: S, locker: Locker, key: K) -> Self {
        Self::from_layer(inner, &DistributedLockLayer::new(locker, key))
    }

    /// A [`DistributedLockLayer`], the configurable way to build this service.
    pub fn layer(locker: Locker, key: K) -> DistributedLockLayer<K> {
        DistributedLockLayer::new(locker, key)
    }
}

impl<S, K, R, M> DistributedLockService<S, K, R, M> {
    pub(crate) fn from_layer(inner: S, layer: &DistributedLockLayer<K, R, M>) -> Self {
        Self {
            inner,
            locker: layer.locker.clone(),
            key: layer.key.clone(),
            mode: layer.mode.clone(),
            reject: layer.reject.clone(),
            retry_after: layer.retry_after.clone(),
            settings: layer.settings,
            misconfigured: layer.misconfigured.clone(),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K, R, M, ReqBody, ResBody> Service<Request<ReqBody>> for DistributedLockService<S, K, R, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: http_body::Body,
    K: KeyExtractor<ReqBody>,
    R: Reject<ResBody>,
    M: ChooseMode<ReqBody>,
{
    type Response = Response<LockedBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        // An empty list of keys is no key: the same fail-closed rules apply.
        let keys = self
            .key
            .extract_keys_mut(&mut request)
            .filter(|keys| !keys.is_empty());
        let Some(keys) = keys else {
            return match (self.settings.missing_key, self.key.absence(&request)) {
                // A value that is there but cannot be read or parsed is never passed unlocked:
                // the client would skip the lock of a key it names.
                (_, KeyAbsence::Unreadable) => {
                    tracing::debug!("the request's lock key cannot be read: rejected");
                    ResponseFuture::rejected(self.reject.reject(Rejection::MissingKey))
                }
                (_, KeyAbsence::Malformed) => {
                    tracing::debug!("the request's lock key does not parse: rejected");
                    ResponseFuture::rejected(self.reject.reject(Rejection::MalformedKey))
                }
                (MissingKey::Pass, _) => {
                    tracing::debug!("request has no lock key: passing it through unlocked");
                    ResponseFuture::unlocked(self.inner.call(request), self.reject.clone())
                }
                // Under `Router::layer` the layer wraps the router's fallback too: a request no
                // route matched has no route's key; a 404, not a 500 that blames the
                // configuration. Not passed on: a fallback service may be a router that routes
                // it to a handler that expects the lock (see `Rejection::NoRoute`).
                (MissingKey::Reject, _) if routed_to_fallback(&request) => {
                    tracing::debug!("request matched no route: rejected");
                    ResponseFuture::rejected(self.reject.reject(Rejection::NoRoute))
                }
                (MissingKey::Reject, KeyAbsence::Route) => {
                    if self.misconfigured.first_time(&request) {
                        let why = if before_routing(&request) {
                            "the layer runs before routing, where there are no path \
                             parameters: use Router::route_layer"
                        } else {
                            "a path parameter the route does not have?"
                        };
                        tracing::error!(
                            path = %request.uri().path(),
                            "the lock key extractor finds no key on this route ({why}): every \
                             request is rejected with 500"
                        );
                    }
                    ResponseFuture::rejected(self.reject.reject(Rejection::Misconfigured))
                }
                (MissingKey::Reject, _) => {
                    tracing::debug!("request has no lock key: rejected");
                    ResponseFuture::rejected(self.reject.reject(Rejection::MissingKey))
                }
            };
        };
        let span = tracing::debug_span!(
            "distributed_lock",
            key = %keys,
            mode = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let mode = self.mode.mode(&request);
        let (acquire, mode) =
            span.in_scope(|| Acquiring::start(&self.locker, keys, mode, &self.settings));
        span.record("mode", mode.as_str());
        // The service that was driven to readiness serves this request once the lock is held;
        // the clone left behind must be driven to readiness again before the next call.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::acquiring(
            acquire,
            mode,
            ready,
            request,
            self.reject.clone(),
            self.retry_after.clone(),
            self.settings,
            span,
        )
    }
}

/// Whether axum's router matched `request` to no route: the router has seen it (it adds the
/// original URI) and found no route (no matched path), so the service is the router's
/// fallback. Always `false` without axum.
fn routed_to_fallback<B>(request: &Request<B>) -> bool {
    #[cfg(feature = "axum")]
    return request
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .is_some()
        && before_routing(request);
    #[cfg(not(feature = "axum"))]
    {
        let _ = request;
        false
    }
}

/// Whether `request` has not been through axum's routing (no matched path): a layer in front
/// of the whole router, or the router's fallback. Always `false` without axum.
fn before_routing<B>(request: &Request<B>) -> bool {
    #[cfg(feature = "axum")]
    return request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .is_none();
    #[cfg(not(feature = "axum"))]
    {
        let _ = request;
        false
    }
}

/// The routes (axum's matched path; one entry without axum) already logged as misconfigured.
#[derive(Debug, Default)]
pub(crate) struct LoggedRoutes(Mutex<HashSet<String>>);

impl LoggedRoutes {
    /// Whether `request`'s route is logged for the first time. The set is bounded by the
    /// number of routes: the matched path is the route's pattern, not the request's path.
    fn first_time<B>(&self, request: &Request<B>) -> bool {
        #[cfg(feature = "axum")]
        let route = request
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .map_or("", |matched| matched.as_str());
        #[cfg(not(feature = "axum"))]
        let route = {
            let _ = request;
            ""
        };
        // A poisoned set only means another thread panicked while inserting: keep using it.
        let mut logged = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        !logged.contains(route) && logged.insert(route.to_owned())
    }
}

impl<S: Clone, K, R, M> Clone for DistributedLockService<S, K, R, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
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

impl<S: fmt::Debug, K, R, M> fmt::Debug for DistributedLockService<S, K, R, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedLockService")
            .field("inner", &self.inner)
            .field("locker", &self.locker)
            .field("key", &std::any::type_name::<K>())
            .field("mode", &std::any::type_name::<M>())
            .field("reject", &std::any::type_name::<R>())
            .field("settings", &self.settings)
            .finish()
    }
}
