//! Who owns a lock inside this process, and the per-key slots that make locks reentrant and
//! queue local waiters fairly.
//!
//! The owner is the tokio task (by [`tokio::task::try_id`]); code outside any task (the future
//! driven by `block_on`, e.g. the body of `#[tokio::main]`) is owned by its thread, which is
//! where `block_on` keeps polling it. Each key this process is interested in has one [`Slot`]:
//! the guard state of its current holder (for reentrancy) and a FIFO semaphore with one permit
//! (local waiters line up here, so only one task per process contends in Redis for a key and
//! handoffs are first come, first served).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Semaphore;

use crate::held::Held;

/// The identity a lock is reentrant for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Owner {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Owner {
    /// The owner of the code running now.
    pub(crate) fn current() -> Self {
        tokio::task::try_id()
            .map(Self::Task)
            .unwrap_or_else(|| Self::Thread(std::thread::current().id()))
    }
}

type SlotMap = Arc<Mutex<HashMap<String, Arc<Slot>>>>;

/// The per-key state shared by every local acquirer and holder of one key.
#[derive(Debug)]
pub(crate) struct Slot {
    /// One permit: the task holding it is the only local one that holds or contends in Redis.
    pub(crate) queue: Arc<Semaphore>,
    /// The current local holder, for reentrancy.
    pub(crate) holder: Mutex<Option<Arc<Held>>>,
    /// After a release that told waiters of other lockers, the next local acquirer holds back
    /// until then, so those waiters get a fair chance instead of losing every race to a task
    /// that was woken without a network hop.
    pub(crate) yield_until: Mutex<Option<tokio::time::Instant>>,
}

impl Slot {
    /// How long after a release with remote waiters local acquirers hold back.
    pub(crate) const YIELD: std::time::Duration = std::time::Duration::from_millis(1);

    /// Records whether the last release told waiters of other lockers.
    pub(crate) fn released(&self, others_waiting: bool) {
        *self
            .yield_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) =
            others_waiting.then(|| tokio::time::Instant::now() + Self::YIELD);
    }

    /// Until when a local acquirer should hold back, if at all.
    pub(crate) fn yield_until(&self) -> Option<tokio::time::Instant> {
        *self
            .yield_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn holder(&self) -> MutexGuard<'_, Option<Arc<Held>>> {
        self.holder.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The slots of one `Locker`, created on first use and dropped with their last user.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    slots: SlotMap,
}

impl Registry {
    /// The slot of `key`, created if needed.
    pub(crate) fn slot(&self, key: &str) -> SlotRef {
        let mut slots = lock(&self.slots);
        let slot = slots
            .entry(key.to_owned())
            .or_insert_with(|| {
                Arc::new(Slot {
                    queue: Arc::new(Semaphore::new(1)),
                    holder: Mutex::new(None),
                    yield_until: Mutex::new(None),
                })
            })
            .clone();
        SlotRef {
            key: key.to_owned(),
            slot: Some(slot),
            slots: self.slots.clone(),
        }
    }

    /// Number of keys with local state (held, or being waited for).
    pub(crate) fn len(&self) -> usize {
        lock(&self.slots).len()
    }
}

/// A counted reference to a slot; the last one removes the slot from the registry.
#[derive(Debug)]
pub(crate) struct SlotRef {
    key: String,
    slot: Option<Arc<Slot>>,
    slots: SlotMap,
}

impl std::ops::Deref for SlotRef {
    type Target = Slot;

    fn deref(&self) -> &Slot {
        self.slot.as_deref().expect("slot is present until drop")
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        let mut slots = lock(&self.slots);
        if let Some(slot) = self.slot.take() {
            // Clones are only made under this mutex, so the count is exact here: the map's
            // reference plus ours means nobody else uses the slot.
            if Arc::strong_count(&slot) == 2 {
                slots.remove(&self.key);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_shared_and_removed_with_their_last_user() {
        let registry = Registry::default();
        let a = registry.slot("k");
        let b = registry.slot("k");
        assert!(Arc::ptr_eq(&a.queue, &b.queue));
        assert_eq!(registry.len(), 1);
        drop(a);
        assert_eq!(registry.len(), 1);
        drop(b);
        assert_eq!(registry.len(), 0);
    }

    #[tokio::test]
    async fn tasks_are_distinct_owners() {
        let here = Owner::current();
        assert_eq!(here, Owner::current());
        let there = tokio::spawn(async { Owner::current() }).await.unwrap();
        assert_ne!(here, there);
    }
}
