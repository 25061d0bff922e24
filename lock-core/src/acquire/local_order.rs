//! The local side of an acquire: the local key it lines up in (reentry first), the order of
//! local queue and Redis for each [`Order`](crate::kind::Order), and the locks a local holder
//! hands over.

use std::future::Future;
use std::sync::Arc;

use futures_util::future::Either;
use tokio::time::Instant;

use super::in_redis::by;
use super::{Acquire, Seen, When};
use crate::backend_error::BackendError;
use crate::error::{ConfigError, LockError};
use crate::guard::LockGuard;
use crate::held::{Grant, Hold, LeaseMode};
use crate::key::RedisKeys;
use crate::kind::Kind;
use crate::local::{LocalLocks, Own};
use crate::local_key::{Baton, LocalKey, LocalKeyRef, Place};
use crate::owner::Owner;
use crate::release::{Attempt, ReleaseOnDrop};
use crate::store::{NewLease, Renewal};
use crate::token::Token;

/// The answer of an acquire that has nothing to acquire: a nested guard of a lock the task
/// holds, or a refusal.
type Answer = Result<LockGuard, LockError>;

/// The local key an acquire lines up in, and this task's own lock of the key when a guard of
/// it is in use in another task.
pub(super) type LocalKeyPlace = (LocalKeyRef<Hold>, Option<Arc<Hold>>);

/// A grant and the local place that goes with it.
type Placed<'k> = (Place<'k>, Grant);

/// Where an acquire may take over a lock a local holder hands over, and what it takes.
pub(super) struct Handoff<'a> {
    pub(super) local_key: &'a LocalKeyRef<Hold>,
    mode: LeaseMode,
    permits: u32,
}

impl Acquire {
    /// The local key this acquire lines up in, with this task's own lock of the key when a
    /// guard of it is used in another task (see [`wait_for_own`](Self::wait_for_own)); `Err`
    /// with the answer when there is nothing to acquire.
    pub(super) fn local_key(&self, owner: Owner) -> Result<LocalKeyPlace, Answer> {
        let inner = &self.inner();
        if let Err(refused) = inner.capabilities().serves(self.kind) {
            return Err(Err(refused.into()));
        }
        match self.kind {
            Kind::Exclusive | Kind::Fair => self.exclusive_key(owner),
            Kind::Shared => self.reader_key(owner),
            Kind::Permits { limit } => {
                if self.permits == 0 || self.permits > limit {
                    return Err(Err(ConfigError::Permits {
                        permits: limit,
                        wanted: self.permits,
                    }
                    .into()));
                }
                // A local queue with the semaphore's permits: at most that many tasks of this
                // process contend in Redis, the others line up here first come, first served.
                // Permits are not reentrant.
                Ok((inner.local.semaphore_key(&self.key, limit), None))
            }
        }
    }

    /// A nested guard of `reentered`, the task's hold of this key.
    fn nested(&self, reentered: Result<Arc<Hold>, LockError>) -> Answer {
        reentered.map(|held| LockGuard::new(self.inner().local.clone(), held))
    }

    /// What the task holds of the lock, as the acquire goes on with it: `Err` with the nested
    /// guard (or the loss), else its lock when a guard of it is used in another task.
    fn unless_nested(&self, own: Own) -> Result<Option<Arc<Hold>>, Answer> {
        match own {
            Own::Nothing => Ok(None),
            Own::Escaped(held) => Ok(Some(held)),
            Own::Nested(reentered) => Err(self.nested(reentered)),
        }
    }

    /// The local key of a mutex or fair lock: the one of the key, or of its fair line.
    fn exclusive_key(&self, owner: Owner) -> Result<LocalKeyPlace, Answer> {
        let local = &self.inner().local;
        // A write inside the task's own read would wait for that read: refused. While a guard
        // of the read is used in another task the read is not the task's alone; the acquire
        // waits for that guard (see `wait_for_own`), then looks again.
        let read = local.read_of(&self.key, owner);
        if read.as_ref().is_some_and(|read| read.reentrant_for(owner)) {
            return Err(Err(LockError::WriteInsideRead {
                key: self.key.clone(),
            }));
        }
        // The mutex and the fair lock of a key are one Redis lock: a task holding either
        // nests the other.
        let (local_key, own) = local.exclusive_key(&self.key, owner, self.kind == Kind::Fair);
        Ok((local_key, self.unless_nested(own)?.or(read)))
    }

    /// A reader's local key, its task's own.
    fn reader_key(&self, owner: Owner) -> Result<LocalKeyPlace, Answer> {
        let local = &self.inner().local;
        // A read inside this task's write lock (or fair lock) shares it.
        let writing = self.unless_nested(local.own_exclusive(&self.key, owner))?;
        // Readers do not exclude each other: each task has a local key of its own, for
        // reentrancy.
        let local_key = local.reader_key(&self.key, owner);
        let reading = self.unless_nested(local.own(&local_key, owner))?;
        Ok((local_key, reading.or(writing)))
    }

    /// Waits while `own`, this task's lock of the key, has a guard in use in another task:
    /// the lock is not reentrant for this task meanwhile, and the local place it would queue
    /// for is its own lock's. `true` once the last such guard left (look again: the task
    /// nests); `false` to acquire as usual: the lock ended or was lost (its place is given
    /// back), or the wait ran out (the usual acquire then answers `Busy` with the holder).
    pub(super) async fn wait_for_own(&self, own: &Hold, owner: Owner, when: When) -> bool {
        if when.try_once {
            return false;
        }
        loop {
            let changed = own.changed();
            let changed = changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if own.is_lost() || own.is_ended() {
                return false;
            }
            if own.reentrant_for(owner) {
                return true;
            }
            match when.deadline {
                Some(deadline) => {
                    if tokio::time::timeout_at(deadline, changed).await.is_err() {
                        return false;
                    }
                }
                None => changed.await,
            }
        }
    }

    /// The usual order: first the local queue (one task per key per process contends in
    /// Redis; first come, first served), then Redis, unless the last local holder handed the
    /// lock over.
    // Not `async fn`: see the module's documentation of `acquire`.
    #[allow(clippy::manual_async_fn)]
    pub(super) fn local_then_in_redis<'a, 'k>(
        &'a self,
        local_key: &'k LocalKeyRef<Hold>,
        mode: LeaseMode,
        when: When,
    ) -> impl Future<Output = Result<Placed<'k>, LockError>> + use<'a, 'k> {
        async move {
            // Each step is looked at before anything is awaited: the uncontended acquire (a
            // free place, nothing handed over, no release to yield to) builds no future but
            // the one of its Redis call.
            let permit = queue_for(local_key, self.permits, when, true).await;
            let Some(permit) = permit else {
                return Err(self.busy(when.started, self.local_holder(local_key)));
            };
            // The last local holder handed the lock over: no Redis round trip.
            if let Some(taken) = LocalLocks::take_over(local_key, mode, self.permits) {
                if let Some(grant) = self.use_handed_over(taken, when).await {
                    return Ok((permit, grant));
                }
            }
            let others_wait = match local_key.yield_until() {
                Some(until) => self.yield_to_others(until, when).await,
                None => false,
            };
            let grant = self
                .acquire_in_redis(self.redis_keys(), mode.lease(), when, None, others_wait)
                .await?;
            Ok((permit, grant))
        }
    }

    /// A semaphore's order in this process, first come, first served: a place of the local
    /// queue (a semaphore's permits' worth of tasks contend in Redis), then the turn (one task
    /// at a time waits in Redis, so a release does not wake every local waiter at once), then
    /// Redis. The turn's holder is the first local waiter: a permit a local holder hands over
    /// goes to it, also while it waits in Redis, never to a task that came later. Every waiting
    /// acquire counts as a local waiter from its arrival to its grant, so a release hands over
    /// whenever one waits, wherever it waits. A zero wait tries Redis once and that is all: it
    /// never stands in the line, so it takes no turn (siblings mid-try do not refuse it) and no
    /// handed-over permit (those are for the waiters).
    pub(super) async fn permits_in_order<'k>(
        &self,
        local_key: &'k LocalKeyRef<Hold>,
        limit: u32,
        mode: LeaseMode,
        when: When,
    ) -> Result<Placed<'k>, LockError> {
        let _waiting = (!when.try_once).then(|| local_key.queued());
        let Some(place) = queue_for(local_key, self.permits, when, false).await else {
            return Err(self.busy(when.started, Seen::default()));
        };
        if when.try_once {
            let grant = self
                .acquire_in_redis(self.redis_keys(), mode.lease(), when, None, false)
                .await?;
            return Ok((place, grant));
        }
        let turn = self.inner().local.semaphore_turn(&self.key, limit);
        let Some(_turn) = queue_for(&turn, 1, when, false).await else {
            return Err(self.busy(when.started, Seen::default()));
        };
        let handoff = self.handoff(local_key, mode);
        if let Some(grant) = self.take_handed_over(&handoff, when).await {
            return Ok((place, grant));
        }
        if let Some(until) = local_key.yield_until() {
            self.yield_to_others(until, when).await;
        }
        let grant = self
            .acquire_in_redis(self.redis_keys(), mode.lease(), when, Some(&handoff), false)
            .await?;
        Ok((place, grant))
    }

    /// A fair lock's order: every waiter of every process lines up in Redis (a local queue
    /// first would let a task of this process that came later take its place in Redis before
    /// an earlier one elsewhere); the local place, the fair local key's (a mutex waiter of the
    /// key holds its own place while it waits in Redis), is taken once Redis granted the lock.
    /// It is free then, or about to be: the previous local holder gives it back right after its
    /// release in Redis. The wait for the place keeps to the acquire's deadline (the grant is
    /// given back when it ends), and the grant is renewed every half lease meanwhile.
    pub(super) async fn in_line_then_local<'k>(
        &self,
        local_key: &'k LocalKeyRef<Hold>,
        mode: LeaseMode,
        when: When,
    ) -> Result<Placed<'k>, LockError> {
        let lease = mode.lease();
        let mut grant = self
            .acquire_in_redis(self.redis_keys(), lease, when, None, false)
            .await?;
        // Dropped while waiting for the place: the granted lock goes back in the background.
        let mut on_drop = ReleaseOnDrop::new(
            self.inner().releaser(),
            Attempt::new(&grant.keys, grant.token.clone()),
        );
        on_drop.arm();
        let placed = self
            .keep_until_placed(local_key, &on_drop.target, &mut grant.sent_at, lease, when)
            .await;
        on_drop.disarm();
        let token = on_drop.target.token.clone();
        drop(on_drop);
        let permit = match placed {
            Ok(permit) => permit,
            Err(answer) => {
                self.give_back(&grant.keys, token, when).await;
                return Err(match answer {
                    Some(Renewal::Undecided(_)) => LockError::backend(
                        Some(&self.key),
                        BackendError::undecided(
                            "the renewal of a fair grant got no decisive answer",
                        ),
                    ),
                    // The wait ran out, or the grant was lost while waiting for the local place.
                    _ => self.busy(when.started, Seen::default()),
                });
            }
        };
        // The queue is never closed; a closed one would be a bug, reported as undecided.
        let permit = permit.map_err(|_| {
            LockError::backend(
                Some(&self.key),
                BackendError::undecided("the local queue was closed"),
            )
        })?;
        Ok((permit, Grant { token, ..grant }))
    }

    /// Waits for a fair grant's local place, renewing the grant in Redis every half lease
    /// meanwhile (`sent_at` follows the renewals). `Err` when the wait ran out (`None`) or a
    /// renewal did not keep the grant (its answer).
    async fn keep_until_placed<'k>(
        &self,
        local_key: &'k LocalKeyRef<Hold>,
        granted: &Attempt<'_>,
        sent_at: &mut Instant,
        lease: std::time::Duration,
        when: When,
    ) -> Result<Result<Place<'k>, tokio::sync::AcquireError>, Option<Renewal>> {
        let bound = when.bound(self.inner().one_try());
        loop {
            let renew_at = *sent_at + lease / 2;
            let until = when.deadline.map_or(renew_at, |d| d.min(renew_at));
            let queued = local_key.place(1);
            if let Ok(permit) = tokio::time::timeout_at(until, queued).await {
                return Ok(permit);
            }
            if when.deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(None);
            }
            // Still waiting for the place: keep the grant ours meanwhile.
            let renewed_at = Instant::now();
            let token = granted.token.stored();
            let pair = [(granted.keys, token.as_str())];
            let store = &self.inner().store;
            let renewal = store.renew(&pair, NewLease::AtLeast(lease));
            // Cut at the bound: the wait ran out meanwhile (the grant then goes back).
            let renewed = match bound {
                Some(bound) => tokio::time::timeout_at(bound, renewal).await.ok(),
                None => Some(renewal.await),
            };
            let Some(renewed) = renewed else {
                return Err(None);
            };
            match renewed.first() {
                Some(Renewal::Renewed) => *sent_at = renewed_at,
                other => return Err(other.copied()),
            }
        }
    }

    fn handoff<'a>(&self, local_key: &'a LocalKeyRef<Hold>, mode: LeaseMode) -> Handoff<'a> {
        Handoff {
            local_key,
            mode,
            permits: self.permits,
        }
    }

    /// The local holder of `local_key`, if one holds it (for a `Busy` answer): how long it still
    /// holds, and its name, this locker's.
    fn local_holder(&self, local_key: &LocalKeyRef<Hold>) -> Seen {
        local_key
            .holder()
            .upgrade()
            .map_or_else(Seen::default, |h| Seen {
                ttl: Some(h.valid_until().saturating_duration_since(Instant::now())),
                holder: Some(self.inner().settings.holder.to_string()),
            })
    }

    /// The lock the last local holder handed over, if one waits in the local key and fits this
    /// acquire; one that does not fit goes back to Redis first.
    pub(super) async fn take_handed_over(
        &self,
        handoff: &Handoff<'_>,
        when: When,
    ) -> Option<Grant> {
        let taken = LocalLocks::take_over(handoff.local_key, handoff.mode, handoff.permits)?;
        self.use_handed_over(taken, when).await
    }

    /// What a local holder handed over (see [`LocalLocks::take_over`]): its grant, or `None`
    /// once a lock that does not fit this acquire went back to Redis.
    async fn use_handed_over(&self, taken: Result<Grant, Baton>, when: When) -> Option<Grant> {
        match taken {
            Ok(grant) => Some(grant),
            Err(baton) => {
                // Boxed, as every step off the uncontended path: its state would otherwise
                // be part of every acquire's future, and copied with it as it starts.
                Box::pin(self.give_back(&baton.keys, baton.token, when)).await;
                None
            }
        }
    }

    /// After our own release told waiters elsewhere, holds back until `until` (within the wait)
    /// so they get their turn. Returns whether this acquire began before that moment ended (it
    /// waited behind that release, or came within it): the lock is then most likely theirs.
    async fn yield_to_others(&self, until: Instant, when: When) -> bool {
        let behind_it = when.started < until;
        let until = when.deadline.map_or(until, |d| d.min(until));
        tokio::time::sleep_until(until).await;
        behind_it
    }

    /// Releases in Redis a lock granted to this acquire that it cannot use: a lock handed over
    /// that does not fit it, a fair grant whose wait ran out. The call ends by the acquire's
    /// bound (`wait(d)` bounds the whole acquire); one cut there, failed, or dropped with this
    /// future is finished by the background releaser, which tries again (a grant left in
    /// Redis would keep every locker out for its lease, held by nobody).
    async fn give_back(&self, keys: &RedisKeys, token: Token, when: When) {
        let inner = &self.inner();
        let mut on_drop = ReleaseOnDrop::new(inner.releaser(), Attempt::new(keys, token));
        on_drop.arm();
        let bound = when.bound(inner.one_try());
        let call = inner.store.release(keys, &on_drop.target.token);
        match by(bound, call).await {
            Ok(_) => on_drop.disarm(),
            Err(error) => {
                tracing::debug!(%error, "release of an unused grant failed; retried in the background");
            }
        }
    }
}

/// `places` places of `local_key`'s queue, first come first served, by `when`'s deadline (at
/// once for a zero wait); counted as queued in `local_key` meanwhile when `counted` (the local
/// handoff looks at it). `None` when the wait ran out.
///
/// A place free now is taken at once, without building the wait's future or its deadline's
/// timer (the uncontended acquire's case). Only a task that finds none waits, first come first
/// served: the queue gives places back to its waiters before anyone can take them this way.
fn queue_for(
    local_key: &LocalKey<Hold>,
    places: u32,
    when: When,
    counted: bool,
) -> impl Future<Output = Option<Place<'_>>> {
    let free = local_key.try_place(places);
    if free.is_some() || when.try_once {
        return Either::Left(std::future::ready(free));
    }
    Either::Right(wait_for_place(local_key, places, when, counted))
}

/// [`queue_for`]'s wait, once no place was free.
async fn wait_for_place(
    local_key: &LocalKey<Hold>,
    places: u32,
    when: When,
    counted: bool,
) -> Option<Place<'_>> {
    let _queued = counted.then(|| local_key.queued());
    let queued = local_key.place(places);
    match when.deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, queued).await.ok(),
        None => Some(queued.await),
    }
    .and_then(Result::ok)
}
