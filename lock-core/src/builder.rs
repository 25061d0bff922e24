//! [`LockerBuilder`]: the settings of a [`Locker`], their validation, and `build`.

use std::sync::Arc;
use std::time::Duration;

use crate::connection::Timeouts;
use crate::error::{ConfigError, DurationSetting, LockError};
use crate::holder;
use crate::key;
use crate::limits::{
    self, DEFAULT_FENCE_RETENTION, DEFAULT_RELEASE_RETRY_WINDOW, MAX_LEASE, MIN_WATCHDOG_LEASE,
};
use crate::locker::{Locker, Settings, Startup};
use crate::store::{MinReplicas, RestartGuard};
use crate::topology::{
    check_features, connect, connect_lazy, redact, Credentials, TlsConfig, Topology,
};

/// Configures and connects a [`Locker`].
///
/// | setting | default | range |
/// |---|---|---|
/// | [`prefix`](Self::prefix) | `"lock:"` | at most 128 bytes, no `{` or `}` |
/// | [`holder_name`](Self::holder_name) | `<host name>:<process id>` | 1 to 64 bytes, no `\|`, control or invisible characters |
/// | [`watchdog_lease`](Self::watchdog_lease) | 30 s, renewed every 10 s | 30 ms to 365 days |
/// | [`default_wait`](Self::default_wait) | 30 s | any; beyond 100 years: no deadline |
/// | [`max_hold`](Self::max_hold) | none | any (from 3 ms on RedLock); beyond 100 years: no limit |
/// | [`trace_holds`](Self::trace_holds) | off: the `lock.hold` span at debug level | |
/// | [`fence_retention`](Self::fence_retention) | 10 s past the lock | 1 ms to 10 × 365 days |
/// | [`fallback_retry`](Self::fallback_retry) | 1 s (jittered ±25 %) | 10 ms to 10 minutes |
/// | [`connect_timeout`](Self::connect_timeout) | 5 s | 1 ms to 1 hour |
/// | [`command_timeout`](Self::command_timeout) | 3 s | 1 ms to 1 hour |
/// | [`release_retry_window`](Self::release_retry_window) | 0: no latch | 0 to 1 hour |
/// | [`min_replicas`](Self::min_replicas) | none | timeout 1 ms to 1 hour, used up to half the command timeout |
/// | [`restart_guard`](Self::restart_guard) | none (not for Cluster) | 1 ms to 365 days |
/// | [`tls`](Self::tls) | system trust store for `rediss://` URLs | |
/// | [`sentinel_data_password`](Self::sentinel_data_password), [`sentinel_data_user`](Self::sentinel_data_user) | none: the data nodes behind Sentinel need no password | |
///
/// A duration outside its range is refused by [`build`](Self::build) with
/// [`ConfigError::OutOfRange`], which names the setting and its range; none of them can make
/// the locker panic later.
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
    /// The data nodes' credentials for a Sentinel topology.
    sentinel_data: Option<Credentials>,
}

impl std::fmt::Debug for LockerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // URLs may carry passwords: only their redacted form is ever printed.
        let urls: Vec<String> = match &self.topology {
            None => Vec::new(),
            Some(Topology::Server(url)) => vec![redact(url)],
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
            .field("sentinel_data", &self.sentinel_data)
            .finish()
    }
}

impl Default for LockerBuilder {
    fn default() -> Self {
        Self {
            topology: None,
            min_replicas: None,
            restart_guard: None,
            tls: None,
            sentinel_data: None,
            settings: Settings {
                prefix: "lock:".to_owned(),
                watchdog_lease: Duration::from_secs(30),
                default_wait: Duration::from_secs(30),
                max_hold: None,
                fence_retention: DEFAULT_FENCE_RETENTION,
                fallback_retry: Duration::from_secs(1),
                command_timeout: Duration::from_secs(3),
                release_retry_window: DEFAULT_RELEASE_RETRY_WINDOW,
                trace_holds: false,
                holder: holder::default_name().into(),
            },
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl LockerBuilder {
    /// One Redis server: `redis://127.0.0.1:6379`, `redis://user:pass@host:6379/0`, or over
    /// TLS `rediss://host:6380` (with the `tls` feature, a default one; see the crate docs,
    /// "TLS"). Without the feature [`build`](Self::build) refuses a `rediss://` URL, here and
    /// in every other topology, with [`ConfigError::FeatureDisabled`].
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.topology = Some(Topology::Server(url.into()));
        self
    }

    /// A Redis Cluster, reached through any of these seed nodes. Every lock's keys and release
    /// channel share one slot (the kit's own hash tag); MOVED/ASK redirections and slot
    /// migrations are followed by the client; the watchdog sends its renewals to every node
    /// at once. Release messages are published cluster-wide, so the one subscriber connection
    /// may sit on any node. Every key a script touches is declared, so while a lock's slot
    /// migrates with its keys split between two nodes the scripts are refused before they run
    /// (`TRYAGAIN`) and retried: a contended acquire waits for the end of the migration (within
    /// its wait); a release is retried (by the cluster client, then by the kit) for a few
    /// seconds, then fails with a backend error having changed nothing (the lock ends with its
    /// lease).
    ///
    /// Needs the `cluster` feature (a default one); without it [`build`](Self::build) refuses
    /// the topology with [`ConfigError::FeatureDisabled`].
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
    ///
    /// The sentinel URLs carry the sentinels' credentials only. Password-protected data nodes
    /// take theirs from [`sentinel_data_password`](Self::sentinel_data_password) or
    /// [`sentinel_data_user`](Self::sentinel_data_user); without, every command to the
    /// primary fails with `NOAUTH`.
    ///
    /// Needs the `sentinel` feature (a default one); without it [`build`](Self::build) refuses
    /// the topology with [`ConfigError::FeatureDisabled`].
    pub fn sentinel<I, S>(mut self, master: impl Into<String>, sentinels: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.topology = Some(Topology::Sentinel {
            master: master.into(),
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            data: None,
        });
        self
    }

    /// The password of the data nodes behind [`sentinel`](Self::sentinel) (`requirepass`, the
    /// `default` user): the primary the sentinels name, and the replica they promote in a
    /// failover. The sentinel URLs carry the sentinels' own credentials
    /// (`redis://:sentinel-secret@host:26379`), which are not the data nodes'. Only with
    /// [`sentinel`](Self::sentinel): with another topology (whose URLs carry the credentials)
    /// [`build`](Self::build) refuses it with [`ConfigError::DataCredentialsWithoutSentinel`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lock_core::Locker;
    ///
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = Locker::builder()
    ///     .sentinel("locks", ["redis://:sentinel-secret@10.0.0.1:26379"])
    ///     .sentinel_data_user("app", "app-secret")
    ///     .build()
    ///     .await?;
    /// # let _ = locker;
    /// # Ok(())
    /// # }
    /// ```
    pub fn sentinel_data_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_data = Some(Credentials {
            username: None,
            password: password.into(),
        });
        self
    }

    /// As [`sentinel_data_password`](Self::sentinel_data_password), for an ACL user of the data
    /// nodes (create it on every one of them: ACL users are not replicated). The documented
    /// minimal ACL (crate docs, "Redis data model (for ACLs)") is enough; its `+role` is for
    /// Sentinel: the client checks with `ROLE` that the node the sentinels name is the primary.
    pub fn sentinel_data_user(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.sentinel_data = Some(Credentials {
            username: Some(username.into()),
            password: password.into(),
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

    /// The delayed-restart guard: a server whose data set is younger than `guard` grants no
    /// lock. A server that restarted has forgotten the locks granted after its last persisted
    /// write (without persistence: all of them; from an RDB snapshot, the default: those since
    /// the snapshot). Without the guard another client is granted such a lock while its first
    /// holder still believes it holds it, and learns otherwise only at its next renewal (or,
    /// with a fixed lease, never). With the guard, the restarted server refuses every acquire
    /// (acquirers wait, as for a held lock) until the forgotten leases have surely run out,
    /// and holders learn of the loss from their renewals first. For RedLock it keeps a
    /// restarted node from voting twice. Set `guard` to at least the longest lease any client
    /// uses on these servers (the watchdog lease, fixed leases). From 1 ms to 365 days
    /// ([`MAX_LEASE`](crate::MAX_LEASE), the longest lease).
    ///
    /// The kit notices a restart by the server's `run_id`, which changes at every start
    /// whatever the server loaded, kept in an epoch key (`<prefix>node-epoch`, no TTL) with the
    /// time the data set began; a missing epoch key (a new or flushed server) also starts the
    /// guard. So every restart costs `guard` of availability, with or without persistence, and
    /// so does a server seen for the first time. Off by default; a single server, Sentinel's
    /// primary (a restart of the same process; a failover is covered by
    /// [`min_replicas`](Self::min_replicas) instead) and RedLock nodes, not Cluster (one epoch
    /// per shard would be needed).
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
    /// Sentinel and Cluster topologies (not RedLock). `timeout` goes from 1 ms (`WAIT` counts
    /// in milliseconds, and `WAIT .. 0` would block for ever) to 1 hour, and is cut to half
    /// the [`command_timeout`](Self::command_timeout) (with a warning when built): the
    /// `WAIT`'s answer must come back within it, or the acquire would fail as a timeout
    /// rather than with [`LockError::NotReplicated`].
    ///
    /// `WAIT` blocks the connection it is sent on until the replicas acknowledge. So on a
    /// single server and Sentinel an acquire (and an [`extend`](crate::LockGuard::extend), a
    /// local handoff's renewal, a Sentinel release) sends its write and `WAIT` on a
    /// connection of its own, up to 8 at once (more wait for one), opened on first need
    /// (within the [`connect_timeout`](Self::connect_timeout)) and kept while idle: a lagging
    /// replica slows those calls, not the locker's other commands. On a cluster they go on
    /// the shared connection, one connection to each primary: a lagging replica holds up the
    /// calls to its own shard, where a burst's `WAIT`s queue. An extension on a connection of
    /// its own is not ordered with the watchdog's renewals sent meanwhile, so the guard counts
    /// those only from the extension's answer; one that never answers (cancelled, timed
    /// out) may still run in Redis later, so the guard's validity never again exceeds what it
    /// leaves the key, and the lock is released rather than handed to a local waiter.
    ///
    /// The watchdog's renewals are followed by `WAIT` too, on the shared connection (one per
    /// round on a server, where other commands queue behind it for up to `timeout`; one per
    /// lock on a cluster's shard), and a renewal fewer replicas acknowledged does not count:
    /// after a failover the old primary, which no replica follows any more, may accept
    /// renewals for seconds while the key runs out on the new primary and another locker
    /// takes it there. So a held lock whose renewals no replica acknowledges for a lease is
    /// lost (it fails closed, as an acquire does): with Sentinel, run two replicas or more,
    /// so that a failover leaves the new primary one.
    pub fn min_replicas(mut self, replicas: u64, timeout: Duration) -> Self {
        self.min_replicas = Some(MinReplicas { replicas, timeout });
        self
    }

    /// Prefix of every Redis key and channel the locker uses (no `{` or `}`, at most 128 bytes).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// The name every lock of this locker carries in Redis, so that whoever finds a lock taken
    /// can tell who holds it: [`Locker::inspect`] returns it, and [`LockError::Busy`]'s message
    /// names it. Default: `<host name>:<process id>` (e.g. `web-3:4711`); give each instance a
    /// name an operator recognises (a pod name, a job name).
    ///
    /// It travels inside the value the lock stores (`<token>|<holder name>`): no extra Redis
    /// command, a few more bytes per lock. It is a label, not an identity: two lockers may carry
    /// the same name and still exclude each other.
    ///
    /// # Errors
    ///
    /// [`build`](Self::build) refuses an empty name, one longer than
    /// [`MAX_HOLDER_NAME_LEN`](crate::MAX_HOLDER_NAME_LEN) (64) bytes, or one with `|` (the
    /// separator of the stored value) or a control or invisible character, with
    /// [`ConfigError::HolderName`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// let locker = lock_core::Locker::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .holder_name("billing-worker-7")
    ///     .build()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`Locker::inspect`]: crate::Locker::inspect
    /// [`LockError::Busy`]: crate::LockError::Busy
    pub fn holder_name(mut self, name: impl Into<String>) -> Self {
        self.settings.holder = Arc::from(name.into());
        self
    }

    /// Lease of locks acquired without an explicit `.lease(..)`; the watchdog renews them every
    /// third of it while their guard lives. From 30 ms (renewed every 10 ms: shorter leases
    /// cannot be renewed in time over a network) to 365 days
    /// ([`MAX_LEASE`](crate::MAX_LEASE)).
    pub fn watchdog_lease(mut self, lease: Duration) -> Self {
        self.settings.watchdog_lease = lease;
        self
    }

    /// How long `lock(..)` waits when the acquire sets no `.wait(..)`. Any value: zero tries
    /// once, and a wait beyond 100 years has no deadline (it waits until the lock is free).
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.settings.default_wait = wait;
        self
    }

    /// The longest a watchdog lock is held, so a hung holder cannot keep a key forever: the
    /// key ends in Redis when the hold does (the last renewals are cut to it) and the guard
    /// reports [`LostReason::MaxHold`](crate::LostReason::MaxHold). Off by default;
    /// `.max_hold(..)` on an acquire overrides it. Any value: zero ends each lock at once (a
    /// 1 ms lease), and a `max_hold` beyond 100 years is no limit (so `Duration::MAX` means
    /// none). On RedLock, which grants no lease under 3 ms, a shorter one is refused with
    /// [`ConfigError::MaxHoldTooShortForRedLock`](crate::ConfigError::MaxHoldTooShortForRedLock)
    /// (by `build`, and by an acquire for its own).
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.settings.max_hold = Some(max);
        self
    }

    /// Emits the `lock.hold` tracing span (from the grant to the release, with the key and the
    /// release's `outcome`) at info level instead of debug, so that an application logging at
    /// info sees its critical sections (their durations, with span-aware subscribers) without
    /// the per-acquire detail. Off by default: one span per lock is noise for most services.
    pub fn trace_holds(mut self, on: bool) -> Self {
        self.settings.trace_holds = on;
        self
    }

    /// How long a key's fencing state (its last fencing token, one small key) outlives the
    /// lock: the fence key of a key whose holder asked for a token expires this long after
    /// the later of the lock's end (renewals carry it along) and its last token (a time of the
    /// Redis server's clock). So what fencing keeps in Redis is one key per lock held now, plus
    /// the keys released within the last lease and this window; 10 s by default.
    ///
    /// Tokens of a key increase across holders, lock expiries, server restarts and forward
    /// clock jumps whether or not its fence key still exists (tokens are the server's clock in
    /// microseconds, and Redis deletes the fence key only once its clock has passed the last
    /// token plus this window). While the fence key lives they also increase across a backward
    /// step of the server's clock of any size (the last token plus one is issued until the
    /// clock catches up; the fence key lives until then). What it does not cover: a backward
    /// step larger than this window hitting a key whose fence state already expired (idle for
    /// longer than its last lease plus this window) may give that key's next holder a smaller
    /// token, smaller by at most the step minus the idle time. Raise the window to cover the
    /// largest backward step your servers' time synchronisation can make. From 1 ms to 10 ×
    /// 365 days (a TTL Redis and its Lua scripts hold exactly).
    pub fn fence_retention(mut self, retention: Duration) -> Self {
        self.settings.fence_retention = retention;
        self
    }

    /// Safety-net retry interval of a waiter that got no release notification (lost message,
    /// pub/sub unavailable). ReleaseMessages also retry when the holder's TTL runs out. From 10 ms
    /// (shorter makes every waiter poll Redis in a tight loop) to 10 minutes (a waiter of a
    /// fair lock or a semaphore whose process is cut off keeps its place in line for three of
    /// them).
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
    /// every URL (sentinel URLs included) must be `rediss://`. Either way the process needs a
    /// default rustls `CryptoProvider`, which the application installs (see the crate docs,
    /// "TLS"); without one, [`build`](Self::build) refuses `rediss://` URLs with
    /// [`ConfigError::NoCryptoProvider`].
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
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, config: TlsConfig) -> Self {
        self.tls = Some(config);
        self
    }

    /// Limit for establishing a connection (TCP, and the TLS handshake for `rediss://`). From
    /// 1 ms to 1 hour.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Limit for one Redis command's reply. From 1 ms to 1 hour.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.settings.command_timeout = timeout;
        self
    }

    /// How long a release may be retried and still learn for sure whether its first try ran.
    /// Default zero: no latch, nothing left in Redis. From zero to 1 hour.
    ///
    /// A release whose connection dropped is sent again, and its first try may or may not have
    /// deleted the key. A retry that finds its token still there releases the lock (`Ok`: the
    /// first try never ran). One that finds the key gone or taken cannot tell its own delete
    /// from a loss, so by default it reports the lock lost
    /// ([`LostReason::Unknown`](crate::LostReason::Unknown)), never a release it cannot
    /// prove. A release that never had its connection drop is always answered exactly.
    ///
    /// A non-zero window makes that rare answer exact too: each release leaves a small latch
    /// key that lives this long, for a retry to find; nothing a release writes outlives it. A
    /// retry answered within the window is told the truth (`Ok` when the first try released
    /// the lock); one answered later cannot tell and reports the loss as above. The cost, on
    /// every release: Redis memory of one latch (about 150 bytes by `MEMORY USAGE`) per release
    /// of the last window, so releases per second × window keys at any time, and Redis CPU
    /// for one more key written and expired (about a quarter of an uncontended cycle's).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), lock_core::LockError> {
    /// use std::time::Duration;
    ///
    /// // A release retried after a dropped connection learns whether its first try ran, for
    /// // one latch key per release that lives a second.
    /// let locker = lock_core::Locker::builder()
    ///     .url("redis://127.0.0.1/")
    ///     .release_retry_window(Duration::from_secs(1))
    ///     .build()
    ///     .await?;
    /// # drop(locker);
    /// # Ok(())
    /// # }
    /// ```
    pub fn release_retry_window(mut self, window: Duration) -> Self {
        self.settings.release_retry_window = window;
        self
    }

    /// Validates the settings, connects, and starts the background tasks.
    ///
    /// # Errors
    ///
    /// [`LockError::Config`] for a missing or malformed URL, a bad prefix, a duration outside
    /// its range ([`ConfigError::OutOfRange`], naming the setting), unusable TLS settings (all
    /// checked before any connection is made);
    /// [`LockError::Backend`] when Redis cannot be reached within the connect timeout;
    /// [`LockError::Tls`] when a TLS handshake fails (untrusted, expired or wrong-host
    /// certificate, refused client certificate); [`ConfigError::ServerTooOld`] when a server
    /// of the topology (each RedLock node that answers, each cluster primary) is older than
    /// Redis 6.2, read from `INFO server` (semaphores, which need 7.0, are refused by their
    /// acquires).
    pub async fn build(self) -> Result<Locker, LockError> {
        let checked = self.check()?;
        let (store, pubsub) = connect(
            checked.topology,
            checked.timeouts,
            checked.settings.fence_retention,
            checked.min_replicas,
            checked.restart_guard,
            checked.tls.as_ref(),
        )
        .await?;
        store.check_servers().await?;
        store.warn_on_eviction_policy().await;
        Ok(Locker::start(
            store,
            pubsub,
            checked.settings,
            checked.timeouts,
            Startup::Done,
        ))
    }

    /// Validates the settings and starts the locker without connecting: for a service that
    /// must start while Redis is down (or not yet up). Each connection is made on first use
    /// and made again after failures; until Redis answers, acquires fail with
    /// [`LockError::Backend`] (after the command timeout at the latest, or the acquire's wait
    /// if it is longer), and once it answers they work, without rebuilding the locker. The
    /// server's version is read before the first acquire's first command (an acquire on a
    /// server too old for it fails with [`ConfigError::ServerTooOld`] and writes nothing), and
    /// the start-up check of `maxmemory_policy` runs after the first acquire Redis answered; the
    /// release listener connects in the background, retrying with a growing pause (at most
    /// 1 s), and waiters poll at the fallback retry until it is connected.
    ///
    /// A single server ([`url`](Self::url)) and [`redlock`](Self::redlock) (every node
    /// lazily: acquires need a majority up) are supported. [`cluster`](Self::cluster) and
    /// [`sentinel`](Self::sentinel) are not: they cannot route a command before a first answer
    /// (the slot map, the primary's address), so they are refused with
    /// [`ConfigError::LazyTopology`]; build those with [`build`](Self::build) and retry it.
    ///
    /// Needs a tokio runtime (it starts the background tasks), not an `.await`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use lock_core::Locker;
    ///
    /// # #[tokio::main] async fn main() -> Result<(), lock_core::LockError> {
    /// let locker = Locker::builder()
    ///     .url("redis://redis.internal:6379")
    ///     .connect_timeout(Duration::from_secs(1))
    ///     .build_lazy()?; // no connection yet: the service starts even if Redis is down
    /// match locker.lock("inventory:42").await {
    ///     Ok(guard) => guard.release().await?,
    ///     Err(error) if error.is_backend() => { /* Redis not up yet: 503, retry later */ }
    ///     Err(error) => return Err(error),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LockError::Config`], as [`build`](Self::build) (nothing about the network is known
    /// yet), plus [`ConfigError::LazyTopology`] for a cluster or Sentinel and
    /// [`ConfigError::NoRuntime`] outside a tokio runtime.
    pub fn build_lazy(self) -> Result<Locker, LockError> {
        let checked = self.check()?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ConfigError::NoRuntime.into());
        }
        let (store, pubsub) = connect_lazy(
            checked.topology,
            checked.timeouts,
            checked.settings.fence_retention,
            checked.min_replicas,
            checked.restart_guard,
            checked.tls.as_ref(),
        )?;
        Ok(Locker::start(
            store,
            pubsub,
            checked.settings,
            checked.timeouts,
            Startup::OnFirstUse,
        ))
    }

    /// Every check that needs no connection, shared by [`build`](Self::build) and
    /// [`build_lazy`](Self::build_lazy).
    fn check(self) -> Result<Checked, LockError> {
        let Self {
            topology,
            settings,
            connect_timeout,
            min_replicas,
            restart_guard,
            tls,
            sentinel_data,
        } = self;
        let mut topology = topology.ok_or(ConfigError::MissingUrl)?;
        check_features(&topology)?;
        if let Some(credentials) = sentinel_data {
            match &mut topology {
                Topology::Sentinel { data, .. } => *data = Some(credentials),
                _ => return Err(ConfigError::DataCredentialsWithoutSentinel.into()),
            }
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = &tls {
            tls.validate()?;
        }
        if !key::valid_prefix(&settings.prefix) {
            return Err(ConfigError::Prefix {
                prefix: settings.prefix,
            }
            .into());
        }
        holder::validate(&settings.holder)?;
        check_durations(&settings, connect_timeout, min_replicas)?;
        let min_replicas = min_replicas.map(|min| within_command_timeout(min, &settings));
        if let Some(max) = settings.max_hold {
            limits::check_max_hold(max, matches!(topology, Topology::RedLock(_)))?;
        }
        let timeouts = Timeouts {
            connect: connect_timeout,
            command: settings.command_timeout,
            release_retry: settings.release_retry_window,
        };
        let restart_guard = match restart_guard {
            None => None,
            Some(_) if matches!(topology, Topology::Cluster(_)) => {
                return Err(ConfigError::RestartGuardInCluster.into());
            }
            Some(guard) => Some(RestartGuard {
                epoch_key: format!("{}node-epoch", settings.prefix),
                guard: limits::check_lease(DurationSetting::RestartGuard, guard)?,
            }),
        };
        Ok(Checked {
            topology,
            settings,
            timeouts,
            min_replicas,
            restart_guard,
            tls,
        })
    }
}

/// A configuration that passed every check made before connecting.
struct Checked {
    topology: Topology,
    settings: Settings,
    timeouts: Timeouts,
    min_replicas: Option<MinReplicas>,
    restart_guard: Option<RestartGuard>,
    tls: Option<TlsConfig>,
}

/// Checks every bounded duration setting against its range (see [`limits`]); `default_wait`
/// and `max_hold` saturate where they are used instead, and the restart guard is checked with
/// the topology.
fn check_durations(
    settings: &Settings,
    connect_timeout: Duration,
    min_replicas: Option<MinReplicas>,
) -> Result<(), ConfigError> {
    limits::check(
        DurationSetting::WatchdogLease,
        settings.watchdog_lease,
        MIN_WATCHDOG_LEASE,
        MAX_LEASE,
    )?;
    limits::check(
        DurationSetting::FenceRetention,
        settings.fence_retention,
        limits::MIN_FENCE_RETENTION,
        limits::MAX_FENCE_RETENTION,
    )?;
    limits::check(
        DurationSetting::FallbackRetry,
        settings.fallback_retry,
        limits::MIN_FALLBACK_RETRY,
        limits::MAX_FALLBACK_RETRY,
    )?;
    limits::check_timeout(DurationSetting::ConnectTimeout, connect_timeout)?;
    limits::check_timeout(DurationSetting::CommandTimeout, settings.command_timeout)?;
    // Zero is allowed: no latch at all.
    limits::check(
        DurationSetting::ReleaseRetryWindow,
        settings.release_retry_window,
        Duration::ZERO,
        limits::MAX_TIMEOUT,
    )?;
    if let Some(min) = min_replicas {
        limits::check_timeout(DurationSetting::ReplicaTimeout, min.timeout)?;
    }
    Ok(())
}

/// `min`, its `WAIT` cut to half the command timeout: the connection gives a reply up to the
/// command timeout, and a `WAIT` that outlived it would fail the acquire as a timeout (tried
/// again with the same `WAIT`, holding up every other command of the locker meanwhile)
/// instead of answering how many replicas acknowledged.
fn within_command_timeout(min: MinReplicas, settings: &Settings) -> MinReplicas {
    let most = (settings.command_timeout / 2).max(limits::MIN_TIMEOUT);
    if min.timeout > most {
        tracing::warn!(
            configured = ?min.timeout,
            used = ?most,
            command_timeout = ?settings.command_timeout,
            "the min_replicas timeout is cut to half the command timeout"
        );
    }
    MinReplicas {
        timeout: min.timeout.min(most),
        ..min
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_wait_is_cut_to_half_the_command_timeout() {
        let settings = |command| Settings {
            command_timeout: command,
            ..LockerBuilder::default().settings
        };
        let wait = |timeout, command| {
            within_command_timeout(
                MinReplicas {
                    replicas: 1,
                    timeout,
                },
                &settings(command),
            )
            .timeout
        };
        let ms = Duration::from_millis;
        assert_eq!(wait(ms(2000), ms(1000)), ms(500));
        assert_eq!(wait(ms(300), ms(1000)), ms(300));
        assert_eq!(wait(ms(500), ms(1000)), ms(500));
        assert_eq!(
            wait(limits::MAX_TIMEOUT, limits::MAX_TIMEOUT),
            limits::MAX_TIMEOUT / 2
        );
        // Never under `WAIT`'s 1 ms (0 would block for ever).
        assert_eq!(wait(ms(5), ms(1)), ms(1));
    }

    #[test]
    fn passwords_never_reach_debug_output() {
        assert_eq!(
            redact("redis://app:hunter2@db:6379/0"),
            "redis://app:***@db:6379/0"
        );
        assert_eq!(redact("redis://:hunter2@db"), "redis://:***@db");
        assert_eq!(redact("redis://db:6379"), "redis://db:6379");
        // Every shape of URL a user may type, passwords with unencoded separators included:
        // the password never survives, the host and database always do.
        for (url, shown) in [
            ("redis://app@db", "redis://app:***@db"),
            ("redis://:hun/ter2@db:6379/0", "redis://:***@db:6379/0"),
            ("redis://app:hun/ter2@db/0", "redis://app:***@db/0"),
            ("redis://app:hu@nt@er2@db", "redis://app:***@db"),
            ("redis://app:hu:nter2@db", "redis://app:***@db"),
            ("redis://app:hunter%2F2@db", "redis://app:***@db"),
            ("redis://app:hun?ter2@db", "redis://app:***@db"),
            ("redis://app:hun#ter2@db", "redis://app:***@db"),
            (
                "rediss://app:hunter2@db:6380/#insecure",
                "rediss://app:***@db:6380/#insecure",
            ),
            (
                "redis+unix:///tmp/r.sock?db=1&pass=hunter2",
                "redis+unix:///tmp/r.sock?db=1&pass=***",
            ),
            (
                "redis+unix:///tmp/r.sock?password=hunter2#x",
                "redis+unix:///tmp/r.sock?password=***#x",
            ),
            ("app:hunter2@db", "app:***@db"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
        let builder = Locker::builder().url("redis://app:hunter2@db:6379/0");
        assert!(!format!("{builder:?}").contains("hunter2"));
        let builder = Locker::builder().redlock(["redis://:s3cret@a", "redis://:s3cret@b"]);
        assert!(!format!("{builder:?}").contains("s3cret"));
        #[cfg(feature = "tls")]
        {
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

    /// The feature a refusal names, from `build_lazy` (which checks before it needs a
    /// runtime) and from `build` (which refuses before it dials).
    #[cfg(not(all(feature = "tls", feature = "cluster", feature = "sentinel")))]
    fn refused_feature(builder: LockerBuilder) -> (&'static str, String) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let built = runtime.block_on(builder.clone().build());
        let lazy = builder.build_lazy();
        match (built, lazy) {
            (
                Err(LockError::Config(ConfigError::FeatureDisabled { feature, what })),
                Err(LockError::Config(ConfigError::FeatureDisabled {
                    feature: lazy_feature,
                    ..
                })),
            ) => {
                assert_eq!(feature, lazy_feature);
                let message = ConfigError::FeatureDisabled {
                    feature,
                    what: what.clone(),
                }
                .to_string();
                assert!(
                    message.contains(&format!("`{feature}` feature")),
                    "{message}"
                );
                (feature, what)
            }
            (built, lazy) => panic!(
                "expected FeatureDisabled, got {:?} and {:?}",
                built.err(),
                lazy.err()
            ),
        }
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_urls_need_the_tls_feature() {
        for url in [
            "rediss://127.0.0.1:6380/",
            "REDISS://127.0.0.1:6380/",
            " rediss://app:hunter2@db:6380/",
            "valkeys://127.0.0.1:6380/",
        ] {
            let (feature, what) = refused_feature(Locker::builder().url(url));
            assert_eq!(feature, "tls", "{url}");
            assert!(!what.contains("hunter2"), "{what}");
        }
        // One TLS node among plaintext ones is enough.
        let (feature, _) = refused_feature(Locker::builder().redlock([
            "redis://a:6379",
            "redis://b:6379",
            "rediss://c:6380",
        ]));
        assert_eq!(feature, "tls");
        // A plaintext URL is accepted (lazily: nothing is dialled).
        let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
        let plain =
            runtime.block_on(async { Locker::builder().url("redis://127.0.0.1:1/").build_lazy() });
        assert!(plain.is_ok(), "{:?}", plain.err());
    }

    #[cfg(not(feature = "cluster"))]
    #[test]
    fn a_cluster_needs_the_cluster_feature() {
        let (feature, what) = refused_feature(Locker::builder().cluster(["redis://a:7000"]));
        assert_eq!(feature, "cluster");
        assert!(what.contains(".cluster("), "{what}");
        // The topology is refused before its URLs are looked at.
        let (feature, _) = refused_feature(Locker::builder().cluster(["rediss://a:7000"]));
        assert_eq!(feature, "cluster");
    }

    #[cfg(not(feature = "sentinel"))]
    #[test]
    fn sentinel_needs_the_sentinel_feature() {
        let (feature, what) = refused_feature(
            Locker::builder()
                .sentinel("locks", ["redis://a:26379"])
                .sentinel_data_password("secret"),
        );
        assert_eq!(feature, "sentinel");
        assert!(what.contains("locks") && !what.contains("secret"), "{what}");
    }

    /// The bounded duration settings: how to set one, its name, its range.
    type Bounded = (
        fn(LockerBuilder, Duration) -> LockerBuilder,
        DurationSetting,
        Duration,
        Duration,
    );

    fn bounded() -> Vec<Bounded> {
        vec![
            (
                |b, d| b.watchdog_lease(d),
                DurationSetting::WatchdogLease,
                MIN_WATCHDOG_LEASE,
                MAX_LEASE,
            ),
            (
                |b, d| b.fence_retention(d),
                DurationSetting::FenceRetention,
                limits::MIN_FENCE_RETENTION,
                limits::MAX_FENCE_RETENTION,
            ),
            (
                |b, d| b.fallback_retry(d),
                DurationSetting::FallbackRetry,
                limits::MIN_FALLBACK_RETRY,
                limits::MAX_FALLBACK_RETRY,
            ),
            (
                |b, d| b.connect_timeout(d),
                DurationSetting::ConnectTimeout,
                limits::MIN_TIMEOUT,
                limits::MAX_TIMEOUT,
            ),
            (
                |b, d| b.command_timeout(d),
                DurationSetting::CommandTimeout,
                limits::MIN_TIMEOUT,
                limits::MAX_TIMEOUT,
            ),
            (
                |b, d| b.min_replicas(1, d),
                DurationSetting::ReplicaTimeout,
                limits::MIN_TIMEOUT,
                limits::MAX_TIMEOUT,
            ),
            (
                |b, d| b.restart_guard(d),
                DurationSetting::RestartGuard,
                limits::MIN_LEASE,
                MAX_LEASE,
            ),
        ]
    }

    /// Edges of every range and durations of any size.
    fn durations() -> impl proptest::strategy::Strategy<Value = Duration> {
        use proptest::prelude::*;
        let ns = Duration::from_nanos(1);
        let mut edges = vec![Duration::ZERO, ns, Duration::MAX];
        for (_, _, min, max) in bounded() {
            edges.extend([min - ns, min, max, max + ns]);
        }
        prop_oneof![
            proptest::sample::select(edges),
            (any::<u64>(), 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
            (0..=7_200_000u64).prop_map(Duration::from_millis),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]

        /// `build` refuses a bounded duration exactly outside its range, naming it, before it
        /// connects: the URL here does not parse, which `build` finds only after the
        /// durations, so an accepted value ends in that error and nothing is dialled.
        #[test]
        fn build_refuses_exactly_the_out_of_range_durations(
            which in 0..7usize,
            value in durations(),
        ) {
            let (set, name, min, max) = bounded()[which];
            let builder = set(Locker::builder().url("nonsense://"), value);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let result = runtime.block_on(builder.build());
            match result {
                Err(LockError::Config(ConfigError::OutOfRange { setting, value: refused, min: lo, max: hi })) => {
                    proptest::prop_assert!(!(min..=max).contains(&value), "{value:?} refused");
                    proptest::prop_assert_eq!((setting, refused, lo, hi), (name, value, min, max));
                }
                // Accepted: then the URL is refused.
                Err(LockError::Config(ConfigError::Url(_))) => {
                    proptest::prop_assert!((min..=max).contains(&value), "{value:?} accepted");
                }
                Err(other) => proptest::prop_assert!(false, "{other}"),
                Ok(_) => proptest::prop_assert!(false, "connected with a malformed url"),
            }
        }
    }
}
