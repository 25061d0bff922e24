//! The lock operations on a topology: one logical Redis (a server, a cluster, a Sentinel
//! primary) or a RedLock quorum of independent primaries.

use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::RedisResult;
use tokio::time::Instant;

use crate::connection::Connection;
use crate::key::RedisKeys;
use crate::scripts;
use crate::watchdog::lease_ms;

/// The answer to one acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The lock is ours, with this fencing token.
    Acquired { fence: u64 },
    /// Someone else holds it; their remaining lease if known.
    Held { ttl: Option<Duration> },
    /// Acquired, but fewer than the required replicas acknowledged; the lock was released again.
    NotReplicated { acked: u64 },
}

/// The answer to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Released {
    /// The lock held our token and is now deleted (on a majority, for RedLock).
    pub(crate) ours: bool,
    /// Waiters listened on the release channel (they are in other lockers: this locker's own
    /// waiters queue locally and do not subscribe while the key is held here).
    pub(crate) others_waiting: bool,
    /// Not `ours`, but only because a retried call (the first one's reply was lost) found the
    /// key held by another token: the first call may have deleted ours and told a waiter, who
    /// took it. A holder whose lease was confirmed when it sent the release knows that it did.
    pub(crate) retried_taken: bool,
}

impl Released {
    /// Whether this release ended a lock that was ours, for a holder that knew, when it sent
    /// the release, whether its confirmed lease was still running (`valid_at_send`). A holder
    /// whose lease was running held the key then, so a retry that finds it taken by another
    /// token was taken after this release's own first call deleted it.
    pub(crate) fn was_ours(&self, valid_at_send: bool) -> bool {
        self.ours || (self.retried_taken && valid_at_send)
    }
}

/// What one renewal learned about one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The lease was extended.
    Renewed,
    /// The key is gone or holds another token: the lock is lost.
    NotOurs,
    /// No answer that decides it (Redis unreachable, no quorum either way).
    Unknown,
}

/// `WAIT` for replicas after acquiring (primary-replica topologies).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MinReplicas {
    pub(crate) replicas: u64,
    pub(crate) timeout: Duration,
}

/// RedLock's delayed-restart guard: a node whose data set is younger than `guard` (restarted
/// without persistence, flushed, new) grants nothing, so locks it forgot cannot be granted
/// twice while their lease may still run on the other nodes.
#[derive(Debug, Clone)]
pub(crate) struct RestartGuard {
    /// The node's epoch key, under the locker's prefix.
    pub(crate) epoch_key: String,
    pub(crate) guard: Duration,
}

/// Where locks live.
#[derive(Debug)]
pub(crate) enum Store {
    /// One logical Redis.
    One {
        conn: Connection,
        min_replicas: Option<MinReplicas>,
    },
    /// RedLock over independent primaries: a lock is held when a majority holds it.
    Quorum {
        nodes: Vec<Connection>,
        /// Per-node limit of one call.
        timeout: Duration,
        restart_guard: Option<RestartGuard>,
    },
}

/// Most keys renewed by one script call.
pub(crate) const BATCH: usize = 500;

impl Store {
    /// The `min_replicas` requirement, if any.
    pub(crate) fn min_replicas(&self) -> Option<u64> {
        match self {
            Self::One { min_replicas, .. } => min_replicas.map(|m| m.replicas),
            Self::Quorum { .. } => None,
        }
    }

    /// Warns when the server may evict lock keys (`maxmemory-policy` other than `noeviction`):
    /// an evicted lock is a silent loss, noticed only at the next renewal. Servers that refuse
    /// `CONFIG GET` (ACL) are not checked.
    pub(crate) async fn warn_on_eviction_policy(&self) {
        let nodes = match self {
            Self::One { conn, .. } => std::slice::from_ref(conn),
            Self::Quorum { nodes, .. } => nodes.as_slice(),
        };
        for node in nodes {
            let mut conn = node.clone();
            let reply: RedisResult<Vec<String>> = redis::cmd("CONFIG")
                .arg("GET")
                .arg("maxmemory-policy")
                .query_async(&mut conn)
                .await;
            if let Ok(pair) = reply {
                if let Some(policy) = pair.get(1).filter(|p| p.as_str() != "noeviction") {
                    tracing::warn!(
                        %policy,
                        "redis may evict lock keys under memory pressure; set maxmemory-policy noeviction"
                    );
                }
            }
        }
    }

    /// Whether this is a RedLock quorum.
    pub(crate) fn is_quorum(&self) -> bool {
        matches!(self, Self::Quorum { .. })
    }

    fn quorum(nodes: &[Connection]) -> usize {
        nodes.len() / 2 + 1
    }

    /// Tries once to take the lock.
    pub(crate) async fn acquire(
        &self,
        keys: &RedisKeys,
        token: &str,
        lease: Duration,
        retention: Duration,
    ) -> RedisResult<Outcome> {
        match self {
            Self::One { conn, min_replicas } => {
                let mut conn = conn.clone();
                let outcome = acquire_on(&mut conn, keys, token, lease, retention, None).await?;
                match (outcome, min_replicas) {
                    (Outcome::Acquired { .. }, Some(min)) => {
                        let acked = wait_for_replicas(&mut conn, &keys.lock, *min).await?;
                        if acked >= min.replicas {
                            Ok(outcome)
                        } else {
                            release_on(&mut conn, keys, token).await?;
                            Ok(Outcome::NotReplicated { acked })
                        }
                    }
                    _ => Ok(outcome),
                }
            }
            Self::Quorum {
                nodes,
                timeout,
                restart_guard,
            } => {
                // RedLock: a node's answer is only worth waiting for a small part of the lease.
                let per_node = (lease / 50).clamp(Duration::from_millis(10), *timeout);
                let attempt = QuorumAttempt {
                    lease,
                    retention,
                    per_node,
                    restart_guard: restart_guard.as_ref(),
                };
                quorum_acquire(nodes, keys, token, attempt).await
            }
        }
    }

    /// Releases the lock if it holds `token`; `true` when it was ours (on a quorum, for RedLock).
    pub(crate) async fn release(&self, keys: &RedisKeys, token: &str) -> RedisResult<Released> {
        match self {
            Self::One { conn, .. } => release_on(&mut conn.clone(), keys, token).await,
            Self::Quorum { nodes, .. } => {
                // Every node gets the release (in its own task, so a dead node cannot hold up
                // the answer); the answer is decided by the first majority.
                let quorum = Self::quorum(nodes);
                let total = nodes.len();
                let replies = gather(
                    nodes.iter().map(|node| {
                        let mut conn = node.clone();
                        let (keys, token) = (keys.clone(), token.to_owned());
                        tokio::spawn(async move { release_on(&mut conn, &keys, &token).await })
                    }),
                    |done: &[RedisResult<Released>]| {
                        let yes = done.iter().filter(|r| matches!(r, Ok(r) if r.ours)).count();
                        let no = done
                            .iter()
                            .filter(|r| matches!(r, Ok(r) if !r.ours))
                            .count();
                        yes >= quorum || no > total - quorum || done.len() == total
                    },
                )
                .await;
                let released = replies
                    .iter()
                    .filter(|r| matches!(r, Ok(r) if r.ours))
                    .count();
                let others_waiting = replies
                    .iter()
                    .any(|r| matches!(r, Ok(r) if r.others_waiting));
                if released >= quorum {
                    return Ok(Released {
                        ours: true,
                        others_waiting,
                        retried_taken: false,
                    });
                }
                let ours_or_taken = replies
                    .iter()
                    .filter(|r| matches!(r, Ok(r) if r.ours || r.retried_taken))
                    .count();
                let no = replies
                    .iter()
                    .filter(|r| matches!(r, Ok(r) if !r.ours))
                    .count();
                if no <= total - quorum {
                    if let Some(Err(error)) = replies.into_iter().find(Result::is_err) {
                        return Err(error);
                    }
                }
                Ok(Released {
                    ours: false,
                    others_waiting,
                    retried_taken: ours_or_taken >= quorum,
                })
            }
        }
    }

    /// Renews `locks` (lock key, token) with `lease`; one answer per lock, in order.
    pub(crate) async fn renew(&self, locks: &[(&str, &str)], lease: Duration) -> Vec<Renewal> {
        match self {
            Self::One { conn, .. } => renew_on(conn, locks, lease)
                .await
                .into_iter()
                .map(|r| match r {
                    Some(true) => Renewal::Renewed,
                    Some(false) => Renewal::NotOurs,
                    None => Renewal::Unknown,
                })
                .collect(),
            Self::Quorum { nodes, timeout, .. } => {
                // A dead node must not hold up the tick: its answers count as unknown.
                let per_node = join_all(nodes.iter().map(|node| async move {
                    tokio::time::timeout(*timeout, renew_on(node, locks, lease))
                        .await
                        .unwrap_or_else(|_| vec![None; locks.len()])
                }))
                .await;
                let quorum = Self::quorum(nodes);
                (0..locks.len())
                    .map(|i| {
                        let yes = per_node.iter().filter(|n| n[i] == Some(true)).count();
                        let no = per_node.iter().filter(|n| n[i] == Some(false)).count();
                        if yes >= quorum {
                            Renewal::Renewed
                        } else if no > nodes.len() - quorum {
                            Renewal::NotOurs
                        } else {
                            Renewal::Unknown
                        }
                    })
                    .collect()
            }
        }
    }

    /// Whether the lock key exists (on a quorum, for RedLock).
    pub(crate) async fn exists(&self, lock_key: &str) -> RedisResult<bool> {
        let exists = |conn: &Connection| {
            let mut conn = conn.clone();
            let lock_key = lock_key.to_owned();
            async move {
                redis::cmd("EXISTS")
                    .arg(lock_key)
                    .query_async::<bool>(&mut conn)
                    .await
            }
        };
        match self {
            Self::One { conn, .. } => exists(conn).await,
            Self::Quorum { nodes, .. } => {
                let replies = join_all(nodes.iter().map(exists)).await;
                let yes = replies.iter().filter(|r| matches!(r, Ok(true))).count();
                let answered = replies.iter().filter(|r| r.is_ok()).count();
                if answered < Self::quorum(nodes) {
                    if let Some(Err(e)) = replies.into_iter().find(Result::is_err) {
                        return Err(e);
                    }
                }
                Ok(yes >= Self::quorum(nodes))
            }
        }
    }

    /// Deletes the lock whoever holds it; `true` if any node had it.
    pub(crate) async fn force_unlock(&self, keys: &RedisKeys) -> RedisResult<bool> {
        let unlock = |conn: &Connection| {
            let mut conn = conn.clone();
            async move {
                let deleted: i64 = scripts::FORCE_UNLOCK
                    .key(&keys.lock)
                    .arg(&keys.channel)
                    .invoke_async(&mut conn)
                    .await?;
                Ok::<bool, redis::RedisError>(deleted == 1)
            }
        };
        match self {
            Self::One { conn, .. } => unlock(conn).await,
            Self::Quorum { nodes, .. } => {
                let replies = join_all(nodes.iter().map(unlock)).await;
                let any = replies.iter().any(|r| matches!(r, Ok(true)));
                match replies.into_iter().find(Result::is_err) {
                    Some(Err(e)) if !any => Err(e),
                    _ => Ok(any),
                }
            }
        }
    }
}

/// Collects the results of spawned per-node calls until `decided` says the outcome is known;
/// calls still running go on in the background.
async fn gather<T: Send + 'static>(
    calls: impl IntoIterator<Item = tokio::task::JoinHandle<T>>,
    mut decided: impl FnMut(&[T]) -> bool,
) -> Vec<T> {
    let mut pending: FuturesUnordered<_> = calls.into_iter().collect();
    let mut done = Vec::new();
    while let Some(result) = pending.next().await {
        if let Ok(value) = result {
            done.push(value);
        }
        if decided(&done) {
            break;
        }
    }
    done
}

/// The settings of one RedLock acquire.
#[derive(Debug, Clone, Copy)]
struct QuorumAttempt<'a> {
    lease: Duration,
    retention: Duration,
    /// Limit of one node's answer.
    per_node: Duration,
    restart_guard: Option<&'a RestartGuard>,
}

/// What the acquiring caller decided, for the per-node tasks of a RedLock acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pending,
    Keep,
    Undo,
}

/// RedLock acquire: every node tries at once, each in its own task; the caller decides as soon
/// as a majority granted (or can no longer grant) the lock. Each node's task then undoes its
/// own grant if the verdict is "undo" (or the caller went away), after its acquire finished,
/// so a late grant is never left behind.
async fn quorum_acquire(
    nodes: &[Connection],
    keys: &RedisKeys,
    token: &str,
    attempt: QuorumAttempt<'_>,
) -> RedisResult<Outcome> {
    let QuorumAttempt {
        lease,
        retention,
        per_node,
        restart_guard,
    } = attempt;
    let started = Instant::now();
    let quorum = nodes.len() / 2 + 1;
    let total = nodes.len();
    let (verdict_tx, verdict_rx) = tokio::sync::watch::channel(Verdict::Pending);
    let tasks = nodes.iter().map(|node| {
        let mut conn = node.clone();
        let (keys, token) = (keys.clone(), token.to_owned());
        let restart_guard = restart_guard.cloned();
        let mut verdict = verdict_rx.clone();
        tokio::spawn(async move {
            let reply = tokio::time::timeout(
                per_node,
                acquire_on(
                    &mut conn,
                    &keys,
                    &token,
                    lease,
                    retention,
                    restart_guard.as_ref(),
                ),
            )
            .await
            .unwrap_or_else(|_| Err(timed_out()));
            let granted_or_unknown = !matches!(reply, Ok(Outcome::Held { .. }));
            let answer = (conn.clone(), reply);
            if granted_or_unknown {
                let keep_conn = conn;
                tokio::spawn(async move {
                    let mut conn = keep_conn;
                    let decided = verdict
                        .wait_for(|v| *v != Verdict::Pending)
                        .await
                        .map(|v| *v);
                    if !matches!(decided, Ok(Verdict::Keep)) {
                        let _ = release_on(&mut conn, &keys, &token).await;
                    }
                });
            }
            answer
        })
    });
    let replies = gather(tasks, |done: &[(Connection, RedisResult<Outcome>)]| {
        let won = done
            .iter()
            .filter(|(_, r)| matches!(r, Ok(Outcome::Acquired { .. })))
            .count();
        won >= quorum || won + (total - done.len()) < quorum
    })
    .await;
    let mut won = Vec::new();
    let mut ttl: Option<Duration> = None;
    let mut held = false;
    let mut first_error = None;
    for (conn, reply) in replies {
        match reply {
            Ok(Outcome::Acquired { fence }) => won.push((conn, fence)),
            Ok(Outcome::Held { ttl: t }) => {
                held = true;
                ttl = ttl.max(t);
            }
            Ok(Outcome::NotReplicated { .. }) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    // Validity: what is left of the lease after the round trips and a drift allowance.
    let drift = lease / 100 + Duration::from_millis(2);
    if won.len() >= quorum && started.elapsed() + drift < lease {
        let fence = won.iter().map(|(_, f)| *f).max().unwrap_or(0);
        let raised = join_all(won.iter().map(|(conn, _)| {
            let mut conn = conn.clone();
            async move {
                let ok: RedisResult<i64> = scripts::RAISE_FENCE
                    .key(&keys.fence)
                    .arg(fence)
                    .arg(lease_ms(retention))
                    .invoke_async(&mut conn)
                    .await;
                ok.is_ok()
            }
        }))
        .await;
        if raised.iter().filter(|ok| **ok).count() >= quorum && started.elapsed() + drift < lease {
            let _ = verdict_tx.send(Verdict::Keep);
            return Ok(Outcome::Acquired { fence });
        }
    }
    let _ = verdict_tx.send(Verdict::Undo);
    // The nodes that granted are undone before answering (their tasks do it again, harmlessly),
    // so a failed acquire returns with no grant of ours left on any node that answered.
    join_all(won.iter().map(|(conn, _)| {
        let mut conn = conn.clone();
        async move { release_on(&mut conn, keys, token).await }
    }))
    .await;
    match first_error {
        Some(error) if !held => Err(error),
        _ => Ok(Outcome::Held { ttl }),
    }
}

async fn acquire_on(
    conn: &mut Connection,
    keys: &RedisKeys,
    token: &str,
    lease: Duration,
    retention: Duration,
    restart_guard: Option<&RestartGuard>,
) -> RedisResult<Outcome> {
    let mut invocation = scripts::ACQUIRE.key(&keys.lock);
    invocation
        .key(&keys.fence)
        .arg(token)
        .arg(lease_ms(lease))
        .arg(lease_ms(retention));
    if let Some(guard) = restart_guard {
        invocation.key(&guard.epoch_key).arg(lease_ms(guard.guard));
    }
    let (answer, value): (i64, i64) = invocation.invoke_async(conn).await?;
    Ok(match answer {
        1 => Outcome::Acquired {
            fence: u64::try_from(value).unwrap_or(0),
        },
        2 => {
            // The node may have forgotten a lock it granted: it votes for nobody until then.
            tracing::debug!(young_ms = value, "redlock node within its restart guard");
            Outcome::Held {
                ttl: u64::try_from(value).ok().map(Duration::from_millis),
            }
        }
        _ => Outcome::Held {
            ttl: u64::try_from(value).ok().map(Duration::from_millis),
        },
    })
}

async fn release_on(conn: &mut Connection, keys: &RedisKeys, token: &str) -> RedisResult<Released> {
    // Compare-and-delete is idempotent, so a call that met a dropped connection is sent again
    // (the connection manager reconnects meanwhile) instead of leaving the key for its lease.
    // If the first call did run, the retry finds the key absent: that is our own delete. Or,
    // when a waiter was told and took the lock meanwhile, held by another token
    // (`retried_taken`): the holder knows whether that was after its own delete (see
    // `LockGuard::release`).
    let mut tries = 0;
    let released: i64 = retry_dropped(|| {
        tries += 1;
        let mut conn = conn.clone();
        async move {
            scripts::RELEASE
                .key(&keys.lock)
                .arg(token)
                .arg(&keys.channel)
                .invoke_async(&mut conn)
                .await
        }
    })
    .await?;
    Ok(Released {
        ours: released >= 1 || (released == -1 && tries > 1),
        retried_taken: released == 0 && tries > 1,
        others_waiting: released == 2,
    })
}

/// Runs `call` again (twice at most, shortly after) when it failed on a dropped or refused
/// connection; for idempotent calls only.
async fn retry_dropped<T, F, Fut>(mut call: F) -> RedisResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = RedisResult<T>>,
{
    let mut result = call().await;
    for delay in [5, 50] {
        match &result {
            Err(e) if e.is_connection_dropped() || e.is_io_error() && !e.is_timeout() => {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                result = call().await;
            }
            _ => break,
        }
    }
    result
}

/// `WAIT replicas timeout` on the node that holds `lock_key`, on the connection that wrote it.
async fn wait_for_replicas(
    conn: &mut Connection,
    lock_key: &str,
    min: MinReplicas,
) -> RedisResult<u64> {
    let mut wait = redis::cmd("WAIT");
    wait.arg(min.replicas).arg(lease_ms(min.timeout));
    match conn {
        Connection::Cluster(cluster) => {
            let route = Route::with_key(lock_key, SlotAddr::Master);
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
            let value = cluster.route_command(wait, routing).await?;
            redis::from_redis_value(value).map_err(Into::into)
        }
        _ => wait.query_async(conn).await,
    }
}

/// Renews on one logical Redis; `None` where the call failed.
async fn renew_on(conn: &Connection, locks: &[(&str, &str)], lease: Duration) -> Vec<Option<bool>> {
    // In a cluster a script's keys must share a slot: every lock is its own call there (all
    // sent at once, so each node still gets them in one pipelined write).
    let size = if conn.is_cluster() { 1 } else { BATCH };
    let calls = locks.chunks(size).map(|chunk| {
        let conn = conn.clone();
        async move {
            let mut invocation = scripts::RENEW.prepare_invoke();
            invocation.arg(lease_ms(lease));
            for (key, token) in chunk {
                invocation.key(*key).arg(*token);
            }
            // Renewal is idempotent: retried at once after a dropped connection rather than at
            // the next tick, so connection resets do not eat into the lease.
            let flags: RedisResult<Vec<i64>> =
                retry_dropped(|| {
                    let mut conn = conn.clone();
                    let invocation = &invocation;
                    async move { invocation.invoke_async(&mut conn).await }
                })
                .await;
            match flags {
                Ok(flags) if flags.len() == chunk.len() => flags.into_iter().map(|f| Some(f == 1)).collect(),
                Ok(_) => vec![None; chunk.len()],
                Err(error) => {
                    tracing::warn!(%error, locks = chunk.len(), "lease renewal failed; retrying next tick");
                    vec![None; chunk.len()]
                }
            }
        }
    });
    join_all(calls).await.into_iter().flatten().collect()
}

fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "redlock node did not answer in time",
    ))
}
