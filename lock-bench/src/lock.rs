//! One interface over the sides of every comparison: the kit (`lock_core::Locker`), the floor
//! ([`Floor`]) and, in W1-W3, rslock ([`Rslock`]).

use std::time::Duration;

use lock_core::{LockError, LockGuard, Locker};

use crate::floor::{Floor, FloorGuard};
use crate::rslock::{Rslock, RslockGuard};
use crate::Side;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A lock client of any side.
#[derive(Clone)]
pub(crate) enum Lock {
    Kit(Locker),
    Floor(Floor),
    Rslock(Rslock),
}

/// Which lock of the kit a hot-key run takes (the floor and rslock always take their mutex).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub(crate) enum KitKind {
    /// `Locker::lock`.
    Mutex,
    /// `Locker::fair_lock`.
    Fair,
    /// `Locker::semaphore(key, permits)`.
    Semaphore,
}

/// A held lock of any side.
pub(crate) enum Held {
    Kit(LockGuard),
    Floor(FloorGuard),
    Rslock(RslockGuard),
}

/// Sets the kit's release retry window in milliseconds (default: the kit's own, none).
pub(crate) const RELEASE_WINDOW_ENV: &str = "LOCK_BENCH_RELEASE_WINDOW_MS";

/// Builds a kit locker with the benchmark's settings: its own key prefix, a short fence
/// retention (fence keys of the many fresh keys expire soon after the run), defaults otherwise.
pub(crate) async fn kit_locker(
    url: &str,
    prefix: &str,
    watchdog_lease: Option<Duration>,
) -> Result<Locker, LockError> {
    let mut builder = Locker::builder()
        .url(url)
        .prefix(prefix)
        .fence_retention(Duration::from_secs(120));
    if let Some(lease) = watchdog_lease {
        builder = builder.watchdog_lease(lease);
    }
    if let Some(window) = release_retry_window() {
        builder = builder.release_retry_window(window);
    }
    builder.build().await
}

/// The kit's release retry window when [`RELEASE_WINDOW_ENV`] sets one (milliseconds; `0`: no
/// latch), for an A/B of what the latch costs. An environment variable, so that the worker
/// processes the benchmark starts use the same.
pub(crate) fn release_retry_window() -> Option<Duration> {
    let ms = std::env::var(RELEASE_WINDOW_ENV).ok()?;
    match ms.trim().parse() {
        Ok(ms) => Some(Duration::from_millis(ms)),
        Err(_) => {
            eprintln!("lock-bench: ignoring {RELEASE_WINDOW_ENV}={ms:?} (not milliseconds)");
            None
        }
    }
}

impl Lock {
    /// Connects one client of `side`; keys live under `prefix`.
    pub(crate) async fn open(
        side: Side,
        url: &str,
        prefix: &str,
        floor_lease_ms: u64,
        floor_retry: Duration,
    ) -> Result<Self, BoxError> {
        Ok(match side {
            Side::Kit => Self::Kit(kit_locker(url, prefix, None).await?),
            Side::Floor => Self::Floor(
                Floor::connect(url, prefix.to_owned(), floor_lease_ms, floor_retry).await?,
            ),
            Side::Guarded => Self::Floor(
                Floor::connect_guarded(url, prefix.to_owned(), floor_lease_ms, floor_retry).await?,
            ),
            // The floor's lease and pause between tries: the same lock, the same waiting.
            Side::Rslock => Self::Rslock(Rslock::connect(
                url,
                prefix.to_owned(),
                floor_lease_ms,
                floor_retry,
            )?),
        })
    }

    /// Acquires `key`, waiting up to `wait`; `Ok(None)` when the wait ran out.
    pub(crate) async fn acquire(
        &self,
        key: &str,
        wait: Duration,
    ) -> Result<Option<Held>, BoxError> {
        match self {
            Self::Kit(locker) => match locker.lock(key).wait(wait).await {
                Ok(guard) => Ok(Some(Held::Kit(guard))),
                Err(LockError::Busy { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            },
            Self::Floor(floor) => Ok(floor.lock(key, wait).await?.map(Held::Floor)),
            Self::Rslock(rslock) => Ok(rslock.lock(key, wait).await?.map(Held::Rslock)),
        }
    }

    /// Acquires `key` as `kind` (semaphores of `permits`), waiting up to `wait`; `Ok(None)`
    /// when the wait ran out. The floor and rslock have only their mutex.
    pub(crate) async fn acquire_as(
        &self,
        key: &str,
        wait: Duration,
        kind: KitKind,
        permits: u32,
    ) -> Result<Option<Held>, BoxError> {
        let Self::Kit(locker) = self else {
            return self.acquire(key, wait).await;
        };
        let acquire = match kind {
            KitKind::Mutex => locker.lock(key),
            KitKind::Fair => locker.fair_lock(key),
            KitKind::Semaphore => locker.semaphore(key, permits).acquire(),
        };
        match acquire.wait(wait).await {
            Ok(guard) => Ok(Some(Held::Kit(guard))),
            Err(LockError::Busy { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Releases a lock; an error if it was no longer ours (rslock cannot tell).
    pub(crate) async fn release(&self, held: Held) -> Result<(), BoxError> {
        match (self, held) {
            (_, Held::Kit(guard)) => Ok(guard.release().await?),
            (Self::Floor(floor), Held::Floor(guard)) => {
                if floor.unlock(&guard).await? {
                    Ok(())
                } else {
                    Err(format!("floor lock {} was lost before release", guard.key).into())
                }
            }
            // rslock's release reports nothing: a lost lock cannot be told from a released one.
            (Self::Rslock(rslock), Held::Rslock(lock)) => {
                rslock.unlock(lock).await;
                Ok(())
            }
            _ => Err("a guard released on another side's client".into()),
        }
    }

    /// Gives background work (the kit's pub/sub listener connecting) a moment, and loads the
    /// scripts with one acquire+release, so that measurements start warm.
    pub(crate) async fn warm_up(&self, scratch_key: &str) -> Result<(), BoxError> {
        for _ in 0..3 {
            if let Some(held) = self.acquire(scratch_key, Duration::from_secs(5)).await? {
                self.release(held).await?;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(())
    }
}
