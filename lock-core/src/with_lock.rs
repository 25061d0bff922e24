//! [`Locker::with_lock`], [`Acquire::with_lock`] and [`AcquireAll::with_lock`]: run a
//! closure's future under a lock, the closure form of `#[distributed_lock]` (whose generated
//! code calls them), and [`OnLost`], what they do when the lock is lost meanwhile.

use std::future::Future;

use crate::{Acquire, AcquireAll, Fence, LockError, LockGuard, Locker, MultiLockGuard};

/// What [`with_lock`](Acquire::with_lock) does when the lock is lost while its body runs
/// (the watchdog's renewal found another owner or no key, or renewals failed until the lease
/// ran out). Set with [`Acquire::on_lost`] or [`AcquireAll::on_lost`]; the macro's
/// `on_lost = ".."` option. It does not apply to a plain `.await` of the acquire, whose guard
/// reports the loss through [`LockGuard::lost`].
///
/// Abort is the default because the lock exists for correctness: once another holder may
/// have come in, every further write of the body is a write without mutual exclusion.
/// Neither mode stops a write already in flight: pass the fencing token to the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnLost {
    /// Drop the body's future at its next `.await` and return [`LockError::Lost`] converted
    /// into the body's error type: code after that `.await` never runs without the lock.
    #[default]
    Abort,
    /// Let the body finish and return its result; a warning is logged. For bodies that are
    /// safe to finish anyway (idempotent work, writes guarded by a fencing token).
    Continue,
}

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
    ///   [`LockError::Lost`] converted into `E` ([`OnLost::Abort`], the default; choose
    ///   [`OnLost::Continue`] with [`Acquire::on_lost`]): code after that `.await` never runs
    ///   without the lock. Partial effects before it stay, so pass the fencing token to the
    ///   store you write to.
    /// - **Release** on every path: after the body returns (a failed release is logged, the
    ///   body's result stands: the key expires with its lease), and if the body panics or the
    ///   returned future is dropped, the guard's drop releases in the background.
    ///
    /// Use [`Acquire::with_lock`] for another wait, a fixed lease or another [`OnLost`].
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
    /// [`Locker::lock`] for the acquire, [`LockError::Lost`] when the lock was lost meanwhile
    /// (also when only the release found it lost after `body` returned `Ok`: its output is
    /// dropped then, since another holder may have been inside beside it; not when the loss
    /// was the lock's clock alone and the release found the key still holding its token).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits gives up the wait as a dropped [`Acquire`] does;
    /// dropping it while the body runs drops the body and releases in the background.
    pub async fn with_lock<T, E, F, Fut>(&self, key: impl Into<String>, body: F) -> Result<T, E>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        self.lock(key).with_lock(body).await
    }
}

impl Acquire {
    /// Acquires with these options, then runs `body` under the lock as
    /// [`Locker::with_lock`] does, acting on a loss as [`on_lost`](Self::on_lost) says.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use lock_core::{LockError, Locker, OnLost};
    ///
    /// # async fn demo(locker: Locker) -> Result<(), LockError> {
    /// locker
    ///     .lock("report:daily")
    ///     .wait(Duration::ZERO) // another instance runs it: skip
    ///     .on_lost(OnLost::Continue) // idempotent: finish even if the lock is lost
    ///     .with_lock(|_fence| async { Ok::<_, LockError>(()) })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Locker::with_lock`]; no [`LockError::Lost`] for a loss with [`OnLost::Continue`].
    ///
    /// # Cancel safety
    ///
    /// As [`Locker::with_lock`].
    pub async fn with_lock<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        let on_lost = self.on_lost_policy();
        let locker = self.locker().clone();
        // A foreign value's error names the full Redis key: the locker's prefix is known here.
        let guard = self
            .await
            .map_err(|e| E::from(e.in_locker(locker.prefix())))?;
        let fence = guard.fence();
        run(guard, on_lost, body(fence)).await
    }
}

impl AcquireAll {
    /// Acquires, then runs `body` under all the locks as [`Locker::with_lock`] does, acting
    /// on the loss of any key as [`on_lost`](Self::on_lost) says; `body` gets the [`Fence`]
    /// of every key, in lock order (sorted, without duplicates).
    ///
    /// # Errors
    ///
    /// What `body` returns, or a [`LockError`] converted into `E` (the acquire's errors,
    /// [`LockError::Lost`] when any key was lost meanwhile with [`OnLost::Abort`]).
    ///
    /// # Cancel safety
    ///
    /// As [`Locker::with_lock`].
    pub async fn with_lock<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce(Vec<Fence>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<LockError>,
    {
        let on_lost = self.on_lost_policy();
        let locker = self.locker().clone();
        let guard = self
            .await
            .map_err(|e| E::from(e.in_locker(locker.prefix())))?;
        let fences = guard.fences();
        run(guard, on_lost, body(fences)).await
    }
}

/// What the runner needs of a guard: one lock or several.
pub(crate) trait Section: Send + Sync + Sized {
    /// Resolves when the lock (any of the locks) is lost.
    fn lost(&self) -> impl Future<Output = ()> + Send + '_;
    /// The error that reports the loss.
    fn lost_error(&self) -> LockError;
    /// Releases the lock(s).
    fn release(self) -> impl Future<Output = Result<(), LockError>> + Send;
}

impl Section for LockGuard {
    fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        Self::lost(self)
    }

    fn lost_error(&self) -> LockError {
        Self::lost_error(self)
    }

    fn release(self) -> impl Future<Output = Result<(), LockError>> + Send {
        Self::release_section(self)
    }
}

impl Section for MultiLockGuard {
    fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        Self::lost(self)
    }

    fn lost_error(&self) -> LockError {
        Self::lost_error(self)
    }

    fn release(self) -> impl Future<Output = Result<(), LockError>> + Send {
        Self::release_section(self)
    }
}

/// Runs the body under the guard, then releases the lock. A failed release is logged, not
/// returned: the body's result stands (the key expires with its lease). A panic or a dropped
/// future leaves the release to the guard's drop.
pub(crate) async fn run<G, T, E, F>(guard: G, on_lost: OnLost, body: F) -> Result<T, E>
where
    G: Section,
    F: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    // The loss is polled first: when it and the body's next step are ready together, the
    // step must not run without the lock.
    let result = match on_lost {
        OnLost::Continue => {
            let mut body = std::pin::pin!(body);
            tokio::select! {
                biased;
                () = guard.lost() => {
                    tracing::warn!(error = %guard.lost_error(), "lock lost while the locked code runs; on_lost continue lets it finish");
                    body.await
                }
                result = body.as_mut() => result,
            }
        }
        OnLost::Abort => {
            tokio::select! {
                biased;
                () = guard.lost() => Err(E::from(guard.lost_error())),
                result = body => result,
            }
        }
    };
    match guard.release().await {
        // The release proved the lock was lost while the body ran: another holder may have
        // been inside, so the body's success does not stand as a section under the lock.
        Err(error @ LockError::Lost { .. }) if result.is_ok() && on_lost == OnLost::Abort => {
            Err(E::from(error))
        }
        Err(error) => {
            tracing::warn!(%error, "lock release after the locked code failed");
            result
        }
        Ok(()) => result,
    }
}
