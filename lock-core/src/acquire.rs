//! [`Acquire`]: the configurable, awaitable acquisition of one lock.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tracing::{Instrument, Span};

use crate::backend_error::BackendError;
use crate::error::{ConfigError, DurationSetting, LockError};
use crate::guard::LockGuard;
use crate::held::{Grant, Hold, LeaseMode, Terms};
use crate::holder::{self, StoredKind};
use crate::key::{self, Access, RedisKeys, ShownKey};
use crate::limits;
use crate::local::LocalLocks;
use crate::local_key::LocalKeyRef;
use crate::locker::Locker;
use crate::metrics;
use crate::owner::Owner;
use crate::release::{Attempt, ReleaseOnDrop, Waiting};
use crate::release_messages::Subscription;
use crate::store::{AcquireArgs, NewLease, Outcome, Renewal};
use crate::with_lock::OnLost;

/// An acquisition of one lock, configured with builder methods and started by `.await`.
///
/// Created by [`Locker::lock`]. Without [`lease`](Self::lease) the lock gets the locker's
/// watchdog lease and is renewed while its guard lives.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
/// // Fail fast when someone else holds it:
/// let guard = locker.lock("order:7").wait(Duration::ZERO).await?;
/// // Wait up to 3 s, with a fixed 10 s lease and no watchdog:
/// let other = locker.lock("order:8").wait(Duration::from_secs(3)).lease(Duration::from_secs(10)).await?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// [`LockError::Busy`] when the wait ran out, [`LockError::InvalidKey`],
/// [`LockError::Config`] for a lease outside 1 ms to 365 days, [`LockError::WrongType`],
/// [`LockError::Backend`] when Redis failed (the wait is not used up retrying a dead server
/// beyond the deadline), [`LockError::Lost`] for a reentrant acquire of a lock this task
/// holds but has lost, and [`LockError::ShutDown`] once the locker was shut down (an acquire
/// waiting then ends at once).
///
/// # Cancel safety
///
/// Dropping the future mid-wait leaves nothing behind: the local queue place and the release
/// subscription are given up, and if an acquire command was in flight, a background
/// compare-and-delete removes the lock it may still take on the server.
#[derive(Debug)]
#[must_use = "an acquire does nothing until it is `.await`ed"]
pub struct Acquire {
    locker: Locker,
    key: String,
    access: Access,
    /// Semaphore permits taken at once (1 for a lock).
    permits: u32,
    wait: Option<Duration>,
    lease: Option<Duration>,
    max_hold: Option<Duration>,
    /// What [`with_lock`](Self::with_lock) does on a loss.
    on_lost: OnLost,
    /// Started by [`skip_if_busy`](Self::skip_if_busy): a busy answer is counted as a skip.
    skip: bool,
}

impl Acquire {
    pub(crate) fn new(locker: Locker, key: String, access: Access) -> Self {
        Self {
            locker,
            key,
            access,
            permits: 1,
            wait: None,
            lease: None,
            max_hold: None,
            on_lost: OnLost::Abort,
            skip: false,
        }
    }

    /// Takes `permits` permits at once (semaphores only).
    pub(crate) fn permits(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
    }

    /// The longest time to wait for the lock; `Duration::ZERO` tries exactly once, and a wait
    /// beyond 100 years has no deadline (it waits until the lock is free). Any value is
    /// accepted. Default: the locker's `default_wait`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// A fixed lease: the lock expires this long after acquisition unless released or
    /// [extended](LockGuard::extend), and the watchdog never renews it. From 1 ms (Redis
    /// counts TTLs in milliseconds) to 365 days ([`MAX_LEASE`](crate::MAX_LEASE)); the acquire
    /// refuses anything else with [`ConfigError::OutOfRange`] before asking Redis.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The longest a watchdog lock is held (overrides the locker's `max_hold`): the watchdog's
    /// last renewals are cut so that the key ends in Redis when the hold does, even if the
    /// holder hangs and never releases, and the guard then reports
    /// [`LostReason::MaxHold`](crate::LostReason::MaxHold). Any value: zero ends the lock at
    /// once (a 1 ms lease), and a `max_hold` beyond 100 years is no limit (so `Duration::MAX`
    /// lifts the locker's). A fixed [`lease`](Self::lease) ignores it.
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = Some(max);
        self
    }

    /// What [`with_lock`](Self::with_lock) does when the lock is lost while its body runs.
    /// Default: [`OnLost::Abort`]. A plain `.await` of the acquire ignores it.
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    pub(crate) fn on_lost_policy(&self) -> OnLost {
        self.on_lost
    }

    /// Marks the acquire as one whose busy answer is a skip (its metric and span outcome say
    /// `skipped`, not `busy`), and makes its wait zero unless one was set.
    pub(crate) fn skipping(mut self) -> Self {
        self.wait.get_or_insert(Duration::ZERO);
        self.skip = true;
        self
    }

    pub(crate) fn locker(&self) -> &Locker {
        &self.locker
    }
}

/// The future of an [`Acquire`].
#[must_use = "futures do nothing unless polled"]
pub struct AcquireFuture {
    inner: Pin<Box<dyn Future<Output = Result<LockGuard, LockError>> + Send>>,
}

impl std::fmt::Debug for AcquireFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcquireFuture").finish_non_exhaustive()
    }
}

impl Future for AcquireFuture {
    type Output = Result<LockGuard, LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl IntoFuture for Acquire {
    type Output = Result<LockGuard, LockError>;
    type IntoFuture = AcquireFuture;

    fn into_future(self) -> AcquireFuture {
        // The macros check the level first: a disabled span formats nothing and allocates
        // nothing (the uncontended acquire's hot path).
        let outcome = tracing::field::Empty;
        let span = match self.access {
            Access::Exclusive => tracing::debug_span!("lock.acquire", key = %self.key, outcome),
            Access::Fair => {
                tracing::debug_span!("lock.acquire", key = %self.key, fair = true, outcome)
            }
            Access::Shared => {
                tracing::debug_span!("lock.acquire", key = %self.key, read = true, outcome)
            }
            Access::Permits { limit } => {
                tracing::debug_span!("lock.acquire", key = %self.key, permits = self.permits, of = limit, outcome)
            }
        };
        let caller = hold_parent(self.locker.inner.settings.trace_holds);
        AcquireFuture {
            inner: Box::pin(self.run(span.clone(), caller).instrument(span)),
        }
    }
}

/// The span the `lock.hold` span goes under: the caller's, not the acquire's, which ends
/// when the lock is granted. Looked up only when a subscriber may want the hold span.
fn hold_parent(trace_holds: bool) -> Span {
    let wanted = if trace_holds {
        tracing::level_enabled!(tracing::Level::INFO)
    } else {
        tracing::level_enabled!(tracing::Level::DEBUG)
    };
    if wanted {
        Span::current()
    } else {
        Span::none()
    }
}

/// The `lock.hold` span of a lock just granted: info level with `trace_holds`, else debug.
fn hold_span(parent: &Span, key: &str, trace_holds: bool) -> Span {
    let outcome = tracing::field::Empty;
    if trace_holds {
        tracing::info_span!(parent: parent, "lock.hold", key = %ShownKey(key), outcome)
    } else {
        tracing::debug_span!(parent: parent, "lock.hold", key = %ShownKey(key), outcome)
    }
}

/// Records `cancelled` as the `lock.acquire` span's outcome if the acquire is dropped before
/// it ends.
struct SpanOutcome<'a> {
    span: &'a Span,
    recorded: bool,
}

impl SpanOutcome<'_> {
    fn record(&mut self, outcome: &'static str) {
        self.recorded = true;
        self.span.record("outcome", outcome);
    }
}

impl Drop for SpanOutcome<'_> {
    fn drop(&mut self) {
        if !self.recorded {
            self.span.record("outcome", "cancelled");
        }
    }
}

/// The time frame of one acquire.
#[derive(Debug, Clone, Copy)]
struct When {
    started: Instant,
    /// `None`: no deadline (a wait beyond any sensible bound).
    deadline: Option<Instant>,
    /// A zero wait: one try, no queueing.
    try_once: bool,
}

/// The outcome of one acquire try in Redis (after its retries).
enum Try {
    Won,
    Busy(Seen),
}

/// What a try that found the lock taken learned of its holder, for a `Busy` answer.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// The holder's remaining lease, when Redis reported one.
    ttl: Option<Duration>,
    /// The holder's name, when its stored value carries one.
    holder: Option<String>,
}

/// Where an acquire may take over a lock a local holder hands over, and what it takes.
struct Handoff<'a> {
    local_key: &'a LocalKeyRef<Hold>,
    mode: LeaseMode,
    permits: u32,
}

/// An acquire that waited at least this long is logged at info level when it gets the lock
/// (quicker ones at debug): long waits are what an operator looks for, and they are rare
/// enough not to flood the log.
const LONG_WAIT: Duration = Duration::from_secs(1);

impl Acquire {
    /// The acquire, run in `span` (the `lock.acquire` span, which gets its outcome); a lock
    /// it takes gets its `lock.hold` span under `caller`.
    async fn run(self, span: Span, caller: Span) -> Result<LockGuard, LockError> {
        let mut outcome = SpanOutcome {
            span: &span,
            recorded: false,
        };
        let started = Instant::now();
        let mut metric = metrics::Acquisition::start(self.access, started);
        let mut reentered = false;
        let local = &self.locker.inner.local;
        // Counted until it ends, so that a shutdown waits for what it leaves behind.
        let _working = local.in_flight.enter();
        let result = tokio::select! {
            biased;
            () = local.closed() => Err(LockError::ShutDown),
            result = self.take(started, &mut metric, &mut reentered) => result,
        };
        let result = match result {
            Ok(guard) if local.is_closed() => {
                // Granted while the locker shut down: given back at once (the shutdown may
                // have listed the held locks before this one was registered).
                drop(guard.release().await);
                Err(LockError::ShutDown)
            }
            result => result,
        };
        let label = match metrics::acquire_outcome(&result, reentered) {
            // Expected, not contention: kept apart so that `busy` still measures contention.
            "busy" if self.skip => "skipped",
            label => label,
        };
        metric.finish(label, reentered);
        outcome.record(label);
        if let (Ok(guard), false) = (&result, reentered) {
            let trace_holds = self.locker.inner.settings.trace_holds;
            guard.set_hold_span(hold_span(&caller, &self.key, trace_holds));
        }
        if result.is_ok() && !reentered {
            let waited = started.elapsed();
            if waited >= LONG_WAIT {
                tracing::info!(key = %ShownKey(&self.key), ?waited, "lock acquired after a long wait");
            } else {
                tracing::debug!(?waited, "lock acquired");
            }
        }
        result
    }

    /// The acquire itself; `reentered` is set when the answer is about a lock the task
    /// already holds (a nested guard, or the loss of that lock).
    async fn take(
        &self,
        started: Instant,
        metric: &mut metrics::Acquisition,
        reentered: &mut bool,
    ) -> Result<LockGuard, LockError> {
        key::validate(&self.key)?;
        let inner = &self.locker.inner;
        let settings = &inner.settings;
        // Saturated here, where every max_hold arrives: the watchdog adds it to an `Instant`.
        let max_hold = self
            .max_hold
            .or(settings.max_hold)
            .and_then(limits::max_hold);
        let mode = match self.lease {
            Some(lease) => LeaseMode::Fixed(limits::check_lease(DurationSetting::Lease, lease)?),
            // A watchdog lease never outlives the max_hold: the key ends in Redis when the hold
            // does, even if the holder is stuck and never releases.
            None => LeaseMode::Watchdog(limits::lease_within(settings.watchdog_lease, max_hold)),
        };
        let wait = self.wait.unwrap_or(settings.default_wait);
        let deadline = limits::wait(wait).and_then(|wait| started.checked_add(wait));
        let when = When {
            started,
            deadline,
            try_once: wait.is_zero(),
        };
        // Captured at first poll, inside the task that awaits the acquire.
        let owner = Owner::current();
        let local_key = match self.local_key(owner) {
            Ok(local_key) => local_key,
            Err(Ok(guard)) => {
                *reentered = true;
                return Ok(guard);
            }
            Err(Err(error @ LockError::Lost { .. })) => {
                *reentered = true;
                return Err(error);
            }
            Err(Err(refused)) => return Err(refused),
        };
        metric.waiting();
        let (permit, grant) = match self.access {
            Access::Fair => self.in_line_then_local(&local_key, mode, when).await?,
            _ => self.local_then_in_redis(&local_key, mode, when).await?,
        };
        let terms = Terms {
            owner,
            mode,
            max_hold,
        };
        let held = Hold::new(
            inner.next_id(),
            self.key.clone(),
            terms,
            grant,
            local_key,
            permit,
        );
        let held = inner.local.register(held);
        Ok(LockGuard::new(self.locker.inner.local.clone(), held))
    }

    /// The local key this acquire lines up in; `Err` with the answer when there is nothing to
    /// acquire: a nested guard of a lock the task holds, or a refusal.
    fn local_key(&self, owner: Owner) -> Result<LocalKeyRef<Hold>, Result<LockGuard, LockError>> {
        let local = &self.locker.inner.local;
        let guard = |reentered: Result<Arc<Hold>, LockError>| {
            reentered.map(|held| LockGuard::new(local.clone(), held))
        };
        if self.locker.inner.store.is_redlock() {
            // Kinds a RedLock quorum cannot serve (see the variants' docs).
            match self.access {
                Access::Fair => return Err(Err(ConfigError::FairLockWithRedLock.into())),
                Access::Permits { .. } => {
                    return Err(Err(ConfigError::SemaphoreWithRedLock.into()))
                }
                Access::Exclusive | Access::Shared => {}
            }
        }
        match self.access {
            Access::Exclusive | Access::Fair => {
                if local.reads(&self.key, owner) {
                    return Err(Err(LockError::WriteInsideRead {
                        key: self.key.clone(),
                    }));
                }
                // The mutex and the fair lock of a key are one Redis lock: a task holding
                // either nests the other.
                if let Some(reentered) = local.reenter_exclusive(&self.key, owner) {
                    return Err(guard(reentered));
                }
                Ok(match self.access {
                    Access::Fair => local.fair_key(&self.key),
                    _ => local.local_key(&self.key),
                })
            }
            Access::Shared => {
                // A read inside this task's write lock (or fair lock) shares it.
                if let Some(reentered) = local.reenter_exclusive(&self.key, owner) {
                    return Err(guard(reentered));
                }
                // Readers do not exclude each other: each task has a local key of its own, for
                // reentrancy.
                let local_key = local.reader_key(&self.key, owner);
                match local.reenter(&local_key, owner) {
                    Some(reentered) => Err(guard(reentered)),
                    None => Ok(local_key),
                }
            }
            Access::Permits { limit } => {
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
                Ok(local.semaphore_key(&self.key, limit))
            }
        }
    }

    /// The Redis names this acquire takes.
    fn redis_keys(&self) -> RedisKeys {
        let inner = &self.locker.inner;
        match self.access {
            Access::Exclusive => inner.keys(&self.key),
            Access::Fair | Access::Shared => inner.keys(&self.key).held_as(self.access),
            Access::Permits { limit } => {
                RedisKeys::semaphore(&inner.settings.prefix, &self.key, limit)
            }
        }
    }

    /// The usual order: first the local queue (one task per key per process contends in
    /// Redis; first come, first served), then Redis, unless the last local holder handed the
    /// lock over. A semaphore has an order of its own ([`permits_in_order`](Self::permits_in_order)).
    async fn local_then_in_redis(
        &self,
        local_key: &LocalKeyRef<Hold>,
        mode: LeaseMode,
        when: When,
    ) -> Result<(OwnedSemaphorePermit, Grant), LockError> {
        if let Access::Permits { limit } = self.access {
            return self.permits_in_order(local_key, limit, mode, when).await;
        }
        let permit = queue_for(&local_key.queue, self.permits, when, Some(local_key)).await;
        let Some(permit) = permit else {
            return Err(self.busy(when.started, self.local_holder(local_key)));
        };
        let handoff = Handoff {
            local_key,
            mode,
            permits: self.permits,
        };
        // The last local holder handed the lock over: no Redis round trip.
        if let Some(grant) = self.take_handed_over(&handoff).await {
            return Ok((permit, grant));
        }
        self.yield_to_others(local_key, when).await;
        let grant = self
            .acquire_in_redis(self.redis_keys(), mode.lease(), when, None)
            .await?;
        Ok((permit, grant))
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
    async fn permits_in_order(
        &self,
        local_key: &LocalKeyRef<Hold>,
        limit: u32,
        mode: LeaseMode,
        when: When,
    ) -> Result<(OwnedSemaphorePermit, Grant), LockError> {
        let _waiting = (!when.try_once).then(|| local_key.queued());
        let Some(place) = queue_for(&local_key.queue, self.permits, when, None).await else {
            return Err(self.busy(when.started, Seen::default()));
        };
        if when.try_once {
            let grant = self
                .acquire_in_redis(self.redis_keys(), mode.lease(), when, None)
                .await?;
            return Ok((place, grant));
        }
        let turn = self.locker.inner.local.semaphore_turn(&self.key, limit);
        let Some(_turn) = queue_for(&turn.queue, 1, when, None).await else {
            return Err(self.busy(when.started, Seen::default()));
        };
        let handoff = Handoff {
            local_key,
            mode,
            permits: self.permits,
        };
        if let Some(grant) = self.take_handed_over(&handoff).await {
            return Ok((place, grant));
        }
        self.yield_to_others(local_key, when).await;
        let grant = self
            .acquire_in_redis(self.redis_keys(), mode.lease(), when, Some(&handoff))
            .await?;
        Ok((place, grant))
    }

    /// The local holder of `local_key`, if one holds it (for a `Busy` answer): how long it still
    /// holds, and its name, this locker's.
    fn local_holder(&self, local_key: &LocalKeyRef<Hold>) -> Seen {
        local_key
            .holder()
            .upgrade()
            .map_or_else(Seen::default, |h| Seen {
                ttl: Some(h.valid_until().saturating_duration_since(Instant::now())),
                holder: Some(self.locker.inner.settings.holder.clone()),
            })
    }

    /// The lock the last local holder handed over, if one waits in the local key and fits this
    /// acquire; one that does not fit goes back to Redis first.
    async fn take_handed_over(&self, handoff: &Handoff<'_>) -> Option<Grant> {
        match LocalLocks::take_over(handoff.local_key, handoff.mode, handoff.permits)? {
            Ok(grant) => Some(grant),
            Err(baton) => {
                self.give_back(&baton.keys, baton.token).await;
                None
            }
        }
    }

    /// After our own release told waiters elsewhere, holds back a moment (within the wait) so
    /// they get their turn.
    async fn yield_to_others(&self, local_key: &LocalKeyRef<Hold>, when: When) {
        if let Some(until) = local_key.yield_until() {
            let until = when.deadline.map_or(until, |d| d.min(until));
            tokio::time::sleep_until(until).await;
        }
    }

    /// A fair lock's order: every waiter of every process lines up in Redis (a local queue
    /// first would let a task of this process that came later take its place in Redis before
    /// an earlier one elsewhere); the local place, the fair local key's (a mutex waiter of the key
    /// holds its own place while it waits in Redis), is taken once Redis granted the lock. It
    /// is free then, or about to be: the previous local holder gives it back right after its
    /// release in Redis. The wait for the place keeps to the acquire's deadline (the grant is
    /// given back when it ends), and the grant is renewed every half lease meanwhile.
    async fn in_line_then_local(
        &self,
        local_key: &LocalKeyRef<Hold>,
        mode: LeaseMode,
        when: When,
    ) -> Result<(OwnedSemaphorePermit, Grant), LockError> {
        let lease = mode.lease();
        let keys = self.redis_keys();
        let mut grant = self.acquire_in_redis(keys, lease, when, None).await?;
        let inner = &self.locker.inner;
        // Dropped while waiting for the place: the granted lock goes back in the background.
        let mut on_drop = ReleaseOnDrop::new(
            &inner.local.releaser,
            Attempt::new(&grant.keys, std::mem::take(&mut grant.token)),
        );
        on_drop.arm();
        let permit = loop {
            let renew_at = grant.sent_at + lease / 2;
            let until = when.deadline.map_or(renew_at, |d| d.min(renew_at));
            let queued = local_key.queue.clone().acquire_owned();
            if let Ok(permit) = tokio::time::timeout_at(until, queued).await {
                break permit;
            }
            let answer = if when.deadline.is_some_and(|d| Instant::now() >= d) {
                None
            } else {
                // Still waiting for the place: keep the grant ours meanwhile.
                let sent_at = Instant::now();
                let pair = [(on_drop.target.keys, on_drop.target.token.as_str())];
                let renewal = inner.store.renew(&pair, NewLease::AtLeast(lease)).await;
                match renewal.first() {
                    Some(Renewal::Renewed) => {
                        grant.sent_at = sent_at;
                        continue;
                    }
                    other => other.copied(),
                }
            };
            let token = std::mem::take(&mut on_drop.target.token);
            on_drop.disarm();
            drop(on_drop);
            self.give_back(&grant.keys, token).await;
            return Err(match answer {
                Some(Renewal::Unknown) => LockError::backend(
                    Some(&self.key),
                    BackendError::undecided("the renewal of a fair grant got no decisive answer"),
                ),
                // The wait ran out, or the grant was lost while waiting for the local place.
                _ => self.busy(when.started, Seen::default()),
            });
        };
        on_drop.disarm();
        let token = std::mem::take(&mut on_drop.target.token);
        drop(on_drop);
        // The queue is never closed; a closed one would be a bug, reported as undecided.
        let permit = permit.map_err(|_| {
            LockError::backend(
                Some(&self.key),
                BackendError::undecided("the local queue was closed"),
            )
        })?;
        Ok((permit, Grant { token, ..grant }))
    }

    /// Releases in Redis a lock granted to this acquire that it cannot use: a lock handed over
    /// that does not fit it, a fair grant whose wait ran out (finished in the background if
    /// this future is dropped meanwhile).
    async fn give_back(&self, keys: &RedisKeys, token: String) {
        let inner = &self.locker.inner;
        let mut on_drop = ReleaseOnDrop::new(&inner.local.releaser, Attempt::new(keys, token));
        on_drop.arm();
        if let Err(error) = inner.store.release(keys, &on_drop.target.token).await {
            tracing::debug!(%error, "release of an unused grant failed; it expires with its lease");
        }
        on_drop.disarm();
    }

    /// A fresh stored value for a try: a new token with the locker's holder name; a fair
    /// lock's is marked, a semaphore holder's names its permits, which the scripts count (see
    /// `holder.rs`).
    fn new_token(&self) -> String {
        let kind = match self.access {
            Access::Permits { .. } => StoredKind::Permits(self.permits),
            Access::Fair => StoredKind::Fair,
            Access::Exclusive | Access::Shared => StoredKind::Plain,
        };
        holder::stored_value(&new_token(), &self.locker.inner.settings.holder, kind)
    }

    fn busy(&self, started: Instant, seen: Seen) -> LockError {
        let waited = started.elapsed();
        tracing::debug!(?waited, "lock busy");
        LockError::Busy {
            key: self.key.clone(),
            waited,
            holder_ttl: seen.ttl,
            holder: seen.holder,
        }
    }

    /// The holder name in a stored value this acquire found (see `holder.rs`): a semaphore's
    /// holders name their permits, a lock's may be a fair one's.
    fn holder_in(&self, value: &str) -> Option<String> {
        let name = match self.access {
            Access::Permits { .. } => holder::parse_permit(value).0,
            Access::Exclusive | Access::Fair | Access::Shared => holder::parse_lock(value).holder,
        };
        name.map(str::to_owned)
    }

    /// Tries, and waits for release notifications or the holder's expiry between tries, until
    /// the deadline (its Redis calls until a bound derived from it). With a `handoff` (the
    /// semaphore's first local waiter), a permit a local holder hands over meanwhile is taken
    /// instead, and the acquire leaves the line in Redis in the background.
    async fn acquire_in_redis(
        &self,
        keys: RedisKeys,
        lease: Duration,
        when: When,
        handoff: Option<&Handoff<'_>>,
    ) -> Result<Grant, LockError> {
        let When {
            started,
            deadline,
            try_once,
        } = when;
        let inner = &self.locker.inner;
        // Redis calls (retries included) end by the deadline, or one command (and its WAIT for
        // replicas) after the start when the wait is shorter: a zero wait still gets one try.
        let replica_wait = inner
            .store
            .min_replicas()
            .map_or(Duration::ZERO, |m| m.timeout);
        let one_try = inner.settings.command_timeout + replica_wait;
        let bound = deadline.map(|d| d.max(started + one_try));
        let attempt = Attempt::new(&keys, self.new_token());
        // The acquire's entry in the waiting writers: its first token, kept for the whole wait
        // although a RedLock try runs under a fresh token each time (the first try's token is
        // also what a release of an abandoned first try takes out).
        let waiter = attempt.token.clone();
        let mut on_drop = ReleaseOnDrop::new(&inner.local.releaser, attempt);
        // Armed once an exclusive try joined the waiting writers: whatever ends this acquire
        // without the lock (its wait ran out, an error, the future dropped) takes the entry
        // out at once, so readers do not let a writer that left go first.
        let mut waiting = ReleaseOnDrop::new(
            &inner.local.releaser,
            Waiting {
                keys: &keys,
                token: String::new(),
            },
        );
        // A waiting acquire that finds the release channel subscribed already takes that
        // subscription before its first try, so a first try that finds the lock taken is not
        // repeated once subscribed (below). Without any subscription in the locker (the
        // uncontended case), the channel is not even named.
        let mut subscription: Option<Subscription> = if try_once || !inner.release_messages.any() {
            None
        } else {
            inner.release_messages.subscribed(&keys.channel())
        };
        // The holder at the last try that found the lock held, once one did.
        let mut seen_busy: Option<Seen> = None;
        loop {
            if let Some(seen) = &seen_busy {
                // The last sleep ended at the deadline: a try now would have no time left. The
                // answer is what the last try found.
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(self.busy(started, seen.clone()));
                }
            }
            let notify = subscription.as_ref().map(|s| s.notify.clone());
            let mut notified = notify.as_deref().map(|n| Box::pin(n.notified()));
            if let Some(n) = notified.as_mut() {
                // Registered before the attempt, so a release between the attempt and the sleep
                // still wakes us.
                n.as_mut().enable();
            }
            // Likewise for a local handoff, registered before the local key is looked at.
            let mut handed = handoff.map(|h| Box::pin(h.local_key.handed.notified()));
            if let Some(h) = handed.as_mut() {
                h.as_mut().enable();
            }
            if let Some(handoff) = handoff {
                if let Some(grant) = self.take_handed_over(handoff).await {
                    // Armed after a try, the attempt takes our place in line out in the
                    // background when dropped here.
                    return Ok(grant);
                }
            }
            // The messages from here on are the ones the attempt may not have seen.
            let mut mark = subscription.as_ref().map_or(0, Subscription::mark);
            let sent_at = Instant::now();
            on_drop.arm();
            // Another locker's release holds back its own next acquirer for us while we wait:
            // the flag lives as long as we may wait, or until our next try renews it.
            let flag = if try_once {
                Duration::ZERO
            } else {
                let retry = inner.settings.fallback_retry * 3;
                deadline.map_or(retry, |d| d.saturating_duration_since(sent_at).min(retry))
            };
            let tried = match self
                .try_once(&mut on_drop.target, &waiter, lease, flag, bound)
                .await
            {
                // Cut at the deadline after the lock was found held: the wait ran out while
                // asking again, which is contention, not a Redis failure.
                Err(LockError::Backend { source, .. }) if source.is_deadline() => match seen_busy {
                    Some(seen) => return Err(self.busy(started, seen)),
                    None => return Err(LockError::backend(Some(&self.key), source)),
                },
                tried => tried?,
            };
            // A fair waiter stays armed between tries: it has a place in line, which the
            // background releaser clears at once if this acquire is dropped or gives up; so
            // does a semaphore's waiter, which may be next (see `scripts/permit_acquire.lua`).
            if !matches!(self.access, Access::Fair | Access::Permits { .. }) || try_once {
                on_drop.disarm();
            }
            let seen = match tried {
                Try::Won => {
                    on_drop.disarm();
                    if on_drop.target.token == waiter {
                        // The winning try took its entry out (see `scripts/acquire.lua`).
                        waiting.disarm();
                    }
                    // Otherwise (a RedLock try under a later token) a node may have granted by
                    // `SET NX`, and the nodes that refused kept the entry: the armed withdrawal
                    // takes it out everywhere, in the background.
                    drop(waiting);
                    let token = std::mem::take(&mut on_drop.target.token);
                    drop(on_drop);
                    if let (Some(subscription), Some(_), Access::Exclusive) =
                        (subscription, seen_busy, self.access)
                    {
                        // Won after waiting: the next wait of this process subscribes
                        // again, behind the waiters of other processes (see `leave_now`).
                        subscription.leave_now();
                    }
                    return Ok(Grant {
                        keys,
                        token,
                        sent_at,
                        handed_over: None,
                    });
                }
                Try::Busy(seen) => seen,
            };
            let ttl = seen.ttl;
            if !flag.is_zero() && self.access == Access::Exclusive {
                waiting.target.token.clone_from(&waiter);
                waiting.arm();
            }
            let now = Instant::now();
            let remaining = deadline.map(|d| d.saturating_duration_since(now));
            if try_once || remaining.is_some_and(|r| r.is_zero()) {
                return Err(self.busy(started, seen));
            }
            seen_busy = Some(seen);
            if inner.store.is_redlock() {
                // A failed quorum try is undone in the background under its token.
                on_drop.target.renew_token(self.new_token());
            }
            if subscription.is_none() {
                let limit = inner
                    .settings
                    .command_timeout
                    .min(remaining.unwrap_or(Duration::MAX));
                subscription = Some(
                    inner
                        .release_messages
                        .subscribe(&keys.channel(), limit)
                        .await,
                );
                // Try again at once: the holder may have released before we subscribed.
                continue;
            }
            let mut sleep = jitter(inner.settings.fallback_retry);
            if let Some(ttl) = ttl {
                sleep = sleep.min(ttl + Duration::from_millis(1));
            }
            if let Some(remaining) = remaining {
                sleep = sleep.min(remaining);
            }
            tracing::trace!(?ttl, ?sleep, "waiting for release");
            let wake_at = Instant::now() + sleep;
            // Ends the sleep when a local holder handed a lock over (never without a handoff).
            let mut handed_over = std::pin::pin!(async {
                match handed.as_mut() {
                    Some(h) => h.await,
                    None => std::future::pending().await,
                }
            });
            match (notified, notify.as_deref(), subscription.as_ref()) {
                (Some(mut n), Some(notify), Some(subscription)) => loop {
                    tokio::select! {
                        _ = &mut n => {}
                        _ = tokio::time::sleep_until(wake_at) => break,
                        _ = &mut handed_over => break,
                    }
                    // Registered before the messages are read, so a later one still wakes us.
                    n = Box::pin(notify.notified());
                    n.as_mut().enable();
                    let token = &on_drop.target.token;
                    let (for_me, now) =
                        subscription.for_me_since(mark, |m| !turn_of_another(m, token));
                    if for_me {
                        break;
                    }
                    mark = now;
                },
                _ => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(wake_at) => {}
                        _ = &mut handed_over => {}
                    }
                }
            };
        }
    }

    /// One acquire call, retried on connection errors and transient server states while
    /// `bound` allows: with the same token (the acquire script is idempotent per token) on one
    /// Redis; with a fresh token on a RedLock quorum, whose undo of a failed try runs in the
    /// background and must not hit the next try. Every call ends by `bound`: one still running
    /// then is abandoned (the background releaser removes what it may still take).
    async fn try_once(
        &self,
        attempt: &mut Attempt<'_>,
        waiter: &str,
        lease: Duration,
        flag: Duration,
        bound: Option<Instant>,
    ) -> Result<Try, LockError> {
        let inner = &self.locker.inner;
        let args = AcquireArgs {
            lease,
            flag,
            fresh_token: false,
        };
        let mut backoff = Duration::from_millis(20);
        let mut tries = 0;
        loop {
            tries += 1;
            if tries > 1 && inner.store.is_redlock() {
                attempt.renew_token(self.new_token());
            }
            let args = AcquireArgs {
                fresh_token: !attempt.sent,
                ..args
            };
            attempt.sent = true;
            let call = inner
                .store
                .acquire(attempt.keys, &attempt.token, waiter, args);
            let reply = match bound {
                Some(bound) => tokio::time::timeout_at(bound, call)
                    .await
                    .unwrap_or_else(|_| Err(BackendError::deadline())),
                None => call.await,
            };
            if reply.is_ok() {
                inner.answered();
            }
            match reply {
                Ok(Outcome::Acquired) => return Ok(Try::Won),
                Ok(Outcome::Busy { ttl, holder }) => {
                    let holder = holder.and_then(|value| self.holder_in(&value));
                    return Ok(Try::Busy(Seen { ttl, holder }));
                }
                Ok(Outcome::NotReplicated { acked }) => {
                    return Err(LockError::NotReplicated {
                        key: self.key.clone(),
                        acked,
                        wanted: inner.store.min_replicas().map_or(0, |m| m.replicas),
                    })
                }
                Err(error) => {
                    let retry_at = Instant::now() + backoff;
                    let in_time = bound.is_none_or(|b| retry_at < b);
                    if error.is_transient() && in_time {
                        tracing::debug!(%error, "acquire failed; retrying");
                        tokio::time::sleep_until(retry_at).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                        continue;
                    }
                    return Err(LockError::backend_on(attempt.keys, &self.key, error));
                }
            }
        }
    }
}

/// `places` places of a local `queue`, first come first served, by `when`'s deadline (at
/// once for a zero wait); counted as queued in `local_key` meanwhile, when given (the local
/// handoff looks at it). `None` when the wait ran out.
async fn queue_for(
    queue: &Arc<Semaphore>,
    places: u32,
    when: When,
    local_key: Option<&LocalKeyRef<Hold>>,
) -> Option<OwnedSemaphorePermit> {
    if when.try_once {
        return queue.clone().try_acquire_many_owned(places).ok();
    }
    let _queued = local_key.map(|local_key| local_key.queued());
    let queued = queue.clone().acquire_many_owned(places);
    match when.deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, queued).await.ok(),
        None => Some(queued.await),
    }
    .and_then(Result::ok)
}

/// Whether a release message names a waiter other than `token`: the release of a semaphore
/// or a fair lock names the first waiter in line (`scripts/permit_release.lua`,
/// `scripts/release.lua`), and the others would only find the lock or permits kept for it.
/// `1` (and the empty message of a wake-up after a reconnection) is for every waiter.
fn turn_of_another(message: &str, token: &str) -> bool {
    !message.is_empty() && message != "1" && message != token
}

/// 128 random bits from the thread-local CSPRNG, as 32 hex digits.
pub(crate) fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// `base` scaled by a random factor in [0.75, 1.25].
fn jitter(base: Duration) -> Duration {
    base.mul_f64(0.75 + rand::random::<f64>() * 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_and_unique() {
        let tokens: std::collections::HashSet<String> = (0..100_000).map(|_| new_token()).collect();
        assert_eq!(tokens.len(), 100_000);
        assert!(tokens.iter().all(|t| t.len() == 32));
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..1000 {
            let j = jitter(Duration::from_millis(1000));
            assert!(j >= Duration::from_millis(750) && j <= Duration::from_millis(1250));
        }
    }
}
