//! [`Locker`], the entry point, and its [`LockerBuilder`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::acquire::Acquire;
use crate::error::{ConfigError, LockError};
use crate::key::{self, RedisKeys};
use crate::reentrancy::Registry;
use crate::release::{self, ReleaseJob};
use crate::scripts;
use crate::waiters::Waiters;
use crate::watchdog::Watchdog;

/// The longest lease accepted (Redis takes millisecond TTLs up to `i64::MAX`; this keeps every
/// deadline computation far from overflow).
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

static GLOBAL: OnceLock<Locker> = OnceLock::new();

/// A handle to distributed locks on one Redis deployment.
///
/// `Locker` is cheap to clone (an `Arc` inside) and meant to be created once per process. It
/// owns one multiplexed command connection (reconnecting by itself), one pub/sub connection for
/// release notifications, the watchdog task that renews held locks, and the registry that makes
/// locks reentrant per task. Background tasks stop when the last clone and the last guard are
/// dropped.
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
            .field("held", &self.inner.watchdog.len())
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
}

pub(crate) struct Inner {
    pub(crate) conn: ConnectionManager,
    pub(crate) settings: Settings,
    pub(crate) registry: Registry,
    pub(crate) waiters: Waiters,
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) releaser: mpsc::UnboundedSender<ReleaseJob>,
    next_id: AtomicU64,
    _shutdown: DropGuard,
}

impl Inner {
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn keys(&self, key: &str) -> RedisKeys {
        RedisKeys::new(&self.settings.prefix, key)
    }
}

impl Locker {
    /// Connects to one Redis server with default settings (see [`LockerBuilder`]).
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a URL that does not parse, [`LockError::Backend`] when Redis
    /// cannot be reached within the connect timeout.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder().url(url).build().await
    }

    /// Starts configuring a locker.
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    /// Starts acquiring `key`; configure the attempt on the returned [`Acquire`] and `.await` it.
    ///
    /// The key is validated when the acquire is awaited ([`LockError::InvalidKey`]).
    pub fn lock(&self, key: impl Into<String>) -> Acquire {
        Acquire::new(self.clone(), key.into())
    }

    /// Whether anyone (any process) holds `key` right now. One `EXISTS`.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`], or [`LockError::Backend`] when Redis fails.
    pub async fn is_locked(&self, key: &str) -> Result<bool, LockError> {
        key::validate(key)?;
        let keys = self.inner.keys(key);
        let mut conn = self.inner.conn.clone();
        let exists: bool = redis::cmd("EXISTS")
            .arg(&keys.lock)
            .query_async(&mut conn)
            .await
            .map_err(|e| LockError::backend(key, e))?;
        Ok(exists)
    }

    /// Deletes the lock on `key` whoever holds it, and wakes its waiters: an operator's tool for
    /// a holder that is known to be gone. The holder, if alive, learns the loss at its next
    /// renewal. Returns whether a lock was deleted.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`], [`LockError::WrongType`] when the key holds a foreign value
    /// (it is left alone), or [`LockError::Backend`].
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        key::validate(key)?;
        let keys = self.inner.keys(key);
        let mut conn = self.inner.conn.clone();
        let deleted: i64 = scripts::FORCE_UNLOCK
            .key(&keys.lock)
            .arg(&keys.channel)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| LockError::backend(key, e))?;
        tracing::info!(%key, deleted = deleted == 1, "force unlock");
        Ok(deleted == 1)
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

    /// Number of locks the watchdog is keeping alive right now.
    pub fn watchdog_locks(&self) -> usize {
        self.inner.watchdog.len()
    }

    /// Renewal script calls the watchdog has sent since the locker was built.
    pub fn renewal_calls(&self) -> u64 {
        self.inner.watchdog.renew_calls.load(Ordering::Relaxed)
    }

    /// Number of keys with local state: held, or waited for by a task of this process.
    pub fn local_keys(&self) -> usize {
        self.inner.registry.len()
    }

    /// Number of release channels the pub/sub connection is subscribed to.
    pub fn subscriptions(&self) -> usize {
        self.inner.waiters.channel_count()
    }

    /// The key prefix of every Redis name the locker writes.
    pub fn prefix(&self) -> &str {
        &self.inner.settings.prefix
    }
}

impl AsRef<Self> for Locker {
    fn as_ref(&self) -> &Self {
        self
    }
}

/// Configures and connects a [`Locker`].
///
/// | setting | default |
/// |---|---|
/// | [`prefix`](Self::prefix) | `"lock:"` |
/// | [`watchdog_lease`](Self::watchdog_lease) | 30 s, renewed every 10 s |
/// | [`default_wait`](Self::default_wait) | 30 s |
/// | [`max_hold`](Self::max_hold) | none |
/// | [`fence_retention`](Self::fence_retention) | 1 hour |
/// | [`fallback_retry`](Self::fallback_retry) | 1 s (jittered ±25 %) |
/// | [`connect_timeout`](Self::connect_timeout) | 5 s |
/// | [`command_timeout`](Self::command_timeout) | 3 s |
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::Locker;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let locker = Locker::builder()
///     .url("redis://127.0.0.1:6379")
///     .prefix("shop:lock:")
///     .watchdog_lease(Duration::from_secs(10))
///     .build()
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `.build().await`"]
pub struct LockerBuilder {
    url: Option<String>,
    settings: Settings,
    connect_timeout: Duration,
}

impl Default for LockerBuilder {
    fn default() -> Self {
        Self {
            url: None,
            settings: Settings {
                prefix: "lock:".to_owned(),
                watchdog_lease: Duration::from_secs(30),
                default_wait: Duration::from_secs(30),
                max_hold: None,
                fence_retention: Duration::from_secs(3600),
                fallback_retry: Duration::from_secs(1),
                command_timeout: Duration::from_secs(3),
            },
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl LockerBuilder {
    /// The Redis URL, e.g. `redis://127.0.0.1:6379` or `redis://user:pass@host:6379/0`.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Prefix of every Redis key and channel the locker uses (no `{` or `}`, at most 128 bytes).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// Lease of locks acquired without an explicit `.lease(..)`; the watchdog renews them every
    /// third of it while their guard lives. At least 30 ms.
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.settings.watchdog_lease = lease;
        self
    }

    /// How long `lock(..)` waits when the acquire sets no `.wait(..)`.
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.settings.default_wait = wait;
        self
    }

    /// Stop renewing a watchdog lock after it has been held this long (the guard then reports
    /// lost when its last lease ends), so a hung holder cannot keep a key forever. Off by
    /// default; `.max_hold(..)` on an acquire overrides it.
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.settings.max_hold = Some(max);
        self
    }

    /// How long a key's fencing counter outlives its last acquire (at least twice the lease).
    /// Tokens stay increasing after the counter expired as long as the Redis server's clock
    /// does not step back by more than this.
    pub fn fence_retention(mut self, retention: Duration) -> Self {
        self.settings.fence_retention = retention;
        self
    }

    /// Safety-net retry interval of a waiter that got no release notification (lost message,
    /// pub/sub unavailable). Waiters also retry when the holder's TTL runs out.
    pub fn fallback_retry(mut self, interval: Duration) -> Self {
        self.settings.fallback_retry = interval;
        self
    }

    /// Limit for establishing a connection.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Limit for one Redis command's reply.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.settings.command_timeout = timeout;
        self
    }

    /// Validates the settings, connects, and starts the background tasks.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a missing or malformed URL, a bad prefix or lease;
    /// [`LockError::Backend`] when Redis cannot be reached within the connect timeout.
    pub async fn build(self) -> Result<Locker, LockError> {
        let Self {
            url,
            settings,
            connect_timeout,
        } = self;
        let url = url.ok_or(ConfigError::MissingUrl)?;
        if !key::valid_prefix(&settings.prefix) {
            return Err(ConfigError::Prefix {
                prefix: settings.prefix,
            }
            .into());
        }
        let lease = settings.watchdog_lease;
        if lease < Duration::from_millis(30) || lease > MAX_LEASE {
            return Err(ConfigError::WatchdogLease { lease }.into());
        }
        let client = redis::Client::open(url.as_str()).map_err(ConfigError::Url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(settings.command_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| LockError::backend("", e))?;

        let shutdown = CancellationToken::new();
        let waiters = Waiters::start(client, connect_timeout, shutdown.clone());
        let watchdog = Arc::new(Watchdog::default());
        watchdog.start(conn.clone(), lease, shutdown.clone());
        let releaser = release::start(conn.clone());
        tracing::debug!(prefix = %settings.prefix, ?lease, "locker connected");
        Ok(Locker {
            inner: Arc::new(Inner {
                conn,
                settings,
                registry: Registry::default(),
                waiters,
                watchdog,
                releaser,
                next_id: AtomicU64::new(1),
                _shutdown: shutdown.drop_guard(),
            }),
        })
    }
}
