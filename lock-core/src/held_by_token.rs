//! [`HeldByToken`]: a locker's held locks by Redis token, the record the watchdog renews.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::held::Hold;
use crate::token::Token;

/// The held locks (outermost guard not yet left) by Redis token. A local handoff passes the
/// token on, so a renewal answer in flight reaches the new holder.
///
/// Filed under the token's hash, not a copy of it: a held lock costs the map 16 bytes. A
/// lookup compares the whole token, so two tokens of one hash (one chance in 2^64 per pair)
/// never answer for each other: the later one's record replaces the earlier's,
/// which is then no longer renewed and ends as lost by its clock.
#[derive(Debug, Default)]
pub(crate) struct HeldByToken {
    records: Mutex<HashMap<u64, Arc<Hold>>>,
    /// Keyed per locker: nobody outside can aim tokens at one bucket.
    hasher: RandomState,
}

impl HeldByToken {
    fn slot(&self, token: &Token) -> u64 {
        self.hasher.hash_one(token)
    }

    /// Files `held` under its token, in place of whoever held the token before (a handoff).
    pub(crate) fn insert(&self, held: Arc<Hold>) {
        let slot = self.slot(held.token());
        self.records.lock().insert(slot, held);
    }

    /// Whoever holds `token` now.
    pub(crate) fn get(&self, token: &Token) -> Option<Arc<Hold>> {
        self.records
            .lock()
            .get(&self.slot(token))
            .filter(|held| held.token() == token)
            .cloned()
    }

    /// Removes `held`'s record, unless its token has passed on to another holder.
    pub(crate) fn remove(&self, held: &Arc<Hold>) {
        let slot = self.slot(held.token());
        let mut records = self.records.lock();
        if records
            .get(&slot)
            .is_some_and(|current| Arc::ptr_eq(current, held))
        {
            records.remove(&slot);
        }
    }

    /// Every held lock now.
    pub(crate) fn all(&self) -> Vec<Arc<Hold>> {
        self.records.lock().values().cloned().collect()
    }

    /// Keeps the records `keep` says to keep.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&Arc<Hold>) -> bool) {
        self.records.lock().retain(|_, held| keep(held));
    }

    /// How many held locks `count` counts.
    pub(crate) fn count(&self, count: impl Fn(&Hold) -> bool) -> usize {
        self.records
            .lock()
            .values()
            .filter(|held| count(held))
            .count()
    }
}
