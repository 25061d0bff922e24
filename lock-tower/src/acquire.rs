//! The acquire of a request's lock, as its keys and mode ask: one key exclusively
//! (`Locker::lock`), for reading (`Locker::read`) or as one of a semaphore's permits
//! (`Locker::semaphore`), or several keys together (`Locker::lock_all`, exclusive); and the
//! [`Guard`] it gives.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};

use lock_core::{
    AcquireAll, AcquireFuture, LockError, LockGuard, LockWatch, Locker, LostReason, MultiLockGuard,
};

use crate::key::LockKeys;
use crate::layer::Settings;
use crate::mode::Mode;

/// The lock(s) a request holds.
#[derive(Debug)]
pub(crate) enum Guard {
    One(LockGuard),
    All(MultiLockGuard),
}

impl Guard {
    /// Whether the lock (every one of several) is still held as far as this process knows:
    /// not marked lost, and the validity clock has not run out. No Redis round trip.
    pub(crate) fn is_held(&self) -> bool {
        match self {
            Self::One(guard) => guard.is_held(),
            Self::All(guard) => guard.is_held(),
        }
    }

    /// Handles that tell when the lock (any of several) is lost, for a watch that must not
    /// borrow the guard.
    pub(crate) fn watches(&self) -> Watches {
        match self {
            Self::One(guard) => Watches::One(guard.watch()),
            Self::All(guard) => Watches::All(guard.guards().iter().map(LockGuard::watch).collect()),
        }
    }

    /// The error that reports the lock's loss (of the first of several keys found lost): the
    /// one a handler's `Rejection::Lost` carries. Asked once the lock is lost.
    pub(crate) fn lost_error(&self) -> LockError {
        let lost = match self {
            Self::One(guard) => guard,
            Self::All(guard) => {
                let first = guard.lost_key().and_then(|key| guard.guard(key));
                match first.or_else(|| guard.guards().first()) {
                    Some(lost) => lost,
                    None => return LockError::NoKeys,
                }
            }
        };
        LockError::Lost {
            key: lost.key().to_owned(),
            reason: lost.lost_reason().unwrap_or(LostReason::Unknown),
        }
    }
}

/// What resolves when a request's lock is lost, apart from its guard.
pub(crate) enum Watches {
    One(LockWatch),
    All(Vec<LockWatch>),
}

impl Watches {
    /// Resolves when the lock (any of several) is lost, or its hold ended.
    pub(crate) async fn lost(self) {
        match self {
            Self::One(watch) => watch.lost().await,
            Self::All(watches) if watches.is_empty() => std::future::pending().await,
            Self::All(watches) => {
                futures_util::future::select_all(watches.iter().map(|w| Box::pin(w.lost()))).await;
            }
        }
    }
}

/// An acquire in progress.
pub(crate) enum Acquiring {
    One(AcquireFuture),
    All(<AcquireAll as IntoFuture>::IntoFuture),
}

impl Acquiring {
    /// Starts acquiring `keys` with `mode` (one key only: several are always exclusive) and
    /// the layer's settings. Returns the mode actually taken.
    pub(crate) fn start(
        locker: &Locker,
        keys: LockKeys,
        mode: Mode,
        settings: &Settings,
    ) -> (Self, Mode) {
        match keys.into_one_or_all() {
            Ok(key) => {
                let mut acquire = match mode {
                    Mode::Read => locker.read(key),
                    Mode::Exclusive => locker.lock(key),
                    Mode::Limit(permits) => locker.semaphore(key, permits).acquire(),
                };
                acquire = acquire.wait(settings.wait);
                if let Some(lease) = settings.lease {
                    acquire = acquire.lease(lease);
                }
                acquire = acquire.max_hold(settings.max_hold);
                (Self::One(acquire.into_future()), mode)
            }
            Err(keys) => {
                let mut acquire = locker.lock_all(keys).wait(settings.wait);
                if let Some(lease) = settings.lease {
                    acquire = acquire.lease(lease);
                }
                acquire = acquire.max_hold(settings.max_hold);
                (Self::All(acquire.into_future()), Mode::Exclusive)
            }
        }
    }
}

impl Future for Acquiring {
    type Output = Result<Guard, LockError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Both futures are `Unpin` (the multi-key one is boxed), so this enum is too.
        match self.get_mut() {
            Self::One(acquire) => Pin::new(acquire).poll(cx).map(|r| r.map(Guard::One)),
            Self::All(acquire) => acquire.as_mut().poll(cx).map(|r| r.map(Guard::All)),
        }
    }
}
