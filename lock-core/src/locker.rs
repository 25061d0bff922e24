//! [`Locker`], the entry point: a handle to the locks of one Redis deployment.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::acquire::Acquire;
use crate::backend_error::BackendError;
use crate::builder::LockerBuilder;
use crate::capabilities::Capabilities;
use crate::connection::Timeouts;
use crate::error::LockError;
use crate::in_flight::InFlight;
use crate::inspect::LockInfo;
use crate::key::{self, RedisKeys, ShownKey};
use crate::kind::Kind;
use crate::local::LocalLocks;
use crate::metrics::{self, Operation};
use crate::multi::AcquireAll;
use crate::release::{self, Releaser};
use crate::release_messages::{PubSubSource, ReleaseMessages};
use crate::semaphore::Semaphore;
use crate::store::Store;
use crate::token::Token;
use crate::watchdog;

static GLOBAL: OnceLock<Locker> = OnceLock::new();

/// A handle to distributed locks on one Redis deployment.
///
/// `Locker` is cheap to clone (an `Arc` inside) and meant to be created once per process. It
/// owns one multiplexed command connection (reconnecting by itself), one pub/sub connection for
/// release notifications, the watchdog task that renews held locks, and the registry that makes
/// locks reentrant per task. Background tasks stop when the last clone and the last guard are
/// dropped, or at [`shutdown`](Self::shutdown), which also gives back every lock it holds.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::Locker;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locker = Locker::connect("redis://127.0.0.1:6379").await?;
/// let guard = locker.lock("inventory:42").wait(Duration::from_secs(3)).await?;
/// // ... read stock, check, write stock - 1 ...
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Locker {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("prefix", &self.inner.settings.prefix)
            .field("watchdog_lease", &self.inner.settings.watchdog_lease)
            .field("held", &self.inner.local.watchdog_locks())
            .finish_non_exhaustive()
    }
}

/// Settings fixed at build time.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) prefix: String,
    pub(crate) watchdog_lease: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) fence_retention: Duration,
    pub(crate) fallback_retry: Duration,
    pub(crate) command_timeout: Duration,
    /// How long a release's latch lives (see `LockerBuilder::release_retry_window`).
    pub(crate) release_retry_window: Duration,
    /// The `lock.hold` span at info level instead of debug.
    pub(crate) trace_holds: bool,
    /// The holder name every stored value carries (see `holder.rs`), shared by the tokens.
    pub(crate) holder: Arc<str>,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<Store>,
    pub(crate) settings: Settings,
    /// The held locks' owner; guards keep it (and with it the background tasks) alive.
    pub(crate) local: Arc<LocalLocks>,
    pub(crate) release_messages: ReleaseMessages,
    /// A lazy locker has not checked the server's eviction policy yet (see
    /// [`Inner::answered`]).
    eviction_unchecked: AtomicBool,
}

impl Inner {
    pub(crate) fn keys(&self, key: &str) -> RedisKeys {
        RedisKeys::new(&self.settings.prefix, key)
    }

    /// The Redis names of `key` held as `kind`.
    pub(crate) fn keys_of(&self, key: &str, kind: Kind) -> RedisKeys {
        RedisKeys::of(&self.settings.prefix, key, kind)
    }

    /// A fresh token of this locker's holder for a try of `kind` (of `permits` permits).
    pub(crate) fn new_token(&self, kind: Kind, permits: u32) -> Token {
        Token::new(&self.settings.holder, kind, permits)
    }

    /// What this locker's store can serve.
    pub(crate) fn capabilities(&self) -> Capabilities {
        Capabilities::of(&self.store)
    }

    /// The longest one acquire command may take: the command timeout, and the `WAIT` for
    /// replicas when `min_replicas` asks for one.
    pub(crate) fn one_try(&self) -> Duration {
        let replica_wait = self
            .store
            .min_replicas()
            .map_or(Duration::ZERO, |m| m.timeout);
        self.settings.command_timeout + replica_wait
    }

    /// Where releases that cannot be awaited go.
    pub(crate) fn releaser(&self) -> &Releaser {
        &self.local.releaser
    }

    /// Redis answered an acquire: a lazy locker runs the start-up check that `build` runs
    /// before it returns (the eviction policy), once, in the background.
    pub(crate) fn answered(&self) {
        if self.eviction_unchecked.load(Ordering::Relaxed)
            && self.eviction_unchecked.swap(false, Ordering::AcqRel)
        {
            let store = self.store.clone();
            tokio::spawn(async move { store.warn_on_eviction_policy().await });
        }
    }
}

impl Locker {
    /// Connects to one Redis server with default settings (see [`LockerBuilder`]).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a URL that does not parse, [`LockError::Backend`] when Redis
    /// cannot be reached within the connect timeout, [`LockError::Tls`] when a `rediss://`
    /// handshake fails.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder().url(url).build().await
    }

    /// A locker for one Redis server with default settings that connects on first use (see
    /// [`LockerBuilder::build_lazy`]): only the URL is checked here, so a service can start
    /// while Redis is down. Until Redis answers, acquires fail with [`LockError::Backend`];
    /// then they work, without rebuilding the locker.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lock_core::Locker;
    ///
    /// # #[tokio::main] async fn main() -> Result<(), lock_core::LockError> {
    /// let locker = Locker::connect_lazy("redis://127.0.0.1:6379")?; // no round trip
    /// let guard = locker.lock("inventory:42").await?; // connects here
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a URL that does not parse or TLS settings that cannot be
    /// used, and [`ConfigError::NoRuntime`](crate::ConfigError::NoRuntime) outside a tokio
    /// runtime.
    pub fn connect_lazy(url: &str) -> Result<Self, LockError> {
        Self::builder().url(url).build_lazy()
    }

    /// Starts configuring a locker.
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    /// Starts acquiring `key`; configure the attempt on the returned [`Acquire`] and `.await` it.
    ///
    /// The key is validated when the acquire is awaited ([`LockError::InvalidKey`]).
    pub fn lock(&self, key: impl Into<String>) -> Acquire {
        Acquire::new(self.clone(), key.into(), Kind::Exclusive)
    }

    /// Starts acquiring several keys at once, all or nothing, as one
    /// [`MultiLockGuard`](crate::MultiLockGuard): a first try asks for every key at once
    /// without waiting (one round trip); if any is busy, the keys are taken one after the
    /// other, waiting, in one order for every caller (sorted, duplicates removed), so callers
    /// naming them in different orders cannot deadlock, and a failure on any key gives back the
    /// ones already taken before the error is returned. Each key is an ordinary lock (watchdog, waiting, fencing token of its own);
    /// the guard's [`lost`](crate::MultiLockGuard::lost) resolves when any is lost.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
    /// let both = locker.lock_all(["account:7", "account:3"]).wait(Duration::from_secs(3)).await?;
    /// // ... move money from 7 to 3 ...
    /// both.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_all<I, S>(&self, keys: I) -> AcquireAll
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        AcquireAll::new(self.clone(), keys.into_iter().map(Into::into).collect())
    }

    /// The semaphore `key` of `permits` permits: at most that many held at once across every
    /// instance, each holder's permits expiring with its lease (see [`Semaphore`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
    /// let permit = locker.semaphore("exports:tenant-42", 3).acquire().await?;
    /// // ... at most 3 of these run at once, everywhere ...
    /// permit.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn semaphore(&self, key: impl Into<String>, permits: u32) -> Semaphore {
        Semaphore::new(self.clone(), key.into(), permits)
    }

    /// Starts acquiring the fair lock of `key`: waiters of every process get it in the order
    /// they arrived. Configure it like any [`Acquire`]; the guard is a
    /// [`LockGuard`](crate::LockGuard) with everything the mutex's has (watchdog, lost signal,
    /// fencing token, reentrancy per task).
    ///
    /// Each waiter lines up in Redis (a sorted set by arrival); only the first in line may take
    /// the lock when it is free, so a waiter that arrived later never overtakes, in this
    /// process or another, and a lock is never handed over locally. A waiter that dies or
    /// gives up leaves the line when it stops renewing its place (at most about three
    /// [`fallback_retry`](crate::LockerBuilder::fallback_retry) intervals, or at once when
    /// its acquire is cancelled), so it does not block those behind it. A `wait` of zero takes
    /// the lock only if nobody is in line.
    ///
    /// Order costs throughput: every release goes through Redis (no local handoff), and the
    /// release message names the first waiter in line, the only one that tries; the others
    /// sleep on. It is the same Redis lock as [`lock`](Self::lock)
    /// of the key, so take it with `fair_lock` everywhere: a plain `lock` does not line up.
    ///
    /// # Errors
    ///
    /// As [`Acquire`]; on RedLock every acquire fails with
    /// [`ConfigError::FairLockWithRedLock`](crate::ConfigError::FairLockWithRedLock) before
    /// anything is sent: each busy try there runs under a fresh token, and a node's line would
    /// keep the waiter's own earlier tries ahead of it. Use a single server, Sentinel or a
    /// Cluster.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
    /// let turn = locker.fair_lock("printer").wait(Duration::from_secs(30)).await?;
    /// // ... first come, first served across every instance ...
    /// turn.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fair_lock(&self, key: impl Into<String>) -> Acquire {
        Acquire::new(self.clone(), key.into(), Kind::Fair)
    }

    /// Starts acquiring the write lock of `key`: the read-write lock's exclusive side. It is
    /// the same lock as [`lock`](Self::lock) (a mutex of a key is its write lock), named for
    /// code that also reads the key with [`read`](Self::read): it excludes every reader and
    /// every other writer, and gets fencing tokens.
    ///
    /// A waiting writer is not starved by a stream of readers: while one waits, new readers
    /// (of any process) wait too, and the writer gets the lock when the current readers are
    /// done. A writer that stops waiting (its wait ran out, its future was dropped) lets the
    /// readers in at once; one whose process died, within three `fallback_retry`s. A task that holds the read lock of `key` gets [`LockError::WriteInsideRead`]
    /// instead of waiting for itself.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
    /// let writer = locker.write("catalogue").await?;
    /// // ... rewrite the catalogue; no reader sees it half done ...
    /// writer.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn write(&self, key: impl Into<String>) -> Acquire {
        self.lock(key)
    }

    /// Starts acquiring the read lock of `key`: any number of readers, in every process, hold
    /// it together while no writer ([`write`](Self::write) or [`lock`](Self::lock) of the same
    /// key) holds it or waits for it. Configure it like any [`Acquire`]; the guard is a
    /// [`LockGuard`](crate::LockGuard) whose lease the watchdog renews per reader (a crashed
    /// reader's hold ends with its own lease, not with the others'), with the lost signal.
    ///
    /// Reentrant per task: a read inside the task's own read or write lock of the key is a
    /// nested guard, at once. Readers get no fencing token
    /// ([`LockError::NotExclusive`]): readers hold together, tokens order exclusive holders.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
    /// let reader = locker.read("catalogue").wait(Duration::from_secs(1)).await?;
    /// // ... read the catalogue; writers wait until every reader is done ...
    /// reader.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn read(&self, key: impl Into<String>) -> Acquire {
        Acquire::new(self.clone(), key.into(), Kind::Shared)
    }

    /// Whether anyone (any process) holds `key` right now: a mutex, write or fair lock, or
    /// read locks. One `EXISTS`. (Semaphores are not locks: their names are separate.)
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`], or [`LockError::Backend`] when Redis fails.
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        key::validate(key)?;
        let keys = self.inner.keys(key);
        self.inner.store.exists(&keys.lock).await.map_err(|e| {
            metrics::backend_error(Operation::IsLocked, &e);
            LockError::backend_on(&keys, key, e)
        })
    }

    /// Who holds `key`, how long its lease still runs, and how many wait: one script call,
    /// which writes nothing, whatever the kind (a mutex, write, read or fair lock, or a
    /// semaphore of that name; a lock and a semaphore of one name are separate, and the lock
    /// is reported when both are held). `None` when nothing holds it.
    ///
    /// The holder is named by the name its locker was built with
    /// ([`LockerBuilder::holder_name`]), which travels in the lock's stored value. The answer
    /// is a snapshot for operators and logs: the lock may change hands right after it.
    ///
    /// On a Cluster the call goes to the node of the key's slot. On RedLock the answer is
    /// the majority's: the holder whose value a majority of nodes hold, with the shortest
    /// remaining lease among them; `None` when no holder has a majority.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
    /// if let Some(info) = locker.inspect("inventory:42").await? {
    ///     println!(
    ///         "held by {} for {:?} more, {} waiting",
    ///         info.holder().unwrap_or("an unnamed holder"),
    ///         info.remaining(),
    ///         info.waiters()
    ///     );
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`], [`LockError::WrongType`] when a Redis name of the key holds
    /// a foreign value, [`LockError::Backend`] when Redis fails (for RedLock: when fewer than
    /// a majority of nodes answer).
    ///
    /// [`LockerBuilder::holder_name`]: crate::LockerBuilder::holder_name
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        key::validate(key)?;
        let lock = self.inner.keys(key);
        let semaphore = RedisKeys::semaphore(&self.inner.settings.prefix, key, 1);
        let found = self
            .inner
            .store
            .inspect(&lock, &semaphore)
            .await
            .map_err(|e| {
                metrics::backend_error(Operation::Inspect, &e);
                LockError::backend_on(&lock, key, e)
            })?;
        Ok(found.map(LockInfo::from_inspected))
    }

    /// Deletes the lock on `key` whoever holds it, and wakes its waiters: an operator's tool for
    /// a holder that is known to be gone. The holder, if alive, learns the loss at its next
    /// renewal. Returns whether a lock was deleted.
    ///
    /// # Cancel safety
    ///
    /// Dropped after it was sent, the deletion may or may not have happened: call it again
    /// (it is idempotent) to know.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`], [`LockError::WrongType`] when the key holds a foreign value
    /// (it is left alone), or [`LockError::Backend`].
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        key::validate(key)?;
        let keys = self.inner.keys(key);
        let deleted = self.inner.store.force_unlock(&keys).await.map_err(|e| {
            metrics::backend_error(Operation::ForceUnlock, &e);
            LockError::backend_on(&keys, key, e)
        })?;
        tracing::info!(key = %ShownKey(key), deleted, "force unlock");
        Ok(deleted)
    }

    /// Makes `locker` the process-wide default, used by `#[distributed_lock]` when it names no
    /// locker. Returns the locker back if a global one was already set.
    pub fn set_global(locker: Self) -> Result<(), Self> {
        GLOBAL.set(locker)
    }

    /// The process-wide default locker.
    ///
    /// # Errors
    ///
    /// [`LockError::NotConfigured`] when [`set_global`](Self::set_global) was never called.
    pub fn global() -> Result<&'static Self, LockError> {
        GLOBAL.get().ok_or(LockError::NotConfigured)
    }

    /// A snapshot of the locker's internal counters, for tests, leak checks and monitoring.
    /// Reading it takes no Redis round trip and a few uncontended locks.
    pub fn stats(&self) -> LockerStats {
        let local = &self.inner.local;
        LockerStats {
            watchdog_locks: local.watchdog_locks(),
            renewal_calls: local.renew_calls(),
            local_keys: self.inner.local.len(),
            subscriptions: self.inner.release_messages.channel_count(),
        }
    }

    /// Shuts the locker down, for a service that stops (SIGTERM, a rolling restart): gives
    /// back in Redis every lock, read lock and semaphore permit this locker holds, so that
    /// other instances get them at once rather than a lease later, and refuses every acquire
    /// from then on.
    ///
    /// In order: acquires fail from now on with [`LockError::ShutDown`], those waiting at
    /// once (one whose Redis call is under way when its answer comes, within the call's
    /// timeout: a lock Redis granted it is given back, and this waits for that); the watchdog and the release listener stop; every lock held is marked lost
    /// ([`LostReason::Shutdown`](crate::LostReason::Shutdown): [`LockGuard::lost`] fires, so
    /// a holder stops before another instance can enter) and released in Redis, all at once;
    /// then it waits until the releases and clean-ups running in the background (guards
    /// dropped just before, acquires that were cancelled) are done. A guard still alive
    /// afterwards releases nothing: its [`release`](crate::LockGuard::release) answers
    /// [`LockError::Lost`] with that reason, and its drop does nothing.
    ///
    /// Clones of the locker share the shutdown. It is idempotent: a second call finds
    /// nothing left to do (and waits for what is still running). Lock inspection
    /// ([`is_locked`](Self::is_locked), [`force_unlock`](Self::force_unlock)) keeps working.
    ///
    /// `timeout` bounds the wait, any value from zero (do not wait) to `Duration::MAX` (wait
    /// until done); the releases go on in the background after it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use lock_core::Locker;
    ///
    /// # async fn demo(locker: Locker) -> Result<(), lock_core::LockError> {
    /// tokio::signal::ctrl_c().await.ok();
    /// locker.shutdown(Duration::from_secs(5)).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] when a release failed (that key ends with its lease; the other
    /// releases went on), or, with [`LockError::is_timeout`] true, when `timeout` passed
    /// first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the locker is shut down at the first poll, and the releases go on in the
    /// background if the future is dropped.
    ///
    /// [`LockGuard::lost`]: crate::LockGuard::lost
    pub async fn shutdown(&self, timeout: std::time::Duration) -> Result<(), LockError> {
        let local = self.inner.local.clone();
        let release_messages = self.inner.release_messages.clone();
        local.close();
        // On a task of its own: the releases go on when the timeout cuts the wait short.
        let work = tokio::spawn(async move {
            let failed = local.give_back_all().await;
            local.in_flight.idle().await;
            // The listener stopped: nothing sweeps the channels of the waiters that left.
            release_messages.clear();
            failed
        });
        let finished = match tokio::time::Instant::now().checked_add(timeout) {
            Some(deadline) => tokio::time::timeout_at(deadline, work).await.ok(),
            None => Some(work.await),
        };
        match finished {
            Some(Ok(failed)) => {
                tracing::info!(
                    failed = failed.len(),
                    "locker shut down; every lock it held is given back"
                );
                failed.into_iter().next().map_or(Ok(()), Err)
            }
            // The task panicked (a bug): its locks end with their lease.
            Some(Err(error)) => Err(LockError::backend(
                None,
                BackendError::undecided("the shutdown's releases did not complete")
                    .context(error.to_string()),
            )),
            None => Err(LockError::backend(
                None,
                BackendError::timed_out("shutting down: releases still running"),
            )),
        }
    }

    /// The key prefix of every Redis name the locker writes.
    pub fn prefix(&self) -> &str {
        &self.inner.settings.prefix
    }
}

/// The internal counters of a [`Locker`], from [`Locker::stats`].
///
/// With nothing held and nobody waiting, `watchdog_locks`, `local_keys` and `subscriptions`
/// return to 0 (release channels are unsubscribed a short linger after their last waiter):
/// a test that finds them above 0 once its work is done has found a leak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LockerStats {
    /// Locks the watchdog is keeping alive right now (held without a fixed lease).
    pub watchdog_locks: usize,
    /// Renewal script calls the watchdog has sent since the locker was built, not one per
    /// lock: each tick sends, to each node, one call per kind of lock renewed (mutex and fair
    /// locks, read locks, semaphore permits) for up to 500 locks, and one per lock on a
    /// Cluster; retries after a dropped connection are not counted. A local handoff's
    /// confirmation is not a watchdog renewal and is not counted.
    pub renewal_calls: u64,
    /// Keys with local state: held, or waited for by a task of this process.
    pub local_keys: usize,
    /// Release channels the pub/sub connection is subscribed to.
    pub subscriptions: usize,
}

impl AsRef<Self> for Locker {
    fn as_ref(&self) -> &Self {
        self
    }
}

/// What of the start-up work is left when a locker starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Startup {
    /// Connected, and the eviction policy checked.
    Done,
    /// Nothing connected yet (a lazy locker): the check runs after Redis first answered.
    OnFirstUse,
}

impl Locker {
    /// Starts the background tasks of a locker on its store: the release listener, the
    /// watchdog and the background releaser.
    pub(crate) fn start(
        store: Store,
        pubsub: PubSubSource,
        settings: Settings,
        timeouts: Timeouts,
        startup: Startup,
    ) -> Self {
        let store = Arc::new(store);
        crate::metrics::describe();
        let lease = settings.watchdog_lease;
        let shutdown = CancellationToken::new();
        let release_messages = ReleaseMessages::start(pubsub, timeouts, shutdown.clone());
        let in_flight = InFlight::new();
        let releaser = release::start(store.clone(), in_flight.clone());
        let local = Arc::new(LocalLocks::new(
            &settings.prefix,
            store.clone(),
            releaser,
            in_flight,
            shutdown.clone(),
            // An extension holds its turn for one call: a command and its `WAIT`, each
            // within the command timeout.
            settings
                .command_timeout
                .saturating_mul(2)
                .saturating_add(Duration::from_secs(1)),
        ));
        watchdog::start(Arc::downgrade(&local), lease, shutdown);
        tracing::debug!(prefix = %settings.prefix, ?lease, ?startup, "locker started");
        Self {
            inner: Arc::new(Inner {
                store,
                settings,
                local,
                release_messages,
                eviction_unchecked: AtomicBool::new(startup == Startup::OnFirstUse),
            }),
        }
    }
}
