//! The RedLock strategy: independent primaries, a lock is held when a majority holds it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use super::node::Node;
use super::{
    AcquireArgs, AcquireReply, Gone, HeldAs, Inspected, NewLease, Outcome, ReleaseReply, Renewal,
};
use crate::backend_error::BackendError;
use crate::key::RedisKeys;
use crate::token::Token;

/// Votes of `nodes` independent nodes, decided by a majority.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Quorum {
    nodes: usize,
}

impl Quorum {
    pub(crate) fn of(nodes: usize) -> Self {
        Self { nodes }
    }

    /// How many votes make a majority.
    pub(crate) fn needed(self) -> usize {
        self.nodes / 2 + 1
    }

    /// Whether `yes` votes carry it.
    pub(crate) fn carried(self, yes: usize) -> bool {
        yes >= self.needed()
    }

    /// Whether `no` votes leave too few nodes to carry it.
    fn defeated(self, no: usize) -> bool {
        no > self.nodes - self.needed()
    }
}

/// Locks on a RedLock quorum.
///
/// A node's answer counts only while no other node's server said the same `run_id` (see
/// [`named_twice`]): one server under two names (`localhost` and `127.0.0.1`, a DNS alias, a
/// proxy) would cast two votes. `build()` refuses such nodes among those up at start-up; this
/// covers the rest (`build_lazy()`, a node down at start-up): a node's answer counts once its
/// `run_id` is read ([`counted`]). A node reads it once (a plain server's
/// connection has one server): one server under two names, restarted between their first
/// reads, says two `run_id`s, as two servers would, one of them restarted; that restart
/// without persistence may grant a lock it forgot, the RedLock hazard the restart guard is
/// for (`LockerBuilder::restart_guard`).
#[derive(Debug)]
pub(crate) struct RedLockStore {
    /// Shared with the per-node tasks, which check their node's `run_id` against the others'.
    pub(crate) nodes: Arc<[Node]>,
    /// Per-node limit of one call.
    pub(crate) timeout: Duration,
    /// Per token, how many node acquires of it are still running. A release waits for them:
    /// a grant that lands on a slow node after the release went there would stay until its
    /// lease.
    in_flight: Arc<Mutex<HashMap<Token, watch::Receiver<usize>>>>,
}

/// What the acquiring caller decided, for the per-node tasks of an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pending,
    Keep,
    Undo,
}

impl RedLockStore {
    pub(crate) fn new(nodes: Vec<Node>, timeout: Duration) -> Self {
        Self {
            nodes: nodes.into(),
            timeout,
            in_flight: Arc::default(),
        }
    }

    /// The error naming the first two nodes whose servers said the same `run_id`, if any.
    pub(crate) fn named_twice(&self) -> Option<BackendError> {
        (0..self.nodes.len()).find_map(|index| named_twice(&self.nodes, index))
    }

    fn quorum(&self) -> Quorum {
        Quorum::of(self.nodes.len())
    }

    /// Every node tries at once, each in its own task; the caller decides as soon as a majority
    /// granted (or can no longer grant) the lock. Each node's task then undoes its own grant if
    /// the verdict is "undo" (or the caller went away), after its acquire finished, so a late
    /// grant is never left behind. An undo deletes the grant and nothing else (`undo.lua`):
    /// the caller's entry in the waiting writers (`waiter`) stays while it waits.
    pub(crate) async fn acquire(
        &self,
        keys: &RedisKeys,
        token: &Token,
        waiter: &Token,
        args: AcquireArgs,
    ) -> Result<Outcome, BackendError> {
        let quorum = self.quorum();
        // A node's answer is only worth waiting for a small part of the lease (at least 10 ms),
        // and never longer than a command. Not `clamp`: it panics when the command timeout is
        // under 10 ms (1 ms is a valid setting).
        let per_node = (args.lease / 50)
            .max(Duration::from_millis(10))
            .min(self.timeout);
        let started = Instant::now();
        let (verdict_tx, verdict_rx) = tokio::sync::watch::channel(Verdict::Pending);
        let (running_tx, running_rx) = watch::channel(self.nodes.len());
        self.in_flight.lock().insert(token.clone(), running_rx);
        let running_tx = Arc::new(running_tx);
        // Nodes that granted this try, those that answer after the verdict included.
        let granted = Arc::new(AtomicUsize::new(0));
        let tasks = self.nodes.iter().enumerate().map(|(index, node)| {
            let (node, nodes) = (node.clone(), self.nodes.clone());
            let (keys, token, waiter) = (keys.clone(), token.clone(), waiter.clone());
            let mut verdict = verdict_rx.clone();
            let (running, in_flight) = (running_tx.clone(), self.in_flight.clone());
            let granted = granted.clone();
            tokio::spawn(async move {
                let acquire = counted(&nodes, index, node.acquire(&keys, &token, &waiter, args));
                let reply = tokio::time::timeout(per_node, acquire)
                    .await
                    .unwrap_or_else(|_| {
                        Err(BackendError::timed_out(
                            "redlock node did not answer in time",
                        ))
                    });
                if matches!(reply, Ok(AcquireReply::Acquired)) {
                    granted.fetch_add(1, Ordering::SeqCst);
                }
                running.send_modify(|n| *n -= 1);
                if *running.borrow() == 0 {
                    in_flight.lock().remove(&token);
                }
                if !matches!(
                    reply,
                    Ok(AcquireReply::Busy { .. } | AcquireReply::Guarded { .. })
                ) {
                    // Granted, or unknown: undo it unless the caller keeps the lock.
                    let node = node.clone();
                    tokio::spawn(async move {
                        let decided = verdict
                            .wait_for(|v| *v != Verdict::Pending)
                            .await
                            .map(|v| *v);
                        if !matches!(decided, Ok(Verdict::Keep)) {
                            let _ = node.undo(&keys, &token).await;
                        }
                    });
                }
                (index, reply)
            })
        });
        let total = self.nodes.len();
        let (mut replies, mut running) = gather(
            tasks,
            |done: &[(usize, Result<AcquireReply, BackendError>)]| {
                let won = done
                    .iter()
                    .filter(|(_, r)| matches!(r, Ok(AcquireReply::Acquired)))
                    .count();
                quorum.carried(won) || quorum.defeated(done.len() - won) || done.len() == total
            },
        )
        .await;
        let won = replies
            .iter()
            .filter(|(_, r)| matches!(r, Ok(AcquireReply::Acquired)))
            .count();
        // Validity: what is left of the lease after the round trips and a drift allowance.
        let drift = args.lease / 100 + Duration::from_millis(2);
        if quorum.carried(won) && started.elapsed() + drift < args.lease {
            let _ = verdict_tx.send(Verdict::Keep);
            return Ok(Outcome::Acquired);
        }
        let _ = verdict_tx.send(Verdict::Undo);
        // The grants of this try are undone before answering (the nodes' tasks do it again,
        // harmlessly, once their acquires end). A grant that landed after the majority was
        // out of reach would otherwise still be there when the caller tries again under a
        // fresh token, which it cannot tell from another holder's lock: it would wait out a
        // whole lease for its own grant (seen in CI: Busy after a 10 s wait with the
        // "holder's" TTL at 29.999 s). So the nodes still answering are waited for (each cut
        // at its per-node limit), then the grants are deleted, each undo cut at the per-node
        // limit too. On the multiplexed connection an undo sent after a cut-off acquire also
        // runs after it.
        // The undo leaves the caller's waiting entry: it is still waiting. The late answers
        // count for when to try again.
        let refusal = |reply: &Result<AcquireReply, BackendError>| {
            matches!(
                reply,
                Ok(AcquireReply::Busy { .. } | AcquireReply::Guarded { .. })
            )
        };
        let refused = quorum.defeated(replies.iter().filter(|(_, r)| refusal(r)).count());
        let _ = tokio::time::timeout(per_node, async {
            while let Some(late) = running.next().await {
                replies.extend(late.ok());
            }
        })
        .await;
        // After a majority's refusal the undo goes only to the nodes that answered (a frozen
        // minority node must not hold up every refused try, turning `Busy` into a timeout);
        // the nodes' own tasks undo the others in the background once their tries end.
        let undo_now =
            |index: usize| !refused || replies.iter().any(|(i, r)| *i == index && r.is_ok());
        join_all(
            self.nodes
                .iter()
                .enumerate()
                .filter(|(index, _)| undo_now(*index))
                .map(|(_, node)| tokio::time::timeout(per_node, node.undo(keys, token))),
        )
        .await;
        let mut frees = Vec::new();
        let mut longest: Option<Duration> = None;
        let mut holder: Option<String> = None;
        let mut refused = false;
        let mut first_error = None;
        let mut set_up_wrong = None;
        for (_, reply) in replies {
            match reply {
                Ok(AcquireReply::Acquired) => frees.push(Duration::ZERO),
                Ok(AcquireReply::Busy { ttl, holder: seen }) => {
                    refused = true;
                    longest = longest.max(ttl);
                    frees.extend(ttl);
                    // Any node's holder will do for a message: nodes that refuse mostly agree.
                    holder = holder.or(seen);
                }
                Ok(AcquireReply::Guarded { for_ms }) => {
                    refused = true;
                    longest = longest.max(Some(for_ms));
                    frees.push(for_ms);
                }
                Err(e) if e.is_named_twice() => {
                    set_up_wrong.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        // One server named twice fails every acquire, whatever the other nodes said: it is
        // the locker's setup that is wrong, as `build()` would have said.
        if let Some(error) = set_up_wrong {
            return Err(error);
        }
        match first_error {
            Some(error) if !refused => Err(error),
            _ => Ok(Outcome::Busy {
                // A waiter sleeps at most this long: until a majority may be free, not until
                // the last node is (a node that keeps an earlier holder's key, or a waiting
                // writer's entry, longer than the others would otherwise keep it asleep
                // after the lock was free on a majority). Without a majority's times, the
                // longest one seen.
                ttl: majority_free_in(quorum, frees).or(longest),
                holder,
                split: granted.load(Ordering::SeqCst) > 0,
            }),
        }
    }

    /// Every node issues a token while it still has the lock for `token`; the largest token
    /// of a majority is written back to that majority, so any later majority (which shares a
    /// node with this one) issues a larger one. The caller checks that the lock was still valid
    /// when this returned: only then did every later holder get its token after this one.
    pub(crate) async fn issue_fence(
        &self,
        keys: &RedisKeys,
        token: &str,
    ) -> Result<Option<u64>, BackendError> {
        let quorum = self.quorum();
        let total = self.nodes.len();
        // Decided on the first majority, as acquires are: a frozen minority node costs nothing
        // (its late token, if any, is its own; the majority below gets the write-back).
        let (issued, _) = gather(
            self.nodes.iter().enumerate().map(|(index, node)| {
                let (node, nodes) = (node.clone(), self.nodes.clone());
                let (keys, token) = (keys.clone(), token.to_owned());
                let timeout = self.timeout;
                tokio::spawn(async move {
                    let issue = counted(&nodes, index, node.issue_fence(&keys, &token));
                    let reply = tokio::time::timeout(timeout, issue)
                        .await
                        .unwrap_or_else(|_| {
                            Err(BackendError::timed_out(
                                "redlock node did not answer in time",
                            ))
                        });
                    (node, reply)
                })
            }),
            |done: &[(Node, Result<Option<u64>, BackendError>)]| {
                let holding = done
                    .iter()
                    .filter(|(_, r)| matches!(r, Ok(Some(_))))
                    .count();
                let not_ours = done.iter().filter(|(_, r)| matches!(r, Ok(None))).count();
                quorum.carried(holding) || quorum.defeated(not_ours) || done.len() == total
            },
        )
        .await;
        let holding: Vec<(&Node, u64)> = issued
            .iter()
            .filter_map(|(node, reply)| match reply {
                Ok(Some(fence)) => Some((node, *fence)),
                _ => None,
            })
            .collect();
        let not_ours = issued.iter().filter(|(_, r)| matches!(r, Ok(None))).count();
        if !quorum.carried(holding.len()) {
            if quorum.defeated(not_ours) {
                return Ok(None);
            }
            return Err(BackendError::undecided(
                "too few redlock nodes issued a fencing token",
            ));
        }
        let fence = holding.iter().map(|(_, f)| *f).max().unwrap_or(0);
        let raised = join_all(
            holding
                .iter()
                .map(|(node, _)| node.raise_fence(keys, fence)),
        )
        .await;
        if quorum.carried(raised.iter().filter(|r| r.is_ok()).count()) {
            Ok(Some(fence))
        } else {
            Err(BackendError::undecided(
                "too few redlock nodes took the fencing token",
            ))
        }
    }

    /// Every node gets the release (in its own task, so a dead node cannot hold up the
    /// answer); the answer is decided by the first majority. When a node says another locker
    /// waits, every other node is told too: a waiter listens on one node only, and its entry
    /// may be missing there (its last try found that node free and undid its grant there),
    /// while a release publishes only where an entry was.
    pub(crate) async fn release(
        &self,
        keys: &RedisKeys,
        token: &Token,
    ) -> Result<ReleaseReply, BackendError> {
        let running = self.in_flight.lock().get(token).cloned();
        if let Some(mut running) = running {
            // Each is cut at its per-node limit, so this wait is bounded.
            let _ = running.wait_for(|n| *n == 0).await;
        }
        let quorum = self.quorum();
        let total = self.nodes.len();
        let tally = |done: &[(usize, Result<ReleaseReply, BackendError>)]| {
            let yes = done
                .iter()
                .filter(|(_, r)| matches!(r, Ok(r) if r.ours))
                .count();
            let no = done
                .iter()
                .filter(|(_, r)| matches!(r, Ok(r) if !r.ours))
                .count();
            (yes, no)
        };
        let (replies, _) = gather(
            self.nodes.iter().enumerate().map(|(i, node)| {
                let (node, nodes) = (node.clone(), self.nodes.clone());
                let (keys, token) = (keys.clone(), token.clone());
                tokio::spawn(
                    async move { (i, counted(&nodes, i, node.release(&keys, &token)).await) },
                )
            }),
            |done| {
                let (yes, no) = tally(done);
                quorum.carried(yes) || quorum.defeated(no) || done.len() == total
            },
        )
        .await;
        let (yes, no) = tally(&replies);
        let told: Vec<usize> = replies
            .iter()
            .filter(|(_, r)| matches!(r, Ok(r) if r.others_waiting))
            .map(|(i, _)| *i)
            .collect();
        let others_waiting = !told.is_empty();
        if others_waiting {
            for (_, node) in self
                .nodes
                .iter()
                .enumerate()
                .filter(|(i, _)| !told.contains(i))
            {
                let (node, channel) = (node.clone(), keys.channel().to_string());
                tokio::spawn(async move { node.publish_release(&channel).await });
            }
        }
        let replies: Vec<_> = replies.into_iter().map(|(_, r)| r).collect();
        let gone = agreed(replies.iter().filter_map(|r| r.as_ref().ok()?.gone));
        if !quorum.carried(yes) && !quorum.defeated(no) {
            // Neither side has a majority: the errors decide nothing, so report one.
            if let Some(Err(error)) = replies.into_iter().find(Result::is_err) {
                return Err(error);
            }
        }
        let ours = quorum.carried(yes);
        Ok(ReleaseReply {
            ours,
            gone: if ours { None } else { gone },
            others_waiting,
        })
    }

    /// Renews on every node; a lock is renewed where a majority renewed it, lost where a
    /// majority no longer holds it. Answers as soon as every lock is decided either way: a
    /// dead node must not hold up the tick, nor a handoff waiting for its confirmation (its
    /// answers count as unknown, and a renewal still on its way there is harmless: it never
    /// shortens a lease).
    pub(crate) async fn renew(
        &self,
        locks: &[(&RedisKeys, &str)],
        lease: NewLease,
    ) -> Vec<Renewal> {
        self.decided(locks.len(), |node| node.renew(locks, lease, None, None))
            .await
    }

    /// Whether a majority still has each lock under its token, changing nothing (a handoff's
    /// confirmation, see [`Node::confirm`]); decided as a renewal is.
    pub(crate) async fn confirm(&self, locks: &[(&RedisKeys, &str)]) -> Vec<Renewal> {
        self.decided(locks.len(), |node| node.confirm(locks)).await
    }

    /// The answers of `ask` on every node for `count` locks, each decided by a majority as
    /// soon as every lock is decided either way.
    async fn decided<'a, F, Fut>(&'a self, count: usize, ask: F) -> Vec<Renewal>
    where
        F: Fn(&'a Node) -> Fut,
        Fut: std::future::Future<Output = Vec<Renewal>>,
    {
        let ask = &ask;
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| async move {
                let answers = async { Ok::<_, BackendError>(ask(node).await) };
                tokio::time::timeout(self.timeout, counted(&self.nodes, index, answers))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_else(|| vec![Renewal::UNKNOWN; count])
            })
            .collect();
        let quorum = self.quorum();
        let mut per_node = Vec::with_capacity(self.nodes.len());
        let mut decided = vec![Renewal::UNKNOWN; count];
        while let Some(answers) = pending.next().await {
            per_node.push(answers);
            decided = (0..count)
                .map(|i| decide(quorum, per_node.iter().map(|n| n[i])))
                .collect();
            if !decided.iter().any(|d| matches!(d, Renewal::Undecided(_))) {
                break;
            }
        }
        decided
    }

    /// Whether a majority has the lock key; decided on the first majority that agrees.
    pub(crate) async fn exists(&self, lock_key: &str) -> Result<bool, BackendError> {
        let quorum = self.quorum();
        let total = self.nodes.len();
        let (replies, _) = gather(
            self.nodes.iter().enumerate().map(|(index, node)| {
                let (node, nodes) = (node.clone(), self.nodes.clone());
                let lock_key = lock_key.to_owned();
                tokio::spawn(async move { counted(&nodes, index, node.exists(&lock_key)).await })
            }),
            |done: &[Result<bool, BackendError>]| {
                let yes = done.iter().filter(|r| matches!(r, Ok(true))).count();
                let no = done.iter().filter(|r| matches!(r, Ok(false))).count();
                quorum.carried(yes) || quorum.carried(no) || done.len() == total
            },
        )
        .await;
        let yes = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        if !self.quorum().carried(answered) {
            if let Some(Err(e)) = replies.into_iter().find(Result::is_err) {
                return Err(e);
            }
        }
        Ok(self.quorum().carried(yes))
    }

    /// What a majority of the nodes hold for the key: the same holder's value (or read locks)
    /// on a majority, with the shortest remaining lease among them and the most waiters any
    /// of them counts; `None` when no holder has a majority (free, or an acquire or release
    /// under way). An error when too few nodes answered to tell.
    pub(crate) async fn inspect(
        &self,
        lock: &RedisKeys,
        semaphore: &RedisKeys,
    ) -> Result<Option<Inspected>, BackendError> {
        let replies = join_all(
            self.nodes
                .iter()
                .enumerate()
                .map(|(index, node)| counted(&self.nodes, index, node.inspect(lock, semaphore))),
        )
        .await;
        let answered = replies.iter().filter(|r| r.is_ok()).count();
        if !self.quorum().carried(answered) {
            if let Some(Err(e)) = replies.into_iter().find(Result::is_err) {
                return Err(e);
            }
            return Ok(None);
        }
        // Who holds it, as one node sees it: the holder's value, or read locks as a whole
        // (their readers may differ between nodes).
        let holder = |found: &Inspected| match found.what {
            HeldAs::Readers => None,
            HeldAs::Lock | HeldAs::Semaphore => found.values.first().cloned(),
        };
        let held: Vec<Inspected> = replies
            .into_iter()
            .filter_map(|r| r.ok().flatten())
            .collect();
        for candidate in &held {
            let same: Vec<&Inspected> = held
                .iter()
                .filter(|other| other.what == candidate.what && holder(other) == holder(candidate))
                .collect();
            if self.quorum().carried(same.len()) {
                let mut merged = candidate.clone();
                for other in same {
                    merged.remaining = match (merged.remaining, other.remaining) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    merged.waiting_writers = merged.waiting_writers.max(other.waiting_writers);
                    merged.in_line = merged.in_line.max(other.in_line);
                }
                return Ok(Some(merged));
            }
        }
        Ok(None)
    }

    /// Deletes the lock on every node; `true` if any had it.
    pub(crate) async fn force_unlock(&self, keys: &RedisKeys) -> Result<bool, BackendError> {
        let replies = join_all(self.nodes.iter().map(|node| node.force_unlock(keys))).await;
        let any = replies.iter().any(|r| matches!(r, Ok(true)));
        match replies.into_iter().find(Result::is_err) {
            Some(Err(e)) if !any => Err(e),
            _ => Ok(any),
        }
    }
}

/// The answer of node `index` of `nodes` to `call`, when it counts: once the node's server is
/// read (the call read it, or it is read now, once per connection), the error of
/// [`named_twice`] if another node's server said the same `run_id`. A server that does not
/// say (an ACL without `+info`), or a failed read, leaves the answer counted, as `build()`
/// does not compare such a server.
async fn counted<T>(
    nodes: &[Node],
    index: usize,
    call: impl std::future::Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    let reply = call.await?;
    let node = &nodes[index];
    if !node.server_read() {
        // `is_locked`, `inspect` and the like read nothing before their first call.
        let _ = node.read_server(node.generation()).await;
    }
    match named_twice(nodes, index) {
        Some(error) => Err(error),
        None => Ok(reply),
    }
}

/// The node of `nodes` at `index` whose server said the same `run_id` as another node's, as
/// the error that names both (the earlier one in the list first); `None` while it is told
/// apart from all of them, or said none. Each node's answer is checked after its own
/// `run_id` was read, so of two nodes that share a server the one checked later has seen the
/// other's: at least one of them is refused. In practice both are (each sees the other's),
/// so every acquire fails with this error.
fn named_twice(nodes: &[Node], index: usize) -> Option<BackendError> {
    let own = nodes[index].run_id_read()?;
    let other = nodes
        .iter()
        .enumerate()
        .position(|(i, node)| i != index && node.said_run_id(&own))?;
    let (first, second) = (index.min(other), index.max(other));
    Some(BackendError::named_twice(
        nodes[first].name.clone(),
        nodes[second].name.clone(),
    ))
}

/// What the nodes that no longer hold a lock found, if they agree on its kind: a lock lost on
/// a majority has one cause there, or the cause is unknown. Absent keys agree whatever the
/// uptimes; the longest one is kept, so a restart is reported only when every such node
/// restarted during the hold.
fn agreed(mut found: impl Iterator<Item = Gone>) -> Option<Gone> {
    let first = found.next()?;
    found.try_fold(first, |agreed, gone| match (agreed, gone) {
        (Gone::Absent { uptime: a }, Gone::Absent { uptime: b }) => Some(Gone::Absent {
            uptime: a.zip(b).map(|(a, b)| a.max(b)),
        }),
        (a, b) if a == b => Some(a),
        _ => Some(Gone::Unknown),
    })
}

/// Per-node calls still running after `gather` returned (dropped, they go on in the
/// background).
type Running<T> = FuturesUnordered<tokio::task::JoinHandle<T>>;

/// Collects the results of spawned per-node calls until `decided` says the outcome is known;
/// returns them and the calls still running.
async fn gather<T: Send + 'static>(
    calls: impl IntoIterator<Item = tokio::task::JoinHandle<T>>,
    mut decided: impl FnMut(&[T]) -> bool,
) -> (Vec<T>, Running<T>) {
    let mut pending: Running<T> = calls.into_iter().collect();
    let mut done = Vec::new();
    while let Some(result) = pending.next().await {
        if let Ok(value) = result {
            done.push(value);
        }
        if decided(&done) {
            break;
        }
    }
    (done, pending)
}

/// How long until a majority of the nodes may grant the lock: the `needed`-th soonest end
/// among the nodes' remaining holds (`frees`, one per node that gave one: a node that granted
/// is free at once). A node that failed, or whose key has no expiry, gives none. `None` when
/// fewer than a majority gave one.
fn majority_free_in(quorum: Quorum, mut frees: Vec<Duration>) -> Option<Duration> {
    frees.sort_unstable();
    frees.get(quorum.needed() - 1).copied()
}

/// One lock's renewal over the nodes that answered so far: renewed by a majority, lost on
/// enough nodes that no majority can renew it, else undecided.
fn decide(quorum: Quorum, answers: impl Iterator<Item = Renewal> + Clone) -> Renewal {
    let renewed = answers.clone().filter(|a| *a == Renewal::Renewed).count();
    let not_ours = answers.clone().filter(|a| a.is_not_ours()).count();
    if quorum.carried(renewed) {
        Renewal::Renewed
    } else if quorum.defeated(not_ours) {
        let gone = answers.filter_map(|a| match a {
            Renewal::NotOurs(gone) => Some(gone),
            _ => None,
        });
        Renewal::NotOurs(agreed(gone).unwrap_or(Gone::Unknown))
    } else {
        Renewal::UNKNOWN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_decides() {
        let three = Quorum::of(3);
        assert_eq!(three.needed(), 2);
        assert!(three.carried(2) && !three.carried(1));
        assert!(three.defeated(2) && !three.defeated(1));
        let five = Quorum::of(5);
        assert_eq!(five.needed(), 3);
        assert!(five.defeated(3) && !five.defeated(2));
    }

    #[test]
    fn a_waiter_waits_until_a_majority_may_be_free() {
        let ms = Duration::from_millis;
        let three = Quorum::of(3);
        // A node that keeps an earlier holder's key for a minute does not count.
        assert_eq!(
            majority_free_in(three, vec![ms(60_000), ms(250), ms(240)]),
            Some(ms(250))
        );
        assert_eq!(
            majority_free_in(three, vec![Duration::ZERO, ms(300)]),
            Some(ms(300))
        );
        assert_eq!(majority_free_in(three, vec![ms(300)]), None);
        assert_eq!(majority_free_in(three, vec![]), None);
        let five = Quorum::of(5);
        assert_eq!(
            majority_free_in(five, vec![ms(5), ms(1), ms(4), ms(2), ms(3)]),
            Some(ms(3))
        );
        assert_eq!(majority_free_in(five, vec![ms(5), ms(1)]), None);
    }

    #[test]
    fn nodes_agree_on_why_a_lock_is_gone_or_it_is_unknown() {
        let absent = |secs| Gone::Absent {
            uptime: Some(Duration::from_secs(secs)),
        };
        assert_eq!(agreed([].into_iter()), None);
        assert_eq!(
            agreed([Gone::Replaced, Gone::Replaced].into_iter()),
            Some(Gone::Replaced)
        );
        assert_eq!(
            agreed([absent(1), absent(90)].into_iter()),
            Some(absent(90))
        );
        assert_eq!(
            agreed([absent(1), Gone::Absent { uptime: None }].into_iter()),
            Some(Gone::Absent { uptime: None })
        );
        assert_eq!(
            agreed([Gone::Replaced, absent(1)].into_iter()),
            Some(Gone::Unknown)
        );
    }
}
