//! The shared state of one held lock: its token, fencing token, nesting count, validity
//! clock and lost signal. Every nested [`LockGuard`](crate::LockGuard) of one acquisition
//! points at the same `Held`.

use std::sync::atomic::{AtomicUsize, Ordering};
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
    valid_until: Mutex<Instant>,
    lost: CancellationToken,
    /// The local queue permit, returned after the Redis release completed.
    pub(crate) permit: Mutex<Option<OwnedSemaphorePermit>>,
    /// Keeps the key's slot registered while the lock lives.
    pub(crate) slot: SlotRef,
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
            valid_until: Mutex::new(sent_at + lease.saturating_sub(safety_margin(lease))),
            lost: CancellationToken::new(),
            permit: Mutex::new(Some(permit)),
            slot,
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a renewal: Redis accepted `lease` for a command sent at `sent_at`. Validity only
    /// grows here (an older renewal answering late must not shorten it).
    pub(crate) fn confirm(&self, sent_at: Instant, lease: Duration) {
        let mut until = self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let new = sent_at + lease.saturating_sub(safety_margin(lease));
        if new > *until {
            *until = new;
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || Instant::now() >= self.valid_until()
    }

    /// Marks the lock lost (once) and logs why.
    pub(crate) fn mark_lost(&self, why: &'static str) {
        if !self.lost.is_cancelled() {
            tracing::warn!(key = %self.key, fence = self.fence, reason = why, "lock lost");
            self.lost.cancel();
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

impl Held {
    /// Records an explicit extension: the validity becomes `sent_at + by`, shorter or longer.
    pub(crate) fn confirm_extension(&self, sent_at: Instant, by: Duration) {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) =
            sent_at + by.saturating_sub(safety_margin(by));
    }
}
