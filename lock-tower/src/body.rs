//! [`LockedBody`]: a response body that can carry the lock until it ends.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::release::{Held, Release};

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
    Held(Held),
    /// The inner body ended; `last` is the frame to yield once released (`None`: the end).
    Releasing {
        release: Release,
        last: Option<Frame<D>>,
    },
    /// Released after the end; only the end is left to yield.
    Released,
}

impl<D> BodyLock<D> {
    /// In the `Held` state, once the inner body ended: starts the release, with `last` to
    /// yield after it.
    fn release(&mut self, last: Option<Frame<D>>) {
        if let Self::Held(held) = std::mem::replace(self, Self::Released) {
            *self = Self::Releasing {
                release: held.release(),
                last,
            };
        }
    }
}

impl<B: Body> LockedBody<B> {
    pub(crate) fn new(inner: B, held: Held) -> Self {
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

impl<B: Body> Body for LockedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        loop {
            match this.lock {
                BodyLock::Unlocked => return this.inner.poll_frame(cx),
                BodyLock::Released => return Poll::Ready(None),
                BodyLock::Releasing { release, last } => {
                    ready!(Pin::new(release).poll(cx));
                    let last = last.take();
                    *this.lock = BodyLock::Released;
                    return Poll::Ready(last.map(Ok));
                }
                BodyLock::Held(_) => {
                    let frame = ready!(this.inner.as_mut().poll_frame(cx));
                    let last = match frame {
                        Some(Ok(frame)) if this.inner.is_end_stream() => Some(frame),
                        Some(Ok(frame)) => return Poll::Ready(Some(Ok(frame))),
                        Some(Err(error)) => {
                            // The response is broken off: release in the background.
                            *this.lock = BodyLock::Unlocked;
                            return Poll::Ready(Some(Err(error)));
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
            BodyLock::Released => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.lock {
            BodyLock::Released => SizeHint::with_exact(0),
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
            BodyLock::Released => "released",
        };
        f.debug_struct("LockedBody")
            .field("inner", &self.inner)
            .field("lock", &lock)
            .finish()
    }
}
