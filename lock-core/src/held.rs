//! The shared state of one held lock: its token, fencing token, nesting count, validity
//! clock and lost signal. Every nested [`LockGuard`](crate::LockGuard) of one acquisition
//! points at the same `Held`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::key::RedisKeys;
use crate::reentrancy::{Owner, SlotRef};

/// How a held lock's lease is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseMode {
    /// Renewed by the watchdog with this lease until released (or until `max_hold`).
    Watchdog { lease: Duration },
    /// A fixed lease, never renewed.
    Fixed,
}

#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) id: u64,
    pub(crate) key: String,
    pub(crate) keys: RedisKeys,
    pub(crate) token: String,
    pub(crate) fence: u64,
    pub(crate) owner: Owner,
    pub(crate) mode: LeaseMode,
    pub(crate) acquired_at: Instant,
    pub(crate) max_hold: Option<Duration>,
    /// Nested guards alive (1 for a plain acquisition).
    pub(crate) depth: AtomicUsize,
    /// Until when the lock is certainly ours, on the monotonic clock, with a safety margin.
    validity: Mutex<Validity>,
    /// A guard of this lock was used by a task other than `owner`: the lock is no longer
    /// reentrant for `owner` (it may have been handed to that task, which may still be inside).
    escaped: AtomicBool,
    lost: CancellationToken,
    /// The local queue permit, returned after the Redis release completed.
    pub(crate) permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// Keeps the key's slot registered while the lock lives.
    pub(crate) slot: SlotRef,
}

/// The validity clock of a held lock.
#[derive(Debug, Clone, Copy)]
struct Validity {
    until: Instant,
    /// When the last explicit extension was sent: renewals sent before it may land after it
    /// and must not undo a shortening.
    extended_at: Option<Instant>,
}

/// Part of a lease treated as unsafe: clock drift between client and server, plus scheduling.
pub(crate) fn safety_margin(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(1)
}

impl Held {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        key: String,
        keys: RedisKeys,
        token: String,
        fence: u64,
        owner: Owner,
        mode: LeaseMode,
        lease: Duration,
        sent_at: Instant,
        max_hold: Option<Duration>,
        permit: OwnedSemaphorePermit,
        slot: SlotRef,
    ) -> Self {
        Self {
            id,
            key,
            keys,
            token,
            fence,
            owner,
            mode,
            acquired_at: sent_at,
            max_hold,
            depth: AtomicUsize::new(1),
            validity: Mutex::new(Validity {
                until: sent_at + lease.saturating_sub(safety_margin(lease)),
                extended_at: None,
            }),
            escaped: AtomicBool::new(false),
            lost: CancellationToken::new(),
            permit: Mutex::new(Some(permit)),
            slot,
        }
    }

    fn validity(&self) -> std::sync::MutexGuard<'_, Validity> {
        self.validity.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.validity().until
    }

    /// Records a renewal: Redis accepted `lease` for a command sent at `sent_at`. Validity only
    /// grows here (an older renewal answering late must not shorten it), and a renewal sent
    /// before the last extension is ignored: it may have run before that extension in Redis
    /// and been overwritten by it.
    pub(crate) fn confirm(&self, sent_at: Instant, lease: Duration) {
        let mut validity = self.validity();
        if validity.extended_at.is_some_and(|at| sent_at < at) {
            return;
        }
        let new = sent_at + lease.saturating_sub(safety_margin(lease));
        if new > validity.until {
            validity.until = new;
        }
    }

    /// Records an explicit extension: the validity becomes `sent_at + by`, shorter or longer,
    /// unless a later extension was recorded already.
    pub(crate) fn confirm_extension(&self, sent_at: Instant, by: Duration) {
        let mut validity = self.validity();
        if validity.extended_at.is_some_and(|at| sent_at < at) {
            return;
        }
        validity.until = sent_at + by.saturating_sub(safety_margin(by));
        validity.extended_at = Some(sent_at);
    }

    /// Notes that a guard of this lock is used in the current task; when that is not the
    /// owner, the lock stops being reentrant for the owner (once, with a warning).
    pub(crate) fn touched(&self) {
        if self.escaped.load(Ordering::Relaxed) || Owner::current() == self.owner {
            return;
        }
        if !self.escaped.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                key = %self.key,
                "lock guard used by a task other than the one that acquired it; the lock is no \
                 longer reentrant for the acquiring task (it waits for this guard like any task)"
            );
        }
    }

    /// Whether a nested acquire by `owner` may share this lock.
    pub(crate) fn reentrant_for(&self, owner: Owner) -> bool {
        self.owner == owner && !self.escaped.load(Ordering::Acquire)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || Instant::now() >= self.valid_until()
    }

    /// Marks the lock lost (once) and logs why. The local queue place is given back at once:
    /// Redis no longer holds the lock for us, so other tasks of this process may contend for it
    /// there while this guard lives on (a hung holder past `max_hold`, a holder that has not
    /// noticed yet).
    pub(crate) fn mark_lost(&self, why: &'static str) {
        if !self.lost.is_cancelled() {
            tracing::warn!(key = %self.key, fence = self.fence, reason = why, "lock lost");
            self.lost.cancel();
            drop(self.take_permit());
        }
    }

    /// Resolves when the lock is lost: marked so, or its confirmed validity ran out.
    pub(crate) async fn lost(&self) {
        loop {
            let until = self.valid_until();
            tokio::select! {
                _ = self.lost.cancelled() => return,
                _ = tokio::time::sleep_until(until) => {
                    if Instant::now() >= self.valid_until() {
                        self.mark_lost("lease ran out before it was renewed");
                        return;
                    }
                }
            }
        }
    }

    /// Whether the watchdog should renew it now.
    pub(crate) fn wants_renewal(&self, now: Instant) -> Option<Duration> {
        match self.mode {
            LeaseMode::Watchdog { lease } if !self.lost.is_cancelled() => match self.max_hold {
                Some(max) if now >= self.acquired_at + max => None,
                _ => Some(lease),
            },
            _ => None,
        }
    }

    pub(crate) fn take_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.permit
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    pub(crate) fn depth(&self) -> usize {
        self.depth.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reentrancy::Registry;

    fn held(registry: &Registry, lease: Duration, sent_at: Instant) -> Held {
        let slot = registry.slot("k");
        let permit = slot.queue.clone().try_acquire_owned().unwrap();
        Held::new(
            1,
            "k".into(),
            RedisKeys::new("p:", "k"),
            "t".into(),
            1,
            Owner::current(),
            LeaseMode::Watchdog { lease },
            lease,
            sent_at,
            None,
            permit,
            slot,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_sent_before_a_shortening_extension_does_not_undo_it() {
        let registry = Registry::default();
        let lease = Duration::from_secs(30);
        let t0 = Instant::now();
        let held = held(&registry, lease, t0);
        // The watchdog sends a renewal at t0 + 1 s; the user shortens the lease to 2 s at
        // t0 + 2 s; the extension's answer arrives first, the renewal's answer after it.
        let renewal_sent = t0 + Duration::from_secs(1);
        let extension_sent = t0 + Duration::from_secs(2);
        held.confirm_extension(extension_sent, Duration::from_secs(2));
        held.confirm(renewal_sent, lease);
        let until = held.valid_until();
        assert!(
            until <= extension_sent + Duration::from_secs(2),
            "{until:?}"
        );
        // A renewal sent after the extension counts again.
        held.confirm(extension_sent + Duration::from_millis(1), lease);
        assert!(held.valid_until() > extension_sent + Duration::from_secs(20));
        // An older extension answering late does not undo a newer one.
        held.confirm_extension(renewal_sent, Duration::from_millis(10));
        assert!(held.valid_until() > extension_sent + Duration::from_secs(20));
    }

    #[tokio::test]
    async fn a_lost_lock_gives_back_its_local_place() {
        let registry = Registry::default();
        let held = held(&registry, Duration::from_secs(30), Instant::now());
        assert_eq!(held.slot.queue.available_permits(), 0);
        held.mark_lost("test");
        assert_eq!(held.slot.queue.available_permits(), 1);
        assert!(held.take_permit().is_none());
    }
}
