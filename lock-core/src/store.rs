//! The lock operations on a topology: one logical Redis (a server, a cluster, a Sentinel
//! primary) or a RedLock quorum of independent primaries.

use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionLike;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::RedisResult;
use tokio::time::Instant;

use crate::connection::{timed_out, Connection};
use crate::key::RedisKeys;
use crate::scripts::{self, ScriptCall};
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
    /// This release deleted the lock while it held our token (on a majority, for RedLock):
    /// now, or in an earlier try whose reply was lost, as the try's latch proves. `false` means
    /// the lock had been lost before any try of this release ran.
    pub(crate) ours: bool,
    /// Another locker flagged that it waits for this lock (and was told on the release
    /// channel). This locker's own waiters queue locally and never flag.
    pub(crate) others_waiting: bool,
}

impl Released {
    /// Decodes `scripts/release.lua`'s answer.
    fn from_reply(reply: i64) -> Self {
        Self {
            ours: (1..=4).contains(&reply),
            others_waiting: reply == 2 || reply == 4,
        }
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
        restart_guard: Option<RestartGuard>,
        /// How long a release's latch lives.
        latch: Duration,
    },
    /// RedLock over independent primaries: a lock is held when a majority holds it.
    Quorum {
        nodes: Vec<Connection>,
        /// Per-node limit of one call.
        timeout: Duration,
        restart_guard: Option<RestartGuard>,
        /// How long a release's latch lives.
        latch: Duration,
    },
}

/// How long a release's latch lives for a given command timeout: past every retry of the
/// release (at most three tries of one command timeout each, plus the pauses between them).
pub(crate) fn latch_ttl(command_timeout: Duration) -> Duration {
    (command_timeout * 4).max(Duration::from_secs(10))
}

/// Most keys renewed by one script call.
pub(crate) const BATCH: usize = 500;

impl Store {
    /// The `min_replicas` requirement, if any.
    pub(crate) fn min_replicas(&self) -> Option<MinReplicas> {
        match self {
            Self::One { min_replicas, .. } => *min_replicas,
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
            match reply {
                Ok(pair) => {
                    if let Some(policy) = pair.get(1).filter(|p| p.as_str() != "noeviction") {
                        tracing::warn!(
                            %policy,
                            "redis may evict lock keys under memory pressure; set maxmemory-policy noeviction"
                        );
                    }
                }
                Err(error) => tracing::debug!(
                    %error,
                    "cannot read maxmemory-policy (grant +config|get to check it); not checked"
                ),
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

    /// Tries once to take the lock. `flag` is how long the caller will wait if the lock is
    /// held (zero: it will not), for the waiting flag.
    pub(crate) async fn acquire(
        &self,
        keys: &RedisKeys,
        token: &str,
        lease: Duration,
        retention: Duration,
        flag: Duration,
    ) -> RedisResult<Outcome> {
        let call = AcquireCall {
            lease,
            retention,
            flag,
        };
        match self {
            Self::One {
                conn,
                min_replicas,
                restart_guard,
                latch,
            } => {
                let mut conn = conn.clone();
                let invocation = call.invocation(keys, token, restart_guard.as_ref());
                let Some(min) = min_replicas else {
                    return acquire_on(&mut conn, &invocation).await;
                };
                // WAIT counts the writes of the connection it is sent on: sent in one pipeline
                // with the script, it follows the script's own write on the same connection,
                // even if the connection is replaced between two calls (a retry after a reset
                // then re-applies the lease, a write, instead of writing nothing).
                let (reply, acked) = with_wait(&mut conn, &invocation, &keys.lock, *min).await?;
                let outcome = decode_acquire(reply);
                match outcome {
                    Outcome::Acquired { .. } if acked < min.replicas => {
                        release_on(&mut conn, keys, token, *latch).await?;
                        Ok(Outcome::NotReplicated { acked })
                    }
                    _ => Ok(outcome),
                }
            }
            Self::Quorum {
                nodes,
                timeout,
                restart_guard,
                latch,
            } => {
                // RedLock: a node's answer is only worth waiting for a small part of the lease.
                let per_node = (lease / 50).clamp(Duration::from_millis(10), *timeout);
                let attempt = QuorumAttempt {
                    call,
                    per_node,
                    restart_guard: restart_guard.as_ref(),
                    latch: *latch,
                };
                quorum_acquire(nodes, keys, token, attempt).await
            }
        }
    }

    /// Releases the lock if it holds `token`; see [`Released`].
    pub(crate) async fn release(&self, keys: &RedisKeys, token: &str) -> RedisResult<Released> {
        match self {
            Self::One { conn, latch, .. } => {
                release_on(&mut conn.clone(), keys, token, *latch).await
            }
            Self::Quorum { nodes, latch, .. } => {
                let latch = *latch;
                // Every node gets the release (in its own task, so a dead node cannot hold up
                // the answer); the answer is decided by the first majority.
                let quorum = Self::quorum(nodes);
                let total = nodes.len();
                let replies = gather(
                    nodes.iter().map(|node| {
                        let mut conn = node.clone();
                        let (keys, token) = (keys.clone(), token.to_owned());
                        tokio::spawn(
                            async move { release_on(&mut conn, &keys, &token, latch).await },
                        )
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
                    });
                }
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

/// The arguments of one acquire script call.
#[derive(Debug, Clone, Copy)]
struct AcquireCall {
    lease: Duration,
    retention: Duration,
    /// Life of the waiting flag; zero when the caller will not wait.
    flag: Duration,
}

impl AcquireCall {
    fn invocation(
        &self,
        keys: &RedisKeys,
        token: &str,
        restart_guard: Option<&RestartGuard>,
    ) -> ScriptCall {
        let mut invocation = ScriptCall::new(&scripts::ACQUIRE);
        invocation
            .key(&keys.lock)
            .key(&keys.fence)
            .arg(token)
            .arg(lease_ms(self.lease))
            .arg(lease_ms(self.retention))
            .arg(u64::try_from(self.flag.as_millis()).unwrap_or(u64::MAX))
            .arg(keys.waiting());
        if let Some(guard) = restart_guard {
            invocation.key(&guard.epoch_key).arg(lease_ms(guard.guard));
        }
        invocation
    }
}

/// The settings of one RedLock acquire.
#[derive(Debug, Clone, Copy)]
struct QuorumAttempt<'a> {
    call: AcquireCall,
    /// Limit of one node's answer.
    per_node: Duration,
    restart_guard: Option<&'a RestartGuard>,
    latch: Duration,
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
        call,
        per_node,
        restart_guard,
        latch,
    } = attempt;
    let AcquireCall {
        lease, retention, ..
    } = call;
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
            let invocation = call.invocation(&keys, &token, restart_guard.as_ref());
            let reply = tokio::time::timeout(per_node, acquire_on(&mut conn, &invocation))
                .await
                .unwrap_or_else(|_| Err(timed_out("redlock node did not answer in time")));
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
                        let _ = release_on(&mut conn, &keys, &token, latch).await;
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
        async move { release_on(&mut conn, keys, token, latch).await }
    }))
    .await;
    match first_error {
        Some(error) if !held => Err(error),
        _ => Ok(Outcome::Held { ttl }),
    }
}

/// One acquire script call on one logical Redis.
async fn acquire_on(conn: &mut Connection, invocation: &ScriptCall) -> RedisResult<Outcome> {
    Ok(decode_acquire(invocation.invoke(conn).await?))
}

/// Decodes `scripts/acquire.lua`'s answer.
fn decode_acquire((answer, value): (i64, i64)) -> Outcome {
    match answer {
        1 => Outcome::Acquired {
            fence: u64::try_from(value).unwrap_or(0),
        },
        2 => {
            // The node may have forgotten a lock it granted: it votes for nobody until then.
            tracing::debug!(young_ms = value, "node within its restart guard");
            Outcome::Held {
                ttl: u64::try_from(value).ok().map(Duration::from_millis),
            }
        }
        _ => Outcome::Held {
            ttl: u64::try_from(value).ok().map(Duration::from_millis),
        },
    }
}

async fn release_on(
    conn: &mut Connection,
    keys: &RedisKeys,
    token: &str,
    latch: Duration,
) -> RedisResult<Released> {
    // Compare-and-delete is idempotent, so a call that met a dropped connection is sent again
    // (the connection manager reconnects meanwhile) instead of leaving the key for its lease.
    // Whether the first call ran is unknown; the latch it leaves when it deletes the key tells
    // the retry (see `scripts/release.lua`).
    let latch_key = keys.latch(token);
    let waiting = keys.waiting();
    let released: i64 = retry_dropped(|| {
        let mut conn = conn.clone();
        let (latch_key, waiting) = (&latch_key, &waiting);
        async move {
            scripts::RELEASE
                .key(&keys.lock)
                .arg(token)
                .arg(&keys.channel)
                .arg(lease_ms(latch))
                .arg(latch_key)
                .arg(waiting)
                .invoke_async(&mut conn)
                .await
        }
    })
    .await?;
    Ok(Released::from_reply(released))
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

/// Runs a script and `WAIT replicas timeout` in one pipeline on the connection of the node that
/// holds `lock_key`, so that WAIT counts the replicas of the script's writes; returns the
/// script's reply and the number of replicas that acknowledged.
async fn with_wait<T: redis::FromRedisValue>(
    conn: &mut Connection,
    invocation: &ScriptCall,
    lock_key: &str,
    min: MinReplicas,
) -> RedisResult<(T, u64)> {
    let mut wait = redis::cmd("WAIT");
    wait.arg(min.replicas).arg(lease_ms(min.timeout));
    let mut loaded = false;
    loop {
        let mut pipe = redis::pipe();
        pipe.add_command(invocation.command())
            .add_command(wait.clone());
        let values = match conn {
            Connection::Cluster(cluster) => {
                let route = Route::with_key(lock_key, SlotAddr::Master);
                cluster
                    .route_pipeline(pipe, 0, 2, SingleNodeRoutingInfo::SpecificNode(route))
                    .await
            }
            _ => conn.req_packed_commands(&pipe, 0, 2).await,
        };
        // The script's error comes back for the whole pipeline or as its own reply.
        let replies = values.and_then(|values| {
            let mut values = values.into_iter();
            match (values.next(), values.next()) {
                (Some(reply), Some(acked)) => Ok((reply.extract_error()?, acked)),
                _ => Err(redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "short reply to a script and WAIT pipeline",
                ))),
            }
        });
        match replies {
            // The script cache was flushed (or the server restarted): load it and send both
            // again; the WAIT that ran alone counted nothing of ours.
            Err(error) if error.code() == Some("NOSCRIPT") && !loaded => {
                invocation.load(conn).await?;
                loaded = true;
            }
            Err(error) => return Err(error),
            Ok((reply, acked)) => {
                let acked: u64 = redis::from_redis_value(acked.extract_error()?)?;
                return Ok((redis::from_redis_value(reply)?, acked));
            }
        }
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
            let flags: RedisResult<Vec<i64>> = retry_dropped(|| {
                let mut conn = conn.clone();
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await;
            match flags {
                Ok(flags) if flags.len() == chunk.len() => {
                    flags.into_iter().map(|f| Some(f == 1)).collect()
                }
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
