//! [`SkipIfBusy`]: "try, and skip quietly if another holder has it", for work that should run
//! in one instance only (a scheduled job every instance starts).

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::key::ShownKey;
use crate::with_lock::run;
use crate::{Acquire, AcquireAll, Fence, LockError, LockGuard, MultiLockGuard};

/// An acquire whose busy answer is a quiet skip: `Ok(None)` instead of [`LockError::Busy`].
///
/// Created by [`Acquire::skip_if_busy`] and [`AcquireAll::skip_if_busy`]. Awaiting it gives
/// `Ok(Some(guard))`, `Ok(None)` when another holder kept the lock for the whole wait, or any
/// other lock error. [`with_lock`](SkipIfBusy::<Acquire>::with_lock) runs a body under the
/// lock and returns `Ok(None)` without running it when skipped.
///
/// The wait is zero (one try) unless [`Acquire::wait`] was set before: the locker's
/// `default_wait` does not apply. A skip is logged at debug level and counted with the
/// outcome `skipped` (not `busy`) in the acquire metrics.
///
/// # Examples
///
/// ```no_run
/// use lock_core::{LockError, Locker};
///
/// # async fn demo(locker: Locker) -> Result<(), LockError> {
/// // Every instance starts the nightly report; one runs it, the others skip.
/// let report = locker
///     .lock("report:nightly")
///     .skip_if_busy()
///     .with_lock(|_fence| async {
///         // ... build the report ...
///         Ok::<_, LockError>("sent")
///     })
///     .await?;
/// match report {
///     Some(outcome) => println!("report {outcome}"),
///     None => println!("another instance runs the report"),
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// Every error of the acquire except [`LockError::Busy`].
///
/// # Cancel safety
///
/// As the acquire's.
#[derive(Debug)]
#[must_use = "an acquire does nothing until it is `.await`ed"]
pub struct SkipIfBusy<A> {
    acquire: A,
}

impl Acquire {
    /// Turns a busy lock into a quiet skip: awaiting the result gives `Ok(None)` rather than
    /// [`LockError::Busy`]. The wait is zero unless [`wait`](Self::wait) was called before:
    /// with a wait, the acquire tries that long before it skips. See [`SkipIfBusy`].
    ///
    /// A wait lets an instance that starts late run the work again once the first one
    /// finished: keep it zero for work that must run once per schedule.
    pub fn skip_if_busy(self) -> SkipIfBusy<Self> {
        SkipIfBusy {
            acquire: self.skipping(),
        }
    }
}

impl AcquireAll {
    /// Turns a busy key into a quiet skip of the whole set, as [`Acquire::skip_if_busy`]: no
    /// key is kept when any is busy.
    pub fn skip_if_busy(self) -> SkipIfBusy<Self> {
        SkipIfBusy {
            acquire: self.skipping(),
        }
    }
}

impl SkipIfBusy<Acquire> {
    /// Acquires, then runs `body` under the lock as [`Acquire::with_lock`] does; `Ok(None)`
    /// without running `body` when the lock is busy.
    ///
    /// # Errors
    ///
    /// As [`Acquire::with_lock`], except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`Locker::with_lock`](crate::Locker::with_lock).
    pub async fn with_lock<T, E, F, Fut>(self, body: F) -> Result<Option<T>, E>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        let on_lost = self.acquire.on_lost_policy();
        let prefix = self.acquire.locker().prefix().to_owned();
        let guard = match self.await {
            Ok(Some(guard)) => guard,
            Ok(None) => return Ok(None),
            Err(error) => return Err(E::from(error.in_locker(&prefix))),
        };
        let fence = guard.fence();
        run(guard, on_lost, body(fence)).await.map(Some)
    }
}

impl SkipIfBusy<AcquireAll> {
    /// Acquires every key, then runs `body` under all the locks as [`AcquireAll::with_lock`]
    /// does; `Ok(None)` without running `body` when any key is busy.
    ///
    /// # Errors
    ///
    /// As [`AcquireAll::with_lock`], except that a busy key is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`Locker::with_lock`](crate::Locker::with_lock).
    pub async fn with_lock<T, E, F, Fut>(self, body: F) -> Result<Option<T>, E>
    where
        F: FnOnce(Vec<Fence>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        let on_lost = self.acquire.on_lost_policy();
        let prefix = self.acquire.locker().prefix().to_owned();
        let guard = match self.await {
            Ok(Some(guard)) => guard,
            Ok(None) => return Ok(None),
            Err(error) => return Err(E::from(error.in_locker(&prefix))),
        };
        let fences = guard.fences();
        run(guard, on_lost, body(fences)).await.map(Some)
    }
}

impl IntoFuture for SkipIfBusy<Acquire> {
    type Output = Result<Option<LockGuard>, LockError>;
    type IntoFuture = SkipIfBusyFuture<<Acquire as IntoFuture>::IntoFuture>;

    fn into_future(self) -> Self::IntoFuture {
        SkipIfBusyFuture {
            inner: self.acquire.into_future(),
        }
    }
}

impl IntoFuture for SkipIfBusy<AcquireAll> {
    type Output = Result<Option<MultiLockGuard>, LockError>;
    type IntoFuture = SkipIfBusyFuture<<AcquireAll as IntoFuture>::IntoFuture>;

    fn into_future(self) -> Self::IntoFuture {
        SkipIfBusyFuture {
            inner: self.acquire.into_future(),
        }
    }
}

/// The future of a [`SkipIfBusy`]: the acquire's, with a busy answer turned into `Ok(None)`.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct SkipIfBusyFuture<F> {
    inner: F,
}

impl<F, G> Future for SkipIfBusyFuture<F>
where
    F: Future<Output = Result<G, LockError>> + Unpin,
{
    type Output = Result<Option<G>, LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.inner).poll(cx).map(skipped_if_busy)
    }
}

/// `Busy` becomes `Ok(None)`, logged at debug level (it is the expected answer on every
/// instance but one); the rest is passed on.
fn skipped_if_busy<G>(acquired: Result<G, LockError>) -> Result<Option<G>, LockError> {
    match acquired {
        Ok(guard) => Ok(Some(guard)),
        Err(LockError::Busy { key, waited, .. }) => {
            tracing::debug!(key = %ShownKey(&key), ?waited, "lock busy: skipped");
            Ok(None)
        }
        Err(error) => Err(error),
    }
}
