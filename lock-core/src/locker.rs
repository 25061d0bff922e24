//! [`Locker`], the entry point, and its [`LockerBuilder`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::acquire::Acquire;
use crate::connection::{Connection, Timeouts};
use crate::error::{ConfigError, LockError};
use crate::key::{self, RedisKeys};
use crate::reentrancy::Registry;
use crate::release::{self, ReleaseJob};
use crate::store::{MinReplicas, RestartGuard, Store};
use crate::tls::{self, TlsConfig};
use crate::waiters::{PubSubSource, Waiters};
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
    pub(crate) store: Arc<Store>,
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
    /// cannot be reached within the connect timeout, [`LockError::Tls`] when a `rediss://`
    /// handshake fails.
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
        self.inner
            .store
            .exists(&keys.lock)
            .await
            .map_err(|e| LockError::backend(key, e))
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
        let deleted = self
            .inner
            .store
            .force_unlock(&keys)
            .await
            .map_err(|e| LockError::backend(key, e))?;
        tracing::info!(%key, deleted, "force unlock");
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
/// | [`min_replicas`](Self::min_replicas) | none |
/// | [`restart_guard`](Self::restart_guard) | none (RedLock only) |
/// | [`tls`](Self::tls) | system trust store for `rediss://` URLs |
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
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build().await`"]
pub struct LockerBuilder {
    topology: Option<Topology>,
    settings: Settings,
    connect_timeout: Duration,
    min_replicas: Option<MinReplicas>,
    restart_guard: Option<Duration>,
    tls: Option<TlsConfig>,
}

impl std::fmt::Debug for LockerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // URLs may carry passwords: only their redacted form is ever printed.
        let urls: Vec<String> = match &self.topology {
            None => Vec::new(),
            Some(Topology::Single(url)) => vec![redact(url)],
            Some(Topology::Cluster(urls) | Topology::RedLock(urls)) => {
                urls.iter().map(|u| redact(u)).collect()
            }
            Some(Topology::Sentinel { sentinels, .. }) => {
                sentinels.iter().map(|u| redact(u)).collect()
            }
        };
        f.debug_struct("LockerBuilder")
            .field("urls", &urls)
            .field("settings", &self.settings)
            .field("connect_timeout", &self.connect_timeout)
            .field("min_replicas", &self.min_replicas)
            .field("restart_guard", &self.restart_guard)
            .field("tls", &self.tls)
            .finish()
    }
}

/// `redis://user:secret@host/` becomes `redis://user:***@host/`.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let host_start = rest.find('/').unwrap_or(rest.len());
    match rest[..host_start].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme_end], &rest[at..])
        }
        None => url.to_owned(),
    }
}

/// Where the locks live.
#[derive(Clone)]
enum Topology {
    Single(String),
    Cluster(Vec<String>),
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
    RedLock(Vec<String>),
}

impl Default for LockerBuilder {
    fn default() -> Self {
        Self {
            topology: None,
            min_replicas: None,
            restart_guard: None,
            tls: None,
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
    /// One Redis server: `redis://127.0.0.1:6379`, `redis://user:pass@host:6379/0`, or over
    /// TLS `rediss://host:6380` (see [`tls`](Self::tls)).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.topology = Some(Topology::Single(url.into()));
        self
    }

    /// A Redis Cluster, reached through any of these seed nodes. Every lock's keys and release
    /// channel share one slot (the kit's own hash tag); MOVED/ASK redirections and slot
    /// migrations are followed by the client; the watchdog sends its renewals to every node
    /// at once. Release messages are published cluster-wide, so the one subscriber connection
    /// may sit on any node.
    pub fn cluster<I, S>(mut self, seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.topology = Some(Topology::Cluster(
            seeds.into_iter().map(Into::into).collect(),
        ));
        self
    }

    /// A primary monitored by Sentinel: the locker asks the sentinels (`redis://host:26379`)
    /// for the primary named `master`, asks again after connection errors or `READONLY` and
    /// every second, so it follows failovers, manual ones included (where the old primary keeps
    /// answering for a while).
    ///
    /// With `rediss://` sentinel URLs, the sentinels are asked over TLS and the primary is
    /// connected over TLS too, at the address the sentinels report (so the servers and the
    /// sentinels need `tls-port` and `tls-replication yes`); both are verified with the
    /// [`tls`](Self::tls) settings, or the system trust store without them. All URLs must then
    /// be `rediss://` and carry the same credentials (redis-rs applies one set to every
    /// sentinel); anything else is a [`ConfigError::Tls`] from [`build`](Self::build).
    pub fn sentinel<I, S>(mut self, master: impl Into<String>, sentinels: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.topology = Some(Topology::Sentinel {
            master: master.into(),
            sentinels: sentinels.into_iter().map(Into::into).collect(),
        });
        self
    }

    /// RedLock over independent primaries (at least 3; 5 is the usual choice): a lock is held
    /// when a majority granted it within its validity (lease minus elapsed time minus a drift
    /// allowance of 1 % plus 2 ms). Failed or partial acquires are undone on every node; renewal
    /// and release need a majority too. Fencing tokens stay strictly increasing: the largest
    /// token of the granting majority is written back to all of its nodes before the lock is
    /// handed out, and any later majority shares a node with it.
    pub fn redlock<I, S>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.topology = Some(Topology::RedLock(
            nodes.into_iter().map(Into::into).collect(),
        ));
        self
    }

    /// RedLock's delayed-restart guard: a node whose data set is younger than `guard` grants
    /// no lock. A node restarted without persistence (or flushed) has forgotten the locks it
    /// granted; without the guard, another client could assemble a majority with it while the
    /// first holder's lease still runs on the other nodes. Set `guard` to at least the longest
    /// lease any client uses on these nodes (the watchdog lease, fixed leases).
    ///
    /// The kit notices a new data set by a per-node epoch key (`<prefix>node-epoch`, no TTL) that
    /// it writes at the first acquire: a restart with AOF keeps it and costs no availability,
    /// but nodes seen for the first time (a new deployment) also refuse locks for `guard`.
    /// Off by default; RedLock only.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use lock_core::Locker;
    ///
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = Locker::builder()
    ///     .redlock(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
    ///     .watchdog_lease(Duration::from_secs(10))
    ///     .restart_guard(Duration::from_secs(10))
    ///     .build()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn restart_guard(mut self, guard: Duration) -> Self {
        self.restart_guard = Some(guard);
        self
    }

    /// After each acquire, `WAIT replicas timeout`: if fewer replicas acknowledged the lock key,
    /// release it again and fail with [`LockError::NotReplicated`]. This narrows the window in
    /// which a failover to a replica that never saw the key grants the lock twice. For single,
    /// Sentinel and Cluster topologies (not RedLock). `WAIT` runs on the shared command
    /// connection: while a replica lags, other commands of this locker queue behind it for up
    /// to `timeout`.
    pub fn min_replicas(mut self, replicas: u64, timeout: Duration) -> Self {
        self.min_replicas = Some(MinReplicas { replicas, timeout });
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

    /// Certificates for `rediss://` URLs: a private CA to trust instead of the system trust
    /// store, and a client certificate for servers with `tls-auth-clients yes`. Applies to
    /// every connection of the locker: the command connection, the pub/sub connection of the
    /// waiters, every RedLock node, every Cluster node, and with [`sentinel`](Self::sentinel)
    /// the connections to the sentinels and to the primary they name.
    ///
    /// `rediss://` URLs work without this (verified against the system trust store); with it,
    /// every URL (sentinel URLs included) must be `rediss://`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lock_core::{Locker, TlsConfig};
    ///
    /// # async fn demo(ca_pem: Vec<u8>) -> Result<(), lock_core::LockError> {
    /// let locker = Locker::builder()
    ///     .url("rediss://127.0.0.1:6380")
    ///     .tls(TlsConfig::new().root_certificate_pem(ca_pem))
    ///     .build()
    ///     .await?;
    /// # let _ = locker;
    /// # Ok(())
    /// # }
    /// ```
    pub fn tls(mut self, config: TlsConfig) -> Self {
        self.tls = Some(config);
        self
    }

    /// Limit for establishing a connection (TCP, and the TLS handshake for `rediss://`).
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
    /// [`LockError::Config`] for a missing or malformed URL, a bad prefix or lease, unusable
    /// TLS settings (all checked before any connection is made);
    /// [`LockError::Backend`] when Redis cannot be reached within the connect timeout;
    /// [`LockError::Tls`] when a TLS handshake fails (untrusted, expired or wrong-host
    /// certificate, refused client certificate).
    pub async fn build(self) -> Result<Locker, LockError> {
        let Self {
            topology,
            settings,
            connect_timeout,
            min_replicas,
            restart_guard,
            tls,
        } = self;
        let topology = topology.ok_or(ConfigError::MissingUrl)?;
        if let Some(tls) = &tls {
            tls.validate()?;
        }
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
        let timeouts = Timeouts {
            connect: connect_timeout,
            command: settings.command_timeout,
        };
        let restart_guard = match restart_guard {
            None => None,
            Some(_) if !matches!(topology, Topology::RedLock(_)) => {
                return Err(ConfigError::RestartGuardWithoutRedLock.into());
            }
            Some(guard) if guard < Duration::from_millis(1) || guard > MAX_LEASE => {
                return Err(ConfigError::RestartGuard { guard }.into());
            }
            Some(guard) => Some(RestartGuard {
                epoch_key: format!("{}node-epoch", settings.prefix),
                guard,
            }),
        };
        let (store, pubsub) = connect(
            topology,
            timeouts,
            min_replicas,
            restart_guard,
            tls.as_ref(),
        )
        .await?;
        let store = Arc::new(store);
        store.warn_on_eviction_policy().await;
        let shutdown = CancellationToken::new();
        let waiters = Waiters::start(pubsub, timeouts, shutdown.clone());
        let watchdog = Arc::new(Watchdog::default());
        watchdog.start(store.clone(), lease, shutdown.clone());
        let releaser = release::start(store.clone());
        tracing::debug!(prefix = %settings.prefix, ?lease, "locker connected");
        Ok(Locker {
            inner: Arc::new(Inner {
                store,
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

/// A client for `url`, with the TLS settings when there are any.
fn open(url: &str, tls: Option<&TlsConfig>) -> Result<redis::Client, ConfigError> {
    let client = redis::Client::open(url).map_err(ConfigError::Url)?;
    let secure = is_tls_url(&client);
    if secure {
        tls::ensure_crypto_provider();
    }
    match tls {
        None => Ok(client),
        Some(_) if !secure => Err(ConfigError::Tls {
            what: "url",
            reason: format!("TLS settings need `rediss://` urls, got {}", redact(url)),
        }),
        Some(tls) => {
            redis::Client::build_with_tls(url, tls.certificates()).map_err(|e| ConfigError::Tls {
                what: "certificates",
                reason: e.to_string(),
            })
        }
    }
}

fn is_tls_url(client: &redis::Client) -> bool {
    matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    )
}

fn clients(urls: &[String], tls: Option<&TlsConfig>) -> Result<Vec<redis::Client>, LockError> {
    urls.iter()
        .map(|u| open(u, tls).map_err(LockError::from))
        .collect()
}

/// A Sentinel client for `master`. With `rediss://` sentinel URLs, the sentinels are asked
/// over TLS and the primary they name is connected over TLS as well, both verified with the
/// configured certificates (or the system trust store); with `redis://` URLs, everything is
/// plaintext.
fn sentinel_client(
    master: &str,
    sentinels: &[String],
    tls: Option<&TlsConfig>,
) -> Result<SentinelClient, ConfigError> {
    // `open` refuses `redis://` URLs when TLS settings are given.
    let opened = sentinels
        .iter()
        .map(|url| open(url, tls))
        .collect::<Result<Vec<_>, _>>()?;
    let secure = opened.iter().filter(|c| is_tls_url(c)).count();
    let unsupported = |reason: &str| ConfigError::Tls {
        what: "topology",
        reason: reason.to_owned(),
    };
    let build_error = |e: redis::RedisError| ConfigError::Tls {
        what: "sentinel",
        reason: e.to_string(),
    };
    if secure == 0 {
        return SentinelClient::build(
            sentinels.iter().map(String::as_str).collect(),
            master,
            None,
            SentinelServerType::Master,
        )
        .map_err(ConfigError::Url);
    }
    if secure != opened.len() {
        return Err(unsupported(
            "sentinel urls mix `redis://` and `rediss://`; use `rediss://` for all of them",
        ));
    }
    // The builder takes one set of credentials for all sentinels.
    let credentials = |c: &redis::Client| {
        let info = c.get_connection_info().redis_settings();
        (
            info.username().map(str::to_owned),
            info.password().map(str::to_owned),
        )
    };
    let (username, password) = credentials(&opened[0]);
    if opened[1..]
        .iter()
        .any(|c| credentials(c) != (username.clone(), password.clone()))
    {
        return Err(unsupported(
            "with `rediss://` sentinels, every sentinel url must carry the same username and password",
        ));
    }
    // Each address carries its TLS parameters (the certificates) from `open`.
    let addrs = opened
        .iter()
        .map(|c| c.get_connection_info().addr().clone());
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
        .map_err(build_error)?
        .set_client_to_redis_tls_mode(redis::TlsMode::Secure);
    if let Some(username) = username {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some(tls) = tls {
        builder = builder.set_client_to_redis_certificates(tls.certificates());
    }
    builder.build().map_err(build_error)
}

/// Connects the command side and describes where release notifications come from.
async fn connect(
    topology: Topology,
    timeouts: Timeouts,
    min_replicas: Option<MinReplicas>,
    restart_guard: Option<RestartGuard>,
    tls: Option<&TlsConfig>,
) -> Result<(Store, PubSubSource), LockError> {
    let backend = |e| LockError::backend("", e);
    Ok(match topology {
        Topology::Single(url) => {
            let client = open(&url, tls)?;
            let conn = Connection::single(client.clone(), timeouts)
                .await
                .map_err(backend)?;
            (
                Store::One { conn, min_replicas },
                PubSubSource::Nodes(vec![client]),
            )
        }
        Topology::Cluster(seeds) => {
            if seeds.is_empty() {
                return Err(ConfigError::MissingUrl.into());
            }
            let pubsub = PubSubSource::Nodes(clients(&seeds, tls)?);
            let conn = Connection::cluster(&seeds, timeouts, tls.map(TlsConfig::certificates))
                .await
                .map_err(backend)?;
            (Store::One { conn, min_replicas }, pubsub)
        }
        Topology::Sentinel { master, sentinels } => {
            if sentinels.is_empty() {
                return Err(ConfigError::MissingUrl.into());
            }
            let client = sentinel_client(&master, &sentinels, tls)?;
            let conn = Connection::sentinel(client, timeouts)
                .await
                .map_err(backend)?;
            let Connection::Sentinel(primary) = &conn else {
                unreachable!("Connection::sentinel returns a Sentinel connection")
            };
            let pubsub = PubSubSource::Sentinel(primary.clone());
            (Store::One { conn, min_replicas }, pubsub)
        }
        Topology::RedLock(urls) => {
            if urls.len() < 3 {
                return Err(ConfigError::RedLockNodes { count: urls.len() }.into());
            }
            if min_replicas.is_some() {
                return Err(ConfigError::MinReplicasWithRedLock.into());
            }
            let clients = clients(&urls, tls)?;
            // Nodes that are down at start-up are connected lazily: RedLock must start with a
            // majority up, not all of them.
            let mut nodes = Vec::new();
            let mut up = 0;
            for client in &clients {
                let conn = match Connection::single(client.clone(), timeouts).await {
                    Ok(conn) => {
                        up += 1;
                        conn
                    }
                    Err(_) => Connection::lazy(client.clone(), timeouts).map_err(backend)?,
                };
                nodes.push(conn);
            }
            if up < urls.len() / 2 + 1 {
                return Err(LockError::backend(
                    "",
                    redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        "fewer than a majority of RedLock nodes are reachable",
                    )),
                ));
            }
            let store = Store::Quorum {
                nodes,
                timeout: timeouts.command,
                restart_guard,
            };
            (store, PubSubSource::Nodes(clients))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_debug_output() {
        assert_eq!(
            redact("redis://app:hunter2@db:6379/0"),
            "redis://app:***@db:6379/0"
        );
        assert_eq!(redact("redis://:hunter2@db"), "redis://:***@db");
        assert_eq!(redact("redis://db:6379"), "redis://db:6379");
        let builder = Locker::builder().url("redis://app:hunter2@db:6379/0");
        assert!(!format!("{builder:?}").contains("hunter2"));
        let builder = Locker::builder().redlock(["redis://:s3cret@a", "redis://:s3cret@b"]);
        assert!(!format!("{builder:?}").contains("s3cret"));
        let builder = Locker::builder()
            .url("rediss://app:hunter2@db:6380/")
            .tls(TlsConfig::new().client_identity_pem("CERT", "PRIVATE-KEY-TEXT"));
        let debug = format!("{builder:?}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("PRIVATE-KEY-TEXT"),
            "{debug}"
        );
    }
}
