//! [`Acquire`]: the configurable, awaitable acquisition of one lock.
//!
//! The builder and its future are here, with the frame of one acquire (`run`, `take`); what
//! differs between kinds is asked of [`Kind`]. The rest is a file per step:
//! `local_order.rs` (the local key and the order of local queue and Redis, local handoffs),
//! `in_redis.rs` (the tries in Redis), `wait.rs` (what one wait in Redis holds between tries),
//! `report.rs` (spans, logs and the outcome label), `shut_down.rs` (how a shutdown ends an
//! acquire).
//!
//! The steps an uncontended acquire awaits (`run`, `take`, `local_then_in_redis`,
//! `acquire_in_redis`, `try_once`) are written `fn .. -> impl Future { async move { .. } }`,
//! not `async fn`: an `async fn`'s future keeps its arguments twice (as it captured them, and
//! moved into its body), and each step's future holds the next one's, so the acquire's future
//! was 2,056 bytes where it is 1,520 written this way. The acquire's future is built in its box
//! (`in_box`), not moved there: a move copied all of it, uninitialised bytes included.

mod in_redis;
mod local_order;
mod report;
mod shut_down;
mod wait;

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, Span};

use crate::error::{ConfigError, DurationSetting, LockError};
use crate::guard::LockGuard;
use crate::held::{Grant, Hold, LeaseMode, Terms};
use crate::in_box::in_box;
use crate::key::{self, RedisKeys};
use crate::kind::{Kind, Order};
use crate::limits;
use crate::local::LocalLocks;
use crate::local_key::LocalKeyRef;
use crate::locker::{Inner, Locker};
use crate::metrics;
use crate::owner::Owner;
use crate::token::Token;
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
/// waiting then ends at once, one whose Redis call is under way when its answer comes).
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
    kind: Kind,
    /// Semaphore permits taken at once (1 for a lock).
    permits: u32,
    wait: Option<Duration>,
    lease: Option<Duration>,
    max_hold: Option<Duration>,
    /// What [`with_lock`](Self::with_lock) does on a loss.
    on_lost: OnLost,
    /// Started by [`skip_if_busy`](Self::skip_if_busy): a busy answer is counted as a skip.
    skip: bool,
    /// A try's Redis call is under way (see `shut_down.rs`).
    in_call: AtomicBool,
}

impl Acquire {
    pub(crate) fn new(locker: Locker, key: String, kind: Kind) -> Self {
        Self {
            locker,
            key,
            kind,
            permits: 1,
            wait: None,
            lease: None,
            max_hold: None,
            on_lost: OnLost::Abort,
            skip: false,
            in_call: AtomicBool::new(false),
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
    /// counts TTLs in milliseconds; from 3 ms on RedLock, whose drift allowance, 2 ms and a
    /// hundredth of the lease, leaves a shorter lease no validity) to 365 days
    /// ([`MAX_LEASE`](crate::MAX_LEASE)); the acquire refuses anything else with
    /// [`ConfigError::OutOfRange`](crate::ConfigError::OutOfRange) before asking Redis.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// The longest a watchdog lock is held (overrides the locker's `max_hold`): the watchdog's
    /// last renewals are cut so that the key ends in Redis when the hold does, even if the
    /// holder hangs and never releases, and the guard then reports
    /// [`LostReason::MaxHold`](crate::LostReason::MaxHold). Any value: zero ends the lock at
    /// once (a 1 ms lease), and a `max_hold` beyond 100 years is no limit (so `Duration::MAX`
    /// lifts the locker's). A fixed [`lease`](Self::lease) ignores it. On RedLock, which grants
    /// no lease under 3 ms, a watchdog acquire with a shorter one is refused with
    /// [`ConfigError::MaxHoldTooShortForRedLock`](crate::ConfigError::MaxHoldTooShortForRedLock).
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

    /// The locker's shared state, what every step of the acquire asks (its settings, local
    /// locks, store); the one place the acquire reaches into the `Locker`.
    fn inner(&self) -> &Inner {
        &self.locker.inner
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
        let span = report::acquire_span(self.kind, &self.key, self.permits);
        let caller = report::hold_parent(self.inner().settings.trace_holds);
        // Without a subscriber for the span, not wrapped in `Instrumented`, whose every poll
        // enters and leaves the span.
        let inner: Pin<Box<dyn Future<Output = _> + Send>> = if span.is_disabled() {
            in_box(|| self.run(span, caller))
        } else {
            in_box(|| self.run(span.clone(), caller).instrument(span))
        };
        AcquireFuture { inner }
    }
}

/// The guard of a lock granted on `terms`: its hold, registered with the locker's local locks.
///
/// Not inlined into the acquire's state machine: built there, the hold (200 bytes, then moved
/// into its `Arc`) took room in the acquire's own stack frame, which stays above the frames of
/// the Redis call's every poll, so one cycle touched those stack lines as well; called, it is
/// built lower down, in stack the Redis call used already. The data an uncontended cycle
/// touches is just over the data cache (32 KB): cachegrind, one task, 503 -> 451 misses a cycle.
#[inline(never)]
fn guard_for(
    local: &Arc<LocalLocks>,
    terms: Terms,
    grant: Grant,
    local_key: LocalKeyRef<Hold>,
    places: u32,
) -> LockGuard {
    let held = local.register(Hold::new(terms, grant, local_key, places));
    LockGuard::new(local.clone(), held)
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

impl When {
    /// When every Redis call of the acquire ends: the deadline, or one command (`one_try`,
    /// with its `WAIT` for replicas) after the start when the wait is shorter, so that a zero
    /// wait still gets one try.
    fn bound(&self, one_try: Duration) -> Option<Instant> {
        self.deadline.map(|d| d.max(self.started + one_try))
    }
}

/// What a try that found the lock taken learned of its holder, for a `Busy` answer.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// The holder's remaining lease, when Redis reported one.
    ttl: Option<Duration>,
    /// The holder's name, when its stored value carries one.
    holder: Option<String>,
}

impl Acquire {
    /// The acquire, run in `span` (the `lock.acquire` span, which gets its outcome); a lock
    /// it takes gets its `lock.hold` span under `caller`.
    // Not `async fn`: see the module's documentation of `acquire`.
    #[allow(clippy::manual_async_fn)]
    fn run(
        self,
        span: Span,
        caller: Span,
    ) -> impl Future<Output = Result<LockGuard, LockError>> + Send {
        async move {
            let mut outcome = report::SpanOutcome::new(&span);
            let started = Instant::now();
            let mut metric = metrics::Acquisition::start(self.kind, started);
            let mut reentered = false;
            let local = &self.inner().local;
            // Counted until it ends, so that a shutdown waits for what it leaves behind.
            let _working = local.in_flight.enter();
            let result = {
                let take = std::pin::pin!(self.take(started, &mut metric, &mut reentered));
                shut_down::until_shut_down(local, &self.in_call, take).await
            };
            let result = match result {
                Ok(guard) if local.is_closed() => {
                    // Granted while the locker shut down: given back at once (the shutdown may
                    // have listed the held locks before this one was registered).
                    drop(Box::pin(guard.release()).await);
                    Err(LockError::ShutDown)
                }
                result => result,
            };
            let label = report::outcome_label(&result, reentered, self.skip);
            metric.finish(label, reentered);
            outcome.record(label);
            if let (Ok(guard), false) = (&result, reentered) {
                let trace_holds = self.inner().settings.trace_holds;
                guard.set_hold_span(report::hold_span(&caller, &self.key, trace_holds));
                report::granted(&self.key, started);
            }
            result
        }
    }

    /// The acquire itself; `reentered` is set when the answer is about a lock the task
    /// already holds (a nested guard, or the loss of that lock).
    // Not `async fn`: see the module's documentation of `acquire`.
    #[allow(clippy::manual_async_fn)]
    fn take<'a>(
        &'a self,
        started: Instant,
        metric: &'a mut metrics::Acquisition,
        reentered: &'a mut bool,
    ) -> impl Future<Output = Result<LockGuard, LockError>> + 'a {
        async move {
            key::validate(&self.key)?;
            let (mode, max_hold) = self.lease_terms()?;
            let when = self.when(started);
            // Captured at first poll, inside the task that awaits the acquire.
            let owner = Owner::current();
            let local_key = loop {
                match self.local_key(owner) {
                    Ok((local_key, None)) => break local_key,
                    // This task holds the lock, with a guard in use in another task: it waits
                    // for that guard, then nests (its own lock's place would never come).
                    Ok((local_key, Some(own))) => {
                        if !self.wait_for_own(&own, owner, when).await {
                            break local_key;
                        }
                    }
                    Err(answer) => {
                        // Only a nested guard or the loss of the held lock is about a lock the
                        // task holds; other refusals are not.
                        *reentered = matches!(answer, Ok(_) | Err(LockError::Lost { .. }));
                        return answer;
                    }
                }
            };
            metric.waiting();
            // The fair lock's and the semaphore's orders boxed: the mutex's uncontended acquire
            // would otherwise carry (and copy as it starts) the largest of the three states.
            let (permit, grant) = match self.kind.order() {
                Order::LineFirst => {
                    Box::pin(self.in_line_then_local(&local_key, mode, when)).await?
                }
                Order::LocalFirst => self.local_then_in_redis(&local_key, mode, when).await?,
                Order::PermitsTurn { limit } => {
                    Box::pin(self.permits_in_order(&local_key, limit, mode, when)).await?
                }
            };
            let terms = Terms {
                owner,
                mode,
                max_hold,
            };
            // The places pass to the hold, which gives them back through its local key.
            let places = permit.keep();
            Ok(guard_for(
                &self.inner().local,
                terms,
                grant,
                local_key,
                places,
            ))
        }
    }

    /// How the lock's lease is kept, and the longest it may be held.
    fn lease_terms(&self) -> Result<(LeaseMode, Option<Duration>), LockError> {
        let settings = &self.inner().settings;
        // Saturated here, where every max_hold arrives: the watchdog adds it to an `Instant`.
        let max_hold = self
            .max_hold
            .or(settings.max_hold)
            .and_then(limits::max_hold);
        let mode = match self.lease {
            Some(lease) => LeaseMode::Fixed(self.check_lease(lease)?),
            // A watchdog lease never outlives the max_hold: the key ends in Redis when the hold
            // does, even if the holder is stuck and never releases.
            None => {
                if let Some(max) = max_hold {
                    limits::check_max_hold(max, self.inner().store.is_redlock())?;
                }
                LeaseMode::Watchdog(limits::lease_within(settings.watchdog_lease, max_hold))
            }
        };
        Ok((mode, max_hold))
    }

    /// A fixed lease within its range: 1 ms to [`MAX_LEASE`](crate::MAX_LEASE), from 3 ms on
    /// RedLock (see [`limits::MIN_REDLOCK_LEASE`]).
    fn check_lease(&self, lease: Duration) -> Result<Duration, ConfigError> {
        let min = if self.inner().store.is_redlock() {
            limits::MIN_REDLOCK_LEASE
        } else {
            limits::MIN_LEASE
        };
        limits::check(DurationSetting::Lease, lease, min, crate::MAX_LEASE)
    }

    /// The time frame of an acquire started at `started`.
    fn when(&self, started: Instant) -> When {
        let wait = self.wait.unwrap_or(self.inner().settings.default_wait);
        When {
            started,
            deadline: limits::wait(wait).and_then(|wait| started.checked_add(wait)),
            try_once: wait.is_zero(),
        }
    }

    /// The Redis names this acquire takes.
    fn redis_keys(&self) -> RedisKeys {
        self.inner().keys_of(&self.key, self.kind)
    }

    /// A fresh token for a try.
    fn new_token(&self) -> Token {
        self.inner().new_token(self.kind, self.permits)
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
}
