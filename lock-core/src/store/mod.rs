//! The lock operations on a topology, behind one small interface ([`Store`]): the single-server
//! strategy (one logical Redis: a server, a cluster or a Sentinel primary) and the RedLock
//! strategy (a majority of independent primaries), each in its own file, both built on the
//! calls of [`node`]. Each script's typed call and typed reply are in [`calls`].

mod calls;
mod node;
mod redlock;
mod single;
mod wait;

use std::future::Future;
use std::time::Duration;

use futures_util::future::{join_all, Either};

pub(crate) use calls::acquire::AcquireReply;
pub(crate) use calls::inspect::{HeldAs, Inspected};
pub(crate) use calls::release::{Gone, ReleaseReply};
pub(crate) use calls::renew::Renewal;
pub(crate) use node::Node;
pub(crate) use redlock::{Quorum, RedLockStore};
pub(crate) use single::SingleStore;
pub(crate) use wait::Opener;

use crate::backend_error::BackendError;
use crate::error::{ConfigError, LockError};
use crate::held::ExtensionPath;
use crate::in_box::in_box;
use crate::key::{RedisKeys, ShownKey};
use crate::limits::lease_ms;
use crate::metrics;
use crate::server_version;
use crate::token::Token;

/// Most keys renewed by one script call.
pub(crate) const BATCH: usize = 500;

/// The answer to one acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The lock is ours.
    Acquired,
    /// Someone else holds it (or the node grants nothing yet); how long that lasts if known,
    /// and the holder's stored value when Redis told it.
    Busy {
        ttl: Option<Duration>,
        holder: Option<String>,
        /// RedLock: a node granted this try that a majority refused. The lock was being
        /// released as the try ran (or a node forgot it), and the release's message may have
        /// gone only to nodes the waiter does not listen on.
        split: bool,
    },
    /// Acquired, but fewer than the required replicas acknowledged; the lock was released again.
    NotReplicated { acked: u64 },
}

impl Outcome {
    /// The metric label of this answer.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Busy { .. } => "busy",
            Self::NotReplicated { .. } => "not_replicated",
        }
    }
}

impl From<AcquireReply> for Outcome {
    fn from(reply: AcquireReply) -> Self {
        match reply {
            AcquireReply::Acquired => Self::Acquired,
            AcquireReply::Busy { ttl, holder } => Self::Busy {
                ttl,
                holder,
                split: false,
            },
            AcquireReply::Guarded { for_ms } => Self::Busy {
                ttl: Some(for_ms),
                holder: None,
                split: false,
            },
        }
    }
}

/// The arguments of one acquire.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcquireArgs {
    pub(crate) lease: Duration,
    /// Life of the waiting flag; zero when the caller will not wait.
    pub(crate) flag: Duration,
    /// No earlier try used this token, so nothing of it can be on the server: the try may start
    /// with a plain `SET NX PX`.
    pub(crate) fresh_token: bool,
    /// Another locker most likely holds the lock (this process's last release of it told
    /// waiters elsewhere): the script goes first, which answers a taken lock in one call,
    /// instead of a plain `SET NX PX` that would fail before it.
    pub(crate) likely_busy: bool,
}

/// The lease a renewal sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum NewLease {
    /// At least this long from now, never less than the lease Redis has: a watchdog renewal,
    /// a handoff's confirmation of a lock with more than an eighth of its lease used. A longer
    /// extension the holder was told about stays.
    AtLeast(Duration),
    /// Exactly this long from now, shorter or longer: an explicit extension.
    Exactly(Duration),
}

impl NewLease {
    pub(crate) fn lease(self) -> Duration {
        match self {
            Self::AtLeast(lease) | Self::Exactly(lease) => lease,
        }
    }
}

/// `WAIT` for replicas after acquiring (primary-replica topologies).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MinReplicas {
    pub(crate) replicas: u64,
    pub(crate) timeout: Duration,
}

impl MinReplicas {
    /// `WAIT replicas timeout`: how many replicas acknowledged the writes sent before it on
    /// the same connection.
    pub(crate) fn wait(self) -> redis::Cmd {
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.replicas).arg(lease_ms(self.timeout));
        wait
    }
}

/// The delayed-restart guard: a node whose data set is younger than `guard` (restarted, flushed,
/// new) grants nothing, so locks it forgot cannot be granted twice while their lease may still
/// run.
#[derive(Debug, Clone)]
pub(crate) struct RestartGuard {
    /// The node's epoch key, under the locker's prefix.
    pub(crate) epoch_key: String,
    pub(crate) guard: Duration,
}

/// Where locks live, and how they are taken, released and renewed there.
#[derive(Debug)]
pub(crate) enum Store {
    Single(SingleStore),
    RedLock(RedLockStore),
}

impl Store {
    fn nodes(&self) -> &[Node] {
        match self {
            Self::Single(store) => std::slice::from_ref(&store.node),
            Self::RedLock(store) => &store.nodes,
        }
    }

    /// The `min_replicas` requirement, if any.
    pub(crate) fn min_replicas(&self) -> Option<MinReplicas> {
        match self {
            Self::Single(store) => store.min_replicas(),
            Self::RedLock(_) => None,
        }
    }

    /// How an explicit extension goes to Redis: on a connection of its own where `WAIT`s do
    /// (a single server's or Sentinel's pool, with `min_replicas`), else on the shared
    /// connection the watchdog's rounds use.
    pub(crate) fn extension_path(&self) -> ExtensionPath {
        match self {
            Self::Single(store) if store.has_pool() => ExtensionPath::OwnConnection,
            _ => ExtensionPath::Shared,
        }
    }

    /// Whether this is a RedLock quorum (a failed try there leaves an undo running in the
    /// background, so the next try needs a fresh token).
    pub(crate) fn is_redlock(&self) -> bool {
        matches!(self, Self::RedLock(_))
    }

    /// The renewal script calls that renewing `locks` sends, on every node: see
    /// [`Node::renew_calls`].
    pub(crate) fn renew_calls(&self, locks: &[(&RedisKeys, &str)]) -> u64 {
        self.nodes()
            .iter()
            .map(|node| node.renew_calls(locks))
            .sum()
    }

    /// Reads the version of every node's server(s) (`build`) and refuses the topology if one
    /// is too old for the kit ([`server_version::KIT`]), or if two RedLock nodes are one
    /// server (the same `run_id`, see [`RedLockStore`]); warns when one cannot serve
    /// semaphores, which their acquires then refuse. A RedLock node that does not answer now
    /// is read at its first use (it may come up later); any other failure is the build's.
    pub(crate) async fn check_servers(&self) -> Result<(), LockError> {
        let read = join_all(
            self.nodes()
                .iter()
                .map(|node| async move { (node, node.read_server(node.conn.generation()).await) }),
        )
        .await;
        for (node, result) in read {
            match result {
                Ok(()) => {}
                Err(error) if self.is_redlock() => {
                    tracing::debug!(node = %node.name, %error, "redlock node's version not read; read at its first use");
                }
                Err(error) => {
                    let context = format!("reading the server version of {}", node.name);
                    return Err(LockError::backend(None, error.context(context)));
                }
            }
        }
        if let Self::RedLock(store) = self {
            if let Some(twice) = store.named_twice() {
                return Err(LockError::backend(None, twice));
            }
        }
        for node in self.nodes() {
            let generation = node.conn.generation();
            if let Some(Some(too_old)) = node.too_old(server_version::KIT, generation) {
                return Err(ConfigError::from(too_old).into());
            }
            if let Some(Some(too_old)) = node.too_old(server_version::SEMAPHORE, generation) {
                tracing::warn!(node = %too_old.node, version = %too_old.found, "this server cannot serve semaphores (they need 7.0); their acquires will be refused");
            }
        }
        Ok(())
    }

    pub(crate) async fn warn_on_eviction_policy(&self) {
        for node in self.nodes() {
            node.warn_on_eviction_policy().await;
        }
    }

    /// Tries once to take the lock for `token`; `waiter` names the acquire in the waiting
    /// writers of an exclusive lock (its first try's token: a RedLock try has a fresh token
    /// each time, the acquire keeps one entry).
    pub(crate) async fn acquire(
        &self,
        keys: &RedisKeys,
        token: &Token,
        waiter: &Token,
        args: AcquireArgs,
    ) -> Result<Outcome, BackendError> {
        // Timed here, once for both strategies; dropped unanswered, it counts as cancelled.
        let call = metrics::AcquireCall::start(keys.kind());
        let result = match self {
            Self::Single(store) => store.acquire(keys, token, waiter, args).await,
            // Boxed: a quorum's state is many times one node's, and every acquire's future
            // would carry it; next to several nodes' round trips the allocation is nothing.
            Self::RedLock(store) => in_box(|| store.acquire(keys, token, waiter, args)).await,
        };
        call.finish(result.as_ref().map(Outcome::label));
        result
    }

    /// Releases the lock if it holds `token`; see [`ReleaseReply`].
    ///
    /// The chosen store's own future, not one more future around it: every release runs
    /// through here.
    pub(crate) fn release<'a>(
        &'a self,
        keys: &'a RedisKeys,
        token: &'a Token,
    ) -> impl Future<Output = Result<ReleaseReply, BackendError>> + 'a {
        match self {
            Self::Single(store) => Either::Left(store.release(keys, token)),
            Self::RedLock(store) => Either::Right(store.release(keys, token)),
        }
    }

    /// Takes `token` out of the waiting writers of `keys` on every node it may have joined
    /// them on (an exclusive acquire that stopped waiting). A node that fails keeps the entry
    /// until it ends on its own (at most three fallback retries). When a node told the lock's
    /// waiters, every other node tells them too: a waiter listens on one node only, and that
    /// node may have had no entry of this writer, or may still hold an earlier writer's grant
    /// that a majority of nodes no longer has (like a RedLock release, see `RedLockStore`).
    pub(crate) async fn withdraw(&self, keys: &RedisKeys, token: &str) {
        let nodes = self.nodes();
        let done = join_all(nodes.iter().map(|node| node.withdraw(keys, token))).await;
        for error in done.iter().filter_map(|r| r.as_ref().err()) {
            tracing::debug!(%error, lock = %ShownKey(&keys.lock), "withdrawing a waiting writer failed; its entry ends on its own");
        }
        if done.iter().any(|told| matches!(told, Ok(true))) {
            let channel = keys.channel().to_string();
            let untold = nodes
                .iter()
                .zip(&done)
                .filter(|(_, told)| !matches!(told, Ok(true)));
            join_all(untold.map(|(node, _)| node.publish_release(&channel))).await;
        }
    }

    /// Renews `locks` (their keys, token) with `lease`; one answer per lock, in order.
    pub(crate) async fn renew(
        &self,
        locks: &[(&RedisKeys, &str)],
        lease: NewLease,
    ) -> Vec<Renewal> {
        match self {
            Self::Single(store) => store.renew(locks, lease).await,
            Self::RedLock(store) => store.renew(locks, lease).await,
        }
    }

    /// [`renew`](Self::renew), each answer given to `apply` (with the lock's place in `locks`)
    /// as soon as it is decided; see `Node::renew_each`.
    pub(crate) async fn renew_each(
        &self,
        locks: &[(&RedisKeys, &str)],
        lease: NewLease,
        apply: &mut (dyn FnMut(usize, Renewal) + Send),
    ) {
        match self {
            Self::Single(store) => store.renew_each(locks, lease, apply).await,
            Self::RedLock(store) => {
                for (i, answer) in store.renew(locks, lease).await.into_iter().enumerate() {
                    apply(i, answer);
                }
            }
        }
    }

    /// Whether each of `locks` (their keys, token; exclusive locks) still holds its token,
    /// changing nothing: a handoff's confirmation while most of the lease Redis confirmed is
    /// left (see `LocalLocks::confirm`). `Renewed` means still held; one answer per lock.
    pub(crate) async fn confirm(&self, locks: &[(&RedisKeys, &str)]) -> Vec<Renewal> {
        match self {
            Self::Single(store) => store.node.confirm(locks).await,
            Self::RedLock(store) => store.confirm(locks).await,
        }
    }

    /// Issues the next fencing token of the lock held by `token` (the counter then lives as
    /// long as the lock plus the fence window); `None` when the lock is no longer held by
    /// `token`.
    pub(crate) async fn issue_fence(
        &self,
        keys: &RedisKeys,
        token: &str,
    ) -> Result<Option<u64>, BackendError> {
        match self {
            Self::Single(store) => store.node.issue_fence(keys, token).await,
            Self::RedLock(store) => store.issue_fence(keys, token).await,
        }
    }

    /// Whether the lock key exists (on a majority, for RedLock).
    pub(crate) async fn exists(&self, lock_key: &str) -> Result<bool, BackendError> {
        match self {
            Self::Single(store) => store.exists(lock_key).await,
            Self::RedLock(store) => store.exists(lock_key).await,
        }
    }

    /// Who holds the lock or the semaphore of one user key (see `scripts/inspect.lua`; for
    /// RedLock, what a majority holds).
    pub(crate) async fn inspect(
        &self,
        lock: &RedisKeys,
        semaphore: &RedisKeys,
    ) -> Result<Option<Inspected>, BackendError> {
        match self {
            Self::Single(store) => store.inspect(lock, semaphore).await,
            Self::RedLock(store) => store.inspect(lock, semaphore).await,
        }
    }

    /// Deletes the lock whoever holds it; `true` if any node had it.
    pub(crate) async fn force_unlock(&self, keys: &RedisKeys) -> Result<bool, BackendError> {
        match self {
            Self::Single(store) => store.force_unlock(keys).await,
            Self::RedLock(store) => store.force_unlock(keys).await,
        }
    }
}
