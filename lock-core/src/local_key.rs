//! The per-key local keys of one `Locker`: for each key this process holds or waits for, a FIFO
//! queue with one place (local waiters line up here, so only one task per process contends in
//! Redis for a key and handoffs are first come, first served) and a reference to the current
//! local holder (for reentrancy).

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use foldhash::fast::RandomState;
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{AcquireError, Notify, Semaphore};
use tokio::time::Instant;

use crate::key::RedisKeys;
use crate::token::Token;

/// The local keys of one family (a `Locker`'s mutexes, its readers, ...).
type LocalKeyMap<H> = Arc<Family<H>>;

/// The local keys of one family, each filed under its own name (a local key costs the set one
/// pointer, and its name is kept once, in the local key), with what a held lock needs to build
/// its Redis names from its local key's name: it keeps neither its key nor its names.
///
/// Hashed with foldhash, seeded at random per set: every acquire and release looks a key up
/// here, and SipHash cost several times as much on short keys; the random seed still keeps
/// users' keys from being chosen to collide.
#[derive(Debug)]
struct Family<H> {
    filed: Mutex<HashSet<Filed<H>, RandomState>>,
    /// The locker's Redis key prefix.
    prefix: Box<str>,
    /// Names are `<qualifier>\0<key>` (a reader's task, a semaphore's limit), not the key
    /// alone: the key follows the first NUL (a qualifier has none).
    qualified: bool,
}

/// A local key as its map files it: found by its name's bytes (a lookup need not check that
/// an inline name is UTF-8, which it always is).
#[derive(Debug)]
struct Filed<H>(Arc<LocalKey<H>>);

impl<H> Borrow<[u8]> for Filed<H> {
    fn borrow(&self) -> &[u8] {
        self.0.name.as_bytes()
    }
}

/// As its name's bytes, so that a lookup by `&[u8]` finds it.
impl<H> Hash for Filed<H> {
    fn hash<S: Hasher>(&self, state: &mut S) {
        self.0.name.as_bytes().hash(state);
    }
}

impl<H> PartialEq for Filed<H> {
    fn eq(&self, other: &Self) -> bool {
        self.0.name.as_bytes() == other.0.name.as_bytes()
    }
}

impl<H> Eq for Filed<H> {}

/// The per-key state shared by every local acquirer and holder (of type `H`) of one key.
#[derive(Debug)]
pub(crate) struct LocalKey<H> {
    /// What its map files it under (the key, or the key with what sets its family apart).
    name: Name,
    /// One place (a semaphore's: its permits): the task holding it is the only local one that
    /// holds or contends in Redis. Inline, not an `Arc` of its own: a [`Place`] borrows it,
    /// and a held lock keeps its local key, so the count of places it holds is all it needs.
    queue: Semaphore,
    /// Live `LocalKeyRef`s, counted under the map's lock: the last one removes the local key (an
    /// `Arc` count would race, since a `LocalKeyRef`'s `Arc` is released after its drop ran).
    refs: AtomicU32,
    /// Local tasks waiting for the key: queued for `queue`'s permit, and for a semaphore every
    /// waiting acquire until it has its permits (also while it waits for the turn or in
    /// Redis), since a handed-over permit goes to the first of them.
    waiting: AtomicU32,
    /// Its local holder and what passes between its local holders, under one lock.
    state: Mutex<KeyState<H>>,
}

/// A local key's name: inline when short (most keys are), else on the heap.
#[derive(Debug)]
enum Name {
    Inline { len: u8, bytes: [u8; Self::INLINE] },
    Heap(Box<str>),
}

impl Name {
    /// The longest name kept inline, in bytes: what fits beside the length in the room a
    /// `Box<str>` and the tag take anyway.
    const INLINE: usize = 22;

    fn new(name: &str) -> Self {
        let mut bytes = [0; Self::INLINE];
        match (bytes.get_mut(..name.len()), u8::try_from(name.len())) {
            (Some(inline), Ok(len)) => {
                inline.copy_from_slice(name.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(name.into()),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Copied whole from a `str`: always UTF-8.
            Self::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Self::Heap(name) => name,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(name) => name.as_bytes(),
        }
    }
}

/// A local key's local holder, and what passes between its local holders. Most local keys
/// never hand a lock over, so what a handoff needs is made or stored only when it is.
#[derive(Debug)]
struct KeyState<H> {
    /// The current local holder, for reentrancy. Weak: the holder keeps its local key alive, not
    /// the other way round.
    holder: Weak<H>,
    /// After a release that told waiters of other lockers, the next local acquirer holds back
    /// until then, so those waiters get a fair chance instead of losing every race to a task
    /// that was woken without a network hop.
    yield_until: Option<Instant>,
    /// A lock still held in Redis, handed over by its last local holder to the next local
    /// acquirer (see `LocalLocks::hand_over`); boxed: a local key lives as long as its lock.
    baton: Option<Box<Baton>>,
    /// Told when a baton is left: a semaphore's first local waiter may be waiting in Redis.
    /// Made by the first waiter that listens.
    handed: Option<Arc<Notify>>,
}

/// A lock handed over locally: the Redis key keeps the token; the next local holder takes it
/// over with what is known of its validity.
#[derive(Debug)]
pub(crate) struct Baton {
    pub(crate) keys: RedisKeys,
    pub(crate) token: Token,
    pub(crate) valid_until: Instant,
    /// Local handoffs in a row, this one included (with the token, it tells this handoff from
    /// a later one of the same local key).
    pub(crate) streak: u32,
}

/// Places taken in a local key's queue, given back when dropped unless [`keep`](Self::keep)
/// hands them to a held lock (which gives them back through its local key).
#[must_use]
#[derive(Debug)]
pub(crate) struct Place<'a> {
    queue: &'a Semaphore,
    places: u32,
}

impl Place<'_> {
    /// The places, now the caller's to give back with [`LocalKey::give_back`].
    pub(crate) fn keep(mut self) -> u32 {
        std::mem::take(&mut self.places)
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.places > 0 {
            self.queue.add_permits(self.places as usize);
        }
    }
}

/// Counts a local task queued for a local key's permit while it lives (also when the wait is
/// cancelled).
pub(crate) struct Queued<'a>(&'a AtomicU32);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<H> LocalKey<H> {
    /// How long after a release with remote waiters local acquirers hold back.
    const YIELD: Duration = Duration::from_millis(1);

    /// `places` places of the queue, if free now.
    pub(crate) fn try_place(&self, places: u32) -> Option<Place<'_>> {
        let permit = self.queue.try_acquire_many(places).ok()?;
        permit.forget();
        Some(Place {
            queue: &self.queue,
            places,
        })
    }

    /// `places` places of the queue, first come, first served. Cancel safe: a wait dropped
    /// holds nothing.
    pub(crate) async fn place(&self, places: u32) -> Result<Place<'_>, AcquireError> {
        let permit = self.queue.acquire_many(places).await?;
        permit.forget();
        Ok(Place {
            queue: &self.queue,
            places,
        })
    }

    /// Gives back places a held lock kept (see [`Place::keep`]).
    pub(crate) fn give_back(&self, places: u32) {
        self.queue.add_permits(places as usize);
    }

    /// Places free now.
    #[cfg(test)]
    pub(crate) fn free_places(&self) -> usize {
        self.queue.available_permits()
    }

    /// Records whether the last release told waiters of other lockers.
    pub(crate) fn released(&self, others_waiting: bool) {
        self.state.lock().yield_until = others_waiting.then(|| Instant::now() + Self::YIELD);
    }

    /// Until when a local acquirer should hold back, if at all.
    pub(crate) fn yield_until(&self) -> Option<Instant> {
        self.state.lock().yield_until
    }

    /// Counts the caller as waiting for the key until the returned value is dropped.
    pub(crate) fn queued(&self) -> Queued<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Queued(&self.waiting)
    }

    /// Whether local tasks wait for the key.
    pub(crate) fn has_waiters(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// Leaves a lock for the next local acquirer, unless one left earlier is still there (a
    /// semaphore's local key has several holders; one baton waits at a time). Returns whether it
    /// was left.
    pub(crate) fn put_baton(&self, baton: Baton) -> bool {
        let mut state = self.state.lock();
        if state.baton.is_some() {
            return false;
        }
        state.baton = Some(Box::new(baton));
        let handed = state.handed.clone();
        drop(state);
        if let Some(handed) = handed {
            handed.notify_waiters();
        }
        true
    }

    /// Resolves when a lock is left here from now on (see [`put_baton`](Self::put_baton)).
    /// Registered under the state's lock, so a baton left after this call wakes it, and one
    /// left before it is found by a look at the local key after it.
    pub(crate) fn handed(&self) -> OwnedNotified {
        let mut state = self.state.lock();
        let handed = state.handed.get_or_insert_with(Arc::default).clone();
        handed.notified_owned()
    }

    /// Takes the lock left by the last local holder, if any.
    pub(crate) fn take_baton(&self) -> Option<Baton> {
        self.state.lock().baton.take().map(|baton| *baton)
    }

    /// Takes the lock handed over under `token` out of the local key if nobody took it yet (Redis
    /// said it is no longer ours: the next local acquirer must go to Redis instead).
    pub(crate) fn withdraw_baton(&self, token: &Token) -> Option<Baton> {
        let baton = &mut self.state.lock().baton;
        if baton.as_ref().is_some_and(|b| b.token == *token) {
            baton.take().map(|baton| *baton)
        } else {
            None
        }
    }

    /// Takes back the lock handed over under `token` as the `streak`th handoff in a row, if
    /// nobody took it. The two name one handoff: a token is fresh with each grant in Redis,
    /// and each handoff of it counts one more.
    pub(crate) fn reclaim_baton(&self, token: &Token, streak: u32) -> Option<Baton> {
        let baton = &mut self.state.lock().baton;
        if baton
            .as_ref()
            .is_some_and(|b| b.token == *token && b.streak == streak)
        {
            baton.take().map(|baton| *baton)
        } else {
            None
        }
    }

    /// The current local holder, locked: reentry and leaving happen under this lock.
    pub(crate) fn holder(&self) -> MappedMutexGuard<'_, Weak<H>> {
        MutexGuard::map(self.state.lock(), |state| &mut state.holder)
    }
}

/// The local keys of one `Locker`, created on first use and dropped with their last user.
#[derive(Debug)]
pub(crate) struct LocalKeys<H> {
    local_keys: LocalKeyMap<H>,
}

impl<H> LocalKeys<H> {
    /// The local keys of a family of locks of the locker of `prefix`, whose names are the
    /// keys, or `qualified` (`<qualifier>\0<key>`).
    pub(crate) fn new(prefix: &str, qualified: bool) -> Self {
        Self {
            local_keys: Arc::new(Family {
                filed: Mutex::default(),
                prefix: prefix.into(),
                qualified,
            }),
        }
    }

    /// The local key of `key`, created if needed.
    pub(crate) fn get(&self, key: &str) -> LocalKeyRef<H> {
        self.get_sized(key, 1)
    }

    /// The local key of `key`, created with `places` places in its queue if needed.
    pub(crate) fn get_sized(&self, key: &str, places: usize) -> LocalKeyRef<H> {
        let mut local_keys = self.local_keys.filed.lock();
        let local_key = match local_keys.get(key.as_bytes()) {
            Some(filed) => filed.0.clone(),
            None => {
                let local_key = Arc::new(LocalKey {
                    name: Name::new(key),
                    queue: Semaphore::new(places),
                    refs: AtomicU32::new(0),
                    waiting: AtomicU32::new(0),
                    state: Mutex::new(KeyState {
                        holder: Weak::new(),
                        yield_until: None,
                        baton: None,
                        handed: None,
                    }),
                });
                local_keys.insert(Filed(local_key.clone()));
                local_key
            }
        };
        local_key.refs.fetch_add(1, Ordering::AcqRel);
        drop(local_keys);
        LocalKeyRef {
            local_key,
            local_keys: self.local_keys.clone(),
        }
    }

    /// The local key of `key` if it exists (not counted as a user: for a look only).
    pub(crate) fn find(&self, key: &str) -> Option<Arc<LocalKey<H>>> {
        self.local_keys
            .filed
            .lock()
            .get(key.as_bytes())
            .map(|filed| filed.0.clone())
    }

    /// Number of keys with local state (held, or being waited for).
    pub(crate) fn len(&self) -> usize {
        self.local_keys.filed.lock().len()
    }
}

/// A counted reference to a local key; the last one removes the local key from the map.
#[derive(Debug)]
pub(crate) struct LocalKeyRef<H> {
    local_key: Arc<LocalKey<H>>,
    local_keys: LocalKeyMap<H>,
}

impl<H> LocalKeyRef<H> {
    /// The locker's Redis key prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.local_keys.prefix
    }

    /// The user's key this local key is for, read from its name.
    pub(crate) fn user_key(&self) -> &str {
        let name = self.local_key.name.as_str();
        if self.local_keys.qualified {
            name.split_once('\0').map_or(name, |(_, key)| key)
        } else {
            name
        }
    }
}

impl<H> std::ops::Deref for LocalKeyRef<H> {
    type Target = LocalKey<H>;

    fn deref(&self) -> &LocalKey<H> {
        &self.local_key
    }
}

impl<H> Clone for LocalKeyRef<H> {
    fn clone(&self) -> Self {
        // Counted under the map's lock, as in `get_sized`.
        let local_keys = self.local_keys.filed.lock();
        self.local_key.refs.fetch_add(1, Ordering::AcqRel);
        drop(local_keys);
        Self {
            local_key: self.local_key.clone(),
            local_keys: self.local_keys.clone(),
        }
    }
}

impl<H> Drop for LocalKeyRef<H> {
    fn drop(&mut self) {
        let mut local_keys = self.local_keys.filed.lock();
        if self.local_key.refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Ours is the one filed under its name: a local key is removed with its last
            // reference, under this lock, before another of that name can be filed.
            local_keys.remove(self.local_key.name.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_key_dropped_by_many_threads_at_once_is_removed() {
        let local_keys = Arc::new(LocalKeys::<()>::new("p:", false));
        for _ in 0..500 {
            let start = Arc::new(std::sync::Barrier::new(8));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (r, start) = (local_keys.get("k"), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        drop(r);
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(local_keys.len(), 0, "a local_key outlived its last user");
        }
    }

    #[test]
    fn names_short_and_long_read_back() {
        for name in [
            "",
            "k",
            "é:ü\0x",
            &"n".repeat(Name::INLINE),
            &"n".repeat(Name::INLINE + 1),
        ] {
            assert_eq!(Name::new(name).as_str(), name);
        }
        assert!(matches!(
            Name::new(&"n".repeat(Name::INLINE)),
            Name::Inline { .. }
        ));
        assert!(matches!(
            Name::new(&"n".repeat(Name::INLINE + 1)),
            Name::Heap(_)
        ));
    }

    #[test]
    fn the_user_key_is_read_from_the_name() {
        let plain = LocalKeys::<()>::new("p:", false);
        assert_eq!(plain.get("a\0b").user_key(), "a\0b");
        assert_eq!(plain.get("a\0b").prefix(), "p:");
        let qualified = LocalKeys::<()>::new("p:", true);
        assert_eq!(qualified.get("3\0a\0b").user_key(), "a\0b");
    }

    #[test]
    fn local_keys_are_shared_and_removed_with_their_last_user() {
        let local_keys = LocalKeys::<()>::new("p:", false);
        let a = local_keys.get("k");
        let b = local_keys.get("k");
        assert!(std::ptr::eq(&*a, &*b));
        assert_eq!(local_keys.len(), 1);
        drop(a);
        assert_eq!(local_keys.len(), 1);
        drop(b);
        assert_eq!(local_keys.len(), 0);
    }
}
