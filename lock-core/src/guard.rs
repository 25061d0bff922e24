//! [`LockGuard`]: proof of holding a lock, and the way to give it back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{DurationSetting, LockError, LostReason};
use crate::fence::Fence;
use crate::held::Hold;
use crate::limits;
use crate::local::{Leave, LocalLocks};
use crate::watch::LockWatch;

/// A held lock. Release it with [`release`](Self::release); dropping it releases in the
/// background.
///
/// A guard of a reentrant (nested) acquire shares the lock with the outer guard: releasing it
/// only decrements the nesting depth, and the Redis key is released with the outermost guard.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
/// let guard = locker.lock("inventory:42").await?;
/// let token = guard.fencing_token().await?; // pass it to the database with the write
/// tokio::select! {
///     _ = guard.lost() => { /* stop: someone else may hold it now */ }
///     _ = async { /* the critical section */ } => {}
/// }
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "if unused the lock is released at once"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    /// The owner of the lock's life: leaving, finishing, renewals.
    local: Arc<LocalLocks>,
    held: Arc<Hold>,
    released: bool,
    /// Used by a task other than the lock's owner (counted in the hold until it leaves).
    escaped: AtomicBool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.held.key())
            .field("fencing_token", &self.held.fence())
            .field("depth", &self.held.depth())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    pub(crate) fn new(local: Arc<LocalLocks>, held: Arc<Hold>) -> Self {
        Self {
            local,
            held,
            released: false,
            escaped: AtomicBool::new(false),
        }
    }

    /// Notes the use of this guard in the current task (see [`Hold::touched`]).
    fn touched(&self) {
        self.held.touched(&self.escaped);
    }

    /// Leaves the lock (a nested guard's depth, or the outermost guard), and stops counting as
    /// escaped.
    fn leave(&self) -> Leave {
        let left = self.local.leave(&self.held);
        if self.escaped.load(Ordering::Acquire) {
            self.held.escaped_guard_left();
        }
        left
    }

    /// The user's key.
    pub fn key(&self) -> &str {
        self.touched();
        self.held.key()
    }

    /// Whether this lock is held together with others: a read lock
    /// ([`Locker::read`](crate::Locker::read)) or semaphore permits
    /// ([`Locker::semaphore`](crate::Locker::semaphore)); `false` for a mutex or write lock
    /// (also for a read nested inside this task's write lock, which shares the write lock).
    pub fn is_shared(&self) -> bool {
        !self.held.kind().is_exclusive()
    }

    /// The fencing token of this acquisition: strictly greater than every token issued before
    /// for the same key. Hand it to the resource you protect and let it reject writes that
    /// carry a smaller token than one it has already seen: that stops a holder that lost its
    /// lock without knowing it. Issued on the first call (one Redis round trip, only while the
    /// lock is still ours); later calls and nested guards share it. An acquire whose token is
    /// never asked for costs no fencing at all.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the lock as it was. Redis may still have issued a token
    /// that nobody receives: the next call asks again and gets a larger one (tokens only need
    /// to increase).
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] when the lock was lost before the token was issued;
    /// [`LockError::Backend`] when Redis fails; [`LockError::NotExclusive`] for a read lock
    /// or semaphore permits.
    pub async fn fencing_token(&self) -> Result<u64, LockError> {
        self.touched();
        self.fence().token().await
    }

    /// A handle to this acquisition's fencing token, for code that does not hold the guard.
    pub fn fence(&self) -> Fence {
        self.touched();
        Fence::new(self.local.clone(), self.held.clone())
    }

    /// A cheap, cloneable handle that tells whether this lock is still held, for code that
    /// does not hold the guard (a task the work is handed to, a handler behind the tower
    /// layer). Unlike a [`Fence`], it never delays a local handoff of the lock.
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
    /// let guard = locker.lock("import:42").await?;
    /// let watch = guard.watch();
    /// let worker = tokio::spawn(async move {
    ///     tokio::select! {
    ///         () = watch.lost() => { /* stop: the lock is gone */ }
    ///         () = async { /* the work */ } => {}
    ///     }
    /// });
    /// # let _ = worker.await;
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn watch(&self) -> LockWatch {
        self.touched();
        LockWatch::new(self.held.clone())
    }

    /// Whether the lock is still ours as far as this process knows: not marked lost, and its
    /// last confirmed lease has not run out. No Redis round trip.
    pub fn is_held(&self) -> bool {
        self.touched();
        !self.held.is_lost()
    }

    /// How long the lock is certainly ours without a further renewal (local estimate, with a
    /// safety margin for clock drift).
    pub fn remaining(&self) -> Duration {
        self.touched();
        // A lock known lost (a renewal found it gone, the shutdown gave it back) has none
        // left, whatever its last confirmed lease said.
        if self.held.is_lost() {
            return Duration::ZERO;
        }
        self.held
            .valid_until()
            .saturating_duration_since(Instant::now())
    }

    /// Resolves when the lock is lost: a renewal found another owner or no key, renewals
    /// failed until the lease ran out, a fixed lease expired, `max_hold` passed, or the
    /// locker was shut down ([`Locker::shutdown`](crate::Locker::shutdown)). Use it in
    /// `tokio::select!` to stop work that must not continue without the lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        self.touched();
        self.held.lost().await;
    }

    /// Why the lock was lost, once it is ([`lost`](Self::lost) resolved, or
    /// [`is_held`](Self::is_held) is `false`); `None` while it is held. For code that waits
    /// on [`lost`](Self::lost) and reports the loss itself:
    /// `LockError::Lost { key: guard.key().to_owned(), reason }`.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.touched();
        if !self.held.is_lost() {
            return None;
        }
        // Marks it lost with the clock's reason if nothing marked it yet.
        match self.held.lost_error() {
            LockError::Lost { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// Sets the lock's remaining lease to `by` from now, if it is still ours. For a watchdog
    /// lock the watchdog takes over again at its next tick; its renewals never shorten a
    /// longer extension (an extension past `max_hold` stands, too).
    ///
    /// # Cancel safety
    ///
    /// Redis may apply the extension even if this future is dropped, or fails, before the
    /// answer: so an extension that shortens the lease counts from when it was sent (the guard
    /// reports the lock lost when that shorter lease ends, unless a later renewal or extension
    /// confirms more), and one that lengthens it counts only once confirmed.
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] when the lock is no longer ours, [`LockError::Config`] for a
    /// duration outside 1 ms to [`MAX_LEASE`](crate::MAX_LEASE), [`LockError::Backend`] when Redis fails.
    pub async fn extend(&self, by: Duration) -> Result<(), LockError> {
        self.touched();
        limits::check_lease(DurationSetting::Extension, by)?;
        if self.held.is_lost() {
            return Err(self.held.lost_error());
        }
        self.local.extend_held(&self.held, by).await
    }

    /// Releases the lock (or, for a nested guard, leaves it to the outer one).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before Redis answered, the release is finished in the
    /// background, as when the guard is dropped.
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] when the lock had been lost before the release (its key, if it
    /// holds someone else's token, is left untouched), with [`LostReason::Shutdown`] when
    /// [`Locker::shutdown`](crate::Locker::shutdown) released it already;
    /// [`LockError::Backend`] when Redis failed, in which case the key expires with its lease.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.touched();
        self.released = true;
        match self.leave() {
            // The outer guard releases the key; a nested guard still reports a lost lock.
            Leave::Nested if self.held.is_lost() => Err(self.held.lost_error()),
            Leave::Nested => Ok(()),
            Leave::Outermost => self.local.finish_cancel_safe(&self.held).await,
            // The shutdown released it already.
            Leave::Finished => Err(self.held.lost_error()),
        }
    }
}

impl LockGuard {
    /// [`release`](Self::release) for `with_lock`: `Ok` also when the lock was lost by its
    /// clock alone and the release found (and deleted) the key still holding its token: no
    /// other holder was inside the section.
    pub(crate) async fn release_section(self) -> Result<(), LockError> {
        let held = self.held.clone();
        match self.release().await {
            Err(LockError::Lost { .. }) if held.was_released_ours() => Ok(()),
            other => other,
        }
    }

    /// Opens the `lock.hold` span of a new acquisition (kept until its release).
    pub(crate) fn set_hold_span(&self, span: tracing::Span) {
        self.held.set_hold_span(span);
    }

    /// The error that reports this lock's loss, with its reason.
    pub(crate) fn lost_error(&self) -> LockError {
        self.held.lost_error()
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.touched();
        if let Leave::Outermost = self.leave() {
            // The same path as `release`, run by the background releaser.
            self.local.finish_in_background(self.held.clone());
        }
    }
}
