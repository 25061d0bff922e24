//! The single-server strategy: one logical Redis (a server, a cluster, a Sentinel primary),
//! optionally with `WAIT` for replicas after each acquire.

use std::future::Future;

use super::node::Node;
use super::{
    AcquireArgs, AcquireReply, Inspected, MinReplicas, NewLease, Outcome, ReleaseReply, Renewal,
};
use crate::backend_error::BackendError;
use crate::in_box::in_box;
use crate::key::RedisKeys;
use crate::token::Token;

/// Locks on one logical Redis.
#[derive(Debug)]
pub(crate) struct SingleStore {
    pub(crate) node: Node,
    pub(crate) min_replicas: Option<MinReplicas>,
}

impl SingleStore {
    pub(crate) async fn acquire(
        &self,
        keys: &RedisKeys,
        token: &Token,
        waiter: &Token,
        args: AcquireArgs,
    ) -> Result<Outcome, BackendError> {
        let Some(min) = self.min_replicas else {
            return self
                .node
                .acquire(keys, token, waiter, args)
                .await
                .map(Outcome::from);
        };
        // Boxed, like the give-back below: their states are several times the plain acquire's,
        // which every acquire's future would otherwise carry (and copy) to serve a setting most
        // lockers leave off.
        let (reply, acked) =
            in_box(|| self.node.acquire_with_wait(keys, token, waiter, args, min)).await?;
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
        self.node.release(keys, token)
    }

    pub(crate) async fn renew(
        &self,
        locks: &[(&RedisKeys, &str)],
        lease: NewLease,
    ) -> Vec<Renewal> {
        self.node.renew(locks, lease, self.min_replicas).await
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
