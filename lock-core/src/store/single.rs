//! The single-server strategy: one logical Redis (a server, a cluster, a Sentinel primary),
//! optionally with `WAIT` for replicas after each acquire.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::future::Either;

use super::node::Node;
use super::wait::{Opener, WaitPool};
use super::{
    AcquireArgs, AcquireReply, Inspected, MinReplicas, NewLease, Outcome, ReleaseReply, Renewal,
};
use crate::backend_error::BackendError;
use crate::connection::Timeouts;
use crate::in_box::in_box;
use crate::key::RedisKeys;
use crate::token::Token;

/// How long an unacknowledged release asks Sentinel whether the primary moved: Sentinel names
/// a promoted replica a moment after the promotion (well under a second on loopback).
const SENTINEL_NAMES_THE_NEW_PRIMARY: std::time::Duration = std::time::Duration::from_secs(1);

/// A release's future, boxed behind a vtable.
type ReleaseFuture<'a> =
    Pin<Box<dyn Future<Output = Result<ReleaseReply, BackendError>> + Send + 'a>>;

/// Locks on one logical Redis.
#[derive(Debug)]
pub(crate) struct SingleStore {
    pub(crate) node: Node,
    /// `min_replicas`, and the connections its writes and `WAIT`s go on.
    replicated: Option<Replicated>,
}

/// The `min_replicas` requirement of a [`SingleStore`].
#[derive(Debug)]
struct Replicated {
    min: MinReplicas,
    /// The connections of their own for writes and their `WAIT`s; none on a cluster (see
    /// `store::wait`).
    pool: Option<Arc<WaitPool>>,
}

impl SingleStore {
    /// A store on `node`; with `min_replicas`, its acquires, extensions, handoff renewals and
    /// releases (on Sentinel) wait for replicas on connections `opener` opens (see
    /// `store::wait`), or on the shared connection without one.
    pub(crate) fn new(
        node: Node,
        min_replicas: Option<MinReplicas>,
        opener: Option<Opener>,
        timeouts: Timeouts,
    ) -> Self {
        let replicated = min_replicas.map(|min| Replicated {
            min,
            pool: opener.map(|opener| WaitPool::new(opener, timeouts)),
        });
        Self { node, replicated }
    }

    /// Whether writes with a `WAIT` go on pooled connections of their own (see `store::wait`).
    pub(crate) fn has_pool(&self) -> bool {
        matches!(&self.replicated, Some(Replicated { pool: Some(_), .. }))
    }

    /// The `min_replicas` requirement, if any.
    pub(crate) fn min_replicas(&self) -> Option<MinReplicas> {
        self.replicated.as_ref().map(|r| r.min)
    }

    pub(crate) async fn acquire(
        &self,
        keys: &RedisKeys,
        token: &Token,
        waiter: &Token,
        args: AcquireArgs,
    ) -> Result<Outcome, BackendError> {
        let Some(Replicated { min, pool }) = &self.replicated else {
            return self
                .node
                .acquire(keys, token, waiter, args)
                .await
                .map(Outcome::from);
        };
        // Boxed, like the give-back below: their states are several times the plain acquire's,
        // which every acquire's future would otherwise carry (and copy) to serve a setting most
        // lockers leave off.
        let (reply, acked) = in_box(|| {
            self.node
                .acquire_with_wait(keys, token, waiter, args, *min, pool.as_deref())
        })
        .await?;
        match reply {
            AcquireReply::Acquired if acked < min.replicas => {
                // Fail closed: a lock that did not reach the replicas is given back.
                in_box(|| self.node.release(keys, token)).await?;
                Ok(Outcome::NotReplicated { acked })
            }
            reply => Ok(reply.into()),
        }
    }

    pub(crate) fn release<'a>(
        &'a self,
        keys: &'a RedisKeys,
        token: &'a Token,
    ) -> impl Future<Output = Result<ReleaseReply, BackendError>> + 'a {
        match &self.replicated {
            // Only Sentinel moves a primary under the locker (a cluster's client follows its
            // shards itself, a single server does not move): elsewhere a release waits for
            // no replica.
            Some(Replicated {
                min,
                pool: Some(pool),
            }) if self.node.follows_sentinel() => {
                // Boxed: most lockers leave the setting off, and every release's future would
                // carry this one's state (behind a vtable: its type is deep enough that the
                // compiler's proof that it is `Send` would overflow).
                let replicated: ReleaseFuture<'a> =
                    Box::pin(self.release_replicated(keys, token, *min, pool));
                Either::Right(replicated)
            }
            _ => Either::Left(self.node.release(keys, token)),
        }
    }

    /// A release with `min_replicas`. A deletion no replica acknowledged may have run on a
    /// primary a failover left behind (the locker learns of the new one within a second, or
    /// at an error); the new primary then keeps the key, held by nobody, for the rest of its
    /// lease. So Sentinel is asked at once (and for a moment, see
    /// [`SENTINEL_NAMES_THE_NEW_PRIMARY`]), and if the primary moved, the release is sent
    /// again there (by token: it deletes the key only if it still holds it). A replica that
    /// merely lags costs the release that moment.
    async fn release_replicated(
        &self,
        keys: &RedisKeys,
        token: &Token,
        min: MinReplicas,
        pool: &WaitPool,
    ) -> Result<ReleaseReply, BackendError> {
        let (reply, waited) = self.node.release_with_wait(keys, token, min, pool).await?;
        if !reply.ours
            || waited.acked >= min.replicas
            || !self
                .node
                .primary_moved(waited.generation, SENTINEL_NAMES_THE_NEW_PRIMARY)
                .await
        {
            return Ok(reply);
        }
        let again = self.node.release(keys, token).await?;
        // Ours where the locks live now, or gone from there: the first answer stands, with
        // the waiters the second one found.
        Ok(ReleaseReply {
            others_waiting: reply.others_waiting || again.others_waiting,
            ..reply
        })
    }

    pub(crate) async fn renew(
        &self,
        locks: &[(&RedisKeys, &str)],
        lease: NewLease,
    ) -> Vec<Renewal> {
        let (min, pool) = match &self.replicated {
            Some(Replicated { min, pool }) => (Some(*min), pool.as_deref()),
            None => (None, None),
        };
        self.node.renew(locks, lease, min, pool).await
    }

    pub(crate) async fn renew_each(
        &self,
        locks: &[(&RedisKeys, &str)],
        lease: NewLease,
        apply: &mut (dyn FnMut(usize, Renewal) + Send),
    ) {
        self.node
            .renew_each(locks, lease, self.min_replicas(), apply)
            .await
    }

    pub(crate) async fn exists(&self, lock_key: &str) -> Result<bool, BackendError> {
        self.node.exists(lock_key).await
    }

    pub(crate) async fn inspect(
        &self,
        lock: &RedisKeys,
        semaphore: &RedisKeys,
    ) -> Result<Option<Inspected>, BackendError> {
        self.node.inspect(lock, semaphore).await
    }

    pub(crate) async fn force_unlock(&self, keys: &RedisKeys) -> Result<bool, BackendError> {
        self.node.force_unlock(keys).await
    }
}
