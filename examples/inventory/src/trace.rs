//! What an instance records of the purchases it serves, for the demo's report.
//!
//! While recording is on (`PUT /debug/trace`), every purchase request that carries a
//! [`PURCHASE_HEADER`] becomes one [`Attempt`]: when it arrived, when the lock was taken,
//! when the stock was read and written, a chaos stall, a write the fencing token refused,
//! when the lock was let go, and the answer. `GET /debug/trace` hands the attempts over and
//! starts a fresh list.
//!
//! Every timestamp is [`now_ns`], `CLOCK_MONOTONIC`: one clock for every process of the
//! machine, so the instances' timelines and the demo client's line up without any clock
//! correction.

use std::cell::RefCell;
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use crate::service::AppState;

/// The request header naming the purchase an attempt belongs to (the demo's own number; a
/// purchase that is retried sends it again).
pub const PURCHASE_HEADER: &str = "x-purchase-id";

/// At most this many attempts are kept between two `GET /debug/trace`, so an instance left
/// recording cannot grow without bound.
const MAX_ATTEMPTS: usize = 200_000;

/// `CLOCK_MONOTONIC` in nanoseconds. Unlike `std::time::Instant`, the raw value is the same
/// clock in every process of the machine, so timestamps taken by different processes compare.
pub fn now_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(now) => {
            let secs = u64::try_from(now.tv_sec()).unwrap_or(0);
            let nanos = u64::try_from(now.tv_nsec()).unwrap_or(0);
            secs * 1_000_000_000 + nanos
        }
        // CLOCK_MONOTONIC exists on every Linux; 0 would only make a report look empty.
        Err(_) => 0,
    }
}

/// A stretch of time, in [`now_ns`] nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// When it began.
    pub start: u64,
    /// When it ended.
    pub end: u64,
}

/// One purchase request as the instance that served it saw it. Timestamps are [`now_ns`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The purchase, from [`PURCHASE_HEADER`].
    pub purchase: u64,
    /// The instance's name.
    pub instance: String,
    /// The request reached the router (before any lock layer).
    pub received: u64,
    /// The code knew it held the lock: the acquire returned, or, under the macro and the
    /// layer, the locked body or handler started.
    pub acquired: Option<u64>,
    /// For a fixed lease: when the lock is certainly still ours until, as the guard knew it
    /// right after the acquire (it counts from when the acquire was sent, minus a margin).
    pub lease_end: Option<u64>,
    /// Reading the stock.
    pub read: Option<Span>,
    /// The stock read.
    pub stock_read: Option<i64>,
    /// A chaos stall right before the write.
    pub stall: Option<Span>,
    /// Writing the stock and the order (absent when nothing was written).
    pub write: Option<Span>,
    /// The stock written.
    pub stock_written: Option<i64>,
    /// The order inserted with the write; order ids follow the commit order.
    pub order_id: Option<i64>,
    /// When the database refused the claim or the write for a stale fencing token.
    pub stale_at: Option<u64>,
    /// The code let go of the lock: the release was called, or the locked body or handler
    /// ended.
    pub releasing: Option<u64>,
    /// The response left the router.
    pub responded: u64,
    /// The response's status code.
    pub status: u16,
}

tokio::task_local! {
    /// The attempt of the request this task serves; the handlers and the service write to it.
    static CURRENT: RefCell<Attempt>;
}

/// The attempts an instance recorded; not recording until [`start`](Self::start).
#[derive(Debug, Default)]
pub struct TraceLog {
    attempts: Mutex<Option<Vec<Attempt>>>,
}

impl TraceLog {
    /// Starts recording, forgetting what was recorded before.
    pub fn start(&self) {
        *self.lock() = Some(Vec::new());
    }

    /// Stops recording and forgets what was recorded.
    pub fn stop(&self) {
        *self.lock() = None;
    }

    /// The attempts recorded since the last take; recording goes on (if it was on).
    pub fn take(&self) -> Vec<Attempt> {
        self.lock().as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn is_recording(&self) -> bool {
        self.lock().is_some()
    }

    fn push(&self, attempt: Attempt) {
        if let Some(attempts) = self.lock().as_mut() {
            if attempts.len() < MAX_ATTEMPTS {
                attempts.push(attempt);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<Attempt>>> {
        // A panic while pushing cannot leave the list half-written: take the data regardless.
        self.attempts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The router middleware (outside every lock layer): records the request as an [`Attempt`]
/// when it names a purchase and the instance is recording.
pub(crate) async fn record(
    State(inventory): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let purchase = request
        .headers()
        .get(PURCHASE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let Some(purchase) = purchase.filter(|_| inventory.trace.is_recording()) else {
        return next.run(request).await;
    };
    let attempt = Attempt {
        purchase,
        instance: inventory.config.instance.clone(),
        received: now_ns(),
        ..Attempt::default()
    };
    let (response, mut attempt) = CURRENT
        .scope(RefCell::new(attempt), async move {
            let response = next.run(request).await;
            (response, CURRENT.with(RefCell::take))
        })
        .await;
    attempt.responded = now_ns();
    attempt.status = response.status().as_u16();
    inventory.trace.push(attempt);
    response
}

/// Writes to the current attempt, if this task serves a recorded one.
fn note(f: impl FnOnce(&mut Attempt, u64)) {
    let now = now_ns();
    let _ = CURRENT.try_with(|attempt| f(&mut attempt.borrow_mut(), now));
}

/// The lock is held; `remaining` is the guard's [`remaining`](lock_core::LockGuard::remaining)
/// for a fixed lease.
pub(crate) fn acquired(remaining: Option<Duration>) {
    note(|a, now| {
        a.acquired = Some(now);
        a.lease_end = remaining.map(|r| now + u64::try_from(r.as_nanos()).unwrap_or(u64::MAX));
    });
}

/// The stock read begins.
pub(crate) fn read_started() {
    note(|a, now| {
        a.read = Some(Span {
            start: now,
            end: now,
        })
    });
}

/// The stock read ended with `stock` (`None`: no such SKU, or a stale claim).
pub(crate) fn read_done(stock: Option<i64>) {
    note(|a, now| {
        if let Some(read) = &mut a.read {
            read.end = now;
        }
        a.stock_read = stock;
    });
}

/// A chaos stall begins.
pub(crate) fn stall_started() {
    note(|a, now| {
        a.stall = Some(Span {
            start: now,
            end: now,
        })
    });
}

/// The chaos stall ended.
pub(crate) fn stall_ended() {
    note(|a, now| {
        if let Some(stall) = &mut a.stall {
            stall.end = now;
        }
    });
}

/// The write begins.
pub(crate) fn write_started() {
    note(|a, now| {
        a.write = Some(Span {
            start: now,
            end: now,
        })
    });
}

/// The write committed `stock` and the order `order_id`.
pub(crate) fn written(stock: i64, order_id: i64) {
    note(|a, now| {
        if let Some(write) = &mut a.write {
            write.end = now;
        }
        a.stock_written = Some(stock);
        a.order_id = Some(order_id);
    });
}

/// The database refused the claim or the write: a later holder's fencing token is there.
pub(crate) fn stale() {
    note(|a, now| {
        // Nothing was written: a refused write is not a write.
        a.write = None;
        a.stale_at = Some(now);
    });
}

/// The code lets go of the lock.
pub(crate) fn releasing() {
    note(|a, now| a.releasing = Some(now));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn marks_land_in_the_current_attempt_only() {
        // Outside a recorded request the marks do nothing (and do not panic).
        read_started();
        let attempt = CURRENT
            .scope(RefCell::new(Attempt::default()), async {
                acquired(Some(Duration::from_millis(200)));
                read_started();
                read_done(Some(7));
                write_started();
                written(6, 1);
                releasing();
                CURRENT.with(RefCell::take)
            })
            .await;
        let acquired = attempt.acquired.expect("acquired");
        assert_eq!(attempt.lease_end, Some(acquired + 200_000_000));
        let read = attempt.read.expect("read");
        let write = attempt.write.expect("write");
        assert!(acquired <= read.start && read.start <= read.end && read.end <= write.start);
        assert_eq!(
            (attempt.stock_read, attempt.stock_written),
            (Some(7), Some(6))
        );
        assert!(attempt.releasing >= Some(write.end));
    }

    #[test]
    fn the_log_keeps_attempts_only_while_recording() {
        let log = TraceLog::default();
        log.push(Attempt::default());
        assert!(log.take().is_empty(), "not recording yet");
        log.start();
        log.push(Attempt::default());
        assert_eq!(log.take().len(), 1);
        assert!(log.take().is_empty(), "taken");
        log.stop();
        log.push(Attempt::default());
        assert!(log.take().is_empty());
    }
}
