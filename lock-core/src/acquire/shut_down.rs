//! How a shutdown ends an acquire under way: [`until_shut_down`].

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::local::LocalLocks;

/// Runs `take`, an acquire, until it ends or the locker shuts down (then `ShutDown`, and
/// `take` is dropped: what it leaves in Redis is taken out in the background, which the
/// shutdown waits for).
///
/// An acquire that waits (for its local place, between tries, for a subscription, before a
/// retry) wakes at once on the shutdown. One that waits only for the answer to its Redis call
/// (`in_call`, set around the call) is left to get it: the call is bounded, the answer comes
/// back to an acquire that ends with `ShutDown` (a lock granted meanwhile is given back), and
/// a shutdown waits for both ways anyway. So the uncontended acquire, which waits for nothing
/// else, never joins the shutdown signal's waiters: joining and leaving them took the signal's
/// lock twice per acquire, shared by all of the locker's tasks.
///
/// `take` is pinned where the caller keeps it: moved in here, its state (a kilobyte) would
/// be copied with each move.
pub(super) async fn until_shut_down<F>(
    local: &LocalLocks,
    in_call: &AtomicBool,
    mut take: Pin<&mut F>,
) -> Result<LockGuard, LockError>
where
    F: Future<Output = Result<LockGuard, LockError>>,
{
    // Made before the flag is read: a shutdown after that wakes it (it joins the waiters when
    // first polled, and a signal sent before that still counts), one before it set the flag.
    let mut signal = pin!(local.close_signal());
    let mut joined = false;
    std::future::poll_fn(|cx| {
        if joined {
            if signal.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(LockError::ShutDown));
            }
        } else if local.is_closed() {
            return Poll::Ready(Err(LockError::ShutDown));
        }
        let taken = take.as_mut().poll(cx);
        if taken.is_pending() && !joined && !in_call.load(Ordering::Acquire) {
            // Waiting for more than a Redis answer from now on: woken by the shutdown too.
            joined = true;
            if signal.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(LockError::ShutDown));
            }
        }
        taken
    })
    .await
}
