//! What an instance records of the purchases it serves, for the demo's report.
//!
//! While recording is on (`PUT /debug/trace`), every purchase request that carries a
//! [`PURCHASE_HEADER`] becomes one [`Attempt`]: when it arrived, when the lock was taken,
//! when the stock was read and written, a chaos stall, a write the fencing token refused,
//! when the lock was let go, and the answer. `GET /debug/trace` hands the attempts over and
//! starts a fresh list.
//!
//! The service records nothing for the demo: [`record`], a middleware outside its router,
//! opens a `tracing` span per recorded request, and [`AttemptLayer`], a
//! `tracing-subscriber` layer, reads the service's own spans inside it (`critical_section`,
//! the statements `claim_and_read` and `write_sale_fenced`, and the control purchases'
//! `read_stock` and `write_sale`) into the request's attempt. The chaos stall happens there
//! too, as a write's span opens on the blocking thread that runs it ([`Chaos`]).
//!
//! Every timestamp is [`now_ns`], `CLOCK_MONOTONIC`: one clock for every process of the
//! machine, so the instances' timelines and the demo client's line up without any clock
//! correction.

use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Instrument, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::{LookupSpan, SpanRef};
use tracing_subscriber::Registry;

use crate::chaos::Chaos;

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

/// What one instance records, and its chaos plan.
#[derive(Debug)]
pub struct Recorder {
    /// The instance's name, in every attempt.
    instance: String,
    /// The attempts recorded; `None` while not recording.
    attempts: Mutex<Option<Vec<Attempt>>>,
    /// The stalls of this instance's writes.
    pub chaos: Chaos,
}

impl Recorder {
    /// The recorder of the instance `instance`, not recording until [`start`](Self::start).
    pub fn new(instance: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            instance: instance.into(),
            attempts: Mutex::new(None),
            chaos: Chaos::default(),
        })
    }

    /// Starts recording, forgetting what was recorded before.
    pub fn start(&self) {
        *self.attempts() = Some(Vec::new());
    }

    /// Stops recording and forgets what was recorded.
    pub fn stop(&self) {
        *self.attempts() = None;
    }

    /// The attempts recorded since the last take; recording goes on (if it was on).
    pub fn take(&self) -> Vec<Attempt> {
        self.attempts()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn is_recording(&self) -> bool {
        self.attempts().is_some()
    }

    fn push(&self, attempt: Attempt) {
        if let Some(attempts) = self.attempts().as_mut() {
            if attempts.len() < MAX_ATTEMPTS {
                attempts.push(attempt);
            }
        }
    }

    fn attempts(&self) -> std::sync::MutexGuard<'_, Option<Vec<Attempt>>> {
        // A panic while pushing cannot leave the list half-written: take the data regardless.
        self.attempts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The name of the span [`record`] opens around a recorded request.
const ATTEMPT_SPAN: &str = "purchase_attempt";

/// The attempt being served, in the extensions of its [`ATTEMPT_SPAN`].
#[derive(Debug)]
struct Open {
    recorder: Arc<Recorder>,
    attempt: Attempt,
}

/// The router middleware, outside every lock layer: records the request as an [`Attempt`]
/// when it names a purchase and the instance is recording.
pub async fn record(
    State(recorder): State<Arc<Recorder>>,
    request: Request,
    next: Next,
) -> Response {
    let purchase = request
        .headers()
        .get(PURCHASE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let Some(purchase) = purchase.filter(|_| recorder.is_recording()) else {
        return next.run(request).await;
    };
    let span = tracing::info_span!(ATTEMPT_SPAN, purchase);
    let attempt = Attempt {
        purchase,
        instance: recorder.instance.clone(),
        received: now_ns(),
        ..Attempt::default()
    };
    let open = Open {
        recorder: recorder.clone(),
        attempt,
    };
    if with_registry(&span, |span| span.extensions_mut().insert(open)).is_none() {
        tracing::warn!("purchase {purchase} not recorded: no AttemptLayer in the subscriber");
        return next.run(request).await;
    }
    let response = next.run(request).instrument(span.clone()).await;
    if let Some(Some(Open { mut attempt, .. })) =
        with_registry(&span, |span| span.extensions_mut().remove::<Open>())
    {
        attempt.responded = now_ns();
        attempt.status = response.status().as_u16();
        recorder.push(attempt);
    }
    response
}

/// Runs `f` on the registry's data of `span`; `None` when the subscriber has no registry.
fn with_registry<T>(span: &tracing::Span, f: impl FnOnce(SpanRef<'_, Registry>) -> T) -> Option<T> {
    span.with_subscriber(|(id, dispatch)| {
        let registry = dispatch.downcast_ref::<Registry>()?;
        registry.span(id).map(f)
    })
    .flatten()
}

/// The `tracing-subscriber` layer that reads the service's spans into the attempts (install
/// it with the [`Registry`], as [`subscriber`](crate::instance::subscriber) does).
#[derive(Debug, Default)]
pub struct AttemptLayer;

/// What a span of the service stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The lock is held (`critical_section`).
    Locked,
    /// The stock read (`read_stock`, `claim_and_read`).
    Read,
    /// The write of the stock and the order (`write_sale`, `write_sale_fenced`).
    Write,
}

impl Step {
    fn of(metadata: &tracing::Metadata<'_>) -> Option<Self> {
        if !metadata.target().starts_with("inventory") {
            return None;
        }
        match metadata.name() {
            "critical_section" => Some(Self::Locked),
            "read_stock" | "claim_and_read" => Some(Self::Read),
            "write_sale" | "write_sale_fenced" => Some(Self::Write),
            _ => None,
        }
    }
}

/// The fields of a step's span the attempt needs, in the span's extensions.
#[derive(Debug, Clone, Copy, Default)]
struct StepFields {
    stock: Option<i64>,
    new_stock: Option<i64>,
    order_id: Option<i64>,
    lease_left_ns: Option<u64>,
    stale: bool,
}

impl Visit for StepFields {
    fn record_i64(&mut self, field: &Field, value: i64) {
        match field.name() {
            "stock" => self.stock = Some(value),
            "new_stock" => self.new_stock = Some(value),
            "order_id" => self.order_id = Some(value),
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "lease_left_ns" => self.lease_left_ns = Some(value),
            _ => self.record_i64(field, i64::try_from(value).unwrap_or(i64::MAX)),
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "stale" {
            self.stale = value;
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

/// Runs `f` on the attempt that `span` belongs to, if it belongs to one.
fn on_attempt<S>(span: &SpanRef<'_, S>, f: impl FnOnce(&mut Open, u64))
where
    S: for<'a> LookupSpan<'a>,
{
    let now = now_ns();
    for ancestor in span.scope() {
        if let Some(open) = ancestor.extensions_mut().get_mut::<Open>() {
            f(open, now);
            return;
        }
    }
}

impl<S> Layer<S> for AttemptLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let (Some(step), Some(span)) = (Step::of(attrs.metadata()), ctx.span(id)) else {
            return;
        };
        let mut fields = StepFields::default();
        attrs.record(&mut fields);
        if step == Step::Write {
            // A write's span opens on the blocking thread that runs it, right before the
            // statements: a stall here is a holder stalled between its lock check and its
            // write. The recorder is looked up first, so no extension stays locked meanwhile.
            let mut recorder = None;
            on_attempt(&span, |open, _| recorder = Some(open.recorder.clone()));
            if let Some(pause) = recorder.and_then(|r| r.chaos.next_pause()) {
                let start = now_ns();
                std::thread::sleep(pause);
                let stall = Span {
                    start,
                    end: now_ns(),
                };
                on_attempt(&span, |open, _| open.attempt.stall = Some(stall));
            }
        }
        on_attempt(&span, |open, now| {
            let attempt = &mut open.attempt;
            let begun = Some(Span {
                start: now,
                end: now,
            });
            match step {
                Step::Locked => {
                    attempt.acquired = Some(now);
                    attempt.lease_end = fields.lease_left_ns.map(|left| now.saturating_add(left));
                }
                Step::Read => attempt.read = begun,
                Step::Write => attempt.write = begun,
            }
        });
        span.extensions_mut().insert((step, fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some((_, fields)) = extensions.get_mut::<(Step, StepFields)>() {
            values.record(fields);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some((step, fields)) = span.extensions().get::<(Step, StepFields)>().copied() else {
            return;
        };
        on_attempt(&span, |open, now| {
            let attempt = &mut open.attempt;
            match step {
                Step::Locked => attempt.releasing = Some(now),
                Step::Read => {
                    if let Some(read) = &mut attempt.read {
                        read.end = now;
                    }
                    attempt.stock_read = fields.stock;
                }
                Step::Write => {
                    if let Some(write) = &mut attempt.write {
                        write.end = now;
                    }
                    if fields.order_id.is_some() {
                        attempt.stock_written = fields.new_stock;
                        attempt.order_id = fields.order_id;
                    }
                }
            }
            if fields.stale {
                // Nothing was written: a refused write is not a write.
                attempt.write = None;
                attempt.stale_at = Some(now);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorder_keeps_attempts_only_while_recording() {
        let recorder = Recorder::new("i1");
        recorder.push(Attempt::default());
        assert!(recorder.take().is_empty(), "not recording yet");
        recorder.start();
        recorder.push(Attempt::default());
        assert_eq!(recorder.take().len(), 1);
        assert!(recorder.take().is_empty(), "taken");
        recorder.stop();
        recorder.push(Attempt::default());
        assert!(recorder.take().is_empty());
    }
}
