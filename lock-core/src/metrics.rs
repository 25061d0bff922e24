//! The kit's metrics, recorded through the [`metrics`](https://docs.rs/metrics) facade with the
//! feature `metrics`: the application installs the recorder (a Prometheus exporter, say) and
//! the kit's numbers appear next to its own. Without the feature nothing is recorded and the
//! recording calls compile to nothing.
//!
//! Every name starts with `lock_`. Labels are bounded: `kind` is the kind of lock (`mutex`
//! for [`lock`](crate::Locker::lock), [`write`](crate::Locker::write) and each key of
//! [`lock_all`](crate::Locker::lock_all); `read`, `fair`, `semaphore`), `operation`, `outcome`
//! and `reason` take the values listed below. Keys are never labels: they are unbounded.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `lock_acquisitions_total` | counter | `kind`, `outcome` | acquires by how they ended: `acquired` (in Redis, or handed over by the previous local holder), `reentered` (a nested guard of a lock the task holds), `busy` (the wait ran out), `skipped` (the wait ran out under [`skip_if_busy`](crate::Acquire::skip_if_busy): expected, not contention), `cancelled` (the acquire future was dropped), or the error: `backend`, `timeout`, `tls`, `wrong_type`, `not_replicated`, `lost` (a nested acquire of a lost lock), `invalid_key`, `config`, `write_inside_read`, `shut_down` (the locker was shut down), `other` |
//! | `lock_acquire_wait_seconds` | histogram | `kind`, `outcome` | how long an acquire took from its start to that outcome: the wait, local queue included (`reentered` is not recorded: it never waits) |
//! | `lock_acquire_call_seconds` | histogram | `kind`, `outcome` | the latency of one acquire call to Redis (a try: `SET NX` or the acquire script, its retries on one node, or a RedLock quorum round), by its answer: `acquired`, `busy`, `not_replicated`, `cancelled` (cut at the acquire's deadline or dropped), or the error `backend`, `timeout`, `tls`, `wrong_type`. A waiting acquire makes several |
//! | `lock_backend_errors_total` | counter | `operation`, `outcome` | Redis failures of the calls other than acquire, release and renewal (those count theirs above): `operation` `fence` (issuing a fencing token), `extend`, `is_locked`, `inspect`, `force_unlock`; `outcome` `backend`, `timeout`, `tls`, `wrong_type` |
//! | `lock_waiters` | gauge | `kind` | acquires of this process under way right now (queued locally or waiting in Redis) |
//! | `lock_held` | gauge | `kind` | locks this process holds right now: acquisitions whose outermost guard is alive (a lost lock counts until its guard is released or dropped; nested guards do not count) |
//! | `lock_hold_seconds` | histogram | `kind`, `outcome` | how long a lock was held, from its grant to its release, by the release's `outcome` (as `lock_releases_total`) |
//! | `lock_releases_total` | counter | `kind`, `outcome` | releases of held locks (explicit, or of a dropped guard): `released` (deleted in Redis while ours), `handed_over` (to the next local waiter without a Redis round trip), `lost` (it had been lost), `failed` (Redis failed; the key expires with its lease) |
//! | `lock_lost_total` | counter | `kind`, `reason` | locks lost, once per lock, by [`LostReason`](crate::LostReason): `expired`, `taken_over`, `deleted`, `server_restarted`, `max_hold`, `unknown`, `renewal_stopped`, `shutdown` (given back by [`Locker::shutdown`](crate::Locker::shutdown)) |
//! | `lock_renewals_total` | counter | `kind`, `outcome` | watchdog renewals, one per lock and tick: `renewed`, `lost` (the renewal found the lock gone or taken), `failed` (no answer: Redis unreachable, no RedLock majority; the lock turns lost if this lasts until its lease ends) |
//! | `lock_renewal_calls_total` | counter | | renewal script calls the watchdog sent: one per tick, node and kind of lock for up to 500 locks (one per lock on a Cluster), not one per lock (as [`LockerStats::renewal_calls`](crate::LockerStats)) |
//!
//! Useful signals: a rising `busy` or `lock_acquire_wait_seconds` is contention; a rising
//! `lock_acquire_call_seconds` is a slow Redis (or network), whatever the contention;
//! `backend`/`timeout`, renewals that `failed` and `lock_backend_errors_total` are Redis trouble; any `lock_lost_total` (but `shutdown`) is
//! worth an alert (a holder ran without its lock; fencing tokens are the safety net);
//! `lock_hold_seconds` shows critical sections longer than expected.
//!
//! Descriptions (the `HELP` lines of a Prometheus exporter) are registered when a locker is
//! built; an application that installs its recorder after that calls [`describe`] itself.
//!
//! ```ignore
//! // With metrics-exporter-prometheus, before building the locker:
//! metrics_exporter_prometheus::PrometheusBuilder::new().install()?;
//! let locker = lock_core::Locker::connect("redis://127.0.0.1:6379").await?;
//! ```

/// Counter: acquires by `kind` and `outcome`.
pub const ACQUISITIONS: &str = "lock_acquisitions_total";
/// Histogram (seconds): acquire time by `kind` and `outcome`.
pub const ACQUIRE_WAIT: &str = "lock_acquire_wait_seconds";
/// Histogram (seconds): latency of one acquire call to Redis by `kind` and `outcome`.
pub const ACQUIRE_CALL: &str = "lock_acquire_call_seconds";
/// Counter: Redis failures of fencing, extension and operator calls by `operation` and
/// `outcome`.
pub const BACKEND_ERRORS: &str = "lock_backend_errors_total";
/// Gauge: acquires under way by `kind`.
pub const WAITERS: &str = "lock_waiters";
/// Gauge: locks held by `kind`.
pub const HELD: &str = "lock_held";
/// Histogram (seconds): hold time by `kind` and release `outcome`.
pub const HOLD: &str = "lock_hold_seconds";
/// Counter: releases by `kind` and `outcome`.
pub const RELEASES: &str = "lock_releases_total";
/// Counter: losses by `kind` and `reason`.
pub const LOST: &str = "lock_lost_total";
/// Counter: watchdog renewals by `kind` and `outcome`.
pub const RENEWALS: &str = "lock_renewals_total";
/// Counter: renewal script calls.
pub const RENEWAL_CALLS: &str = "lock_renewal_calls_total";

/// How a release of a held lock ended, the `outcome` of `lock_releases_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) enum ReleaseOutcome {
    Released,
    HandedOver,
    Lost,
    Failed,
}

impl ReleaseOutcome {
    /// The label, also the `outcome` of the `lock.release` and `lock.hold` spans.
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::HandedOver => "handed_over",
            Self::Lost => "lost",
            Self::Failed => "failed",
        }
    }
}

/// A call whose Redis failures `lock_backend_errors_total` counts, its `operation` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) enum Operation {
    Fence,
    Extend,
    IsLocked,
    Inspect,
    ForceUnlock,
}

impl Operation {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const fn as_str(self) -> &'static str {
        match self {
            Self::Fence => "fence",
            Self::Extend => "extend",
            Self::IsLocked => "is_locked",
            Self::Inspect => "inspect",
            Self::ForceUnlock => "force_unlock",
        }
    }
}

/// The `outcome` of an acquire: the label of `lock_acquisitions_total` and the field of the
/// `lock.acquire` span.
pub(crate) fn acquire_outcome(
    result: &Result<crate::LockGuard, crate::LockError>,
    reentered: bool,
) -> &'static str {
    use crate::LockError;
    match result {
        Ok(_) if reentered => "reentered",
        Ok(_) => "acquired",
        Err(error) => match error {
            LockError::Busy { .. } => "busy",
            LockError::Backend { source, .. } if source.is_timeout() => "timeout",
            LockError::Backend { .. } => "backend",
            LockError::Tls { .. } => "tls",
            LockError::WrongType { .. } => "wrong_type",
            LockError::NotReplicated { .. } => "not_replicated",
            LockError::Lost { .. } => "lost",
            LockError::InvalidKey { .. } => "invalid_key",
            LockError::Config(_) => "config",
            LockError::WriteInsideRead { .. } => "write_inside_read",
            LockError::ShutDown => "shut_down",
            _ => "other",
        },
    }
}

pub use record::describe;
pub(crate) use record::{
    backend_error, held, lost, released, renewal_calls, renewed, unheld, AcquireCall, Acquisition,
};

#[cfg(feature = "metrics")]
mod record {
    use ::metrics::{
        counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit,
    };
    use tokio::time::Instant;

    use super::*;
    use crate::backend_error::BackendError;
    use crate::error::LostReason;
    use crate::kind::Kind;

    /// Registers the descriptions (and units) of every metric of the kit with the installed
    /// recorder. Called when a locker is built; call it again after installing a recorder
    /// later than that. Does nothing without the feature `metrics`.
    pub fn describe() {
        describe_counter!(ACQUISITIONS, "Lock acquires by kind and outcome");
        describe_histogram!(
            ACQUIRE_WAIT,
            Unit::Seconds,
            "Time from the start of a lock acquire to its outcome"
        );
        describe_histogram!(
            ACQUIRE_CALL,
            Unit::Seconds,
            "Latency of one acquire call to Redis, by its answer"
        );
        describe_counter!(
            BACKEND_ERRORS,
            "Redis failures of fencing, extension and operator calls"
        );
        describe_gauge!(WAITERS, "Lock acquires under way");
        describe_gauge!(HELD, "Locks held by this process");
        describe_histogram!(
            HOLD,
            Unit::Seconds,
            "Time a lock was held, by release outcome"
        );
        describe_counter!(RELEASES, "Releases of held locks by outcome");
        describe_counter!(LOST, "Locks lost, by reason");
        describe_counter!(RENEWALS, "Watchdog lease renewals, per lock, by outcome");
        describe_counter!(RENEWAL_CALLS, "Renewal script calls sent by the watchdog");
    }

    /// The `outcome` label of a Redis failure.
    fn backend_outcome(error: &BackendError) -> &'static str {
        if error.is_timeout() {
            "timeout"
        } else if error.is_tls() {
            "tls"
        } else if error.is_wrong_type() {
            "wrong_type"
        } else {
            "backend"
        }
    }

    /// One acquire call to Redis, timed until its answer (`cancelled` if dropped first).
    #[derive(Debug)]
    pub(crate) struct AcquireCall {
        kind: &'static str,
        started: Instant,
        done: bool,
    }

    impl AcquireCall {
        pub(crate) fn start(kind: Kind) -> Self {
            Self {
                kind: kind.label(),
                started: Instant::now(),
                done: false,
            }
        }

        /// Records the call's latency by its answer (the outcome's label, see
        /// `store::Outcome::label`).
        pub(crate) fn finish(mut self, result: Result<&'static str, &BackendError>) {
            let outcome = result.unwrap_or_else(backend_outcome);
            self.record(outcome);
        }

        fn record(&mut self, outcome: &'static str) {
            self.done = true;
            histogram!(ACQUIRE_CALL, "kind" => self.kind, "outcome" => outcome)
                .record(self.started.elapsed().as_secs_f64());
        }
    }

    impl Drop for AcquireCall {
        fn drop(&mut self) {
            if !self.done {
                self.record("cancelled");
            }
        }
    }

    /// A Redis failure of `operation`.
    pub(crate) fn backend_error(operation: Operation, error: &BackendError) {
        counter!(BACKEND_ERRORS, "operation" => operation.as_str(), "outcome" => backend_outcome(error))
            .increment(1);
    }

    /// One acquire: counted once it ends (`cancelled` if its future is dropped first), and a
    /// waiter while it waits.
    #[derive(Debug)]
    pub(crate) struct Acquisition {
        kind: &'static str,
        started: Instant,
        waiting: bool,
        done: bool,
    }

    impl Acquisition {
        pub(crate) fn start(kind: Kind, started: Instant) -> Self {
            Self {
                kind: kind.label(),
                started,
                waiting: false,
                done: false,
            }
        }

        /// The acquire has to take the lock (it is not a reentry or a refusal): a waiter
        /// until it ends.
        pub(crate) fn waiting(&mut self) {
            if !self.waiting {
                self.waiting = true;
                gauge!(WAITERS, "kind" => self.kind).increment(1.0);
            }
        }

        /// Records how the acquire ended (its [`acquire_outcome`]); `reentered`: the guard is a
        /// nested one.
        pub(crate) fn finish(&mut self, outcome: &'static str, reentered: bool) {
            self.end(outcome, !reentered);
        }

        fn end(&mut self, outcome: &'static str, timed: bool) {
            self.done = true;
            counter!(ACQUISITIONS, "kind" => self.kind, "outcome" => outcome).increment(1);
            if timed {
                histogram!(ACQUIRE_WAIT, "kind" => self.kind, "outcome" => outcome)
                    .record(self.started.elapsed().as_secs_f64());
            }
            if std::mem::take(&mut self.waiting) {
                gauge!(WAITERS, "kind" => self.kind).decrement(1.0);
            }
        }
    }

    impl Drop for Acquisition {
        fn drop(&mut self) {
            if !self.done {
                self.end("cancelled", true);
            }
        }
    }

    /// A lock was registered as held.
    pub(crate) fn held(kind: Kind) {
        gauge!(HELD, "kind" => kind.label()).increment(1.0);
    }

    /// A held lock's outermost guard left.
    pub(crate) fn unheld(kind: Kind) {
        gauge!(HELD, "kind" => kind.label()).decrement(1.0);
    }

    /// A held lock's release ended with `outcome` after it was held since `since`.
    pub(crate) fn released(kind: Kind, outcome: ReleaseOutcome, since: Instant) {
        let (kind, outcome) = (kind.label(), outcome.as_str());
        counter!(RELEASES, "kind" => kind, "outcome" => outcome).increment(1);
        histogram!(HOLD, "kind" => kind, "outcome" => outcome)
            .record(since.elapsed().as_secs_f64());
    }

    /// A lock was marked lost.
    pub(crate) fn lost(kind: Kind, reason: LostReason) {
        counter!(LOST, "kind" => kind.label(), "reason" => reason.as_str()).increment(1);
    }

    /// The watchdog's renewal of one lock answered `outcome` (`store::Renewal::label`).
    pub(crate) fn renewed(kind: Kind, outcome: &'static str) {
        counter!(RENEWALS, "kind" => kind.label(), "outcome" => outcome).increment(1);
    }

    /// The watchdog sent `calls` renewal script calls.
    pub(crate) fn renewal_calls(calls: u64) {
        counter!(RENEWAL_CALLS).increment(calls);
    }
}

/// Without the feature: the same calls, doing nothing (and inlined away).
#[cfg(not(feature = "metrics"))]
mod record {
    use tokio::time::Instant;

    use super::{Operation, ReleaseOutcome};
    use crate::backend_error::BackendError;
    use crate::error::LostReason;
    use crate::kind::Kind;

    /// Registers the descriptions (and units) of every metric of the kit with the installed
    /// recorder. Called when a locker is built; call it again after installing a recorder
    /// later than that. Does nothing without the feature `metrics`.
    #[inline(always)]
    pub fn describe() {}

    #[derive(Debug)]
    pub(crate) struct Acquisition;

    impl Acquisition {
        #[inline(always)]
        pub(crate) fn start(_: Kind, _: Instant) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn waiting(&mut self) {}

        #[inline(always)]
        pub(crate) fn finish(&mut self, _: &'static str, _: bool) {}
    }

    #[derive(Debug)]
    pub(crate) struct AcquireCall;

    impl AcquireCall {
        #[inline(always)]
        pub(crate) fn start(_: Kind) -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn finish(self, _: Result<&'static str, &BackendError>) {}
    }

    #[inline(always)]
    pub(crate) fn backend_error(_: Operation, _: &BackendError) {}

    #[inline(always)]
    pub(crate) fn held(_: Kind) {}

    #[inline(always)]
    pub(crate) fn unheld(_: Kind) {}

    #[inline(always)]
    // Takes the start of the hold, not its length: without the feature the clock is not read.
    pub(crate) fn released(_: Kind, _: ReleaseOutcome, _: Instant) {}

    #[inline(always)]
    pub(crate) fn lost(_: Kind, _: LostReason) {}

    #[inline(always)]
    pub(crate) fn renewed(_: Kind, _: &'static str) {}

    #[inline(always)]
    pub(crate) fn renewal_calls(_: u64) {}
}
