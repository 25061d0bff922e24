//! [`HeldLock`] and [`HeldLocks`]: what the handler learns about the lock(s) its request holds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use lock_core::{Fence, LockError, LockGuard, LockWatch, LostReason};

use crate::acquire::Guard;

/// The lock held for this request, in the request extensions of every request locked on one
/// key (requests locked on several keys have [`HeldLocks`] only).
///
/// A cheap, cloneable handle (the [`LockGuard`] itself stays with the layer, which releases it
/// when the response is done). Hand [`fencing_token`](Self::fencing_token) to the resource you
/// write so it can refuse writes from a holder whose lock has expired; a handler that never
/// asks for it costs no fencing.
///
/// Absent when the request had no key and passed unlocked, or when Redis was unavailable
/// and the layer [fails open](crate::DistributedLockLayer::fail_open). A [read
/// lock](crate::Mode::Read) ([`is_shared`](Self::is_shared)) has no fencing token.
///
/// # Examples
///
/// With axum it is an extractor (or `Option<HeldLock>` where the lock may be absent):
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use lock_tower::HeldLock;
///
/// async fn purchase(lock: HeldLock) -> Result<String, String> {
///     let token = lock.fencing_token().await.map_err(|e| e.to_string())?;
///     Ok(format!("{} fenced by {token}", lock.key()))
/// }
/// # let _: axum::Router = axum::Router::new().route("/", axum::routing::post(purchase));
/// # }
/// ```
///
/// In any tower service it is `request.extensions().get::<HeldLock>()`.
///
/// Under [`OnLost::Continue`](lock_core::OnLost::Continue) the handler runs on when the lock
/// is lost; it learns of the loss with [`is_held`](Self::is_held) and [`lost`](Self::lost):
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use lock_tower::HeldLock;
///
/// async fn import(lock: HeldLock) -> Result<&'static str, String> {
///     tokio::select! {
///         () = lock.lost() => Err(format!("lock lost: {:?}", lock.lost_reason())),
///         () = async { /* the import, in steps */ } => Ok("imported"),
///     }
/// }
/// # let _: axum::Router = axum::Router::new().route("/", axum::routing::post(import));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct HeldLock {
    fence: Fence,
    watch: LockWatch,
    shared: bool,
}

impl HeldLock {
    pub(crate) fn new(guard: &LockGuard) -> Self {
        Self {
            fence: guard.fence(),
            watch: guard.watch(),
            shared: guard.is_shared(),
        }
    }

    /// Whether the lock is still held as far as this process knows: not lost (a renewal
    /// found another owner or no key, the lease ran out, the layer's
    /// [`max_hold`](crate::DistributedLockLayer::max_hold) passed) and not yet released by
    /// the layer. No Redis round trip (see [`LockGuard::is_held`]).
    pub fn is_held(&self) -> bool {
        self.watch.is_held()
    }

    /// Resolves when the lock is lost, or once the layer released it (the response is done):
    /// the hold is over either way. For a handler that runs on after a loss
    /// ([`OnLost::Continue`](lock_core::OnLost::Continue)), or work it hands to another task
    /// that may outlive the request.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        self.watch.lost().await;
    }

    /// Why the lock was lost, once it is; `None` while it is held (and after a release of a
    /// lock that was not lost).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.watch.lost_reason()
    }

    /// Whether this is a read lock, shared with other readers ([`Mode::Read`](crate::Mode::Read)).
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// The lock key (with its [prefix](crate::KeyFrom::prefix)).
    pub fn key(&self) -> &str {
        self.watch.key()
    }

    /// The fencing token of this acquisition: strictly greater than the token of every earlier
    /// holder of the key, issued on the first call (see [`LockGuard::fencing_token`]).
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] when the lock was lost before the token was issued;
    /// [`LockError::Backend`] when Redis fails; [`LockError::NotExclusive`] for a read lock.
    pub async fn fencing_token(&self) -> Result<u64, LockError> {
        self.fence.token().await
    }
}

/// Every lock held for this request: one, or several taken together (a key extractor that
/// returns several keys, such as [`KeyFrom::path_params`](crate::KeyFrom::path_params)). In
/// the request extensions of every locked request; with axum it is an extractor too.
///
/// Each [`HeldLock`] has its own fencing token: hand each resource the token of its key.
///
/// # Examples
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum::extract::Path;
/// use lock_tower::HeldLocks;
///
/// // Behind `KeyFrom::path_params(["from", "to"]).prefix("account:")`.
/// async fn transfer(Path((from, to)): Path<(u64, u64)>, locks: HeldLocks) -> Result<String, String> {
///     let debit = locks.fencing_token(&format!("account:{from}")).await.map_err(|e| e.to_string())?;
///     let credit = locks.fencing_token(&format!("account:{to}")).await.map_err(|e| e.to_string())?;
///     Ok(format!("moved from {from} (token {debit}) to {to} (token {credit})"))
/// }
/// # let _: axum::Router = axum::Router::new().route("/transfer/{from}/{to}", axum::routing::post(transfer));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct HeldLocks {
    /// In lock order (sorted by key for several).
    locks: Locks,
}

/// The lock of a request locked on one key inline (no allocation per request), several
/// shared.
#[derive(Debug, Clone)]
enum Locks {
    One(HeldLock),
    All(Arc<[HeldLock]>),
}

impl HeldLocks {
    pub(crate) fn new(guard: &Guard) -> Self {
        let locks = match guard {
            Guard::One(guard) => return Self::one(HeldLock::new(guard)),
            Guard::All(guard) => guard.guards().iter().map(HeldLock::new).collect(),
        };
        Self {
            locks: Locks::All(locks),
        }
    }

    /// The one lock of a request locked on one key: the handle its [`HeldLock`] is too.
    pub(crate) fn one(lock: HeldLock) -> Self {
        Self {
            locks: Locks::One(lock),
        }
    }

    fn as_slice(&self) -> &[HeldLock] {
        match &self.locks {
            Locks::One(lock) => std::slice::from_ref(lock),
            Locks::All(locks) => locks,
        }
    }

    /// The locks, in the order they were taken (sorted by key for several).
    pub fn iter(&self) -> impl Iterator<Item = &HeldLock> {
        self.as_slice().iter()
    }

    /// The keys, in the order they were taken (with their [prefix](crate::KeyFrom::prefix)).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.as_slice().iter().map(HeldLock::key)
    }

    /// The lock of `key`, if this request holds it.
    pub fn get(&self, key: &str) -> Option<&HeldLock> {
        self.as_slice().iter().find(|lock| lock.key() == key)
    }

    /// How many locks (equal keys of one request are locked once).
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Always false: a request holds at least one lock when this is present.
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// Whether every lock is still held (see [`HeldLock::is_held`]).
    pub fn is_held(&self) -> bool {
        self.as_slice().iter().all(HeldLock::is_held)
    }

    /// Resolves when any of the locks is lost, or once the layer released them (see
    /// [`HeldLock::lost`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        let mut each: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = self
            .as_slice()
            .iter()
            .map(|lock| Box::pin(lock.lost()) as Pin<Box<dyn Future<Output = ()> + Send + '_>>)
            .collect();
        std::future::poll_fn(|cx| {
            // Every one is polled, so each registers its wake-up.
            let mut any = false;
            for lost in &mut each {
                any |= lost.as_mut().poll(cx).is_ready();
            }
            if any {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// The first lock found lost (in lock order), if any.
    pub fn lost_lock(&self) -> Option<&HeldLock> {
        self.as_slice().iter().find(|lock| !lock.is_held())
    }

    /// The fencing token of `key` (see [`HeldLock::fencing_token`]).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] when this request does not hold `key`, and the errors of
    /// [`HeldLock::fencing_token`].
    pub async fn fencing_token(&self, key: &str) -> Result<u64, LockError> {
        match self.get(key) {
            Some(lock) => lock.fencing_token().await,
            None => Err(LockError::InvalidKey {
                key: key.chars().take(64).collect(),
                reason: lock_core::InvalidKeyReason::NotHeld,
            }),
        }
    }
}

#[cfg(feature = "axum")]
mod axum_impls {
    use axum::extract::{FromRequestParts, OptionalFromRequestParts};
    use axum::http::request::Parts;
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};

    use super::{HeldLock, HeldLocks};

    /// Rejection of the [`HeldLock`] and [`HeldLocks`] extractors: the request holds no lock,
    /// or (for `HeldLock`) it holds several. Answers `500 Internal Server Error`, since it
    /// means the route is not set up as the handler expects.
    #[derive(Debug, Clone, Copy, Default)]
    #[non_exhaustive]
    pub struct MissingHeldLock {
        /// `Some(n)`: the request holds `n` locks taken together, and `HeldLock` was asked for.
        several: Option<usize>,
    }

    impl std::fmt::Display for MissingHeldLock {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self.several {
                Some(n) => write!(
                    f,
                    "this request holds {n} distributed locks taken together (a key extractor \
                     with several keys): extract `HeldLocks` instead of `HeldLock`"
                ),
                None => f.write_str(
                    "no distributed lock is held for this request: the route has no \
                     DistributedLockLayer, the request had no key, or the layer failed open",
                ),
            }
        }
    }

    impl std::error::Error for MissingHeldLock {}

    impl IntoResponse for MissingHeldLock {
        fn into_response(self) -> Response {
            tracing::error!("{self}");
            let body = match self.several {
                Some(_) => "several locks held for this request\n",
                None => "no lock held for this request\n",
            };
            (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
        }
    }

    impl<S: Send + Sync> FromRequestParts<S> for HeldLock {
        type Rejection = MissingHeldLock;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            if let Some(lock) = parts.extensions.get::<Self>() {
                return Ok(lock.clone());
            }
            // Requests locked on one key have both extensions, on several keys `HeldLocks` only.
            let several = parts.extensions.get::<HeldLocks>().map(HeldLocks::len);
            Err(MissingHeldLock { several })
        }
    }

    impl<S: Send + Sync> OptionalFromRequestParts<S> for HeldLock {
        type Rejection = std::convert::Infallible;

        async fn from_request_parts(
            parts: &mut Parts,
            _: &S,
        ) -> Result<Option<Self>, Self::Rejection> {
            Ok(parts.extensions.get::<Self>().cloned())
        }
    }

    impl<S: Send + Sync> FromRequestParts<S> for HeldLocks {
        type Rejection = MissingHeldLock;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            parts
                .extensions
                .get::<Self>()
                .cloned()
                .ok_or(MissingHeldLock { several: None })
        }
    }

    impl<S: Send + Sync> OptionalFromRequestParts<S> for HeldLocks {
        type Rejection = std::convert::Infallible;

        async fn from_request_parts(
            parts: &mut Parts,
            _: &S,
        ) -> Result<Option<Self>, Self::Rejection> {
            Ok(parts.extensions.get::<Self>().cloned())
        }
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use axum_impls::MissingHeldLock;
