//! [`LocalLocks`]: the one owner of a held lock's life in this process. It registers a lock
//! Redis granted (the key's slot names it as holder; the watchdog renews it), hands out nested
//! guards to its owner (reentry) and takes them back (leaving), unregisters it when the
//! outermost guard goes, hands it over to the next local acquirer without a Redis round trip
//! when one is queued, and settles its slot after the Redis release.
//!
//! Reentry and leaving both run under the slot's holder lock, so a nested acquire can never
//! join a lock whose outermost guard is leaving.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::LockError;
use crate::held::{Grant, HeldLock, LeaseMode};
use crate::key::Access;
use crate::metrics::{self, ReleaseOutcome};
use crate::owner::Owner;
use crate::slot::{Baton, SlotRef, Slots};
use crate::store::Store;
use crate::watchdog::Watchdog;

/// Local handoffs in a row before a lock goes back through Redis, so that waiters of other
/// lockers (who cannot be seen from here without a round trip) get their turn.
const MAX_STREAK: u32 = 6;

/// Whether a lock valid until `valid_until` has time enough left to be handed over: the next
/// holder's first renewal comes up to a third of the lease later, plus the pickup.
fn worth_handing_over(valid_until: Instant, lease: Duration) -> bool {
    valid_until >= Instant::now() + lease / 2
}

/// How long a handed-over lock waits for the next local holder (queued, so normally woken at
/// once) before it is released in Redis after all.
const PICKUP: Duration = Duration::from_millis(5);

/// The name of a read-lock slot: the owner and the key (a NUL cannot start a Debug form).
fn reader_slot_name(key: &str, owner: Owner) -> String {
    format!("{owner:?}\0{key}")
}

/// The locks this locker holds or waits for in this process.
#[derive(Debug)]
pub(crate) struct LocalLocks {
    slots: Slots<HeldLock>,
    /// The read locks, one slot per key and task (readers do not queue behind each other).
    readers: Slots<HeldLock>,
    /// The semaphores, one slot per key and permit count, whose queue has that many places.
    semaphores: Slots<HeldLock>,
    watchdog: Arc<Watchdog>,
}

/// What giving up one guard meant for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leave {
    /// An outer guard still holds it.
    Nested,
    /// That was the outermost guard: the lock is unregistered and must now be released in Redis.
    Outermost,
}

impl LocalLocks {
    pub(crate) fn new(watchdog: Arc<Watchdog>) -> Self {
        Self {
            slots: Slots::default(),
            readers: Slots::default(),
            semaphores: Slots::default(),
            watchdog,
        }
    }

    /// The slot of `key`, created if needed.
    pub(crate) fn slot(&self, key: &str) -> SlotRef<HeldLock> {
        self.slots.get(key)
    }

    /// The read-lock slot of `key` for `owner`, created if needed.
    pub(crate) fn reader_slot(&self, key: &str, owner: Owner) -> SlotRef<HeldLock> {
        self.readers.get(&reader_slot_name(key, owner))
    }

    /// The slot of the semaphore `key` of `limit` permits, created if needed. Its queue has
    /// `limit` places; callers that count another limit get a slot of their own (Redis
    /// enforces each caller's count).
    pub(crate) fn semaphore_slot(&self, key: &str, limit: u32) -> SlotRef<HeldLock> {
        self.semaphores
            .get_sized(&format!("{limit}\0{key}"), limit as usize)
    }

    /// The one-place queue of the semaphore `key` of `limit` permits for waiting in Redis:
    /// one task of this process at a time.
    pub(crate) fn semaphore_turn(&self, key: &str, limit: u32) -> SlotRef<HeldLock> {
        self.semaphores.get(&format!("turn\0{limit}\0{key}"))
    }

    /// Whether `owner` holds a read lock of `key`.
    pub(crate) fn reads(&self, key: &str, owner: Owner) -> bool {
        if self.readers.len() == 0 {
            return false;
        }
        self.readers
            .find(&reader_slot_name(key, owner))
            .and_then(|slot| slot.holder().upgrade())
            .is_some_and(|held| held.reentrant_for(owner))
    }

    /// Number of keys with local state: held, or waited for (a read lock counts once per
    /// task).
    pub(crate) fn len(&self) -> usize {
        self.slots.len() + self.readers.len() + self.semaphores.len()
    }

    /// The watchdog's view of the held locks.
    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    /// A reentrant acquire: when `owner` holds the slot's lock, another guard of it, with no
    /// Redis round trip (`Err(Lost)` when that lock is lost); `None` when it must be acquired.
    /// Not once a guard of the lock was seen in another task: it may have been moved there and
    /// be in use (see "Reentrancy" in the crate docs).
    pub(crate) fn reenter(
        &self,
        slot: &SlotRef<HeldLock>,
        owner: Owner,
    ) -> Option<Result<Arc<HeldLock>, LockError>> {
        let holder = slot.holder();
        let held = holder.upgrade().filter(|h| h.reentrant_for(owner))?;
        if held.is_lost() {
            return Some(Err(held.lost_error()));
        }
        held.nest();
        tracing::trace!(depth = held.depth(), "reentrant acquire");
        Some(Ok(held))
    }

    /// Registers a lock Redis granted: its slot names it as the local holder, and a watchdog
    /// lock is renewed from now on.
    pub(crate) fn register(&self, held: HeldLock) -> Arc<HeldLock> {
        let held = Arc::new(held);
        *held.slot().holder() = Arc::downgrade(&held);
        metrics::held(held.keys().access);
        if let LeaseMode::Watchdog(_) = held.mode() {
            self.watchdog.insert(held.clone());
        }
        held
    }

    /// Gives up one guard's share of the lock; with the outermost one the lock stops being
    /// reentrant and renewed.
    pub(crate) fn leave(&self, held: &Arc<HeldLock>) -> Leave {
        let mut holder = held.slot().holder();
        if !held.unnest() {
            return Leave::Nested;
        }
        if std::ptr::eq(holder.as_ptr(), Arc::as_ptr(held)) {
            *holder = Weak::new();
        }
        drop(holder);
        if let LeaseMode::Watchdog(_) = held.mode() {
            self.watchdog.remove(held.id());
        }
        metrics::unheld(held.keys().access);
        Leave::Outermost
    }

    /// Hands a lock whose outermost guard just left to the next local acquirer, without a
    /// Redis round trip: the Redis key keeps its token and the next holder takes it over (a
    /// fencing token it asks for is issued later than this holder's, so it is larger). Returns
    /// whether it did; otherwise the caller releases the lock in Redis.
    ///
    /// Only a watchdog lock with time to spare, a local acquirer queued, a streak under
    /// [`MAX_STREAK`] (then the lock goes back through Redis, where waiters of other lockers
    /// get their turn: the release tells them, and this process holds back its next acquirer
    /// for a moment), and no [`Fence`](crate::Fence) handle of `held`
    /// alive (it could still ask for a token under this Redis token after the next holder
    /// did). A lock nobody picks up within [`PICKUP`] is released in Redis.
    pub(crate) fn hand_over(&self, held: &Arc<HeldLock>, store: &Arc<Store>) -> bool {
        let LeaseMode::Watchdog(lease) = held.mode() else {
            return false;
        };
        if !matches!(
            held.keys().access,
            Access::Exclusive | Access::Permits { .. }
        ) {
            // Readers do not queue behind each other, and a fair lock's next holder is
            // whoever is first in line in Redis.
            return false;
        }
        let slot = held.slot();
        if held.has_fences() || !slot.has_waiters() || held.streak() >= MAX_STREAK {
            return false;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let valid_until = held.valid_until();
        if held.is_lost() || !worth_handing_over(valid_until, lease) {
            return false;
        }
        let id = held.id();
        let left = slot.put_baton(Baton {
            id,
            keys: held.keys().clone(),
            token: held.token().to_owned(),
            valid_until,
            streak: held.streak() + 1,
        });
        if !left {
            return false;
        }
        held.give_back_place();
        metrics::released(
            held.keys().access,
            ReleaseOutcome::HandedOver,
            held.held_for(),
        );
        tracing::trace!(key = %held.key(), "lock handed over locally");
        let slot = slot.clone();
        let store = store.clone();
        runtime.spawn(async move {
            tokio::time::sleep(PICKUP).await;
            if let Some(baton) = slot.reclaim_baton(id) {
                if let Err(error) = store.release(&baton.keys, &baton.token).await {
                    tracing::warn!(%error, "release of a lock nobody took over failed; it expires with its lease");
                }
            }
        });
        true
    }

    /// Takes over the lock the last local holder handed over, if one waits in `slot`: the grant
    /// for a watchdog acquire (`Ok`), or the baton back when it does not fit (a fixed-lease
    /// acquire, or too little validity left), for the caller to release in Redis.
    pub(crate) fn take_over(
        slot: &SlotRef<HeldLock>,
        mode: LeaseMode,
        permits: u32,
    ) -> Option<Result<Grant, Baton>> {
        let baton = slot.take_baton()?;
        let LeaseMode::Watchdog(lease) = mode else {
            return Some(Err(baton));
        };
        if let Access::Permits { .. } = baton.keys.access {
            // A semaphore holder's token names its permits (`<token>:<permits>`): an
            // acquire of another count cannot take it over.
            let count = baton.token.rsplit(':').next();
            if count.and_then(|c| c.parse::<u32>().ok()) != Some(permits) {
                return Some(Err(baton));
            }
        }
        if !worth_handing_over(baton.valid_until, lease) {
            return Some(Err(baton));
        }
        Some(Ok(Grant {
            keys: baton.keys,
            token: baton.token,
            sent_at: Instant::now(),
            handed_over: Some((baton.valid_until, baton.streak)),
        }))
    }

    /// After the Redis release of a left lock: the slot learns whether other lockers wait
    /// (`None`: the release failed, so nobody was told), and the local queue place is given
    /// back to the next local acquirer.
    pub(crate) fn settle(held: &HeldLock, others_waiting: Option<bool>) {
        if let Some(others_waiting) = others_waiting {
            held.slot().released(others_waiting);
        }
        held.give_back_place();
    }
}
