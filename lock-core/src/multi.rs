//! [`AcquireAll`] and [`MultiLockGuard`]: several keys locked all or nothing, as one guard.
//!
//! The keys are sorted (duplicates removed). The first try asks for every key at once, without
//! waiting (pipelined on the multiplexed connection: one round trip, one per node in parallel
//! in a Cluster); that is safe in any order since nobody waits while holding part of the set.
//! If any key is busy (or that try failed in a way that may pass, such as a dropped connection,
//! while time is left), the keys that try took go back, and the keys are then taken one after
//! the other in the sorted order, waiting for each: two callers naming the same keys in
//! different orders cannot deadlock, since whoever holds the first key of the order is the
//! only one that may wait for the second. With no time left (a zero wait), a key that answered
//! busy is the answer, also when another key's try failed in a way that may pass. Each key is
//! an ordinary lock (the watchdog renews it, its waiters are woken by its release, it has its
//! own fencing token); a failure on any key gives back the keys already taken before the error
//! is returned, so no key stays behind. In a Cluster each key lives in its own slot, so a
//! script cannot take them at once there; the order makes waiting safe.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use tokio::time::Instant;

use crate::error::LockError;
use crate::fence::Fence;
use crate::guard::LockGuard;
use crate::key;
use crate::limits;
use crate::locker::Locker;
use crate::with_lock::OnLost;

/// An acquisition of several locks at once, configured like [`Acquire`](crate::Acquire) and
/// started by `.await`. Created by [`Locker::lock_all`].
///
/// `wait` bounds the whole acquisition, not each key; `lease` and `max_hold` apply to every
/// key.
///
/// # Errors
///
/// [`LockError::NoKeys`] for an empty list, [`LockError::InvalidKey`] (for any key, before
/// Redis is asked), and the errors of [`Acquire`](crate::Acquire) for the key that failed.
///
/// # Cancel safety
///
/// Dropping the future releases the keys taken so far in the background, and abandons the
/// key being taken as a cancelled [`Acquire`](crate::Acquire) does.
#[derive(Debug)]
#[must_use = "an acquire does nothing until it is `.await`ed"]
pub struct AcquireAll {
    locker: Locker,
    keys: Vec<String>,
    wait: Option<Duration>,
    lease: Option<Duration>,
    max_hold: Option<Duration>,
    /// What [`with_lock`](Self::with_lock) does on a loss.
    on_lost: OnLost,
    /// Started by [`skip_if_busy`](Self::skip_if_busy): each key's busy answer is counted as
    /// a skip.
    skip: bool,
}

impl AcquireAll {
    pub(crate) fn new(locker: Locker, keys: Vec<String>) -> Self {
        Self {
            locker,
            keys,
            wait: None,
            lease: None,
            max_hold: None,
            on_lost: OnLost::Abort,
            skip: false,
        }
    }

    /// The longest time to wait for all the keys together; `Duration::ZERO` tries each key
    /// once, and a wait beyond 100 years has no deadline. Default: the locker's
    /// `default_wait`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// A fixed lease for every key, from 1 ms to 365 days (see
    /// [`Acquire::lease`](crate::Acquire::lease)).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Stop watchdog renewal after the keys have been held this long; beyond 100 years, no
    /// limit (see [`Acquire::max_hold`](crate::Acquire::max_hold)).
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = Some(max);
        self
    }

    /// What [`with_lock`](Self::with_lock) does when any of the locks is lost while its body
    /// runs. Default: [`OnLost::Abort`]. A plain `.await` ignores it.
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    pub(crate) fn on_lost_policy(&self) -> OnLost {
        self.on_lost
    }

    /// As [`Acquire::skipping`](crate::Acquire): a zero wait unless one was set, and busy keys
    /// counted as skips.
    pub(crate) fn skipping(mut self) -> Self {
        self.wait.get_or_insert(Duration::ZERO);
        self.skip = true;
        self
    }

    pub(crate) fn locker(&self) -> &Locker {
        &self.locker
    }

    async fn run(mut self) -> Result<MultiLockGuard, LockError> {
        let started = Instant::now();
        if self.keys.is_empty() {
            return Err(LockError::NoKeys);
        }
        for key in &self.keys {
            key::validate(key)?;
        }
        let mut keys = std::mem::take(&mut self.keys);
        // One order for every caller: no two of them can each hold a key the other waits for.
        keys.sort_unstable();
        keys.dedup();
        let wait = self.wait.unwrap_or(self.locker.inner.settings.default_wait);
        // Beyond a century, no deadline, as for one key.
        let deadline = limits::wait(wait).and_then(|wait| started.checked_add(wait));
        if keys.len() > 1 {
            // First every key at once, without waiting: on the multiplexed connection that is
            // one round trip (one per node in a Cluster, in parallel). Safe whatever the order,
            // since nobody waits while holding part of the set; on contention the part taken
            // goes back and the ordered way below takes over.
            let tries = join_all(keys.iter().map(|k| self.one(k.clone(), Duration::ZERO))).await;
            if tries.iter().all(Result::is_ok) {
                let guards = tries.into_iter().filter_map(Result::ok).collect::<Vec<_>>();
                tracing::debug!(keys = guards.len(), "locks acquired at once");
                return Ok(MultiLockGuard { guards });
            }
            let mut taken = Vec::new();
            let mut busy = None;
            let mut failed = None;
            for result in tries {
                match result {
                    Ok(guard) => taken.push(guard),
                    Err(error @ LockError::Busy { .. }) => {
                        busy.get_or_insert(error);
                    }
                    Err(error) => {
                        failed.get_or_insert(error);
                    }
                }
            }
            release_all(taken).await;
            let time_left = !wait.is_zero() && deadline.is_none_or(|d| Instant::now() < d);
            match (failed, busy) {
                // Bad input or a state a retry cannot change (a key of another type, too few
                // replicas): the caller must hear it, whatever the other keys said.
                (Some(error), _) if !is_transient(&error) => return Err(error),
                // Redis unreachable or slow for a moment (longer than the first try's command
                // timeout): with time left, the ordered way below retries like contention.
                (Some(error), _) if time_left => {
                    tracing::debug!(%error, "first try of every key failed; taking them in order");
                }
                // No time left: a key that answered busy is the answer (the set is taken,
                // whatever a failure that may pass says of another key).
                (Some(_), Some(busy)) => return Err(waited_since(busy, started)),
                (Some(error), None) => return Err(error),
                // A zero wait had its one try.
                (None, Some(busy)) if wait.is_zero() => return Err(waited_since(busy, started)),
                (None, _) => {}
            }
        }
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            match self.one(key, left).await {
                Ok(guard) => guards.push(guard),
                Err(error) => {
                    // All or nothing: the keys taken so far go back before the caller hears.
                    release_all(guards).await;
                    return Err(waited_since(error, started));
                }
            }
        }
        tracing::debug!(keys = guards.len(), waited = ?started.elapsed(), "locks acquired");
        Ok(MultiLockGuard { guards })
    }

    /// The acquire of one of the keys.
    fn one(&self, key: String, wait: Duration) -> crate::AcquireFuture {
        let mut acquire = self.locker.lock(key).wait(wait);
        if let Some(lease) = self.lease {
            acquire = acquire.lease(lease);
        }
        if let Some(max) = self.max_hold {
            acquire = acquire.max_hold(max);
        }
        if self.skip {
            acquire = acquire.skipping();
        }
        acquire.into_future()
    }
}

/// Whether `error` is a backend failure that may pass (a dropped or refused connection, a
/// timeout, a failover), not one a retry would meet again.
fn is_transient(error: &LockError) -> bool {
    matches!(error, LockError::Backend { source, .. } if source.is_transient())
}

/// A key's `Busy` says how long the whole acquisition waited.
fn waited_since(error: LockError, started: Instant) -> LockError {
    match error {
        LockError::Busy {
            key,
            holder_ttl,
            holder,
            ..
        } => LockError::Busy {
            key,
            waited: started.elapsed(),
            holder_ttl,
            holder,
        },
        other => other,
    }
}

impl IntoFuture for AcquireAll {
    type Output = Result<MultiLockGuard, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// Releases every guard at once; the errors were logged where they matter (a lost lock when
/// it was marked lost), and the keys expire with their leases otherwise.
async fn release_all(guards: Vec<LockGuard>) -> Vec<Result<(), LockError>> {
    join_all(guards.into_iter().map(LockGuard::release)).await
}

/// Several held locks, taken together by [`Locker::lock_all`] and given back together.
///
/// Every key is an ordinary lock underneath (renewed by the watchdog, with its own fencing
/// token); the guard is held while all of them are, and [`lost`](Self::lost) resolves when
/// any of them is lost. Dropping it releases every key in the background.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
/// // A transfer locks both accounts, whatever order the caller names them in.
/// let both = locker.lock_all(["account:7", "account:3"]).wait(Duration::from_secs(3)).await?;
/// let from = both.fencing_token("account:7").await?;
/// let to = both.fencing_token("account:3").await?;
/// // ... debit 7 with `from`, credit 3 with `to` ...
/// both.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "if unused the locks are released at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MultiLockGuard {
    /// In lock order (sorted by key).
    guards: Vec<LockGuard>,
}

impl MultiLockGuard {
    /// The keys, in the order they were locked (sorted, without duplicates).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::key)
    }

    /// The guard of one of the keys.
    pub fn guard(&self, key: &str) -> Option<&LockGuard> {
        self.guards.iter().find(|g| g.key() == key)
    }

    /// The guards of every key, in lock order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The fencing token of `key` (see [`LockGuard::fencing_token`]).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a key this guard does not hold, and the errors of
    /// [`LockGuard::fencing_token`].
    pub async fn fencing_token(&self, key: &str) -> Result<u64, LockError> {
        match self.guard(key) {
            Some(guard) => guard.fencing_token().await,
            None => Err(LockError::InvalidKey {
                key: key.chars().take(64).collect(),
                reason: crate::error::InvalidKeyReason::NotHeld,
            }),
        }
    }

    /// The [`Fence`] of every key, in lock order.
    pub fn fences(&self) -> Vec<Fence> {
        self.guards.iter().map(LockGuard::fence).collect()
    }

    /// Whether every key is still held as far as this process knows (no Redis round trip).
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// How long every key is certainly still held without a further renewal.
    pub fn remaining(&self) -> Duration {
        self.guards
            .iter()
            .map(LockGuard::remaining)
            .min()
            .unwrap_or_default()
    }

    /// Resolves when any of the keys is lost.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        select_all(self.guards.iter().map(|g| Box::pin(g.lost()))).await;
    }

    /// The first key found lost, if any.
    pub fn lost_key(&self) -> Option<&str> {
        self.guards
            .iter()
            .find(|g| !g.is_held())
            .map(LockGuard::key)
    }

    /// The error that reports the loss of the first key found lost (of the first key when
    /// none is, which the caller does not ask for).
    pub(crate) fn lost_error(&self) -> LockError {
        let lost = self.guards.iter().find(|g| !g.is_held());
        match lost.or_else(|| self.guards.first()) {
            Some(guard) => guard.lost_error(),
            None => LockError::NoKeys,
        }
    }

    /// Sets every key's remaining lease to `by` from now, from 1 ms to 365 days (see
    /// [`LockGuard::extend`]).
    ///
    /// # Errors
    ///
    /// The first error of any key's extension (every key is tried).
    pub async fn extend(&self, by: Duration) -> Result<(), LockError> {
        join_all(self.guards.iter().map(|g| g.extend(by)))
            .await
            .into_iter()
            .collect()
    }

    /// Releases every key at once.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before Redis answered, each key's release is finished in the
    /// background, as when the guard is dropped.
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] when any key had been lost before the release (the others are
    /// released all the same), else the first [`LockError::Backend`].
    pub async fn release(self) -> Result<(), LockError> {
        Self::first_error(release_all(self.guards).await)
    }

    /// [`release`](Self::release) for `with_lock` (see `LockGuard::release_section`).
    pub(crate) async fn release_section(self) -> Result<(), LockError> {
        Self::first_error(join_all(self.guards.into_iter().map(LockGuard::release_section)).await)
    }

    /// The answer of a release of every key: a loss first, else the first error.
    fn first_error(results: Vec<Result<(), LockError>>) -> Result<(), LockError> {
        let mut first = None;
        for result in results {
            match result {
                Err(lost @ LockError::Lost { .. }) => return Err(lost),
                Err(other) => {
                    first.get_or_insert(other);
                }
                Ok(()) => {}
            }
        }
        first.map_or(Ok(()), Err)
    }
}
