//! [`LocalLocks`]: the one owner of a held lock's life in this process. It registers a lock
//! Redis granted (the key's slot names it as holder; the watchdog renews it), hands out nested
//! guards to its owner (reentry) and takes them back (leaving), unregisters it when the
//! outermost guard goes, and settles its slot after the Redis release.
//!
//! Reentry and leaving both run under the slot's holder lock, so a nested acquire can never
//! join a lock whose outermost guard is leaving.

use std::sync::{Arc, Weak};

use crate::error::LockError;
use crate::held::{HeldLock, LeaseMode};
use crate::owner::Owner;
use crate::slot::{SlotRef, Slots};
use crate::watchdog::Watchdog;

/// The locks this locker holds or waits for in this process.
#[derive(Debug)]
pub(crate) struct LocalLocks {
    slots: Slots<HeldLock>,
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
            watchdog,
        }
    }

    /// The slot of `key`, created if needed.
    pub(crate) fn slot(&self, key: &str) -> SlotRef<HeldLock> {
        self.slots.get(key)
    }

    /// Number of keys with local state: held, or waited for.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
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
        Leave::Outermost
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
