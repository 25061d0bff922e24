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
use std::task::{Context, Poll};

use lock_core::LockError;
use tracing::Span;

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
        // Only lock-core's release future is boxed (its type cannot be named), the one of the
        // guard's kind; the logging and the span are this future's own.
        let release: BoxedRelease = match guard {
            Guard::One(guard) => Box::pin(guard.release()),
            Guard::All(guard) => Box::pin(guard.release()),
        };
        Release {
            release: Some(release),
            span,
        }
    }
}

/// The lock(s) of a request, watched for a loss while the handler runs and while a body holds
/// them.
///
/// The check costs nothing until the handler (or the body) has to wait: each poll first asks
/// the guard whether the lock is still held (no Redis round trip, no allocation), and only a
/// poll that leaves the handler pending arms a watch ([`Watches::lost`]) that wakes the
/// request on a loss. A handler that answers on its first poll, the common case, never arms
/// one (no boxed future, no timer entry).
pub(crate) struct Watched {
    guard: Guard,
    span: Span,
    /// Resolves when the lock is lost; armed by the first poll that leaves the handler
    /// pending.
    lost: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Held {
    /// Watches the lock for a loss.
    pub(crate) fn watched(self) -> Watched {
        let Self { guard, span } = self;
        Watched {
            guard,
            span,
            lost: None,
        }
    }
}

impl Watched {
    /// Ready with the lock-lost error once the lock is lost, logged as a warning that says
    /// what follows (`then`). Asked before the handler or the body goes on; a `Pending` answer
    /// here does not yet register for a wake-up: call [`poll_lost_armed`](Self::poll_lost_armed)
    /// when the handler or body is about to wait.
    pub(crate) fn poll_lost(&mut self, then: &str) -> Poll<LockError> {
        if self.guard.is_held() {
            return Poll::Pending;
        }
        Poll::Ready(self.lost(then))
    }

    /// As [`poll_lost`](Self::poll_lost), and arms the watch that wakes the task of `cx` when
    /// the lock is lost: for a poll that leaves the handler or the body pending.
    pub(crate) fn poll_lost_armed(&mut self, cx: &mut Context<'_>, then: &str) -> Poll<LockError> {
        let guard = &self.guard;
        let lost = self
            .lost
            .get_or_insert_with(|| Box::pin(guard.watches().lost()));
        if lost.as_mut().poll(cx).is_pending() && self.guard.is_held() {
            return Poll::Pending;
        }
        Poll::Ready(self.lost(then))
    }

    /// The lock-lost error, logged as a warning that says what follows (`then`).
    fn lost(&self, then: &str) -> LockError {
        let error = self.guard.lost_error();
        self.span.in_scope(|| {
            tracing::warn!(%error, "the lock was lost before the request was done: {then}");
        });
        error
    }

    /// Releases the lock at the end of the body, as [`Held::release`].
    pub(crate) fn release(self) -> Release {
        let Self { guard, span, lost } = self;
        drop(lost);
        Held { guard, span }.release()
    }
}

/// lock-core's release of one guard or of several.
type BoxedRelease = Pin<Box<dyn Future<Output = Result<(), LockError>> + Send>>;

/// A release in progress: ready once Redis confirmed it (or it failed and was logged), polled
/// and dropped in the request's `distributed_lock` span.
pub(crate) struct Release {
    /// `None` once finished.
    release: Option<BoxedRelease>,
    span: Span,
}

impl Future for Release {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let _entered = this.span.enter();
        let Some(release) = this.release.as_mut() else {
            return Poll::Ready(());
        };
        let released = std::task::ready!(release.as_mut().poll(cx));
        this.release = None;
        match released {
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
        Poll::Ready(())
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        // Dropped unfinished (the client hung up), lock-core hands the release to its
        // background releaser: what it logs belongs to the request's span.
        if let Some(release) = self.release.take() {
            let _entered = self.span.enter();
            drop(release);
        }
    }
}
