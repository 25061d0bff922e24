//! What an acquire tells of itself: its `lock.acquire` span and outcome, the `lock.hold` span
//! of the lock it took, and the log line of a grant.

use std::time::Duration;

use tokio::time::Instant;

use tracing::Span;

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::key::ShownKey;
use crate::kind::Kind;
use crate::metrics;

/// An acquire that waited at least this long is logged at info level when it gets the lock
/// (quicker ones at debug): long waits are what an operator looks for, and they are rare
/// enough not to flood the log.
const LONG_WAIT: Duration = Duration::from_secs(1);

/// The `lock.acquire` span of an acquire of `key` as `kind` (of `permits` permits for a
/// semaphore).
pub(super) fn acquire_span(kind: Kind, key: &str, permits: u32) -> Span {
    // The macros check the level first: a disabled span formats nothing and allocates
    // nothing (the uncontended acquire's hot path).
    let outcome = tracing::field::Empty;
    match kind {
        Kind::Exclusive => tracing::debug_span!("lock.acquire", key = %key, outcome),
        Kind::Fair => tracing::debug_span!("lock.acquire", key = %key, fair = true, outcome),
        Kind::Shared => tracing::debug_span!("lock.acquire", key = %key, read = true, outcome),
        Kind::Permits { limit } => {
            tracing::debug_span!("lock.acquire", key = %key, permits = permits, of = limit, outcome)
        }
    }
}

/// The span the `lock.hold` span goes under: the caller's, not the acquire's, which ends
/// when the lock is granted. Looked up only when a subscriber may want the hold span.
pub(super) fn hold_parent(trace_holds: bool) -> Span {
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
pub(super) fn hold_span(parent: &Span, key: &str, trace_holds: bool) -> Span {
    let outcome = tracing::field::Empty;
    if trace_holds {
        tracing::info_span!(parent: parent, "lock.hold", key = %ShownKey(key), outcome)
    } else {
        tracing::debug_span!(parent: parent, "lock.hold", key = %ShownKey(key), outcome)
    }
}

/// The outcome label of an acquire, for its metric and span.
pub(super) fn outcome_label(
    result: &Result<LockGuard, LockError>,
    reentered: bool,
    skip: bool,
) -> &'static str {
    match metrics::acquire_outcome(result, reentered) {
        // Expected, not contention: kept apart so that `busy` still measures contention.
        "busy" if skip => "skipped",
        label => label,
    }
}

/// Logs a grant of an acquire started at `started`: at info level after a long wait.
pub(super) fn granted(key: &str, started: Instant) {
    // The clock is read only for a subscriber that may log the grant.
    if !tracing::level_enabled!(tracing::Level::INFO) {
        return;
    }
    let waited = started.elapsed();
    if waited >= LONG_WAIT {
        tracing::info!(key = %ShownKey(key), ?waited, "lock acquired after a long wait");
    } else {
        tracing::debug!(?waited, "lock acquired");
    }
}

/// Records `cancelled` as the `lock.acquire` span's outcome if the acquire is dropped before
/// it ends.
pub(super) struct SpanOutcome<'a> {
    span: &'a Span,
    recorded: bool,
}

impl<'a> SpanOutcome<'a> {
    pub(super) fn new(span: &'a Span) -> Self {
        Self {
            span,
            recorded: false,
        }
    }

    pub(super) fn record(&mut self, outcome: &'static str) {
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
