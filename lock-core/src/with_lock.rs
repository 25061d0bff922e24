//! [`Locker::with_lock`] and [`Acquire::with_lock`]: run a closure's future under a lock, the
//! closure form of `#[distributed_lock]`.

use std::future::Future;

use crate::__private::{self, OnLost};
use crate::{Acquire, Fence, LockError, LockGuard, Locker};

impl Locker {
    /// Acquires `key` with the locker's default wait, runs the future `body` returns while
    /// holding it, then releases it: the closure form of `#[distributed_lock]`.
    ///
    /// `body` gets the lock's [`Fence`] (an owned handle: its `token()` is the fencing token,
    /// issued on first use), so the future can be `async move` without borrowing the guard.
    ///
    /// - **Lock failures** (busy for the whole wait, Redis unavailable, invalid key) become the
    ///   body's error type through `From<LockError>`, and the body does not run.
    /// - **Loss.** If the lock is lost while the body runs (its lease ran out, another owner
    ///   took it), the body's future is dropped at its next `.await` and the call returns
    ///   [`LockError::Lost`] converted into `E`, like the macro's `on_lost = "abort"`: code
    ///   after that `.await` never runs without the lock. Partial effects before it stay, so
    ///   pass the fencing token to the store you write to.
    /// - **Release** on every path: after the body returns (a failed release is logged, the
    ///   body's result stands: the key expires with its lease), and if the body panics or the
    ///   returned future is dropped, the guard's drop releases in the background.
    ///
    /// Use [`Acquire::with_lock`] for another wait or a fixed lease.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lock_core::{LockError, Locker};
    ///
    /// # async fn demo(locker: Locker) -> Result<(), LockError> {
    /// let token = locker
    ///     .with_lock("inventory:42", |fence| async move {
    ///         let token = fence.token().await?;
    ///         // Only one task in all instances runs here for "inventory:42":
    ///         // read the stock, write stock - 1 along with `token` ...
    ///         Ok::<_, LockError>(token)
    ///     })
    ///     .await?;
    /// # let _ = token;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// What `body` returns, or a [`LockError`] converted into `E`: the errors of
    /// [`Locker::lock`] for the acquire, [`LockError::Lost`] when the lock was lost meanwhile.
    pub async fn with_lock<T, E, F, Fut>(&self, key: impl Into<String>, body: F) -> Result<T, E>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        let guard = self
            .lock(key)
            .await
            .map_err(|e| E::from(e.in_locker(self.prefix())))?;
        run(guard, body).await
    }
}

impl Acquire {
    /// Acquires with these options, then runs `body` under the lock as
    /// [`Locker::with_lock`] does.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use lock_core::{LockError, Locker};
    ///
    /// # async fn demo(locker: Locker) -> Result<(), LockError> {
    /// locker
    ///     .lock("report:daily")
    ///     .wait(Duration::ZERO) // another instance runs it: skip
    ///     .with_lock(|_fence| async { Ok::<_, LockError>(()) })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Locker::with_lock`].
    pub async fn with_lock<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        run(self.await?, body).await
    }
}

/// Runs `body` under `guard` with the macro's runner: abort on loss, release afterwards,
/// release in the background when the future is dropped or the body panics (the guard's
/// drop).
async fn run<T, E, F, Fut>(guard: LockGuard, body: F) -> Result<T, E>
where
    F: FnOnce(Fence) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    let fence = guard.fence();
    __private::run(guard, OnLost::Abort, body(fence)).await
}
