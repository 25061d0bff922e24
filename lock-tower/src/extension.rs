//! [`HeldLock`]: what the handler learns about the lock its request holds.

use std::sync::Arc;

use lock_core::{Fence, LockError, LockGuard};

/// The lock held for this request, in the request extensions of every request that got one.
///
/// A cheap, cloneable handle (the [`LockGuard`] itself stays with the layer, which releases it
/// when the response is done). Hand [`fencing_token`](Self::fencing_token) to the resource you
/// write so it can refuse writes from a holder whose lock has expired; a handler that never
/// asks for it costs no fencing.
///
/// Absent when the request had no key and passed unlocked, or when Redis was unavailable
/// and the layer [fails open](crate::DistributedLockLayer::fail_open).
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
#[derive(Debug, Clone)]
pub struct HeldLock {
    key: Arc<str>,
    fence: Fence,
}

impl HeldLock {
    pub(crate) fn new(guard: &LockGuard) -> Self {
        Self {
            key: guard.key().into(),
            fence: guard.fence(),
        }
    }

    /// The lock key (with its [prefix](crate::KeyFrom::prefix)).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token of this acquisition: strictly greater than the token of every earlier
    /// holder of the key, issued on the first call (see [`LockGuard::fencing_token`]).
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] when the lock was lost before the token was issued;
    /// [`LockError::Backend`] when Redis fails.
    pub async fn fencing_token(&self) -> Result<u64, LockError> {
        self.fence.token().await
    }
}

#[cfg(feature = "axum")]
mod axum_impls {
    use axum::extract::{FromRequestParts, OptionalFromRequestParts};
    use axum::http::request::Parts;
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};

    use super::HeldLock;

    /// Rejection of the [`HeldLock`] extractor: the request holds no lock. Answers
    /// `500 Internal Server Error`, since it means the route is not set up as the handler
    /// expects.
    #[derive(Debug, Clone, Copy, Default)]
    #[non_exhaustive]
    pub struct MissingHeldLock;

    impl std::fmt::Display for MissingHeldLock {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(
                "no distributed lock is held for this request: the route has no \
                 DistributedLockLayer, the request had no key, or the layer failed open",
            )
        }
    }

    impl std::error::Error for MissingHeldLock {}

    impl IntoResponse for MissingHeldLock {
        fn into_response(self) -> Response {
            tracing::error!("{self}");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "no lock held for this request\n",
            )
                .into_response()
        }
    }

    impl<S: Send + Sync> FromRequestParts<S> for HeldLock {
        type Rejection = MissingHeldLock;

        async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
            parts
                .extensions
                .get::<Self>()
                .cloned()
                .ok_or(MissingHeldLock)
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
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use axum_impls::MissingHeldLock;
