//! [`HeldByToken`]: a locker's held locks by Redis token, the record the watchdog renews.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use foldhash::fast::RandomState;
use parking_lot::Mutex;

use crate::held::Hold;
use crate::token::Token;

/// The held locks (outermost guard not yet left) by Redis token. A local handoff passes the
/// token on, so a renewal answer in flight reaches the new holder.
///
/// A set of the holds themselves, found by the token each carries: a held lock costs it one
/// pointer, no copy of its token. The set's hasher is foldhash (quicker than SipHash, and a
/// hold is filed and unfiled with every acquire and release), seeded at random per locker;
/// tokens are random and secret besides, so nobody outside can aim them at one bucket.
#[derive(Debug, Default)]
pub(crate) struct HeldByToken {
    records: Mutex<HashSet<Record, RandomState>>,
}

/// A hold as the set files it: by its token.
#[derive(Debug)]
struct Record(Arc<Hold>);

impl Borrow<Token> for Record {
    fn borrow(&self) -> &Token {
        self.0.token()
    }
}

/// As its token, so that a lookup by token finds it.
impl Hash for Record {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.token().hash(state);
    }
}

impl PartialEq for Record {
    fn eq(&self, other: &Self) -> bool {
        self.0.token() == other.0.token()
    }
}

impl Eq for Record {}

impl HeldByToken {
    /// Files `held` under its token, in place of whoever held the token before (a handoff).
    pub(crate) fn insert(&self, held: Arc<Hold>) {
        self.records.lock().replace(Record(held));
    }

    /// Whoever holds `token` now.
    pub(crate) fn get(&self, token: &Token) -> Option<Arc<Hold>> {
        self.records
            .lock()
            .get(token)
            .map(|record| record.0.clone())
    }

    /// Removes `held`'s record, unless its token has passed on to another holder.
    pub(crate) fn remove(&self, held: &Arc<Hold>) {
        let mut records = self.records.lock();
        // Taken out in one lookup (the usual case: the record is `held`'s), and put back in
        // the rare one where a handoff passed the token on.
        if let Some(other) = records
            .take(held.token())
            .filter(|current| !Arc::ptr_eq(&current.0, held))
        {
            records.insert(other);
        }
    }

    /// Every held lock now.
    pub(crate) fn all(&self) -> Vec<Arc<Hold>> {
        self.records
            .lock()
            .iter()
            .map(|record| record.0.clone())
            .collect()
    }

    /// Visits every record, under the records' lock.
    pub(crate) fn for_each(&self, mut visit: impl FnMut(&Arc<Hold>)) {
        self.records
            .lock()
            .iter()
            .for_each(|record| visit(&record.0));
    }

    /// How many held locks `count` counts.
    pub(crate) fn count(&self, count: impl Fn(&Hold) -> bool) -> usize {
        self.records
            .lock()
            .iter()
            .filter(|record| count(&record.0))
            .count()
    }
}
