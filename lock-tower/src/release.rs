//! The end of a request's hold on its lock: [`Held`] carries the guard from the acquire to
//! the end of the hold, wherever that ends (the response future, or the body with
//! [`HoldUntil::BodyEnd`](crate::HoldUntil::BodyEnd)).
//!
//! - At the end of the hold, [`Held::release`] releases it and the [`Release`] future waits for
//!   Redis to confirm, so the response head (or the end of the body) goes out after the key
//!   is free.
//! - Dropped early (response future or body dropped, an error frame), `Held` drops the guard,
//!   and `lock_core` releases it in the background at once.
//! - Watched ([`Watched`]), while the handler runs and while a body holds it, the lock's loss
//!   is seen at once, so the handler can be stopped and the body broken off instead of going
//!   on without it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use lock_core::LockError;
use tracing::{Instrument, Span};

use crate::acquire::Guard;

/// The lock(s) of one request, held until the end of the request's hold.
pub(crate) struct Held {
    guard: Guard,
    /// The request's `distributed_lock` span, which the release logs into.
    span: Span,
}

impl Held {
    pub(crate) fn new(guard: Guard, span: Span) -> Self {
        Self { guard, span }
    }

    /// Releases the lock, and logs what went wrong. A lock lost before the end of the
    /// response means another holder may have run concurrently.
    ///
    /// Run inline, without a task of its own: `LockGuard::release` and
    /// `MultiLockGuard::release` are cancel safe (dropped mid-call, lock-core finishes the
    /// release in the background), so the response future or body waiting for it may be
    /// dropped at any moment (the client hangs up) without leaving the key locked.
    pub(crate) fn release(self) -> Release {
        let Self { guard, span } = self;
        let release = async move {
            match guard.release().await {
                Ok(()) => tracing::trace!("lock released"),
                Err(error) if error.is_lost() => tracing::warn!(
                    %error,
                    "the lock was lost before the response was complete"
                ),
                Err(error) => tracing::warn!(
                    %error,
                    "lock release failed: the lock expires with its lease"
                ),
            }
        }
        .instrument(span);
        Release(Box::pin(release))
    }
}

/// The lock(s) of a request, watched for a loss while the handler runs and while a body holds
/// them.
///
/// The guard is shared with the watch (which borrows it while it waits), and taken back
/// for the release once the watch is dropped.
pub(crate) struct Watched {
    guard: Arc<Guard>,
    span: Span,
    /// Resolves with the lock-lost error when the lock is lost.
    lost: Pin<Box<dyn Future<Output = LockError> + Send>>,
}

impl Held {
    /// Watches the lock for a loss.
    pub(crate) fn watched(self) -> Watched {
        let Self { guard, span } = self;
        let guard = Arc::new(guard);
        let watch = guard.clone();
        Watched {
            guard,
            span,
            lost: Box::pin(async move { watch.lost().await }),
        }
    }
}

impl Watched {
    /// Ready with the lock-lost error once the lock is lost, logged as a warning that says
    /// what follows (`then`).
    pub(crate) fn poll_lost(&mut self, cx: &mut Context<'_>, then: &str) -> Poll<LockError> {
        let error = std::task::ready!(self.lost.as_mut().poll(cx));
        self.span.in_scope(|| {
            tracing::warn!(%error, "the lock was lost before the request was done: {then}");
        });
        Poll::Ready(error)
    }

    /// Releases the lock at the end of the body, as [`Held::release`].
    pub(crate) fn release(self) -> Release {
        let Self { guard, span, lost } = self;
        // The watch holds the only other reference.
        drop(lost);
        match Arc::into_inner(guard) {
            Some(guard) => Held { guard, span }.release(),
            // Not reached (nothing else keeps the guard); if it were, the last reference's
            // drop releases it in the background.
            None => Release(Box::pin(std::future::ready(()))),
        }
    }
}

/// A release in progress: ready once Redis confirmed it (or it failed and was logged).
pub(crate) struct Release(Pin<Box<dyn Future<Output = ()> + Send>>);

impl Future for Release {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}
