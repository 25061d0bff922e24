//! [`ResponseFuture`]: the acquire, then the inner call with the lock held.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use http_body::Body;
use lock_core::{AcquireFuture, LockGuard};
use pin_project_lite::pin_project;
use tower_service::Service;
use tracing::Span;

use crate::body::LockedBody;
use crate::extension::HeldLock;
use crate::layer::{HoldUntil, Settings};
use crate::reject::{Reject, Rejection};
use crate::release::{Held, Release};

pin_project! {
    /// The response future of [`DistributedLockService`](crate::DistributedLockService).
    ///
    /// It owns the lock acquire, then the [`LockGuard`] alongside the inner service's future,
    /// so the lock lives exactly as long as the response. When the inner future completes,
    /// the lock is released and the response returned once Redis confirmed the release (with
    /// [`HoldUntil::BodyEnd`], the guard moves into the [`LockedBody`] instead). When this
    /// future is dropped early (client gone, timeout, panic in the handler), the guard is
    /// dropped with it and releases in the background.
    ///
    /// # Panics
    ///
    /// When polled after it completed.
    pub struct ResponseFuture<S, ReqBody, R>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
        reject: Option<Arc<R>>,
        settings: Settings,
        span: Span,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Acquiring {
            acquire: AcquireFuture,
            // The ready inner service and the request, taken when the acquire completes.
            call: Option<(S, Request<ReqBody>)>,
        },
        Calling {
            #[pin]
            future: S::Future,
            guard: Option<LockGuard>,
        },
        Releasing {
            release: Release,
            response: Option<S::Response>,
        },
        Rejected {
            response: Option<S::Response>,
        },
        Done,
    }
}

impl<S, ReqBody, R> ResponseFuture<S, ReqBody, R>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn acquiring(
        acquire: AcquireFuture,
        service: S,
        request: Request<ReqBody>,
        reject: Arc<R>,
        settings: Settings,
        span: Span,
    ) -> Self {
        Self {
            state: State::Acquiring {
                acquire,
                call: Some((service, request)),
            },
            reject: Some(reject),
            settings,
            span,
        }
    }

    pub(crate) fn unlocked(future: S::Future, settings: Settings) -> Self {
        Self {
            state: State::Calling {
                future,
                guard: None,
            },
            reject: None,
            settings,
            span: Span::none(),
        }
    }

    pub(crate) fn rejected(response: S::Response) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
            reject: None,
            settings: Settings::default(),
            span: Span::none(),
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
                StateProj::Acquiring { acquire, call } => {
                    let result = ready!(Pin::new(acquire).poll(cx));
                    let (mut service, mut request) = call.take().expect("acquire polled once");
                    let guard = match result {
                        Ok(guard) => {
                            this.span.record("outcome", "acquired");
                            this.span.record("fencing_token", guard.fencing_token());
                            request.extensions_mut().insert(HeldLock::new(&guard));
                            Some(guard)
                        }
                        Err(error) if error.is_backend() && this.settings.fail_open => {
                            this.span.record("outcome", "fail_open");
                            tracing::warn!(%error, "redis unavailable: passing the request through unlocked (fail open)");
                            None
                        }
                        Err(error) => {
                            let rejection = Rejection::from_error(error);
                            trace_rejection(this.span, &rejection);
                            let reject = this.reject.as_ref().expect("set while acquiring");
                            let response = reject.reject(rejection);
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(response.map(LockedBody::unlocked)));
                        }
                    };
                    let future = service.call(request);
                    this.state.set(State::Calling { future, guard });
                }
                StateProj::Calling { future, guard } => {
                    let result = ready!(future.poll(cx));
                    let guard = guard.take();
                    let (response, guard) = match (result, guard) {
                        (Ok(response), Some(guard)) => (response, guard),
                        (result, guard) => {
                            // Unlocked, or the inner service failed: nothing to wait for (a
                            // guard is dropped here and releases in the background).
                            drop(guard);
                            this.state.set(State::Done);
                            return Poll::Ready(result.map(|r| r.map(LockedBody::unlocked)));
                        }
                    };
                    if let HoldUntil::BodyEnd = this.settings.hold_until {
                        let span = this.span.clone();
                        this.state.set(State::Done);
                        return Poll::Ready(Ok(
                            response.map(|body| LockedBody::new(body, Held::new(guard, span)))
                        ));
                    }
                    this.state.set(State::Releasing {
                        release: Held::new(guard, this.span.clone()).release(),
                        response: Some(response),
                    });
                }
                StateProj::Releasing { release, response } => {
                    ready!(Pin::new(release).poll(cx));
                    let response = response.take().expect("response taken once");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(response.map(LockedBody::unlocked)));
                }
                StateProj::Rejected { response } => {
                    let response = response.take().expect("rejection taken once");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(response.map(LockedBody::unlocked)));
                }
                StateProj::Done => panic!("lock_tower::ResponseFuture polled after completion"),
            }
        }
    }
}

fn trace_rejection(span: &Span, rejection: &Rejection) {
    let outcome = match rejection {
        Rejection::Busy(_) => "busy",
        Rejection::Unavailable(_) => "unavailable",
        Rejection::InvalidKey(_) => "invalid_key",
        Rejection::MissingKey => "missing_key",
        Rejection::Failed(_) => "failed",
    };
    span.record("outcome", outcome);
    let error = rejection.error().map(tracing::field::display);
    match rejection {
        Rejection::Unavailable(_) => {
            tracing::warn!(error, "redis unavailable: request rejected (fail closed)")
        }
        Rejection::Failed(_) => tracing::error!(error, "lock failed: request rejected"),
        _ => tracing::debug!(error, "request rejected"),
    }
}

impl<S, ReqBody, R> fmt::Debug for ResponseFuture<S, ReqBody, R>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Acquiring { .. } => "acquiring",
            State::Calling { guard: Some(_), .. } => "calling (locked)",
            State::Calling { guard: None, .. } => "calling (unlocked)",
            State::Releasing { .. } => "releasing",
            State::Rejected { .. } => "rejected",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("span", &self.span)
            .finish_non_exhaustive()
    }
}
