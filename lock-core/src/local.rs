//! [`LocalLocks`]: the one owner of a held lock's life in this process, from the grant to the
//! last word on it. It registers a lock Redis granted (its local key names it as holder, the
//! records by token are what the watchdog renews), hands out nested guards to its owner
//! (reentry) and takes them back (leaving), and finishes a left lock on one path whether its
//! guard was released or dropped: handed over to the next local acquirer once Redis confirmed
//! the token, or released in Redis, then settled. Renewal answers and losses land here too: an
//! answer for a token goes to whoever holds that token when it arrives.
//!
//! Guards and fences hold an `Arc` of it (not the whole `Locker`): the store, the background
//! releaser and the fencing settings are all a held lock needs.
//!
//! Reentry and leaving both run under the local key's holder lock, so a nested acquire can never
//! join a lock whose outermost guard is leaving.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::backend_error::BackendError;
use crate::error::{LockError, LostReason};
use crate::held::{Grant, Hold, LeaseMode};
use crate::held_by_token::HeldByToken;
use crate::hold_ends::HoldEnds;
use crate::in_box::in_box;
use crate::in_flight::InFlight;
use crate::key::ShownKey;
use crate::kind::Kind;
use crate::limits::MIN_LEASE;
use crate::local_key::{Baton, LocalKey, LocalKeyRef, LocalKeys};
use crate::metrics::{self, Operation, ReleaseOutcome};
use crate::owner::Owner;
use crate::release::{self, ReleaseJob, ReleaseOnDrop, Releaser};
use crate::store::{NewLease, Renewal, Store};

/// Local handoffs in a row before a lock goes back through Redis, so that waiters of other
/// lockers (who cannot be seen from here without a round trip) get their turn.
const MAX_STREAK: u32 = 6;

/// Whether a lock valid until `valid_until` has time enough left to be handed over: the next
/// holder's first renewal comes up to a third of the lease later, plus the pickup.
fn worth_handing_over(valid_until: Instant, lease: Duration) -> bool {
    valid_until >= Instant::now() + lease / 2
}

/// Whether a lock valid until `valid_until` has so much of its `lease` left that its handoff's
/// confirmation need not renew it: at most an eighth used since Redis last confirmed it (a
/// grant, a renewal, an earlier handoff's renewal), so the next holder starts with more than a
/// watchdog lock ever has between two renewals (two thirds, less the margin). Only the token is
/// compared then, and nothing is written (a hot key passes its lock on within that time). A
/// lock extended past its lease is confirmed by the renewal, as before, which keeps the
/// extension.
fn fresh(valid_until: Instant, lease: Duration) -> bool {
    let now = Instant::now();
    valid_until >= now + (lease - lease / 8) && valid_until <= now + lease
}

/// How long a handed-over lock waits for the next local holder (queued, so normally woken at
/// once) before it is released in Redis after all.
const PICKUP: Duration = Duration::from_millis(5);

/// The name of a read-lock local key: the owner and the key (a NUL cannot start a Debug form).
fn reader_key_name(key: &str, owner: Owner) -> String {
    format!("{owner:?}\0{key}")
}

/// The locks this locker holds or waits for in this process.
#[derive(Debug)]
pub(crate) struct LocalLocks {
    /// How long the end of a hold waits for an extension of it on its way (see `finish`).
    turn_wait: Duration,
    /// The mutexes (and write locks), one local key per key.
    local_keys: LocalKeys<Hold>,
    /// The fair locks, one local key per key: apart from the mutexes' although they are the same
    /// Redis lock, since a fair acquire takes its local place after the Redis grant and a
    /// mutex before it. Sharing one place, a mutex waiter holding it and waiting in Redis and
    /// a fair waiter granted in Redis and waiting for it would wait for each other.
    fairs: LocalKeys<Hold>,
    /// The read locks, one local key per key and task (readers do not queue behind each other).
    readers: LocalKeys<Hold>,
    /// The semaphores, one local key per key and permit count, whose queue has that many places.
    semaphores: LocalKeys<Hold>,
    /// The held locks (outermost guard not yet left) by Redis token: what the watchdog renews.
    held: HeldByToken,
    /// When the next of them ends by design (a fixed lease, a `max_hold`), for the watchdog.
    pub(crate) ends: Arc<HoldEnds>,
    pub(crate) store: Arc<Store>,
    pub(crate) releaser: Releaser,
    /// Renewal script calls sent so far (for `Locker::stats` and the metrics).
    renew_calls: AtomicU64,
    /// Work under way that ends in Redis: acquires, finishing locks, background jobs.
    pub(crate) in_flight: InFlight,
    /// Cancelled by [`Locker::shutdown`](crate::Locker::shutdown): the watchdog and the
    /// release listener stop.
    closed: CancellationToken,
    /// Set by the shutdown too, before `closed` is cancelled: acquires fail with `ShutDown`.
    /// Apart from the token because every acquire reads it and waits on it: the token's
    /// look and wait each take its tree's locks, this flag and signal none but the signal's own.
    closing: AtomicBool,
    /// Wakes the acquires under way when `closing` is set.
    close_signal: Notify,
    /// Stops the watchdog and the release listener when the last locker and guard are gone.
    _shutdown: DropGuard,
}

/// What an acquiring task holds already of the lock it asks for (see [`LocalLocks::own`]).
#[derive(Debug)]
pub(crate) enum Own {
    /// Nothing: the lock is acquired as usual.
    Nothing,
    /// A nested guard of its lock, or the loss of that lock.
    Nested(Result<Arc<Hold>, LockError>),
    /// Its lock, with a guard in use in another task: not reentrant until that guard leaves.
    Escaped(Arc<Hold>),
}

/// What giving up one guard meant for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leave {
    /// An outer guard still holds it.
    Nested,
    /// That was the outermost guard: the lock is unregistered and must now be finished
    /// ([`LocalLocks::finish`]).
    Outermost,
    /// That was the outermost guard, and the shutdown has finished the lock already.
    Finished,
}

/// What Redis said when asked to confirm a lock about to be handed over.
enum Confirmation {
    /// Still ours, with its lease renewed from `sent_at`: valid until then.
    Ours(Instant),
    /// Lost before the handoff: the loss is marked.
    Lost,
    /// No decisive answer: released through Redis instead, whose answer decides.
    Undecided,
}

impl LocalLocks {
    pub(crate) fn new(
        prefix: &str,
        store: Arc<Store>,
        releaser: Releaser,
        in_flight: InFlight,
        shutdown: CancellationToken,
        turn_wait: Duration,
    ) -> Self {
        Self {
            turn_wait,
            local_keys: LocalKeys::new(prefix, false),
            fairs: LocalKeys::new(prefix, false),
            readers: LocalKeys::new(prefix, true),
            semaphores: LocalKeys::new(prefix, true),
            held: HeldByToken::default(),
            ends: Arc::new(HoldEnds::new()),
            store,
            releaser,
            renew_calls: AtomicU64::new(0),
            in_flight,
            closed: shutdown.clone(),
            closing: AtomicBool::new(false),
            close_signal: Notify::new(),
            _shutdown: shutdown.drop_guard(),
        }
    }

    /// Whether the locker was shut down.
    pub(crate) fn is_closed(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// The shutdown's signal: resolves on a shutdown after it was made (whether or not it was
    /// polled yet); one before sets [`is_closed`](Self::is_closed) first.
    pub(crate) fn close_signal(&self) -> Notified<'_> {
        self.close_signal.notified()
    }

    /// Shuts the locker down: acquires fail from now on, acquires waiting wake up and fail,
    /// the watchdog and the release listener stop.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.close_signal.notify_waiters();
        self.closed.cancel();
    }

    /// Gives back every lock held now (the shutdown): each is marked lost first, so that its
    /// holder stops before another can take the key, then released in Redis, all at once.
    /// Locks whose outermost guard is leaving already are left to that guard's release.
    /// Returns the errors of the releases that failed (those keys end with their lease).
    pub(crate) async fn give_back_all(&self) -> Vec<LockError> {
        let records: Vec<Arc<Hold>> = self.held.all();
        let releases =
            records
                .into_iter()
                .filter(|held| held.claim_finish())
                .map(|held| async move {
                    let _working = self.in_flight.enter();
                    if held.is_lost() {
                        // Lost before (by its clock, say): keep that reason.
                        drop(held.lost_error());
                    } else {
                        held.mark_lost(LostReason::Shutdown);
                    }
                    {
                        let mut holder = held.local_key().holder();
                        if std::ptr::eq(holder.as_ptr(), Arc::as_ptr(&held)) {
                            *holder = Weak::new();
                        }
                    }
                    self.unregister(&held);
                    metrics::unheld(held.kind());
                    let released = release::release_held(&self.store, &held).await;
                    Self::settle(&held, released.others_waiting);
                    match released.result {
                        Err(error @ (LockError::Backend { .. } | LockError::Tls { .. })) => {
                            Some(error)
                        }
                        // Released, or lost before: nothing of ours is left.
                        _ => None,
                    }
                });
        join_all(releases).await.into_iter().flatten().collect()
    }

    /// The read-lock local key of `key` for `owner`, created if needed.
    pub(crate) fn reader_key(&self, key: &str, owner: Owner) -> LocalKeyRef<Hold> {
        self.readers.get(&reader_key_name(key, owner))
    }

    /// The local key of the semaphore `key` of `limit` permits, created if needed. Its queue has
    /// `limit` places; callers that count another limit get a local key of their own (Redis
    /// enforces each caller's count).
    pub(crate) fn semaphore_key(&self, key: &str, limit: u32) -> LocalKeyRef<Hold> {
        self.semaphores
            .get_sized(&format!("{limit}\0{key}"), limit as usize)
    }

    /// The one-place queue of the semaphore `key` of `limit` permits for waiting in Redis:
    /// one task of this process at a time, in arrival order; its holder is the first local
    /// waiter, which takes a permit a local holder hands over (a zero-wait acquire takes no
    /// turn: it does not wait).
    pub(crate) fn semaphore_turn(&self, key: &str, limit: u32) -> LocalKeyRef<Hold> {
        self.semaphores.get(&format!("turn:{limit}\0{key}"))
    }

    /// `owner`'s read lock of `key`, if it holds one (with a guard in another task or not).
    pub(crate) fn read_of(&self, key: &str, owner: Owner) -> Option<Arc<Hold>> {
        if self.readers.len() == 0 {
            return None;
        }
        self.readers
            .find(&reader_key_name(key, owner))
            .and_then(|local_key| local_key.holder().upgrade())
            .filter(|held| held.is_owned_by(owner))
    }

    /// Number of keys with local state: held, or waited for (a read lock counts once per
    /// task).
    pub(crate) fn len(&self) -> usize {
        self.local_keys.len() + self.fairs.len() + self.readers.len() + self.semaphores.len()
    }

    /// Locks the watchdog keeps alive now (held, not lost, without a fixed lease).
    pub(crate) fn watchdog_locks(&self) -> usize {
        self.held
            .count(|held| matches!(held.mode(), LeaseMode::Watchdog(_)) && !held.is_lost())
    }

    /// Renewal script calls sent so far.
    pub(crate) fn renew_calls(&self) -> u64 {
        self.renew_calls.load(Ordering::Relaxed)
    }

    /// What `owner` holds of the local key's lock: a nested guard of it, with no Redis round
    /// trip (`Err(Lost)` when that lock is lost), or nothing (it must be acquired). Not while a
    /// guard of the lock is used in another task: that task may be inside (see "Reentrancy" in
    /// the crate docs); the acquire then waits for that guard to leave.
    pub(crate) fn own(&self, local_key: &LocalKey<Hold>, owner: Owner) -> Own {
        let holder = local_key.holder();
        let Some(held) = holder.upgrade().filter(|h| h.is_owned_by(owner)) else {
            return Own::Nothing;
        };
        // The local key's lock stays held to the nest: a guard's leave takes it too, so the
        // last guard cannot end the lock between this look and the nest.
        if !held.reentrant_for(owner) {
            return Own::Escaped(held);
        }
        if held.is_lost() {
            return Own::Nested(Err(held.lost_error()));
        }
        held.nest();
        tracing::trace!(depth = held.depth(), "reentrant acquire");
        Own::Nested(Ok(held))
    }

    /// [`own`](Self::own) for the exclusive lock of `key`, held as a mutex or as a fair lock
    /// (one Redis lock): a task holding either kind gets a nested guard of it.
    pub(crate) fn own_exclusive(&self, key: &str, owner: Owner) -> Own {
        [&self.local_keys, &self.fairs]
            .into_iter()
            .filter_map(|local_keys| local_keys.find(key))
            .map(|local_key| self.own(&local_key, owner))
            .find(|own| !matches!(own, Own::Nothing))
            .unwrap_or(Own::Nothing)
    }

    /// The local key an exclusive acquire of `key` lines up in (its fair line's when `fair`),
    /// made if needed, with what `owner` holds of the key's exclusive lock as either kind (one
    /// Redis lock). One lookup for the usual acquire: the local key it lines up in is where a
    /// hold of its own kind is, and the other family is searched only when it has keys at all.
    pub(crate) fn exclusive_key(
        &self,
        key: &str,
        owner: Owner,
        fair: bool,
    ) -> (LocalKeyRef<Hold>, Own) {
        let (mine, other) = if fair {
            (&self.fairs, &self.local_keys)
        } else {
            (&self.local_keys, &self.fairs)
        };
        let local_key = mine.get(key);
        let own = match self.own(&local_key, owner) {
            Own::Nothing => other
                .find(key)
                .map_or(Own::Nothing, |other| self.own(&other, owner)),
            own => own,
        };
        (local_key, own)
    }

    /// Registers a lock Redis granted (or a local handoff passed on): its local key names it as the
    /// local holder, and its token's record is renewed from now on (for a watchdog lock).
    pub(crate) fn register(&self, held: Hold) -> Arc<Hold> {
        let held = Arc::new(held);
        *held.local_key().holder() = Arc::downgrade(&held);
        metrics::held(held.kind());
        self.held.insert(held.clone());
        if let Some(end) = held.planned_end_of_grant() {
            self.ends.note(end);
        }
        held
    }

    /// Has the watchdog look at `held` when it ends by design (see [`HoldEnds`]); after the
    /// grant, and after an extension that may have shortened it.
    pub(crate) fn watch_end(&self, held: &Hold) {
        if let Some(end) = held.planned_end() {
            self.ends.note(end);
        }
    }

    /// Marks lost the held locks whose validity ran out (their holders keep their guards:
    /// their local places go back to the waiting tasks now), and notes when the next of the
    /// others ends by design. The watchdog's look at [`HoldEnds::next`].
    pub(crate) fn mark_ended(&self) {
        self.ends.clear();
        self.for_each_live(|held| {
            if let Some(end) = held.planned_end() {
                self.ends.keep(end);
            }
        });
    }

    /// Visits every held record not lost; those found lost by their clock are marked so.
    /// They stay in the records until their guards leave: Redis may still hold their keys
    /// (a lease that ran out here first, an extension whose answer was lost), and a shutdown
    /// gives back what the records list.
    fn for_each_live(&self, mut live: impl FnMut(&Arc<Hold>)) {
        self.held.for_each(|held| {
            if held.is_lost() {
                // Marks it lost, with the reason the clock gives, if nothing did yet.
                drop(held.lost_error());
            } else {
                live(held);
            }
        });
    }

    /// Gives up one guard's share of the lock; with the outermost one the lock stops being
    /// reentrant and renewed, and the caller must [`finish`](Self::finish) it.
    pub(crate) fn leave(&self, held: &Arc<Hold>) -> Leave {
        let mut holder = held.local_key().holder();
        if !held.unnest() {
            return Leave::Nested;
        }
        if !held.claim_finish() {
            // The shutdown released it, and took it out of the local key and the records.
            return Leave::Finished;
        }
        if std::ptr::eq(holder.as_ptr(), Arc::as_ptr(held)) {
            *holder = Weak::new();
        }
        drop(holder);
        self.unregister(held);
        held.end();
        metrics::unheld(held.kind());
        Leave::Outermost
    }

    /// Removes `held`'s record by token, unless the token has passed on to another holder.
    fn unregister(&self, held: &Arc<Hold>) {
        self.held.remove(held);
    }

    /// Finishes a lock whose outermost guard has left, on the one path for a release and a
    /// drop: handed over to the next local acquirer when one is queued and Redis confirms the
    /// token (`Ok`; `Lost` when it does not), otherwise released in Redis (`Ok` only when that
    /// release deleted the key while it was still ours). Runs again from the start when an
    /// interrupted call is finished in the background: every step before the last Redis
    /// answer leaves nothing behind.
    pub(crate) async fn finish(&self, held: &Arc<Hold>) -> Result<(), LockError> {
        let _working = self.in_flight.enter();
        // An extension of this hold on its way (an extension sent again after a renewal, with
        // its retries) runs before the key is released or handed over: a handoff keeps the
        // token, and a late one would cut the next holder's lease (boxed: rare).
        let turn = held.extension_turn_if_extended();
        let (_turn, extension_pending) = match &turn {
            Some(turn) => {
                match in_box(|| tokio::time::timeout(self.turn_wait, turn.lock())).await {
                    Ok(taken) => (Some(taken), false),
                    // An extension keeps the turn far beyond its call (its future kept and never
                    // polled again): released in Redis, which a late extension cannot undo, and
                    // never handed over under the same token.
                    Err(_) => (None, true),
                }
            }
            None => (None, false),
        };
        // An extension on a connection of its own that never answered may run in Redis after
        // a handoff's confirmation and cut the next holder's lease: released instead.
        let extension_pending = extension_pending || held.extension_may_still_run();
        if let Some(lease) = self.may_hand_over(held).filter(|_| !extension_pending) {
            // Boxed: only a handoff confirms, and its state would otherwise be part of every
            // release's future.
            match in_box(|| self.confirm(held, lease)).await {
                Confirmation::Ours(valid_until) => {
                    if self.hand_over(held, valid_until) {
                        release::end_hold(held.take_hold_span(), ReleaseOutcome::HandedOver);
                        return Ok(());
                    }
                }
                Confirmation::Lost => {
                    // Nothing to delete: the key is gone or another holder's. The next local
                    // acquirer takes its turn in Redis.
                    Self::settle(held, None);
                    let error = held.lost_error();
                    release::end_hold(held.take_hold_span(), ReleaseOutcome::Lost);
                    metrics::released(held.kind(), ReleaseOutcome::Lost, held.held_since());
                    return Err(error);
                }
                Confirmation::Undecided => {}
            }
        }
        // Boxed: the release's state (a kilobyte, the span and the Redis call's retry) would
        // otherwise be part of every release's future up to the caller's task, copied into it
        // as it starts and carried for good; one allocation costs less than the copies.
        let released = in_box(|| release::release_held(&self.store, held)).await;
        Self::settle(held, released.others_waiting);
        if released.retry {
            // A lock left in Redis would keep every locker out for its lease, held by
            // nobody: tried again in the background, as an unused grant is. Also for a lock
            // lost by its clock, whose answer is `Lost` whatever the call met: a renewal or
            // extension that ran without its reply coming back keeps its key in Redis.
            self.releaser.send(ReleaseJob::Abandoned {
                keys: held.redis_keys(),
                token: held.token().clone(),
                in_flight: false,
            });
        }
        released.result
    }

    /// [`finish`](Self::finish) from a guard's `Drop` (which cannot await): the background
    /// releaser runs it. Never blocks, never panics, with or without a runtime.
    pub(crate) fn finish_in_background(self: &Arc<Self>, held: Arc<Hold>) {
        self.releaser.send(ReleaseJob::Finish {
            local: self.clone(),
            held,
        });
    }

    /// [`finish`](Self::finish), cancel safe: if the returned future is dropped before Redis
    /// answered, the background releaser runs it again from the start.
    pub(crate) async fn finish_cancel_safe(
        self: &Arc<Self>,
        held: &Arc<Hold>,
    ) -> Result<(), LockError> {
        let mut on_drop = ReleaseOnDrop::new(&self.releaser, (self, held));
        on_drop.arm();
        let result = self.finish(held).await;
        on_drop.disarm();
        result
    }

    /// The lease to confirm `held` with if it may be handed over to the next local acquirer:
    /// a watchdog mutex or semaphore permit (readers do not queue behind each other, and a
    /// fair lock's next holder is whoever is first in line in Redis), a local acquirer waiting,
    /// a streak under [`MAX_STREAK`] (then the lock goes back through Redis, where waiters of
    /// other lockers get their turn), no [`Fence`](crate::Fence) handle alive (it could still
    /// ask for a token under this Redis token after the next holder did), not known lost.
    fn may_hand_over(&self, held: &Hold) -> Option<Duration> {
        let LeaseMode::Watchdog(lease) = held.mode() else {
            return None;
        };
        let kind_fits = held.kind().hands_over_locally();
        let local_key = held.local_key();
        let fits = kind_fits
            && local_key.has_waiters()
            && !held.has_fences()
            && held.streak() < MAX_STREAK
            && !held.is_lost()
            && !held.was_release_sent()
            && !self.is_closed()
            && tokio::runtime::Handle::try_current().is_ok();
        fits.then_some(lease)
    }

    /// Asks Redis whether `held`'s token still holds its lock: a lock is handed over only on
    /// what Redis says after its last holder left its section, never on the local clock alone.
    /// A mutex with most of its lease left ([`fresh`]) is only compared (one `GET`): the next
    /// holder inherits the validity Redis last confirmed. Otherwise (and for a semaphore
    /// permit) the same step renews the lease, never shortening it, and the next holder starts
    /// with the lease renewed.
    async fn confirm(&self, held: &Hold, lease: Duration) -> Confirmation {
        let sent_at = Instant::now();
        let (keys, token) = (held.redis_keys(), held.token().stored());
        let pair = [(&keys, token.as_str())];
        let renew = held.kind() != Kind::Exclusive || !fresh(held.valid_until(), lease);
        let answers = if renew {
            self.store.renew(&pair, NewLease::AtLeast(lease)).await
        } else {
            self.store.confirm(&pair).await
        };
        let answer = answers.first().copied().unwrap_or(Renewal::UNKNOWN);
        metrics::renewed(held.kind(), answer.label());
        match answer {
            Renewal::Renewed => {
                if renew {
                    held.confirm(sent_at, lease);
                }
                if held.lost_reason().is_some() {
                    // Marked lost meanwhile (an older renewal's answer): believe the loss.
                    Confirmation::Lost
                } else if held.is_lost() {
                    // Only the clock ran out while the answer came back: Redis had the lock
                    // then (and a renewal renewed it); its release decides.
                    Confirmation::Undecided
                } else {
                    Confirmation::Ours(held.valid_until())
                }
            }
            Renewal::NotOurs(gone) => {
                held.mark_lost(held.reason_for(gone));
                Confirmation::Lost
            }
            Renewal::Undecided(_) => Confirmation::Undecided,
        }
    }

    /// Leaves the confirmed lock in the local key for the next local acquirer: the Redis key keeps
    /// its token and the next holder takes it over (a fencing token it asks for is issued
    /// later than this holder's, so it is larger). Returns whether it did (a semaphore's local key
    /// keeps one baton at a time); a lock nobody picks up within [`PICKUP`] is released in
    /// Redis.
    fn hand_over(&self, held: &Arc<Hold>, valid_until: Instant) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let local_key = held.local_key();
        let (token, streak) = (held.token().clone(), held.streak() + 1);
        let left = local_key.put_baton(Baton {
            keys: held.redis_keys(),
            token: token.clone(),
            valid_until,
            streak,
        });
        if !left {
            return false;
        }
        held.give_back_place();
        metrics::released(held.kind(), ReleaseOutcome::HandedOver, held.held_since());
        tracing::trace!(key = %held.key(), "lock handed over locally");
        let local_key = local_key.clone();
        let releaser = self.releaser.clone();
        let working = self.in_flight.enter();
        runtime.spawn(async move {
            let _working = working;
            tokio::time::sleep(PICKUP).await;
            if let Some(baton) = local_key.reclaim_baton(&token, streak) {
                // As an unused grant's: tried again if it fails (a lock left in Redis would
                // keep every locker out for its lease, held by nobody).
                releaser.send(ReleaseJob::Abandoned {
                    keys: baton.keys,
                    token: baton.token,
                    in_flight: false,
                });
            }
        });
        true
    }

    /// Takes over the lock the last local holder handed over, if one waits in `local_key`: the grant
    /// for a watchdog acquire (`Ok`), or the baton back when it does not fit (a fixed-lease
    /// acquire, or too little validity left), for the caller to release in Redis.
    pub(crate) fn take_over(
        local_key: &LocalKeyRef<Hold>,
        mode: LeaseMode,
        permits: u32,
    ) -> Option<Result<Grant, Baton>> {
        let baton = local_key.take_baton()?;
        let LeaseMode::Watchdog(lease) = mode else {
            return Some(Err(baton));
        };
        if let Kind::Permits { .. } = baton.keys.kind() {
            // A semaphore holder's token names its permits (`<token>|<holder>:<permits>`): an
            // acquire of another count cannot take it over.
            if baton.token.permits() != Some(permits) {
                return Some(Err(baton));
            }
        }
        // Too little left to be worth it, or more than this acquire may hold: a lease cut to a
        // short max_hold must not inherit a longer one, which would outlive the hold in Redis.
        if !worth_handing_over(baton.valid_until, lease)
            || baton.valid_until > Instant::now() + lease
        {
            return Some(Err(baton));
        }
        Some(Ok(Grant {
            keys: baton.keys,
            token: baton.token,
            sent_at: Instant::now(),
            handed_over: Some((baton.valid_until, baton.streak)),
        }))
    }

    /// After the Redis release of a left lock: the local key learns whether other lockers wait
    /// (`None`: the release failed, so nobody was told), and the local queue place is given
    /// back to the next local acquirer.
    pub(crate) fn settle(held: &Hold, others_waiting: Option<bool>) {
        if let Some(others_waiting) = others_waiting {
            held.local_key().released(others_waiting);
        }
        held.give_back_place();
    }

    /// The records the watchdog should renew now, by lease; records found lost by their clock
    /// are marked so.
    pub(crate) fn due_for_renewal(&self, now: Instant) -> HashMap<Duration, Vec<Arc<Hold>>> {
        let mut due: HashMap<Duration, Vec<Arc<Hold>>> = HashMap::new();
        self.for_each_live(|held| {
            if let Some(lease) = held.wants_renewal(now) {
                due.entry(lease).or_default().push(held.clone());
            }
        });
        due
    }

    /// Counts renewal script calls about to be sent.
    pub(crate) fn count_renew_calls(&self, calls: u64) {
        self.renew_calls.fetch_add(calls, Ordering::Relaxed);
        metrics::renewal_calls(calls);
    }

    /// Applies a renewal's answer for `token`, sent at `sent_at` with `lease`, to whoever
    /// holds that token now (a local handoff may have passed it on since it was sent; a
    /// release may have ended it, and then the answer concerns nobody).
    ///
    /// `renewed` is the record the renewal was sent for: when nobody holds its token now and
    /// Redis no longer has it, a handoff of it still waiting in the local key is withdrawn, so the
    /// next local acquirer goes to Redis instead of entering a lock another holder has.
    ///
    /// Returns the hold whose shortening extension this renewal may have undone in Redis; the
    /// caller sends that extension again ([`extend_again`](Self::extend_again)).
    pub(crate) fn renewed(
        &self,
        renewed: &Hold,
        sent_at: Instant,
        lease: Duration,
        answer: Renewal,
    ) -> Option<Arc<Hold>> {
        let token = renewed.token();
        let Some(held) = self.held.get(token) else {
            if let Renewal::NotOurs(_) = answer {
                if renewed.local_key().withdraw_baton(token).is_some() {
                    tracing::debug!(
                        "a lock handed over locally was lost before its next holder took it"
                    );
                }
            }
            return None;
        };
        metrics::renewed(held.kind(), answer.label());
        match answer {
            // Sent before an extension that shortened the lock, it may have run after it in
            // Redis (retried on a new connection) and given the key its whole lease back: the
            // caller sends the extension again.
            Renewal::Renewed | Renewal::Undecided(_)
                if held.renewal_undoes_extension(sent_at, lease) =>
            {
                return Some(held)
            }
            Renewal::Renewed => held.confirm(sent_at, lease),
            Renewal::NotOurs(gone) => {
                held.mark_lost(held.reason_for(gone));
                self.unregister(&held);
            }
            Renewal::Undecided(_) => {}
        }
        None
    }

    /// Sets the remaining lease of `held`'s lock to `by` from now, if Redis still holds it for
    /// its token (see [`LockGuard::extend`](crate::LockGuard::extend)).
    pub(crate) async fn extend_held(&self, held: &Hold, by: Duration) -> Result<(), LockError> {
        let turn = held.extension_turn();
        let _turn = turn.lock().await;
        if held.is_lost() {
            return Err(held.lost_error());
        }
        self.extend_in_turn(held, by).await
    }

    /// [`extend_held`](Self::extend_held) once the hold's extension turn is taken.
    async fn extend_in_turn(&self, held: &Hold, by: Duration) -> Result<(), LockError> {
        let sent_at = Instant::now();
        // Assumed applied where it shortens the lock, until Redis answers: dropped mid-call
        // or left without an answer, the extension may have run all the same.
        held.expect_extension(sent_at, by, self.store.extension_path());
        self.watch_end(held);
        let (keys, token) = (held.redis_keys(), held.token().stored());
        let pair = [(&keys, token.as_str())];
        let answer = self.store.renew(&pair, NewLease::Exactly(by)).await;
        match answer.first().copied().unwrap_or(Renewal::UNKNOWN) {
            Renewal::Renewed => {
                held.confirm_extension(sent_at, by, Instant::now());
                Ok(())
            }
            Renewal::NotOurs(gone) => {
                held.mark_lost(held.reason_for(gone));
                Err(held.lost_error())
            }
            Renewal::Undecided(why) => {
                if why.settled() {
                    // It ran in Redis before its answer, or never left: nothing of it is
                    // still on its way.
                    held.extension_ran(sent_at, Instant::now());
                }
                let error =
                    BackendError::undecided("the extension got no decisive answer from redis");
                metrics::backend_error(Operation::Extend, &error);
                Err(LockError::backend_on(&keys, held.key(), error))
            }
        }
    }

    /// Sends again the extension that a renewal answered at `answered_at` may have undone
    /// (see [`renewed`](Self::renewed)): the lease `held` keeps now, from now (1 ms when it
    /// has run out, which ends the key at once). It counts as an extension: renewals sent
    /// before it no longer count, so nothing this process believes outlives what Redis keeps.
    /// It takes the hold's extension turn, as an `extend` and the hold's end do; an extension
    /// sent after the renewal's answer ran after the renewal in Redis, and nothing is sent
    /// again, nor once the hold has ended.
    pub(crate) async fn extend_again(&self, held: &Hold, answered_at: Instant) {
        let turn = held.extension_turn();
        let _turn = turn.lock().await;
        // Ended: released or handed over (the next holder's lease, under the same token, is
        // not this hold's to set).
        if held.is_ended() || held.extended_since(answered_at) {
            return;
        }
        let by = held
            .valid_until()
            .saturating_duration_since(Instant::now())
            .max(MIN_LEASE);
        if let Err(error) = self.extend_in_turn(held, by).await {
            tracing::debug!(%error, key = %ShownKey(held.key()), "an extension undone by a late renewal could not be sent again");
        }
    }

    /// Marks every held watchdog lock lost at once: nothing renews them any more.
    pub(crate) fn lose_renewed(&self, reason: LostReason) {
        let records: Vec<_> = self.held.all();
        for held in records {
            if let LeaseMode::Watchdog(_) = held.mode() {
                held.mark_lost(reason);
            }
        }
    }
}
