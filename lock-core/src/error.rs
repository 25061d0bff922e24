//! The error type of every fallible operation of the kit.

use std::fmt;
use std::time::Duration;

use crate::backend_error::BackendError;
use crate::holder::HolderNameReason;
use crate::key::{RedisKeys, ShownKey};

/// Why a lock operation failed.
///
/// Contention ([`Busy`](Self::Busy)) and infrastructure failure ([`Backend`](Self::Backend)) are
/// always distinct: a Redis error never turns into `Busy`, and a release of a lock that had
/// expired reports [`Lost`](Self::Lost).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock was held by another owner for the whole `wait`.
    #[error(
        "lock `{}` is busy (waited {}{}{})",
        ShownKey(key),
        Approx(*waited),
        HeldBy(holder),
        HolderTtl(*holder_ttl)
    )]
    Busy {
        /// The user's key.
        key: String,
        /// How long the acquire waited before giving up.
        waited: Duration,
        /// The holder's remaining lease at the last attempt, when Redis reported one. On
        /// RedLock, how long until a majority of the nodes may be free (a node that keeps an
        /// earlier holder's key longer does not count).
        holder_ttl: Option<Duration>,
        /// The holder's name (see
        /// [`LockerBuilder::holder_name`](crate::LockerBuilder::holder_name)) at the last
        /// attempt, when it was known: read by the acquire script that refused (no extra
        /// command), or this locker's own name when a task of this process holds the lock.
        /// `None` for a holder of an older version of the kit, when read locks (many
        /// holders) or waiting writers kept the acquire out, and for a fair lock or semaphore
        /// that is free but kept for an earlier waiter.
        holder: Option<String>,
    },
    /// The lock is no longer ours: its lease ran out, another owner took it over, its key was
    /// deleted, ... ([`LostReason`] says which, as far as the kit can tell).
    #[error("lock `{}` was lost: {reason}", ShownKey(key))]
    Lost {
        /// The user's key.
        key: String,
        /// Why, as far as the kit can tell.
        reason: LostReason,
    },
    /// The key is not a valid lock key.
    #[error("invalid lock key `{}`: {reason}", ShownKey(key))]
    InvalidKey {
        /// The rejected key, cut to its first 64 characters.
        key: String,
        /// What is wrong with it.
        reason: InvalidKeyReason,
    },
    /// A setting or an argument is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A Redis key of the lock exists with a type the kit never writes (a hash, a list, ...):
    /// another program uses the name. An operator must inspect (and remove) it.
    #[error(
        "redis key {}{} of lock `{}` holds a value of another type (see TYPE in redis-cli); \
         the kit never overwrites it",
        RedisKeyName(key, redis_key),
        OrOneOf(others),
        ShownKey(key)
    )]
    WrongType {
        /// The user's key.
        key: String,
        /// The Redis key to inspect: the lock key, or the companion key the failed call alone
        /// could have found of another type (the fence key for a fencing token). Where an
        /// operation did not know the locker's prefix the message names it as
        /// `<prefix>{h}:lock:<key>` with the hash tag `h` filled in.
        redis_key: Option<String>,
        /// Other Redis keys of the lock the failed call read with a type (a read lock's
        /// readers set, the line of a fair lock or a semaphore), any of which may be the one:
        /// Redis does not say which key of a script had the wrong type. Often empty.
        others: Vec<String>,
    },
    /// Redis was unreachable, timed out, or answered with an error.
    #[error("redis error{}: {source}", OnKey(key))]
    Backend {
        /// The user's key; `None` for operations that concern no single key (connecting).
        key: Option<String>,
        /// What went wrong.
        #[source]
        source: BackendError,
    },
    /// A TLS connection to Redis failed: the server's certificate is not trusted, has expired
    /// or does not name the host of the URL, the server refused the client certificate (or its
    /// absence), or the peer does not speak TLS. Reported by
    /// [`LockerBuilder::build`](crate::LockerBuilder::build), or by an operation whose
    /// reconnect fails that way.
    ///
    /// A plaintext `redis://` client talking to a TLS port is not this error: the server just
    /// closes the connection, which arrives as [`Backend`](Self::Backend).
    #[error("TLS connection to redis failed{}: {source}", OnKey(key))]
    Tls {
        /// The user's key; `None` for the connect.
        key: Option<String>,
        /// What went wrong; its chain of sources holds the TLS library's error.
        #[source]
        source: BackendError,
    },
    /// The lock was acquired but fewer replicas than `min_replicas` acknowledged it within the
    /// timeout, so it was released again (fail closed).
    #[error(
        "lock `{}` reached {acked} of {wanted} required replicas; released it again",
        ShownKey(key)
    )]
    NotReplicated {
        /// The user's key.
        key: String,
        /// Replicas that acknowledged.
        acked: u64,
        /// Replicas required.
        wanted: u64,
    },
    /// A task that holds a read lock asked for the write lock (or the mutex) of the same key. A
    /// read lock cannot be upgraded: the write would wait for the task's own read lock. Release
    /// the read lock first, or take the write lock from the start (a read inside a write is
    /// allowed).
    #[error(
        "lock `{}`: this task holds it for reading and asked to write; a read lock cannot be \
         upgraded (release it first, or take the write lock from the start)",
        ShownKey(key)
    )]
    WriteInsideRead {
        /// The user's key.
        key: String,
    },
    /// A fencing token was asked of a read lock: tokens order exclusive holders (a mutex, a
    /// write lock), and readers hold together.
    #[error(
        "lock `{}` is held for reading: fencing tokens are issued to writers only",
        ShownKey(key)
    )]
    NotExclusive {
        /// The user's key.
        key: String,
    },
    /// [`Locker::lock_all`](crate::Locker::lock_all) was given no keys.
    #[error("lock_all needs at least one key")]
    NoKeys,
    /// `#[distributed_lock]` named no locker and no global one was set with
    /// [`Locker::set_global`](crate::Locker::set_global).
    #[error("no locker configured: call Locker::set_global(..) at start-up or pass `locker = ..`")]
    NotConfigured,
    /// The locker was shut down ([`Locker::shutdown`](crate::Locker::shutdown), by any of its
    /// clones): it takes no new locks, and acquires that were waiting ended with this error.
    #[error("the locker was shut down: it takes no new locks")]
    ShutDown,
}

/// Why a lock was lost, as far as the kit can tell: carried by [`LockError::Lost`], shown in
/// its message and in the `lock lost` warning, and the `reason` label of the
/// `lock_lost_total` metric ([`LostReason::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out before a renewal confirmed it: renewals failed (Redis unreachable, a
    /// partition, this process paused) until the last confirmed lease ended, a fixed lease
    /// ended before the release, or a renewal found the holder's lease ended.
    Expired,
    /// The key holds another holder's token (or a value the kit did not write): someone else
    /// took the lock after it was lost here, or wrote over it.
    TakenOver,
    /// The key was gone while its lease should still have run: deleted by
    /// [`Locker::force_unlock`](crate::Locker::force_unlock), a `DEL`, a flush, or evicted.
    Deleted,
    /// The Redis server restarted while the lock was held and came back without it (no
    /// persistence, or an older snapshot): the server's uptime is shorter than the hold.
    ServerRestarted,
    /// The lock reached its `max_hold`: the watchdog cut its last renewals so that its lease
    /// ended there.
    MaxHold,
    /// The kit cannot tell why: the lock is not held by this holder any more (a fencing token
    /// was refused, RedLock nodes disagreed on the cause), or a release retried after its
    /// connection dropped found the key gone and cannot tell its own first try's delete from a
    /// loss (see [`LockerBuilder::release_retry_window`](crate::LockerBuilder::release_retry_window)).
    Unknown,
    /// The locker's watchdog failed (a bug, logged as an error), so nothing renews the lock:
    /// it is reported lost at once instead of silently a lease later.
    RenewalStopped,
    /// The locker was shut down ([`Locker::shutdown`](crate::Locker::shutdown)), which
    /// released the lock in Redis while its guard was alive.
    Shutdown,
}

impl LostReason {
    /// A short snake_case name: `expired`, `taken_over`, `deleted`, `server_restarted`,
    /// `max_hold`, `unknown`, `renewal_stopped`, `shutdown` (the `reason` field of the log and
    /// label of the metric).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::TakenOver => "taken_over",
            Self::Deleted => "deleted",
            Self::ServerRestarted => "server_restarted",
            Self::MaxHold => "max_hold",
            Self::Unknown => "unknown",
            Self::RenewalStopped => "renewal_stopped",
            Self::Shutdown => "shutdown",
        }
    }

    /// The code kept in an atomic (never 0, which means "not lost").
    pub(crate) const fn code(self) -> u8 {
        match self {
            Self::Expired => 1,
            Self::TakenOver => 2,
            Self::Deleted => 3,
            Self::ServerRestarted => 4,
            Self::MaxHold => 5,
            Self::Unknown => 6,
            Self::RenewalStopped => 7,
            Self::Shutdown => 8,
        }
    }

    pub(crate) const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::Expired,
            2 => Self::TakenOver,
            3 => Self::Deleted,
            4 => Self::ServerRestarted,
            5 => Self::MaxHold,
            6 => Self::Unknown,
            7 => Self::RenewalStopped,
            8 => Self::Shutdown,
            _ => return None,
        })
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Expired => "its lease expired before it was renewed",
            Self::TakenOver => "another owner holds it now",
            Self::Deleted => "its key was deleted while its lease still ran",
            Self::ServerRestarted => "the redis server restarted without it",
            Self::MaxHold => "it was held past its max_hold",
            Self::Unknown => "it is no longer held by this holder",
            Self::RenewalStopped => "the watchdog that renews it failed",
            Self::Shutdown => "the locker was shut down and released it",
        })
    }
}

/// What is wrong with a lock key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidKeyReason {
    /// The key is empty.
    #[error("the key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes.
    #[error("the key is longer than {} bytes", crate::MAX_KEY_LEN)]
    TooLong,
    /// A [`MultiLockGuard`](crate::MultiLockGuard) was asked about a key it does not hold.
    #[error("the guard does not hold this key")]
    NotHeld,
}

/// A configuration value or call argument that the kit refuses before talking to Redis.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The Redis URL does not parse.
    #[error("invalid redis url: {0}")]
    Url(#[source] BackendError),
    /// No Redis URL was given to the builder.
    #[error(
        "no redis url: call .url(..), .cluster(..), .sentinel(..) or .redlock(..) on the builder"
    )]
    MissingUrl,
    /// [`LockerBuilder::cluster`](crate::LockerBuilder::cluster) got no seed URLs.
    #[error("no cluster seed urls: .cluster(..) needs at least one node url")]
    NoClusterSeeds,
    /// [`LockerBuilder::sentinel`](crate::LockerBuilder::sentinel) got no sentinel URLs.
    #[error(
        "no sentinel urls for primary `{master}`: .sentinel(..) needs at least one sentinel url"
    )]
    NoSentinels {
        /// The primary's name, as given.
        master: String,
    },
    /// TLS settings that cannot be used: a PEM without a usable certificate or key, a client
    /// key that does not belong to its certificate, TLS settings for a plaintext `redis://`
    /// URL, sentinel URLs that mix `redis://` and `rediss://` (or `rediss://` sentinels with
    /// different credentials), or a URL with `#insecure` (certificate verification off).
    #[error("invalid TLS settings ({what}): {reason}")]
    Tls {
        /// What was rejected, e.g. `"root certificate PEM"`, `"client key PEM"`, `"url"`.
        what: &'static str,
        /// Why. Never quotes key material.
        reason: String,
    },
    /// The configuration needs a feature of lock-core that this build leaves out: a
    /// `rediss://` URL without `tls`, [`cluster`](crate::LockerBuilder::cluster) without
    /// `cluster`, [`sentinel`](crate::LockerBuilder::sentinel) without `sentinel`. All three are
    /// default features; a build with `default-features = false` names the ones it needs.
    #[error(
        "{what} needs lock-core's `{feature}` feature, which this build leaves out: add \
         \"{feature}\" to the `features` of the lock-core dependency in Cargo.toml"
    )]
    FeatureDisabled {
        /// The feature to enable: `"tls"`, `"cluster"` or `"sentinel"`.
        feature: &'static str,
        /// What needs it: a URL (redacted) or the builder call.
        what: String,
    },
    /// A `rediss://` URL while the process has no default rustls `CryptoProvider`. redis-rs
    /// builds its TLS configuration with the process default, and the kit never installs one
    /// (it is a process-wide choice): the application installs it once at start-up, before
    /// building a TLS locker, e.g. `rustls::crypto::ring::default_provider().install_default()`.
    #[error(
        "TLS needs a process-wide rustls CryptoProvider and none is installed (lock-core \
         installs none itself): call `rustls::crypto::ring::default_provider().install_default()` \
         (or aws-lc-rs's) once at start-up, before building the locker"
    )]
    NoCryptoProvider,
    /// The key prefix contains `{` or `}` (it would pick the cluster hash slot) or is too long.
    #[error("invalid key prefix {prefix:?}: it must be at most 128 bytes without `{{` or `}}`")]
    Prefix {
        /// The rejected prefix.
        prefix: String,
    },
    /// A duration setting or argument outside its range.
    #[error("invalid {setting} {value:?}: it must be between {min:?} and {max:?}")]
    OutOfRange {
        /// Which setting.
        setting: DurationSetting,
        /// The rejected value.
        value: Duration,
        /// The smallest value accepted.
        min: Duration,
        /// The largest value accepted.
        max: Duration,
    },
    /// A semaphore of no permits, or an acquire of none or of more than the semaphore has.
    #[error(
        "a semaphore of {permits} permits cannot give {wanted} at once (at least 1, at most all)"
    )]
    Permits {
        /// The semaphore's permits.
        permits: u32,
        /// The permits asked for at once.
        wanted: u32,
    },
    /// Semaphores need one logical Redis (a server, Sentinel or a Cluster): on RedLock each
    /// node counts permits on its own, and majorities of different holders could together
    /// hold more permits than the semaphore has.
    #[error(
        "semaphores are not available on redlock: per-node counts would let more holders in \
         than permits; use a single server, Sentinel or a Cluster"
    )]
    SemaphoreWithRedLock,
    /// Fair locks need one logical Redis (a server, Sentinel or a Cluster): on RedLock every
    /// busy try runs under a fresh token (a failed quorum try is undone in the background
    /// under its own), and the line of each node keeps the waiter's older tokens ahead of its
    /// current one until their liveness ends, so a waiter would be held back by itself.
    #[error(
        "fair locks are not available on redlock: a waiter's earlier tries would stand in \
         line ahead of it on every node; use a single server, Sentinel or a Cluster"
    )]
    FairLockWithRedLock,
    /// RedLock needs at least 3 independent nodes.
    #[error("redlock needs at least 3 nodes, got {count}")]
    RedLockNodes {
        /// Nodes given.
        count: usize,
    },
    /// One server named twice among the RedLock nodes (the same address, or the same `run_id`,
    /// read from the servers at start-up, or, for a node not reached then or a lazily built
    /// locker, before its first call, when calls that need its vote fail with this error):
    /// it would cast two votes, and its restart alone would lose a majority's grants while
    /// their holders still hold them.
    #[error(
        "redlock nodes {first} and {second} are the same server; each node must be an \
         independent redis"
    )]
    RedLockNodeTwice {
        /// The first name of the server (its password redacted).
        first: String,
        /// The other name of the same server.
        second: String,
    },
    /// A `max_hold` shorter than the shortest lease RedLock can grant (3 ms): a watchdog lock's
    /// lease ends with its `max_hold`, and a grant counts only if it leaves some validity after
    /// the drift allowance (lease / 100 + 2 ms), so every acquire would end `Busy`.
    #[error(
        "max_hold {max_hold:?} is too short for redlock: its lease ends with the max_hold, and \
         redlock grants no lease under {min:?} (use a max_hold of {min:?} or more, or none)"
    )]
    MaxHoldTooShortForRedLock {
        /// The refused max_hold.
        max_hold: Duration,
        /// The shortest max_hold RedLock accepts.
        min: Duration,
    },
    /// `min_replicas` applies to primary-replica topologies, not to RedLock.
    #[error("min_replicas does not apply to redlock (its nodes are independent primaries)")]
    MinReplicasWithRedLock,
    /// `restart_guard` keeps one epoch per server; a cluster would need one per shard.
    #[error("restart_guard applies to a single server, Sentinel or redlock, not to a cluster")]
    RestartGuardInCluster,
    /// [`sentinel_data_password`](crate::LockerBuilder::sentinel_data_password) or
    /// [`sentinel_data_user`](crate::LockerBuilder::sentinel_data_user) without
    /// [`sentinel`](crate::LockerBuilder::sentinel): other topologies take the credentials in
    /// their URLs.
    #[error(
        "sentinel data-node credentials need .sentinel(..); other topologies take credentials \
         in their urls"
    )]
    DataCredentialsWithoutSentinel,
    /// [`LockerBuilder::holder_name`](crate::LockerBuilder::holder_name) got a name that cannot
    /// be stored with a lock or shown safely.
    #[error("invalid holder name `{name}`: {reason}")]
    HolderName {
        /// The refused name, escaped and cut as keys are in messages.
        name: String,
        /// What is wrong with it.
        reason: HolderNameReason,
    },
    /// [`build_lazy`](crate::LockerBuilder::build_lazy) for a topology that cannot start
    /// without an answer: a cluster (its slot map) or Sentinel (the primary's address). Use
    /// [`build`](crate::LockerBuilder::build) for those, retried until it connects.
    #[error(
        "a {topology} locker cannot be built lazily: it needs an answer from redis to route \
         any command; use .build().await (retried until it connects)"
    )]
    LazyTopology {
        /// `"cluster"` or `"sentinel"`.
        topology: &'static str,
    },
    /// A lazy locker ([`Locker::connect_lazy`](crate::Locker::connect_lazy),
    /// [`build_lazy`](crate::LockerBuilder::build_lazy)) was built outside a tokio runtime:
    /// there is nothing to run its background tasks (the watchdog, the release listener) on.
    #[error("a locker needs a tokio runtime: build it inside one (e.g. in #[tokio::main])")]
    NoRuntime,
    /// A Redis server lacks a command or option the kit's scripts need: below 6.2 for any
    /// locker (fencing tokens use `SET .. PXAT`), below 7.0 for a semaphore (`PEXPIRE .. GT`).
    /// Reported by [`build`](crate::LockerBuilder::build) for every node of the topology, and
    /// by an acquire for a node whose version was not known yet (a lazy locker's first
    /// acquire, a Sentinel primary after a failover, a RedLock node down at start-up) or that
    /// cannot serve the kind of lock asked for (a semaphore on Redis 6.2). Nothing was
    /// written: upgrade the server (Valkey 7.2 and later serve everything).
    ///
    /// ```text
    /// redis at redis://db:6379/ reports version 6.0.16, but the kit (fencing tokens use
    /// `SET .. PXAT`) needs 6.2.0 or later
    /// ```
    #[error("redis at {node} reports version {found}, but {for_what} needs {needed} or later")]
    ServerTooOld {
        /// The server: its URL (credentials redacted), a Sentinel primary's name and address,
        /// or a cluster node's address.
        node: String,
        /// The version it reports (`redis_version`), with Valkey's or Dragonfly's own version
        /// when it gives one: `7.2.4 (valkey 8.0.1)`.
        found: String,
        /// The oldest version that serves it: `6.2.0` or `7.0.0`.
        needed: String,
        /// What needs it, and the command or option that sets the version.
        for_what: &'static str,
    },
}

impl From<crate::server_version::TooOld> for ConfigError {
    fn from(too_old: crate::server_version::TooOld) -> Self {
        Self::ServerTooOld {
            node: too_old.node,
            found: too_old.found,
            needed: too_old.needed.to_string(),
            for_what: too_old.for_what,
        }
    }
}

/// The duration settings and arguments that have a range, for [`ConfigError::OutOfRange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurationSetting {
    /// A fixed lease ([`Acquire::lease`](crate::Acquire::lease)).
    Lease,
    /// [`LockerBuilder::watchdog_lease`](crate::LockerBuilder::watchdog_lease).
    WatchdogLease,
    /// [`LockerBuilder::restart_guard`](crate::LockerBuilder::restart_guard).
    RestartGuard,
    /// [`LockGuard::extend`](crate::LockGuard::extend).
    Extension,
    /// [`LockerBuilder::command_timeout`](crate::LockerBuilder::command_timeout).
    CommandTimeout,
    /// [`LockerBuilder::connect_timeout`](crate::LockerBuilder::connect_timeout).
    ConnectTimeout,
    /// The timeout of [`LockerBuilder::min_replicas`](crate::LockerBuilder::min_replicas).
    ReplicaTimeout,
    /// [`LockerBuilder::fallback_retry`](crate::LockerBuilder::fallback_retry).
    FallbackRetry,
    /// [`LockerBuilder::fence_retention`](crate::LockerBuilder::fence_retention).
    FenceRetention,
    /// [`LockerBuilder::release_retry_window`](crate::LockerBuilder::release_retry_window).
    ReleaseRetryWindow,
}

impl fmt::Display for DurationSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Lease => "lease",
            Self::WatchdogLease => "watchdog lease",
            Self::RestartGuard => "restart guard",
            Self::Extension => "extension",
            Self::CommandTimeout => "command timeout",
            Self::ConnectTimeout => "connect timeout",
            Self::ReplicaTimeout => "min_replicas timeout",
            Self::FallbackRetry => "fallback retry",
            Self::FenceRetention => "fence retention",
            Self::ReleaseRetryWindow => "release retry window",
        })
    }
}

/// A duration rounded for people: `0s`, `6µs`, `250ms`, `3s`, `2.5s`.
struct Approx(Duration);

impl fmt::Display for Approx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_zero() {
            return f.write_str("0s");
        }
        let micros = (self.0.as_nanos() + 500) / 1_000;
        if micros < 1_000 {
            return write!(f, "{micros}µs");
        }
        let millis = (micros + 500) / 1_000;
        if millis < 1_000 {
            return write!(f, "{millis}ms");
        }
        let tenths = (millis + 50) / 100;
        match tenths % 10 {
            0 => write!(f, "{}s", tenths / 10),
            tenth => write!(f, "{}.{tenth}s", tenths / 10),
        }
    }
}

/// `, held by `web-1:4711`` when the holder's name is known; escaped like keys (the name was
/// read from Redis, where anyone may have written it).
struct HeldBy<'a>(&'a Option<String>);

impl fmt::Display for HeldBy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(holder) => write!(f, ", held by `{}`", ShownKey(holder)),
            None => Ok(()),
        }
    }
}

/// `, the holder's lease ends in 25s` when Redis reported it.
struct HolderTtl(Option<Duration>);

impl fmt::Display for HolderTtl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(ttl) => write!(f, ", the holder's lease ends in {}", Approx(ttl)),
            None => Ok(()),
        }
    }
}

/// The Redis key of a lock: the full name when known, else with a `<prefix>` placeholder.
struct RedisKeyName<'a>(&'a str, &'a Option<String>);

impl fmt::Display for RedisKeyName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(name) => write!(f, "`{}`", ShownKey(name)),
            None => write!(
                f,
                "`<prefix>{}` (<prefix>: the locker's key prefix, `lock:` by default)",
                ShownKey(&RedisKeys::new("", self.0).lock)
            ),
        }
    }
}

/// ` (or one of `a`, `b`: ...)` when there are other candidates.
struct OrOneOf<'a>(&'a [String]);

impl fmt::Display for OrOneOf<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some((first, rest)) = self.0.split_first() else {
            return Ok(());
        };
        write!(f, " (or one of `{}`", ShownKey(first))?;
        for name in rest {
            write!(f, ", `{}`", ShownKey(name))?;
        }
        f.write_str(": redis does not say which)")
    }
}

/// ` on lock `k`` when there is a key.
struct OnKey<'a>(&'a Option<String>);

impl fmt::Display for OnKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(key) => write!(f, " on lock `{}`", ShownKey(key)),
            None => Ok(()),
        }
    }
}

impl LockError {
    /// `true` when the lock was held by someone else for the whole wait.
    pub fn is_busy(&self) -> bool {
        matches!(self, Self::Busy { .. })
    }

    /// `true` when the lock had been lost.
    pub fn is_lost(&self) -> bool {
        matches!(self, Self::Lost { .. })
    }

    /// `true` when Redis was unreachable or failed (not contention, not bad input): a
    /// [`Backend`](Self::Backend) error, or a failed TLS connection ([`Tls`](Self::Tls);
    /// [`is_tls`](Self::is_tls) tells them apart).
    pub fn is_backend(&self) -> bool {
        matches!(self, Self::Backend { .. } | Self::Tls { .. })
    }

    /// `true` when a TLS connection failed ([`Tls`](Self::Tls)): a certificate problem, a
    /// refused client certificate, a non-TLS peer.
    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Tls { .. })
    }

    /// `true` when a Redis command or connection attempt timed out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Backend { source, .. } if source.is_timeout())
    }

    /// The backend failure behind a [`Backend`](Self::Backend) or [`Tls`](Self::Tls) error.
    pub fn backend_error(&self) -> Option<&BackendError> {
        match self {
            Self::Backend { source, .. } | Self::Tls { source, .. } => Some(source),
            _ => None,
        }
    }

    /// For [`Busy`](Self::Busy): how long the current holder's lease still ran at the last
    /// attempt. An upper bound on the wait for a lock with a fixed lease; with the watchdog the
    /// lease is renewed, so it says little about when the holder releases.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Busy { holder_ttl, .. } => *holder_ttl,
            _ => None,
        }
    }

    /// The user's key this error concerns, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::Busy { key, .. }
            | Self::Lost { key, .. }
            | Self::InvalidKey { key, .. }
            | Self::WrongType { key, .. }
            | Self::NotReplicated { key, .. }
            | Self::WriteInsideRead { key }
            | Self::NotExclusive { key } => Some(key),
            Self::Backend { key, .. } | Self::Tls { key, .. } => key.as_deref(),
            Self::Config(_) | Self::NotConfigured | Self::NoKeys | Self::ShutDown => None,
        }
    }

    /// The error for a backend failure on `key` (`None`: no single key): [`WrongType`],
    /// [`Tls`] or [`Backend`].
    ///
    /// [`WrongType`]: Self::WrongType
    /// [`Tls`]: Self::Tls
    /// [`Backend`]: Self::Backend
    pub(crate) fn backend(key: Option<&str>, source: BackendError) -> Self {
        let source = match source.into_config() {
            Ok(config) => return Self::Config(config),
            Err(source) => source,
        };
        let key = key.map(str::to_owned);
        match key {
            Some(key) if source.is_wrong_type() => Self::WrongType {
                key,
                redis_key: None,
                others: Vec::new(),
            },
            key if source.is_tls() => Self::Tls { key, source },
            key => Self::Backend { key, source },
        }
    }

    /// Completes a [`WrongType`](Self::WrongType) built without the locker's prefix (by an
    /// acquire) with the full Redis key; any other error is returned as it is.
    pub(crate) fn in_locker(self, prefix: &str) -> Self {
        match self {
            Self::WrongType {
                key,
                redis_key: None,
                others,
            } => Self::WrongType {
                redis_key: Some(RedisKeys::new(prefix, &key).lock),
                key,
                others,
            },
            other => other,
        }
    }

    /// [`backend`](Self::backend) for an acquire, a release or another call on the lock key
    /// of `keys`, so a [`WrongType`](Self::WrongType) names the Redis key to inspect, and the
    /// companions of that kind of hold that the scripts also read with a type.
    pub(crate) fn backend_on(keys: &RedisKeys, key: &str, source: BackendError) -> Self {
        if source.is_wrong_type() {
            return Self::WrongType {
                key: key.to_owned(),
                redis_key: Some(keys.lock.clone()),
                others: keys.typed_companions(),
            };
        }
        Self::backend(Some(key), source)
    }

    /// [`backend`](Self::backend) for a call whose only key that can have another type is
    /// `redis_key` (the fence key of a fencing token's script, which reads the lock key in a
    /// `pcall`).
    pub(crate) fn backend_at(redis_key: String, key: &str, source: BackendError) -> Self {
        if source.is_wrong_type() {
            return Self::WrongType {
                key: key.to_owned(),
                redis_key: Some(redis_key),
                others: Vec::new(),
            };
        }
        Self::backend(Some(key), source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(waited: Duration, holder_ttl: Option<Duration>) -> String {
        LockError::Busy {
            key: "inventory:42".into(),
            waited,
            holder_ttl,
            holder: None,
        }
        .to_string()
    }

    #[test]
    fn busy_names_the_holder_escaped() {
        let busy = |holder: &str| {
            LockError::Busy {
                key: "k".into(),
                waited: Duration::from_secs(1),
                holder_ttl: Some(Duration::from_secs(2)),
                holder: Some(holder.into()),
            }
            .to_string()
        };
        assert_eq!(
            busy("web-1:4711"),
            "lock `k` is busy (waited 1s, held by `web-1:4711`, the holder's lease ends in 2s)"
        );
        // A stored value anyone could have written: no raw control characters get through.
        assert_eq!(
            busy("evil\n\u{1b}[31m"),
            "lock `k` is busy (waited 1s, held by `evil\\n\\u{1b}[31m`, the holder's lease ends in 2s)"
        );
    }

    #[test]
    fn busy_rounds_the_wait_and_names_the_holders_lease() {
        assert_eq!(
            busy(Duration::new(3, 412_345), None),
            "lock `inventory:42` is busy (waited 3s)"
        );
        assert_eq!(
            busy(
                Duration::from_micros(250_400),
                Some(Duration::from_millis(24_960))
            ),
            "lock `inventory:42` is busy (waited 250ms, the holder's lease ends in 25s)"
        );
        assert_eq!(
            busy(
                Duration::from_millis(2_549),
                Some(Duration::from_millis(80))
            ),
            "lock `inventory:42` is busy (waited 2.5s, the holder's lease ends in 80ms)"
        );
        assert_eq!(
            busy(Duration::from_nanos(5_939), None),
            "lock `inventory:42` is busy (waited 6µs)"
        );
        assert_eq!(
            busy(Duration::ZERO, None),
            "lock `inventory:42` is busy (waited 0s)"
        );
        assert_eq!(
            busy(Duration::from_micros(999_700), None),
            "lock `inventory:42` is busy (waited 1s)"
        );
    }

    #[test]
    fn lost_says_why() {
        let lost = |reason| {
            LockError::Lost {
                key: "inventory:42".into(),
                reason,
            }
            .to_string()
        };
        assert_eq!(
            lost(LostReason::TakenOver),
            "lock `inventory:42` was lost: another owner holds it now"
        );
        assert_eq!(
            lost(LostReason::Expired),
            "lock `inventory:42` was lost: its lease expired before it was renewed"
        );
        let all = [
            LostReason::Expired,
            LostReason::TakenOver,
            LostReason::Deleted,
            LostReason::ServerRestarted,
            LostReason::MaxHold,
            LostReason::Unknown,
        ];
        for reason in all {
            assert_eq!(LostReason::from_code(reason.code()), Some(reason));
        }
        let names: std::collections::HashSet<_> = all.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), all.len());
        assert_eq!(LostReason::from_code(0), None);
    }

    #[test]
    fn wrong_type_names_the_redis_key() {
        let known = LockError::WrongType {
            key: "k".into(),
            redis_key: Some("app:{13fbd79c3d390e5d}:lock:k".into()),
            others: Vec::new(),
        };
        assert_eq!(
            known.to_string(),
            "redis key `app:{13fbd79c3d390e5d}:lock:k` of lock `k` holds a value of another \
             type (see TYPE in redis-cli); the kit never overwrites it"
        );
        let unknown = LockError::WrongType {
            key: "k".into(),
            redis_key: None,
            others: Vec::new(),
        };
        assert!(
            unknown
                .to_string()
                .starts_with("redis key `<prefix>{13fbd79c3d390e5d}:lock:k` (<prefix>: "),
            "{unknown}"
        );
    }
}
