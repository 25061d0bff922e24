//! Distributed locks on Redis for tokio: reentrant per task, renewed by a watchdog,
//! woken by pub/sub, with lost-lock detection and fencing tokens.
//!
//! Several instances of a service must not run the same read-modify-write at once (read stock
//! = 1, decrement, sell): an in-process `Mutex` cannot stop the other instances, a lock in the
//! shared Redis can.
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_core::{LockError, Locker};
//!
//! # async fn demo() -> Result<(), LockError> {
//! let locker = Locker::connect("redis://127.0.0.1:6379").await?;
//! let guard = locker.lock("inventory:42").wait(Duration::from_secs(3)).await?;
//! // Only one task in all instances runs here for "inventory:42".
//! let fence = guard.fencing_token().await?; // give it to the database with the write
//! guard.release().await?;
//! # let _ = fence;
//! # Ok(())
//! # }
//! ```
//!
//! The same as a closure, which also aborts the body if the lock is lost meanwhile and releases
//! on every path: [`Locker::with_lock`]. As an attribute on an async fn: `#[distributed_lock]`
//! (feature `macros`), which takes one key (`key = "inventory:<sku>"`), its read lock
//! (`mode = "read"`, see [`Locker::read`]) or several keys at once (`keys = ["account:<from>",
//! "account:<to>"]`, see [`Locker::lock_all`]). For axum and tower services: the `lock-tower`
//! crate.
//!
//! For work that should run in one instance only (a scheduled job every instance starts),
//! [`Acquire::skip_if_busy`] turns a busy lock into a quiet `Ok(None)` (macro: `on_busy =
//! "skip"`). Code that does not hold the guard (a task the work is handed to) watches the lock
//! with [`LockGuard::watch`].
//!
//! # Lock kinds
//!
//! Every kind is built on the same machinery (store, topologies, watchdog, pub/sub waiting,
//! lost signal, cancel-safe acquire and release) and gives the mutex's guarantees:
//!
//! | kind | call | holders | fencing token |
//! |---|---|---|---|
//! | mutex | [`Locker::lock`] | one | yes |
//! | several keys at once | [`Locker::lock_all`] | one per key, all or nothing, deadlock-free | one per key |
//! | read-write | [`Locker::read`], [`Locker::write`] | many readers or one writer; a waiting writer goes first | writers |
//! | semaphore | [`Locker::semaphore`] | at most N permits, each holder's expiring with its lease | no |
//! | fair lock | [`Locker::fair_lock`] | one, in order of arrival across processes | yes |
//!
//! Semaphores and fair locks need one logical Redis (a server, Sentinel or a Cluster): on
//! RedLock they are refused with [`ConfigError::SemaphoreWithRedLock`] and
//! [`ConfigError::FairLockWithRedLock`].
//!
//! ```no_run
//! # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
//! let both = locker.lock_all(["account:7", "account:3"]).await?; // a transfer
//! both.release().await?;
//! let reader = locker.read("catalogue").await?; // many readers at once
//! reader.release().await?;
//! let permit = locker.semaphore("exports:tenant-42", 3).acquire().await?; // at most 3
//! permit.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Behaviour
//!
//! - **Atomic acquire, owner-checked release.** An uncontended acquire is one `SET NX PX`
//!   (a Lua script when the lock is taken: it reports the holder's TTL and flags the wait);
//!   every lock value is a fresh 128-bit random token, and release and renewal act only when
//!   the key still holds that token.
//! - **Reentrant per task.** A task holding a key that asks for it again gets a nested guard at
//!   once, without a Redis round trip; the key is released with the outermost guard. The owner
//!   is the tokio task (or, outside any task, the thread running `block_on`). See
//!   [Reentrancy](#reentrancy) for its two sharp edges.
//! - **Waiting without polling.** A waiter subscribes to the key's release channel (one pub/sub
//!   connection per [`Locker`] for all keys) and sleeps until a release message, the holder's
//!   TTL, or the deadline. A jittered fallback retry (1 s by default) covers lost messages.
//!   Local waiters of one key queue first come, first served, so only one task per process
//!   contends in Redis; a release hands the lock straight to the next of them (the key keeps
//!   its token) once Redis confirmed that it still holds it for us (a `GET` of the token; a
//!   compare-and-`PEXPIRE` instead when more than an eighth of the lease is used) (the
//!   release says `Ok` only then, and `Lost` when Redis had lost it behind the holder: the next
//!   task then contends in Redis), at most 6 times in a row: then the lock goes back
//!   through Redis, whose release tells the waiters of other processes, and this process holds
//!   back for a moment so that they get their turn. Redis tells a channel's subscribers in the
//!   order they subscribed; a waiter that won after a release subscribes again for its next
//!   wait, behind the others, so processes take turns.
//! - **Watchdog.** A lock without an explicit lease gets the watchdog lease (30 s) and one
//!   background task per locker renews all such locks every third of it, in one round trip.
//! - **Loss detection.** A renewal that finds another owner, or renewals failing until the
//!   last confirmed lease ends (monotonic clock, 1 % safety margin), marks the guard lost:
//!   [`LockGuard::lost`] resolves and [`LockGuard::release`] returns [`LockError::Lost`],
//!   whose [`LostReason`] says why when the kit can tell (expired, taken over, deleted,
//!   server restarted, `max_hold` reached).
//! - **Fencing tokens.** See below.
//!
//! # Reentrancy
//!
//! Reentrancy follows the task that acquired the lock, not the guard value. Two consequences:
//!
//! - Futures joined inside one task (`join!`, `select!`) are one owner, so they do not exclude
//!   each other; a task spawned by the holder is another owner and waits.
//! - A guard moved into another task keeps the lock, but the acquiring task no longer holds
//!   it. As soon as the guard is used there (any method, or dropped there), the kit notices,
//!   logs a warning once, and the acquiring task's next `lock()` of that key waits for the
//!   guard like any other task's, for as long as that guard lives (a nested guard dropped in
//!   another task while the acquiring task keeps its outer guard gives reentrancy back to
//!   it). Before the guard is touched in the new task the kit cannot
//!   see the move: a `lock()` of the same key by the acquiring task in that window still gets
//!   a nested guard at once. So do not call `lock()` again for a key whose guard you handed
//!   to another task; release first, or let the other task acquire for itself.
//!
//! ```no_run
//! # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
//! let guard = locker.lock("report:9").await?;
//! let worker = tokio::spawn(async move {
//!     let token = guard.fencing_token().await?; // used here: the lock now belongs to this task
//!     // ... write with `token` ...
//!     guard.release().await
//! });
//! // This waits until the worker released (a nested guard if the worker had not touched it).
//! let again = locker.lock("report:9").await?;
//! # drop(again); let _ = worker.await;
//! # Ok(())
//! # }
//! ```
//!
//! # Fencing tokens
//!
//! [`LockGuard::fencing_token`] is issued on first use, by a script that checks that the lock is
//! still held by this acquisition: a holder that lost its lock gets no token. An acquire whose
//! token is never asked for pays nothing for fencing; one that asks pays one round trip, once
//! (nested guards and [`Fence`] handles share the token). The token is the Redis server's
//! clock in microseconds, or the previous token of the key plus one when that is larger. The
//! previous token is kept in a companion key (the fence key) that lives as long as the lock
//! (renewals carry it along) plus [`fence_retention`] (10 s by default), and at least until
//! the server's clock has passed the token plus that window. So fencing keeps one small key
//! per lock held now, plus the keys released within their last lease and the window; idle
//! keys leave nothing behind. Guarantee: on one Redis server, tokens of one key strictly
//! increase across holders (each holder gets its token while it holds, so after every earlier
//! holder got theirs), lock expiries, forward clock jumps and restarts, also empty ones: a
//! fence key is deleted only once the server's clock has read past its token, so a later clock
//! term is larger, and a restart that loses it is followed by a clock term larger than every
//! token before (unless one was ahead of the clock after a backward step). A backward
//! step of the server's clock is covered while the key's fence state lives (the last token
//! plus one is issued until the clock catches up, and the fence key lives until then); a
//! backward step larger than the window, hitting a key idle for longer than its last lease
//! plus the window, may give that key a token smaller than its last one (by at most the step
//! minus the idle time): raise [`fence_retention`] to cover the largest step your time
//! synchronisation makes.
//! What it cannot give: after a failover that lost the last writes, the new primary may issue
//! a token equal to or lower than one issued just before the failover (if its clock lags);
//! with reasonable clock sync the clock term keeps it increasing.
//!
//! [`fence_retention`]: LockerBuilder::fence_retention
//!
//! # Redis data model (for ACLs)
//!
//! For a user key `k`, with `h` the first 16 hex digits of SHA-1(`k`) and `p` the prefix
//! (`lock:` by default): `p{h}:lock:k` (string, the holder's token and holder name,
//! `<token>|<holder>`, see [`LockerBuilder::holder_name`]), `p{h}:fence:k` (string,
//! the last fencing token), `p{h}:waiters:k` (sorted set with a TTL: the tokens of other lockers' waiting exclusive acquirers),
//! `p{h}:unlocked:<token>` (only with a non-zero release retry window, none by default: a
//! string living that window, the release latch that tells a retried release its first try ran), `pnode-epoch` (with
//! [`restart_guard`](LockerBuilder::restart_guard): the server's `run_id` and when its data
//! set began) and the channel `p{h}:released:k`. Read locks add `p{h}:readers:k` (sorted set),
//! fair locks `p{h}:line:k` and `p{h}:line-alive:k` (sorted sets), a semaphore `k` lives in
//! `p{h}:semaphore:k` (sorted set) with its own `p{h}:semaphore-line:k`, `p{h}:semaphore-line-alive:k` and channel
//! `p{h}:semaphore-released:k`. Commands: `SET` (an uncontended acquire), `EVALSHA`,
//! `SCRIPT LOAD` (after `NOSCRIPT`), `EXISTS`, `SUBSCRIBE`, `UNSUBSCRIBE`, `WAIT` (with
//! [`min_replicas`](LockerBuilder::min_replicas)), `INFO` (the start-up check of
//! `maxmemory_policy`, skipped with a debug message when refused, and a lost lock's reason),
//! `ROLE` (Sentinel); inside scripts `SET`, `GET`, `DEL`, `EXISTS`, `PEXPIRE`, `PEXPIREAT`
//! (RedLock's fence write-back), `PTTL`, `TIME`, `TYPE`, `PUBLISH`, `INFO` (restart guard),
//! `ZADD`, `ZREM` (the waiting writers), and for the other kinds `ZSCORE`, `ZRANGE`,
//! `ZRANGEBYSCORE`, `ZREMRANGEBYSCORE`.
//!
#![doc = include_str!("acl.md")]
//!
//! # Topologies and what each guarantees
//!
//! [`LockerBuilder::url`], [`cluster`](LockerBuilder::cluster),
//! [`sentinel`](LockerBuilder::sentinel) and [`redlock`](LockerBuilder::redlock) choose where
//! locks live; reentrancy, waiting, the watchdog, the lost signal, the macro and the tower
//! layer work the same on all of them. [`min_replicas`](LockerBuilder::min_replicas) adds a
//! `WAIT` after each acquire on the primary-replica topologies.
//!
//! | topology | primary fails | network partition | process pause past the lease | clock jump |
//! |---|---|---|---|---|
//! | single server | locks unavailable until it is back; a restart forgets the locks taken since the last persisted write (all of them without persistence): holders learn it at the next renewal (a release says `Lost`), and without [`restart_guard`](LockerBuilder::restart_guard) another client may be granted such a lock before that | the cut-off holder reports lost when its confirmed lease runs out (monotonic clock); others acquire after the TTL | another holder may enter; the paused one learns it at its next renewal; fencing tokens reject its writes | client: none (monotonic clock); server: TTLs follow the server's clock, a jump forward expires locks early |
//! | Sentinel | failover in about 2 s; a lock not yet replicated is lost and can be granted twice (holders learn it at the next renewal); `min_replicas(1, ..)` refuses unreplicated acquires, counts only renewals a replica acknowledged (a holder left on an old primary learns the loss within its lease, before the key runs out on the new one), and narrows, not closes, the window (`WAIT` is best effort) | as single; a partitioned old primary may keep accepting writes for seconds after a failover | as single | as single |
//! | Cluster | per-shard failover in 2–3 s (other shards answer `CLUSTERDOWN` for about 1 s); the same replication window as Sentinel, per shard; `min_replicas` applies per shard | as Sentinel, per shard | as single | as single |
//! | RedLock (N independent primaries) | survives the loss of a minority of nodes; a node restarted without persistence may vote again for a lock it forgot, unless [`restart_guard`](LockerBuilder::restart_guard) is set (it notices every restart by the server's `run_id`, also one from an old RDB snapshot; AOF with `appendfsync always` alone also keeps what the node granted) | a client needs a majority; a minority side cannot acquire | another holder may enter after the validity; fencing tokens still increase (write-back to the majority) | a server clock jump forward on a majority of nodes can expire a lock early; RedLock assumes bounded drift |
//!
//! Credentials come with the URLs (`redis://user:secret@host:6379`), for every node of a
//! cluster or RedLock. With Sentinel the URLs are the sentinels' and carry only the sentinels'
//! credentials; the data nodes' (the primary, and the replica a failover promotes) are given
//! apart with [`sentinel_data_password`](LockerBuilder::sentinel_data_password) or
//! [`sentinel_data_user`](LockerBuilder::sentinel_data_user), for the command and the pub/sub
//! connections alike, plaintext or TLS.
//!
//! None of them makes a Redis lock a substitute for a fencing token or a database constraint
//! where a double holder would corrupt data.
//!
//! # TLS
//!
//! A `rediss://` URL connects over TLS (rustls; feature `tls`). The server's
//! certificate must chain to a trusted CA, be valid now, and name the URL's host in its subject
//! alternative names: an IP address SAN for `rediss://10.0.0.5:6380`, a DNS SAN for
//! `rediss://redis.internal:6380`. By default the system trust store is used; a private CA and,
//! for servers with `tls-auth-clients yes`, a client certificate are given with
//! [`LockerBuilder::tls`] and [`TlsConfig`]. The settings cover every connection of the locker:
//! commands, the waiters' pub/sub connection, each RedLock node, each Cluster node, and with
//! Sentinel both sides: `rediss://` sentinel URLs make the locker ask the sentinels over TLS
//! *and* connect to the primary they name over TLS (the command connection and the pub/sub
//! connection, which follow failovers), with the same certificates. Such a deployment runs
//! its servers and sentinels with `tls-port` and `tls-replication yes`, so that the sentinels
//! report the primary's TLS port. A cluster is seeded with `rediss://` URLs and its nodes run
//! with `tls-cluster yes`, so that they name each other's TLS ports (in `CLUSTER SLOTS` and in
//! `MOVED`/`ASK` redirects) to TLS clients.
//!
//! The kit never installs a process-wide rustls `CryptoProvider`: which cryptography the
//! process uses is the application's choice. redis-rs builds its TLS configuration from the
//! process's default provider (it takes no configuration of its own), so the application
//! installs one once at start-up, before it builds a TLS locker:
//! `rustls::crypto::ring::default_provider().install_default()` (rustls with its `ring`
//! feature), or aws-lc-rs's. Without one, [`build`](LockerBuilder::build) and
//! [`build_lazy`](LockerBuilder::build_lazy) refuse `rediss://` URLs with
//! [`ConfigError::NoCryptoProvider`] before any connection (rustls would otherwise install the
//! provider its crate features name as the process default itself, or panic when they name
//! two). Plaintext lockers need no provider.
//!
//! ```no_run
//! use lock_core::{Locker, TlsConfig};
//!
//! # async fn demo(ca_pem: Vec<u8>) -> Result<(), lock_core::LockError> {
//! // Once, at start-up: the process's rustls provider (the kit installs none).
//! let _ = rustls::crypto::ring::default_provider().install_default();
//! let locker = Locker::builder()
//!     .url("rediss://redis.internal:6380")
//!     .tls(TlsConfig::new().root_certificate_pem(ca_pem))
//!     .build()
//!     .await?;
//! # let _ = locker;
//! # Ok(())
//! # }
//! ```
//!
//! Malformed PEM is a [`ConfigError::Tls`] from `build()`, before any connection. A failed
//! handshake (untrusted, expired or wrong-host certificate, a refused client certificate) is
//! [`LockError::Tls`]; a server that never answers the handshake is a timeout
//! [`LockError::Backend`]. There is no switch to skip verification: a URL with redis-rs's
//! `#insecure` fragment (accept any certificate) is refused with [`ConfigError::Tls`] by
//! [`build`](LockerBuilder::build), before any connection, whatever `redis` features the
//! build enables.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `macros` | yes | the `#[distributed_lock]` re-export |
//! | `tls` | yes | `rediss://` URLs, [`TlsConfig`] and [`LockerBuilder::tls`] (rustls, redis-rs's `tls-rustls`) |
//! | `cluster` | yes | [`LockerBuilder::cluster`] working (redis-rs's `cluster-async`) |
//! | `sentinel` | yes | [`LockerBuilder::sentinel`] working (redis-rs's `sentinel`) |
//! | `metrics` | no | recording through the `metrics` facade (see below) |
//!
//! An application that talks to one plaintext server (or RedLock nodes) can leave out `tls`,
//! `cluster` and `sentinel` (`default-features = false, features = ["macros"]`) and compile
//! less. Without its feature, a `rediss://` URL, a cluster or a Sentinel topology is refused
//! by [`build`](LockerBuilder::build) and [`build_lazy`](LockerBuilder::build_lazy) with
//! [`ConfigError::FeatureDisabled`], which names the feature to enable; the builder methods
//! exist in every build, so a topology read from configuration compiles either way.
//!
//! # Metrics
//!
//! With the feature `metrics`, the kit records through the [`metrics`](https://docs.rs/metrics)
//! facade into whatever recorder the application installed (a Prometheus exporter, say). Names
//! start with `lock_`; labels are `kind` (`mutex`, `read`, `fair`, `semaphore`) or
//! `operation`, and an `outcome` or `reason`, never the key. The [`metrics`] module lists every value of each.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `lock_acquisitions_total` | counter | `kind`, `outcome` | acquires by outcome: `acquired`, `reentered`, `busy`, `skipped` (busy under `skip_if_busy`), `cancelled`, or the error (`backend`, `timeout`, `tls`, `wrong_type`, `not_replicated`, `lost`, `invalid_key`, `config`, `write_inside_read`, `shut_down`, `other`) |
//! | `lock_acquire_wait_seconds` | histogram | `kind`, `outcome` | time from the start of an acquire to its outcome (not for reentries) |
//! | `lock_acquire_call_seconds` | histogram | `kind`, `outcome` | latency of one acquire call to Redis (a try) by its answer: `acquired`, `busy`, `not_replicated`, `cancelled`, or the error |
//! | `lock_backend_errors_total` | counter | `operation`, `outcome` | Redis failures of `fence`, `extend`, `is_locked`, `force_unlock` calls, by error (`backend`, `timeout`, `tls`, `wrong_type`) |
//! | `lock_waiters` | gauge | `kind` | acquires under way |
//! | `lock_held` | gauge | `kind` | locks held (outermost guards alive) |
//! | `lock_hold_seconds` | histogram | `kind`, `outcome` | time from grant to release, by release outcome |
//! | `lock_releases_total` | counter | `kind`, `outcome` | releases: `released`, `handed_over`, `lost`, `failed` |
//! | `lock_lost_total` | counter | `kind`, `reason` | losses by [`LostReason`]: `expired`, `taken_over`, `deleted`, `server_restarted`, `max_hold`, `unknown`, `renewal_stopped`, `shutdown` |
//! | `lock_renewals_total` | counter | `kind`, `outcome` | watchdog renewals per lock: `renewed`, `lost`, `failed` |
//! | `lock_renewal_calls_total` | counter | | the watchdog's renewal script calls (one per tick, node and kind of lock for up to 500 locks, not per lock) |
//!
//! Without the feature nothing is recorded and the calls compile to nothing.
//!
//! # Logging
//!
//! The kit logs through `tracing`. At `info` and above only what an operator acts on, at most a
//! line per lock: a lock lost (`warn`, with its reason and how long it was held), an acquire
//! that got its lock after waiting a second or more, a release after a hold of a whole lease
//! or more (a long or hung critical section), a `force_unlock`. Per-acquire detail is at `debug`
//! and `trace`.
//!
//! Keys are user input (a request path, an order id, personal data). Wherever the kit shows
//! one, in its log fields and in its error messages, control characters and invisible
//! formatting ones are escaped (`\n`, `\u{1b}`, `\u{202e}`, and `\` doubled) and the key is cut
//! after 128 characters, so a key cannot forge a log line (a `%0A` decoded into a newline) or
//! flood a log. The error values keep the whole key in their `key` fields.
//!
//! Spans, each with the `key` and an `outcome` field recorded when it ends:
//!
//! | span | level | covers | `outcome` |
//! |---|---|---|---|
//! | `lock.acquire` | debug | one acquire, from its start to its answer | as `lock_acquisitions_total`: `acquired`, `reentered`, `busy`, `cancelled`, or the error |
//! | `lock.hold` | debug; info with [`trace_holds(true)`](LockerBuilder::trace_holds) | the held section, from the grant to the release (under the span that was current at the acquire) | the release's: `released`, `handed_over`, `lost`, `failed` |
//! | `lock.release` | debug | one release in Redis, inside `lock.hold` | `released`, `lost`, `failed` |
//!
//! A span no subscriber wants costs no formatting and no allocation.
//!
//! # Operating it
//!
//! - **Starting before Redis.** [`Locker::connect_lazy`] and [`LockerBuilder::build_lazy`]
//!   check the configuration and connect on first use: acquires fail with
//!   [`LockError::Backend`] until Redis answers, then work, without rebuilding the locker
//!   (a single server and RedLock; Cluster and Sentinel are refused with
//!   [`ConfigError::LazyTopology`]).
//! - **Stopping.** [`Locker::shutdown`] gives back in Redis, at once, every lock, read lock
//!   and semaphore permit the process holds (their guards' [`LockGuard::lost`] fires with
//!   [`LostReason::Shutdown`]), waits for the releases running in the background, stops the
//!   watchdog and the release listener, and fails every acquire from then on with
//!   [`LockError::ShutDown`]. Call it on SIGTERM, after the requests drained: the next
//!   instance of a rolling restart takes the keys at once instead of a lease later.
//! - **Server versions.** [`LockerBuilder::build`] reads `INFO server` of every server of the
//!   topology and refuses one below Redis 6.2 (fencing tokens use `SET .. PXAT`) with
//!   [`ConfigError::ServerTooOld`]; a semaphore's acquire refuses one below 7.0 (its scripts
//!   use `PEXPIRE .. GT`) with the same error, from the version read then. A lazy locker reads
//!   it before its first acquire sends anything. Valkey reports `redis_version:7.2.4` and
//!   serves everything.
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_core::Locker;
//!
//! # #[tokio::main] async fn main() -> Result<(), lock_core::LockError> {
//! let locker = Locker::connect_lazy("redis://127.0.0.1:6379")?; // Redis may be down now
//! // ... serve ...
//! locker.shutdown(Duration::from_secs(5)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What a Redis lock does not protect against
//!
//! A primary that fails over before the lock key replicated can grant the lock twice; a
//! process pause longer than the lease lets a second holder in before the first notices. Use
//! the fencing token (or a conditional write) where a double holder would corrupt data, and
//! keep database constraints (unique indexes, conditional updates) as the last line.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod backend_error;
mod builder;
mod capabilities;
mod connection;
mod error;
mod fence;
mod guard;
mod held;
mod held_by_token;
mod hex;
mod hold_ends;
mod holder;
mod in_box;
mod in_flight;
mod inspect;
mod key;
mod kind;
mod limits;
mod local;
mod local_key;
mod locker;
pub mod metrics;
mod multi;
mod owner;
mod release;
mod release_messages;
mod scripts;
mod semaphore;
mod server_version;
mod skip;
mod store;
mod template;
#[cfg(feature = "tls")]
mod tls;
mod token;
mod topology;
mod watch;
mod watchdog;
mod with_lock;

#[doc(hidden)]
pub mod __private;

pub use acquire::{Acquire, AcquireFuture};
pub use backend_error::BackendError;
pub use builder::LockerBuilder;
pub use error::{ConfigError, DurationSetting, InvalidKeyReason, LockError, LostReason};
pub use fence::Fence;
pub use guard::LockGuard;
pub use holder::{HolderNameReason, MAX_HOLDER_NAME_LEN};
pub use inspect::{LockInfo, LockKind};
pub use key::MAX_KEY_LEN;
pub use limits::MAX_LEASE;
pub use locker::{Locker, LockerStats};
pub use multi::{AcquireAll, MultiLockGuard};
pub use semaphore::Semaphore;
pub use skip::{SkipIfBusy, SkipIfBusyFuture};
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub use tls::TlsConfig;
pub use topology::redact as redact_url;
pub use watch::LockWatch;
pub use with_lock::OnLost;

/// Protects an async fn with a distributed lock (one key, its read lock, or several keys); see
/// the `lock-macros` crate docs.
#[cfg(feature = "macros")]
#[doc(inline)]
pub use lock_macros::distributed_lock;

#[cfg(test)]
mod bounds {
    use super::*;

    fn is_send<T: Send>() {}
    fn is_sync<T: Sync>() {}

    #[test]
    fn bounds() {
        is_send::<Locker>();
        is_sync::<Locker>();
        is_send::<LockGuard>();
        is_sync::<LockGuard>();
        is_send::<AcquireFuture>();
        is_send::<Acquire>();
        is_send::<LockError>();
        is_send::<MultiLockGuard>();
        is_sync::<MultiLockGuard>();
        is_send::<AcquireAll>();
        is_send::<Semaphore>();
        is_sync::<Semaphore>();
        is_sync::<LockError>();
        is_send::<SkipIfBusyFuture<AcquireFuture>>();
        is_send::<LockWatch>();
        is_sync::<LockWatch>();
    }
}
