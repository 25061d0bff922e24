//! [`Semaphore`]: at most N holders of a name across every process, with expiring permits.

use crate::acquire::Acquire;
use crate::kind::Kind;
use crate::locker::Locker;

/// A distributed semaphore with expiring permits: at most `permits` permits of one name are
/// held at once across every instance. Created by [`Locker::semaphore`]; cheap to clone.
///
/// Each holder's permits have a lease like a lock: the watchdog renews them while the guard
/// lives (or a fixed [`lease`](Acquire::lease) ends them), so a crashed holder's permits come
/// back when its lease ends, never leaked. The guard is a [`LockGuard`](crate::LockGuard)
/// (`release`, `lost`, `extend`, drop releases in the background); semaphores have no fencing
/// token ([`LockError::NotExclusive`](crate::LockError::NotExclusive)). ReleaseMessages sleep until a
/// release message (or the first held lease's end), they do not poll; within a process they
/// line up first come, first served, and only as many as the semaphore has permits ask Redis
/// at a time, one of them waiting there. A released permit goes to the first waiting task of
/// the same process (the one waiting in Redis, if one does) without a Redis round trip, also
/// while waiters of other processes are in line in Redis: up to 6 such local handoffs in a
/// row may pass a remote waiter that is first in line; then a release goes through Redis,
/// whose message names the first in line, and the permit is kept for it. Across processes the
/// waiters in Redis line up in arrival order, and
/// permits freed in Redis are kept for the first in line (one that gives up leaves the line at
/// once; one whose process is cut off stops counting after three fallback retries without a
/// try, 3 s by default). A zero [`wait`](Acquire::wait) does not line up: it asks Redis once,
/// whatever the other tasks of the process are doing, and is admitted when enough permits are
/// free and nobody is in line.
///
/// The count travels with each acquire instead of living in Redis, so changing it is a
/// deploy, not a migration: each acquire is granted when the permits held (by everyone, of
/// whatever count they asked under) plus its own fit in its own count. During a rolling
/// change each caller admits up to its own count; lowering it revokes no held permit (new
/// holders wait until fewer than the new count are held), raising it admits more at once.
/// Permits are not reentrant: a task that asks twice holds two.
///
/// Needs Redis 7.0 or later: the set's expiry follows its longest lease with
/// `PEXPIRE .. GT` (`scripts/permit_acquire.lua`, `scripts/permit_renew.lua`).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
/// // At most 3 exports per tenant at a time, across every instance.
/// let exports = locker.semaphore("exports:tenant-42", 3);
/// let permit = exports.acquire().wait(Duration::from_secs(10)).await?;
/// // ... run the export ...
/// permit.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    locker: Locker,
    key: String,
    permits: u32,
}

impl Semaphore {
    pub(crate) fn new(locker: Locker, key: String, permits: u32) -> Self {
        Self {
            locker,
            key,
            permits,
        }
    }

    /// The semaphore's name.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How many permits the semaphore has, as this handle counts them.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Starts taking one permit; configure it like any [`Acquire`] (`wait`, `lease`,
    /// `max_hold`) and `.await` it.
    ///
    /// # Errors
    ///
    /// As [`Acquire`]: [`LockError::Busy`](crate::LockError::Busy) when no permit came free
    /// within the wait; [`ConfigError::Permits`](crate::ConfigError::Permits) for a semaphore
    /// of 0 permits.
    pub fn acquire(&self) -> Acquire {
        self.acquire_many(1)
    }

    /// Starts taking `permits` permits at once (all or none; at least 1, at most all of
    /// them). Requests are served first come, first served, whatever their size: a large
    /// request waits until that many are free at once, and smaller ones that arrived after it
    /// wait behind it even when they would fit (in this process in the local queue, across
    /// processes in the line in Redis), so a large request is not starved by small ones.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); [`ConfigError::Permits`](crate::ConfigError::Permits)
    /// for 0 or more than the semaphore has.
    pub fn acquire_many(&self, permits: u32) -> Acquire {
        Acquire::new(
            self.locker.clone(),
            self.key.clone(),
            Kind::Permits {
                limit: self.permits,
            },
        )
        .permits(permits)
    }
}
