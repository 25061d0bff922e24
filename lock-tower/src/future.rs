//! [`ResponseFuture`]: the acquire, then the inner call with the lock held.

use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use lock_core::{LockError, OnLost};
use pin_project_lite::pin_project;
use tower_service::Service;
use tracing::Span;

use crate::acquire::{Acquiring, Guard};
use crate::body::LockedBody;
use crate::extension::{HeldLock, HeldLocks};
use crate::layer::{HoldUntil, Settings};
use crate::mode::Mode;
use crate::reject::{Reject, Rejection, RetryAfter};
use crate::release::{Held, Release, Watched};
use crate::warn_limit::WarnLimit;

pin_project! {
    /// The response future of [`DistributedLockService`](crate::DistributedLockService).
    ///
    /// It owns the lock acquire, then the guard ([`LockGuard`](lock_core::LockGuard), or
    /// [`MultiLockGuard`](lock_core::MultiLockGuard) for several keys) alongside the
    /// inner service's future, so the lock lives exactly as long as the response. When the
    /// inner future completes, the lock is released and the response returned once Redis
    /// confirmed the release (with [`HoldUntil::BodyEnd`], the guard moves into the
    /// [`LockedBody`] instead, unless the response has no body to send). When this future is
    /// dropped early (client gone, timeout, panic in the handler), the guard is dropped with
    /// it and releases in the background. When the lock is lost while the inner future runs
    /// (its `max_hold` reached, say) and the layer's `on_lost` is
    /// [`OnLost::Abort`], the inner future is dropped and the answer is the
    /// [lost](Rejection::Lost) rejection.
    ///
    /// # Panics
    ///
    /// When polled after it completed.
    pub struct ResponseFuture<S, ReqBody, R>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody, R>,
        // The request's `distributed_lock` span (none when unlocked), entered on every poll.
        span: Span,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, R>
    where
        S: Service<Request<ReqBody>>,
    {
        // The inner service's future runs. It is pinned, so this state is polled in place.
        Calling {
            #[pin]
            future: S::Future,
            lock: Lock,
            // Builds the answer when the lock is lost and the call is aborted.
            reject: Arc<R>,
        },
        // Every other state: nothing in it is pinned, so a poll takes it by value.
        Unpinned {
            step: Step<S, ReqBody, R>,
        },
    }
}

/// The lock of a request whose inner service runs.
enum Lock {
    /// No key, or Redis unavailable under `fail_open`.
    Unlocked,
    /// Released here when the response is in, or moved into the body (`HoldUntil::BodyEnd`)
    /// when it has one to send.
    Held {
        held: Watched,
        until: HoldUntil,
        /// The request is a `HEAD`: its response sends no body.
        head: bool,
        /// Stop the call when the lock is lost ([`OnLost::Abort`]).
        abort: bool,
    },
}

// The acquiring state is the largest (the request and the ready service wait in it). It stays
// inline rather than boxed, which would cost an allocation per locked request.
#[allow(clippy::large_enum_variant)]
enum Step<S, ReqBody, R>
where
    S: Service<Request<ReqBody>>,
{
    /// The lock is being taken.
    Acquiring {
        acquire: Acquiring,
        call: PendingCall<S, ReqBody, R>,
    },
    /// The response is in; it is returned once the lock's release is confirmed.
    Releasing {
        release: Release,
        response: S::Response,
    },
    /// Rejected before any lock was tried (the request had no key).
    Rejected {
        response: S::Response,
    },
    Done,
}

/// The call of the inner service that waits for the lock.
struct PendingCall<S, ReqBody, R> {
    /// The inner service that was driven to readiness.
    service: S,
    request: Request<ReqBody>,
    reject: Arc<R>,
    retry_after: RetryAfter,
    fail_open: bool,
    hold_until: HoldUntil,
    on_lost: OnLost,
    busy_status: StatusCode,
    /// The request's lock is a permit of a concurrency limit: a busy answer means full.
    limit: bool,
}

impl<S, ReqBody, R> PendingCall<S, ReqBody, R> {
    /// Calls the inner service once the acquire is done: with the lock, or without it when
    /// Redis is unavailable under `fail_open`. Any other failure is the rejection's response
    /// instead.
    fn start<ResBody>(
        self,
        acquired: Result<Guard, LockError>,
        span: &Span,
    ) -> Result<State<S, ReqBody, R>, Response<ResBody>>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        R: Reject<ResBody>,
    {
        let Self {
            mut service,
            mut request,
            reject,
            retry_after,
            fail_open,
            hold_until,
            on_lost,
            busy_status,
            limit,
        } = self;
        let lock = match acquired {
            Ok(guard) => {
                span.record("outcome", "acquired");
                // One key: `HeldLock` too; several: `HeldLocks` only, so that a handler
                // written for one lock cannot fence only one of several keys.
                let locks = match &guard {
                    Guard::One(one) => {
                        let lock = HeldLock::new(one);
                        request.extensions_mut().insert(lock.clone());
                        HeldLocks::one(lock)
                    }
                    Guard::All(_) => HeldLocks::new(&guard),
                };
                request.extensions_mut().insert(locks);
                Lock::Held {
                    held: Held::new(guard, span.clone()).watched(),
                    until: hold_until,
                    head: request.method() == Method::HEAD,
                    abort: on_lost == OnLost::Abort,
                }
            }
            Err(error) if error.is_backend() && fail_open => {
                span.record("outcome", "fail_open");
                static FAIL_OPEN: WarnLimit = WarnLimit::new();
                match FAIL_OPEN.admit() {
                    Some(left_out) => tracing::warn!(
                        %error,
                        left_out,
                        "redis unavailable: passing the request through unlocked (fail open)"
                    ),
                    None => tracing::debug!(%error, "redis unavailable: passed through unlocked"),
                }
                Lock::Unlocked
            }
            Err(error) => {
                let mut rejection = Rejection::from_error(error, &retry_after);
                if limit {
                    rejection = rejection.under_limit();
                }
                trace_rejection(span, &rejection);
                let busy = matches!(rejection, Rejection::Busy { .. });
                let mut response = reject.reject(rejection);
                // Only an answer with the default busy status: a `Reject` that chose its own
                // status keeps it.
                if busy && response.status() == StatusCode::CONFLICT {
                    *response.status_mut() = busy_status;
                }
                return Err(response);
            }
        };
        Ok(State::Calling {
            future: service.call(request),
            lock,
            reject,
        })
    }
}

impl<S, ReqBody, R> ResponseFuture<S, ReqBody, R>
where
    S: Service<Request<ReqBody>>,
{
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn acquiring(
        acquire: Acquiring,
        mode: Mode,
        service: S,
        request: Request<ReqBody>,
        reject: Arc<R>,
        retry_after: RetryAfter,
        settings: Settings,
        span: Span,
    ) -> Self {
        let call = PendingCall {
            service,
            request,
            reject,
            retry_after,
            fail_open: settings.fail_open,
            hold_until: settings.hold_until,
            on_lost: settings.on_lost,
            busy_status: settings.busy_status,
            limit: matches!(mode, Mode::Limit(_)),
        };
        Self::new(Step::Acquiring { acquire, call }, span)
    }

    pub(crate) fn unlocked(future: S::Future, reject: Arc<R>) -> Self {
        Self {
            state: State::Calling {
                future,
                lock: Lock::Unlocked,
                reject,
            },
            span: Span::none(),
        }
    }

    pub(crate) fn rejected(response: S::Response) -> Self {
        Self::new(Step::Rejected { response }, Span::none())
    }

    fn new(step: Step<S, ReqBody, R>, span: Span) -> Self {
        Self {
            state: State::Unpinned { step },
            span,
        }
    }
}

impl<S, ReqBody, ResBody, R> Future for ResponseFuture<S, ReqBody, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
    R: Reject<ResBody>,
{
    type Output = Result<Response<LockedBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        loop {
            match this.state.as_mut().project() {
                StateProj::Calling {
                    future,
                    lock,
                    reject,
                } => {
                    const THEN: &str = "the handler is stopped and the request answered as lost";
                    // Checked before the call goes on: what it does after the loss would run
                    // unlocked. Without a wake-up yet: a call that is done at once needs none.
                    let mut lost = match lock {
                        Lock::Held {
                            held, abort: true, ..
                        } => held.poll_lost(THEN),
                        _ => Poll::Pending,
                    };
                    let polled = if lost.is_pending() {
                        future.poll(cx)
                    } else {
                        Poll::Pending
                    };
                    if polled.is_pending() && lost.is_pending() {
                        // The call waits: be woken when the lock is lost meanwhile.
                        if let Lock::Held {
                            held, abort: true, ..
                        } = lock
                        {
                            lost = held.poll_lost_armed(cx, THEN);
                        }
                    }
                    if let Poll::Ready(error) = lost {
                        let reject = reject.clone();
                        // Drops the inner future, then the guard (released in the
                        // background).
                        this.state.set(State::Unpinned { step: Step::Done });
                        let rejection = Rejection::Lost(error);
                        trace_rejection(this.span, &rejection);
                        let response = reject.reject(rejection);
                        return Poll::Ready(Ok(response.map(LockedBody::unlocked)));
                    }
                    let result = ready!(polled);
                    let lock = mem::replace(lock, Lock::Unlocked);
                    // The inner future is done: drop it now.
                    this.state.set(State::Unpinned { step: Step::Done });
                    match (result, lock) {
                        (
                            Ok(response),
                            Lock::Held {
                                held,
                                until: HoldUntil::BodyEnd,
                                head,
                                ..
                            },
                        ) if sends_a_body(&response, head) => {
                            let response = response.map(|body| LockedBody::new(body, held));
                            return Poll::Ready(Ok(response));
                        }
                        // `HoldUntil::Response`, or a response without a body to hold it:
                        // released before the response is passed on.
                        (Ok(response), Lock::Held { held, .. }) => {
                            let release = held.release();
                            let step = Step::Releasing { release, response };
                            this.state.set(State::Unpinned { step });
                        }
                        // Unlocked, or the inner service failed: nothing to wait for (a
                        // guard is dropped here and releases in the background).
                        (result, _) => {
                            return Poll::Ready(result.map(|r| r.map(LockedBody::unlocked)));
                        }
                    }
                }
                // A pending step is polled in place: the request and the service waiting in
                // it are moved only once it is done.
                StateProj::Unpinned { step } => match step {
                    Step::Acquiring { acquire, .. } => {
                        let acquired = ready!(Pin::new(acquire).poll(cx));
                        let Step::Acquiring { call, .. } = mem::replace(step, Step::Done) else {
                            continue;
                        };
                        match call.start(acquired, this.span) {
                            Ok(calling) => this.state.set(calling),
                            Err(rejected) => {
                                return Poll::Ready(Ok(rejected.map(LockedBody::unlocked)));
                            }
                        }
                    }
                    Step::Releasing { release, .. } => {
                        ready!(Pin::new(release).poll(cx));
                        let Step::Releasing { response, .. } = mem::replace(step, Step::Done)
                        else {
                            continue;
                        };
                        return Poll::Ready(Ok(response.map(LockedBody::unlocked)));
                    }
                    Step::Rejected { .. } => {
                        let Step::Rejected { response } = mem::replace(step, Step::Done) else {
                            continue;
                        };
                        return Poll::Ready(Ok(response.map(LockedBody::unlocked)));
                    }
                    Step::Done => panic!("lock_tower::ResponseFuture polled after completion"),
                },
            }
        }
    }
}

/// Whether `response` has a body that will be sent, and so polled to its end, which is where
/// [`HoldUntil::BodyEnd`] releases the lock. Not for the answer to a `HEAD`, a `1xx`, `204`
/// or `304` status, or a body known to be empty: hyper drops those bodies without polling
/// them, so the release would only happen in the background, after the response went out,
/// and the client's next request for the key could find it still taken.
fn sends_a_body<B: Body>(response: &Response<B>, head: bool) -> bool {
    let status = response.status();
    let body = response.body();
    !(head
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || body.is_end_stream()
        || body.size_hint().exact() == Some(0))
}

/// Records the outcome and logs it: an outage or a failure at warn or error level, at most
/// once a second of each (with the number left out since: `left_out`), so a Redis outage
/// writes a line a second rather than one per request; the rest at debug level.
fn trace_rejection(span: &Span, rejection: &Rejection) {
    static UNAVAILABLE: WarnLimit = WarnLimit::new();
    static FAILED: WarnLimit = WarnLimit::new();
    span.record("outcome", rejection.kind());
    let error = rejection.error().map(tracing::field::display);
    let admitted = match rejection {
        Rejection::Unavailable(_) => UNAVAILABLE.admit(),
        Rejection::Failed(_) => FAILED.admit(),
        _ => None,
    };
    match (rejection, admitted) {
        (Rejection::Unavailable(_), Some(left_out)) => tracing::warn!(
            error,
            left_out,
            "redis unavailable: request rejected (fail closed)"
        ),
        (Rejection::Failed(_), Some(left_out)) => {
            tracing::error!(error, left_out, "lock failed: request rejected")
        }
        _ => tracing::debug!(error, "request rejected"),
    }
}

impl<S, ReqBody, R> fmt::Debug for ResponseFuture<S, ReqBody, R>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Calling {
                lock: Lock::Held { .. },
                ..
            } => "calling (locked)",
            State::Calling {
                lock: Lock::Unlocked,
                ..
            } => "calling (unlocked)",
            State::Unpinned { step } => match step {
                Step::Acquiring { .. } => "acquiring",
                Step::Releasing { .. } => "releasing",
                Step::Rejected { .. } => "rejected",
                Step::Done => "done",
            },
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("span", &self.span)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    use futures_util::FutureExt;

    use super::*;
    use crate::DefaultReject;

    /// Answers with the request's body.
    struct Echo;

    impl Service<Request<String>> for Echo {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response<String>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request<String>) -> Self::Future {
            std::future::ready(Ok(Response::new(request.into_body())))
        }
    }

    type EchoFuture = ResponseFuture<Echo, String, DefaultReject>;

    /// One poll, outside any task.
    fn poll(future: &mut EchoFuture) -> Poll<Result<Response<LockedBody<String>>, Infallible>> {
        future.now_or_never().map_or(Poll::Pending, Poll::Ready)
    }

    fn state(future: &EchoFuture) -> String {
        let debug = format!("{future:?}");
        debug
            .split('"')
            .nth(1)
            .unwrap_or_else(|| panic!("no state in {debug}"))
            .to_owned()
    }

    /// Once done, the future says so and panics when polled again.
    fn assert_done(future: &mut EchoFuture) {
        assert_eq!(state(future), "done");
        let again = catch_unwind(AssertUnwindSafe(|| poll(future)));
        assert!(again.is_err(), "polled after completion");
    }

    #[test]
    fn an_unlocked_request_is_passed_through() {
        let mut future = EchoFuture::unlocked(
            Echo.call(Request::new("hi".to_owned())),
            Arc::new(DefaultReject),
        );
        assert_eq!(state(&future), "calling (unlocked)");
        let Poll::Ready(Ok(response)) = poll(&mut future) else {
            panic!("the inner future is ready");
        };
        assert!(!response.body().holds_lock());
        assert_eq!(response.into_body().into_inner(), "hi");
        assert_done(&mut future);
    }

    #[test]
    fn only_responses_with_a_body_to_send_keep_the_lock_in_the_body() {
        let response = |status: u16, body: &str| {
            let mut response = Response::new(http_body_util::Full::new(bytes::Bytes::from(
                body.to_owned(),
            )));
            *response.status_mut() = StatusCode::from_u16(status).unwrap();
            response
        };
        assert!(sends_a_body(&response(200, "x"), false));
        assert!(sends_a_body(&response(500, "x"), false));
        assert!(!sends_a_body(&response(200, ""), false), "known empty");
        assert!(!sends_a_body(&response(200, "x"), true), "HEAD");
        for status in [101, 204, 304] {
            assert!(!sends_a_body(&response(status, "x"), false), "{status}");
        }
    }

    #[test]
    fn a_rejection_is_answered_once() {
        let mut future = EchoFuture::rejected(Response::new("no key".to_owned()));
        assert_eq!(state(&future), "rejected");
        let Poll::Ready(Ok(response)) = poll(&mut future) else {
            panic!("a rejection is ready");
        };
        assert_eq!(response.into_body().into_inner(), "no key");
        assert_done(&mut future);
    }
}
