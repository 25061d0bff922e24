//! [`LockedBody`]: a response body that can carry the lock until it ends.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::release::{Release, Watched};

/// The error of a [`LockedBody`]: the inner body's error, or the lock-lost error.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// The response body of [`DistributedLockService`](crate::DistributedLockService): the
    /// inner body, unchanged, plus the lock when the layer holds it until the body ends
    /// ([`HoldUntil::BodyEnd`](crate::HoldUntil::BodyEnd)).
    ///
    /// When the inner body ends, the lock is released before the end is passed on: the last
    /// data frame (a frame after which the inner body reports
    /// [`is_end_stream`](Body::is_end_stream)) or the end of the stream is held back until
    /// Redis confirmed the release. On an error frame, or when the body is dropped unfinished,
    /// the lock is released in the background.
    ///
    /// When the lock is lost while the body streams (a renewal found the key gone or taken,
    /// a fixed lease ran out), the body ends with an error instead of sending on without the
    /// lock: the lock-lost error, a `lock_core::LockError::Lost` (the error of
    /// [`Rejection::Lost`](crate::Rejection::Lost)), boxed. The client sees the response
    /// broken off (hyper closes the connection), never a complete-looking body.
    ///
    /// Errors are boxed (`Box<dyn Error + Send + Sync>`, what hyper and axum take of a body),
    /// the inner body's as they come; downcast to `LockError` to tell the loss apart.
    pub struct LockedBody<B>
    where
        B: Body,
    {
        #[pin]
        inner: B,
        lock: BodyLock<B::Data>,
    }
}

enum BodyLock<D> {
    /// No lock: the layer released it with the response, or there was none.
    Unlocked,
    Held(Watched),
    /// The inner body ended; `last` is the frame to yield once released (`None`: the end).
    Releasing {
        release: Release,
        last: Option<Frame<D>>,
    },
    /// Released after the end, or broken off by the lock's loss: only the end is left.
    Done,
}

impl<D> BodyLock<D> {
    /// In the `Held` state, once the inner body ended: starts the release, with `last` to
    /// yield after it.
    fn release(&mut self, last: Option<Frame<D>>) {
        if let Self::Held(held) = std::mem::replace(self, Self::Done) {
            *self = Self::Releasing {
                release: held.release(),
                last,
            };
        }
    }
}

impl<B: Body> LockedBody<B> {
    pub(crate) fn new(inner: B, held: Watched) -> Self {
        Self {
            inner,
            lock: BodyLock::Held(held),
        }
    }

    pub(crate) fn unlocked(inner: B) -> Self {
        Self {
            inner,
            lock: BodyLock::Unlocked,
        }
    }

    /// Whether this body still holds the lock of its request.
    pub fn holds_lock(&self) -> bool {
        matches!(self.lock, BodyLock::Held(_) | BodyLock::Releasing { .. })
    }

    /// Unwraps the inner body, releasing the lock (in the background) if it still holds it.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B> Body for LockedBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        loop {
            match this.lock {
                BodyLock::Unlocked => return this.inner.poll_frame(cx).map_err(Into::into),
                BodyLock::Done => return Poll::Ready(None),
                BodyLock::Releasing { release, last } => {
                    ready!(Pin::new(release).poll(cx));
                    let last = last.take();
                    *this.lock = BodyLock::Done;
                    return Poll::Ready(last.map(Ok));
                }
                BodyLock::Held(held) => {
                    // Checked before every frame: once the lock is gone, what follows would
                    // be sent unlocked. Dropping the guard lets lock-core finish it.
                    const THEN: &str = "the body ends with this error";
                    let mut lost = held.poll_lost(THEN);
                    let mut polled = Poll::Pending;
                    if lost.is_pending() {
                        polled = this.inner.as_mut().poll_frame(cx);
                        if polled.is_pending() {
                            // The body waits: be woken when the lock is lost meanwhile.
                            lost = held.poll_lost_armed(cx, THEN);
                        }
                    }
                    if let Poll::Ready(error) = lost {
                        *this.lock = BodyLock::Done;
                        return Poll::Ready(Some(Err(error.into())));
                    }
                    let frame = ready!(polled);
                    let last = match frame {
                        Some(Ok(frame)) if this.inner.is_end_stream() => Some(frame),
                        Some(Ok(frame)) => return Poll::Ready(Some(Ok(frame))),
                        Some(Err(error)) => {
                            // The response is broken off: release in the background.
                            *this.lock = BodyLock::Unlocked;
                            return Poll::Ready(Some(Err(error.into())));
                        }
                        None => None,
                    };
                    this.lock.release(last);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self.lock {
            BodyLock::Unlocked => self.inner.is_end_stream(),
            // The end is reported only after the release.
            BodyLock::Held(_) | BodyLock::Releasing { .. } => false,
            BodyLock::Done => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.lock {
            BodyLock::Done => SizeHint::with_exact(0),
            BodyLock::Releasing { ref last, .. } => {
                let len = last
                    .as_ref()
                    .and_then(Frame::data_ref)
                    .map_or(0, |d| bytes::Buf::remaining(d) as u64);
                SizeHint::with_exact(len)
            }
            _ => self.inner.size_hint(),
        }
    }
}

impl<B: Body + Default> Default for LockedBody<B> {
    fn default() -> Self {
        Self::unlocked(B::default())
    }
}

impl<B: Body + fmt::Debug> fmt::Debug for LockedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lock = match &self.lock {
            BodyLock::Unlocked => "unlocked",
            BodyLock::Held(_) => "held",
            BodyLock::Releasing { .. } => "releasing",
            BodyLock::Done => "done",
        };
        f.debug_struct("LockedBody")
            .field("inner", &self.inner)
            .field("lock", &lock)
            .finish()
    }
}
