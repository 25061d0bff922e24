//! The script calls on one logical Redis (a server, a cluster, a Sentinel primary): what both
//! strategies send, the single-server one once, RedLock once per node.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::{Cmd, InfoDict, RedisResult, Value};

use super::calls::acquire::{self, AcquireReply};
use super::calls::fence::{self, FenceReply};
use super::calls::inspect::{self, InspectReply, Inspected};
use super::calls::release::{self, Gone, ReleaseReply};
use super::calls::renew::{RenewReply, RenewScript, Renewal, Undecided};
use super::calls::{self, force_unlock};
use super::wait::{with_wait, WaitPool, Waited};
use super::{AcquireArgs, MinReplicas, NewLease, RestartGuard, BATCH};
use crate::backend_error::BackendError;
use crate::connection::{Connection, Timeouts};
use crate::in_box::in_box;
use crate::key::RedisKeys;
use crate::kind::Kind;
use crate::limits::lease_ms;
use crate::scripts::Lua;
use crate::server_version::{self, first_too_old, Need, ServerInfo, TooOld};
use crate::token::Token;

/// What a node's server(s) said they are (see [`Node::read_server`]).
#[derive(Debug, Default)]
struct Known {
    /// The connection's generation it was read at (a Sentinel primary's switches: a new
    /// primary is read again); `None` until read.
    at: Option<u64>,
    /// Each server's name and what it said (a cluster: every primary); empty when it could
    /// not be read (a server that refuses `INFO`), which passes every check.
    servers: Vec<(String, ServerInfo)>,
}

/// One Redis endpoint and the settings its calls need.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) conn: Connection,
    /// How messages name it: its URL (redacted), `primary `name`` for Sentinel, `cluster`.
    pub(crate) name: String,
    /// What its server(s) said they are, shared by the node's clones.
    server: Arc<Mutex<Known>>,
    /// Held while the version is read before a call.
    reading: Arc<tokio::sync::Mutex<()>>,
    pub(crate) restart_guard: Option<RestartGuard>,
    /// How long a release's latch lives.
    pub(crate) latch: Duration,
    /// How long a fence key outlives its lock and its last token (see `scripts/fence.lua`).
    pub(crate) fence_window: Duration,
}

impl Node {
    /// A node on `conn`, its release latch living the locker's release retry window.
    pub(crate) fn new(
        conn: Connection,
        name: String,
        restart_guard: Option<RestartGuard>,
        timeouts: Timeouts,
        fence_window: Duration,
    ) -> Self {
        Self {
            conn,
            name,
            server: Arc::default(),
            reading: Arc::default(),
            restart_guard,
            latch: timeouts.release_retry,
            fence_window,
        }
    }

    /// Refuses a call that needs `need` when the server is older: from the version this node
    /// remembers, or, when it knows none for its connection yet (a lazy locker's first call, a
    /// RedLock node down at start-up, the first call after a Sentinel failover), after reading
    /// it. Nothing is sent when it refuses.
    pub(crate) async fn require(&self, need: Need) -> Result<(), BackendError> {
        if let Some(known) = self.required(need) {
            return known;
        }
        // One read for the acquires that all start at once (a lazy locker's first burst): the
        // others wait for it and find its answer.
        let _reading = self.reading.lock().await;
        if let Some(known) = self.required(need) {
            return known;
        }
        let generation = self.conn.generation();
        self.read_server(generation).await?;
        refusal(self.too_old(need, generation).flatten())
    }

    /// [`require`](Self::require)'s answer when the servers behind the connection are known
    /// (every call but the first ones on a connection), without building its future; `None`
    /// when they must be read first.
    fn required(&self, need: Need) -> Option<Result<(), BackendError>> {
        self.too_old(need, self.conn.generation()).map(refusal)
    }

    /// `None` when nothing is known for the connection's `generation`; then whether a server
    /// is older than `need`.
    pub(crate) fn too_old(&self, need: Need, generation: u64) -> Option<Option<TooOld>> {
        let known = self.server.lock();
        (known.at == Some(generation)).then(|| first_too_old(&known.servers, need))
    }

    /// Reads `INFO server` and remembers what each server behind the connection says it is
    /// (a cluster: every primary), as of the connection's `generation`. A connection failure
    /// is returned, and remembers nothing. A server that refuses `INFO` (an ACL without
    /// `+info`) or gives no readable `redis_version` is not checked: remembered as such, with
    /// a warning, as the eviction policy's check does.
    pub(crate) async fn read_server(&self, generation: u64) -> Result<(), BackendError> {
        let reply: RedisResult<Value> = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut self.conn.clone())
            .await;
        let servers = match reply {
            Ok(reply) => self.servers_in(&reply),
            Err(error) => {
                let error = BackendError::redis(error);
                // Only the server's own refusal (`NOPERM`, an unknown command) is final.
                if error.is_transient() || error.code().is_none() {
                    return Err(error);
                }
                tracing::warn!(node = %self.name, %error, "cannot read the server's version (grant +info to check it); not checked");
                Vec::new()
            }
        };
        *self.server.lock() = Known {
            at: Some(generation),
            servers,
        };
        Ok(())
    }

    /// Each server of an `INFO server` reply, named, and what it says it is; one that does not
    /// say is left out, with a warning.
    fn servers_in(&self, reply: &Value) -> Vec<(String, ServerInfo)> {
        let mut servers = Vec::new();
        for (address, info) in server_version::info_replies(reply) {
            let name = match (address, self.conn.primary_address()) {
                (Some(address), _) => format!("cluster node {address}"),
                (None, Some(address)) => format!("{} at {address}", self.name),
                (None, None) => self.name.clone(),
            };
            match info.map(|info| ServerInfo::from_info(&info)) {
                Ok(Some(server)) => {
                    tracing::debug!(node = %name, version = %server, "server version");
                    servers.push((name, server));
                }
                Ok(None) => {
                    tracing::warn!(node = %name, "the server does not say its version (`redis_version` of INFO server); not checked")
                }
                Err(error) => {
                    tracing::warn!(node = %name, %error, "cannot read the server's version; not checked")
                }
            }
        }
        servers
    }

    /// The `run_id` its server said when it was last read (`INFO server`: before the node's
    /// first call, and again after a Sentinel switch; a plain server's connection is read
    /// once): `None` before that, or from a server that did not say (an ACL without `+info`).
    pub(crate) fn run_id_read(&self) -> Option<String> {
        self.with_run_id(|id| id.map(str::to_owned))
    }

    /// Whether its server(s) were read (`INFO server`) for the connection as it is now, even
    /// if they did not say what they are (see [`read_server`](Self::read_server)).
    pub(crate) fn server_read(&self) -> bool {
        self.server.lock().at == Some(self.conn.generation())
    }

    /// Whether its server said `run_id` (see [`run_id_read`](Self::run_id_read)).
    pub(crate) fn said_run_id(&self, run_id: &str) -> bool {
        self.with_run_id(|id| id == Some(run_id))
    }

    fn with_run_id<T>(&self, answer: impl FnOnce(Option<&str>) -> T) -> T {
        let known = self.server.lock();
        match known.servers.as_slice() {
            [(_, server)] => answer(server.run_id.as_deref()),
            _ => answer(None),
        }
    }

    /// Whether a try can start with a plain `SET NX PX`: nothing of its token can be on the
    /// server yet (otherwise only the script recognises a lock already ours), no restart
    /// guard has to be checked first, and the lock is not known to be taken (the script
    /// would follow a failed `SET`).
    fn plain_set(&self, keys: &RedisKeys, args: AcquireArgs) -> bool {
        args.fresh_token
            && !args.likely_busy
            && self.restart_guard.is_none()
            && keys.kind() == Kind::Exclusive
    }

    /// `SET lock token NX PX lease`: the whole uncontended acquire.
    fn set_nx(keys: &RedisKeys, token: &Token, lease: Duration) -> Cmd {
        // Sized up front: growing a command as its arguments arrive reallocates several times,
        // which was most of building it.
        let mut cmd = Cmd::with_capacity(6, keys.lock.len() + token.stored_capacity() + 32);
        cmd.arg("SET")
            .arg(&keys.lock)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(lease_ms(lease));
        cmd
    }

    /// Tries once to take the lock: a plain `SET NX PX` when it can, the script when the lock
    /// is taken (it may be ours from an earlier try, and the waiting flag and the holder's TTL
    /// come from there) or a restart guard applies.
    pub(crate) async fn acquire(
        &self,
        keys: &RedisKeys,
        token: &Token,
        waiter: &Token,
        args: AcquireArgs,
    ) -> Result<AcquireReply, BackendError> {
        let need = Need::of(keys.kind());
        match self.required(need) {
            Some(known) => known?,
            // Boxed: the read (and its lock) runs once per connection, and its state would
            // otherwise be part of every acquire's.
            None => in_box(|| self.require(need)).await?,
        }
        if self.plain_set(keys, args) {
            let set: Value = Self::set_nx(keys, token, args.lease)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(BackendError::redis)?;
            if set == Value::Okay {
                return Ok(AcquireReply::Acquired);
            }
        }
        let guard = self.restart_guard.as_ref();
        let reply = acquire::of_kind(keys, token, waiter, args, guard)
            .invoke(&mut self.conn.clone())
            .await?;
        if let AcquireReply::Guarded { for_ms } = reply {
            // The node may have forgotten a lock it granted: it votes for nobody until then.
            tracing::debug!(?for_ms, "node within its restart guard");
        }
        Ok(reply)
    }

    /// As [`acquire`](Self::acquire), each command sent in one pipeline with `WAIT`, on a
    /// connection of its own from `pool` (see `store::wait`), on the shared one without a
    /// pool (a cluster's): WAIT counts the writes of the connection it is sent on, so sent
    /// together it follows the acquire's own write there, and from a pool it blocks no other
    /// call of the locker while it waits. Returns the reply and the number of replicas that
    /// acknowledged.
    pub(crate) async fn acquire_with_wait(
        &self,
        keys: &RedisKeys,
        token: &Token,
        waiter: &Token,
        args: AcquireArgs,
        min: MinReplicas,
        pool: Option<&WaitPool>,
    ) -> Result<(AcquireReply, u64), BackendError> {
        self.require(Need::of(keys.kind())).await?;
        if self.plain_set(keys, args) {
            let set = Self::set_nx(keys, token, args.lease);
            let waited = self
                .send_with_wait(pool, &set, None, &keys.lock, min)
                .await?;
            if waited.reply == Value::Okay {
                return Ok((AcquireReply::Acquired, waited.acked));
            }
        }
        let guard = self.restart_guard.as_ref();
        let (cmd, lua) = acquire::of_kind(keys, token, waiter, args, guard).into_command();
        let waited = self
            .send_with_wait(pool, &cmd, Some(lua), &keys.lock, min)
            .await?;
        Ok((calls::decode(lua, waited.reply)?, waited.acked))
    }

    /// `cmd` and `WAIT` in one pipeline (see `store::wait::with_wait`): on a connection of
    /// its own from `pool`, else on the shared connection.
    async fn send_with_wait(
        &self,
        pool: Option<&WaitPool>,
        cmd: &Cmd,
        script: Option<&'static Lua>,
        lock_key: &str,
        min: MinReplicas,
    ) -> Result<Waited, BackendError> {
        if let Some(pool) = pool {
            return pool.send(cmd, script, lock_key, min).await;
        }
        let generation = self.conn.generation();
        let mut conn = self.conn.clone();
        let (reply, acked) = with_wait(&mut conn, cmd.clone(), script, lock_key, min).await?;
        Ok(Waited {
            reply,
            acked,
            generation,
        })
    }

    /// Issues the next fencing token if the lock holds `token`; `None` when it does not.
    pub(crate) async fn issue_fence(
        &self,
        keys: &RedisKeys,
        token: &str,
    ) -> Result<Option<u64>, BackendError> {
        fence::fence(keys, token, self.fence_window)
            .invoke(&mut self.conn.clone())
            .await
            .map(|FenceReply(fence)| fence)
    }

    /// Releases the lock if it holds `token`. Compare-and-delete is idempotent, so a call that
    /// met a dropped connection is sent again (the connection manager reconnects meanwhile)
    /// instead of leaving the key for its lease, and so is one a cluster refused before it ran
    /// (its slot migrating). Whether the first call ran is unknown; the latch it leaves when it
    /// deletes the key tells the retry (see `scripts/release.lua`).
    pub(crate) async fn release(
        &self,
        keys: &RedisKeys,
        token: &Token,
    ) -> Result<ReleaseReply, BackendError> {
        let call = release::of_kind(keys, token, self.latch);
        let sent = self.release_sent(|| {
            let mut conn = self.conn.clone();
            let call = &call;
            async move { call.invoke(&mut conn).await.map(|reply| (reply, ())) }
        });
        Ok(sent.await?.0)
    }

    /// As [`release`](Self::release), the release sent in one pipeline with `WAIT` on a
    /// connection of its own from `pool` (see `store::wait`). Returns the reply, with how
    /// many replicas acknowledged the try answered and the connection generation it ran at.
    pub(crate) async fn release_with_wait(
        &self,
        keys: &RedisKeys,
        token: &Token,
        min: MinReplicas,
        pool: &WaitPool,
    ) -> Result<(ReleaseReply, Waited), BackendError> {
        let call = release::of_kind(keys, token, self.latch);
        self.release_sent(|| {
            let call = &call;
            async move {
                let (cmd, lua) = call.command();
                let waited = pool.send(cmd, Some(lua), &keys.lock, min).await?;
                let reply = call.decode(waited.reply.clone())?;
                Ok((reply, waited))
            }
        })
        .await
    }

    /// A release, each try sent by `send` (which gives the reply and what else its way of
    /// sending learnt), retried after a dropped connection (see [`release`](Self::release)).
    async fn release_sent<T, Fut>(
        &self,
        send: impl FnMut() -> Fut,
    ) -> Result<(ReleaseReply, T), BackendError>
    where
        Fut: std::future::Future<Output = Result<(ReleaseReply, T), BackendError>>,
    {
        let first_sent = Instant::now();
        // Whether an earlier try may have run: its connection dropped after it was sent (a
        // refusal, a cluster's or a replica's, comes before the script runs).
        let mut earlier_may_have_run = false;
        let reply = retry_dropped_noting(send, |error| {
            earlier_may_have_run |= error.is_dropped_connection()
        })
        .await;
        match reply {
            // A retry that found the key gone (or taken) and no latch proves that no earlier
            // try released it only while that try's latch would still live: the try ran, if
            // at all, after `first_sent`, and its latch lives `self.latch` from then. Answered
            // later than that (less a tenth, for the two clocks' rates), it cannot tell; with a
            // zero window (no latch) it never can.
            Ok((found, learnt))
                if earlier_may_have_run
                    && !found.ours
                    && first_sent.elapsed() >= self.latch - self.latch / 10 =>
            {
                let unknown = ReleaseReply {
                    ours: false,
                    gone: Some(Gone::Unknown),
                    others_waiting: false,
                };
                Ok((unknown, learnt))
            }
            reply => reply,
        }
    }

    /// Undoes this node's grant to a RedLock try that did not win a majority: deletes the lock
    /// if it holds `token`, and nothing else (see `scripts/undo.lua`). A read grant's undo is
    /// its release (it removes the reader's entry, and nothing of the waiting writers).
    pub(crate) async fn undo(&self, keys: &RedisKeys, token: &Token) -> Result<(), BackendError> {
        if keys.kind() != Kind::Exclusive {
            return self.release(keys, token).await.map(drop);
        }
        let call = release::undo(keys, token);
        retry_dropped(|| {
            let mut conn = self.conn.clone();
            let call = &call;
            async move { call.invoke(&mut conn).await.map(drop) }
        })
        .await
    }

    /// Tells every waiter of the lock on this node's channel that it may try (the message of
    /// a release that found a waiter, see `scripts/release.lua`). Best effort: a waiter that
    /// misses it wakes at its fallback retry.
    pub(crate) async fn publish_release(&self, channel: &str) {
        let sent: RedisResult<i64> = redis::cmd("PUBLISH")
            .arg(channel)
            .arg("1")
            .query_async(&mut self.conn.clone())
            .await;
        if let Err(error) = sent {
            tracing::debug!(%error, "telling a RedLock node's waiters of a release failed");
        }
    }

    /// Takes `token` out of the waiting writers of an exclusive lock (an acquire that stopped
    /// waiting), so that readers need not let it go first (see `scripts/withdraw.lua`).
    /// Answers whether the lock's waiters were told on this node.
    pub(crate) async fn withdraw(
        &self,
        keys: &RedisKeys,
        token: &str,
    ) -> Result<bool, BackendError> {
        let call = acquire::withdraw(keys, token);
        retry_dropped(|| {
            let mut conn = self.conn.clone();
            let call = &call;
            async move { call.invoke(&mut conn).await.map(|reply| reply == 2) }
        })
        .await
    }

    /// Renews `locks` (their keys, token); `Unknown` where the call failed. Each kind of hold
    /// has its renewal script; all calls go out at once.
    ///
    /// With `min` and a `pool` (an extension, a handoff's renewal: calls a burst can bring),
    /// each call and its `WAIT` go on a connection of their own; otherwise (the watchdog's
    /// round) on the shared connection, one `WAIT` after them all. A pooled extension is not
    /// ordered with the rounds sent after it: the hold counts those only from its answer
    /// (`Hold::expect_extension`, `ExtensionPath`).
    pub(crate) async fn renew(
        &self,
        locks: &[(&RedisKeys, &str)],
        lease: NewLease,
        min: Option<MinReplicas>,
        pool: Option<&WaitPool>,
    ) -> Vec<Renewal> {
        // The oldest connection generation a renewal answered below was sent at: a `WAIT` on
        // a later primary (a Sentinel switch since) did not count it. A renewal sent again on
        // the new primary after the switch is counted there.
        let sent_at = &AtomicU64::new(u64::MAX);
        let groups = RenewScript::ALL.map(|script| {
            let group: Vec<(usize, &(&RedisKeys, &str))> = locks
                .iter()
                .enumerate()
                .filter(|(_, (keys, _))| RenewScript::of(keys.kind()) == script)
                .collect();
            (script, group)
        });
        // A cluster's calls each go to their own shard, and each waits there; one server's
        // calls share one `WAIT` after them all (it covers every write before it on the
        // connection), so a lagging replica holds the connection up once a round.
        let (each, after) = if self.conn.is_cluster() || pool.is_some() {
            (min, None)
        } else {
            (None, min)
        };
        let renewed = join_all(groups.iter().filter(|(_, group)| !group.is_empty()).map(
            |(script, group)| async move {
                let pairs: Vec<_> = group.iter().map(|(_, lock)| **lock).collect();
                let answers = self
                    .renew_with(*script, &pairs, lease, each, pool, sent_at)
                    .await;
                group
                    .iter()
                    .map(|(i, _)| *i)
                    .zip(answers)
                    .collect::<Vec<_>>()
            },
        ))
        .await;
        let mut answers = vec![Renewal::UNKNOWN; locks.len()];
        for (i, answer) in renewed.into_iter().flatten() {
            answers[i] = answer;
        }
        if let Some(min) = after {
            let generation = sent_at.load(Ordering::SeqCst);
            if answers.contains(&Renewal::Renewed)
                && self.replicas_acked(generation, min).await < min.replicas
            {
                answers = answers.into_iter().map(Renewal::unreplicated).collect();
            }
        }
        self.dated(answers).await
    }

    /// Whether Sentinel names this node's server (a failover may move it).
    pub(crate) fn follows_sentinel(&self) -> bool {
        self.conn.follows_sentinel()
    }

    /// Whether the primary this node's connection goes to moved since its `generation` (see
    /// `Connection::primary_moved`).
    pub(crate) async fn primary_moved(&self, since: u64, within: Duration) -> bool {
        self.conn.primary_moved(since, within).await
    }

    /// `WAIT` on this node's connection: how many replicas acknowledged every write sent on it
    /// so far. 0 when the call fails, or when the connection's `generation` is no longer the
    /// oldest one the writes were sent at (a Sentinel primary switched since: the `WAIT` ran
    /// on the new primary and did not count them): nothing is known to have reached them.
    pub(crate) async fn replicas_acked(&self, generation: u64, min: MinReplicas) -> u64 {
        let acked = min.wait().query_async::<u64>(&mut self.conn.clone()).await;
        let acked = acked.unwrap_or_else(|error| {
            tracing::debug!(%error, "WAIT after writes failed; the writes are not counted");
            0
        });
        if self.conn.generation() == generation {
            acked
        } else {
            0
        }
    }

    /// The generation of this node's connection (see `Connection::generation`).
    pub(crate) fn generation(&self) -> u64 {
        self.conn.generation()
    }

    /// [`renew`](Self::renew), each answer given to `apply` (with the lock's place in
    /// `locks`) as soon as it is known. On a cluster every lock is its own call, to the shard
    /// of its slot, and a shard that is slow to answer (or does not) must not hold back the
    /// answers of the others: applied only once the slowest call ended, they could come after
    /// the validity their locks had left, and those locks were lost although their shards
    /// renewed them. Elsewhere the calls go to one server and end together.
    pub(crate) async fn renew_each(
        &self,
        locks: &[(&RedisKeys, &str)],
        lease: NewLease,
        min: Option<MinReplicas>,
        apply: &mut (dyn FnMut(usize, Renewal) + Send),
    ) {
        if !self.conn.is_cluster() {
            let answers = self.renew(locks, lease, min, None).await;
            for (i, answer) in answers.into_iter().enumerate() {
                apply(i, answer);
            }
            return;
        }
        let mut calls: FuturesUnordered<_> = locks
            .iter()
            .enumerate()
            .map(|(i, lock)| async move {
                let script = RenewScript::of(lock.0.kind());
                let sent_at = AtomicU64::new(u64::MAX);
                let answer = self
                    .renew_with(script, &[*lock], lease, min, None, &sent_at)
                    .await;
                (i, answer.into_iter().next().unwrap_or(Renewal::UNKNOWN))
            })
            .collect();
        // A cluster reads no uptime (`dated` would change nothing).
        while let Some((i, answer)) = calls.next().await {
            apply(i, answer);
        }
    }

    /// The script calls [`renew`](Self::renew) sends for `locks` (retries after a dropped
    /// connection aside): one per renewal script their kinds need, for up to [`BATCH`] locks,
    /// and one per lock on a cluster.
    pub(crate) fn renew_calls(&self, locks: &[(&RedisKeys, &str)]) -> u64 {
        let size = if self.conn.is_cluster() { 1 } else { BATCH };
        RenewScript::ALL
            .iter()
            .map(|script| {
                let n = locks
                    .iter()
                    .filter(|(keys, _)| RenewScript::of(keys.kind()) == *script)
                    .count();
                n.div_ceil(size) as u64
            })
            .sum()
    }

    /// Whether each of `locks` (exclusive locks: their keys, token) still holds its token, one
    /// `GET` each and nothing written: a handoff's confirmation while the lease Redis last
    /// confirmed is mostly left (its end does not move, so neither does the fence key's).
    /// `Renewed` when the key holds the token; a value of another type is another holder's.
    pub(crate) async fn confirm(&self, locks: &[(&RedisKeys, &str)]) -> Vec<Renewal> {
        let answers = join_all(locks.iter().map(|(keys, token)| async move {
            // A read: idempotent, so retried after a dropped connection like a renewal.
            let value = retry_dropped(|| {
                let mut conn = self.conn.clone();
                async move {
                    redis::cmd("GET")
                        .arg(&keys.lock)
                        .query_async::<Option<Vec<u8>>>(&mut conn)
                        .await
                        .map_err(BackendError::redis)
                }
            })
            .await;
            match value {
                Ok(Some(value)) if value == token.as_bytes() => Renewal::Renewed,
                Ok(Some(_)) => Renewal::NotOurs(Gone::Replaced),
                Ok(None) => Renewal::NotOurs(Gone::Absent { uptime: None }),
                Err(error) if error.code() == Some("WRONGTYPE") => Renewal::NotOurs(Gone::Replaced),
                Err(error) => {
                    tracing::warn!(%error, "confirming a lock before its handoff failed");
                    Renewal::UNKNOWN
                }
            }
        }))
        .await;
        self.dated(answers).await
    }

    /// `answers`, with the server's uptime in those that found a lock absent.
    async fn dated(&self, mut answers: Vec<Renewal>) -> Vec<Renewal> {
        let absent = |a: &Renewal| matches!(a, Renewal::NotOurs(Gone::Absent { .. }));
        if answers.iter().any(absent) {
            // Rare (a lock gone from under its holder), so worth one more round trip to tell
            // a restart from a deletion.
            let asked = Instant::now();
            if let Some(uptime) = self.uptime().await {
                // The server read its uptime up to this round trip ago, and `Hold::reason_for`
                // compares it with the hold's age when the reply has arrived: without the
                // round trip a slow link (over a second each way) made every deletion look
                // like a restart.
                let uptime = uptime + asked.elapsed();
                for answer in answers.iter_mut().filter(|a| absent(a)) {
                    *answer = Renewal::NotOurs(Gone::Absent {
                        uptime: Some(uptime),
                    });
                }
            }
        }
        answers
    }

    /// The server's uptime (`INFO server`), in whole seconds, within one second of the real
    /// one; `None` when it cannot be known: a cluster (the command would reach any node),
    /// an ACL without `+info`, a failure.
    async fn uptime(&self) -> Option<Duration> {
        if self.conn.is_cluster() {
            return None;
        }
        let info: RedisResult<InfoDict> = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut self.conn.clone())
            .await;
        match info {
            Ok(info) => info
                .get::<u64>("uptime_in_seconds")
                .map(Duration::from_secs),
            Err(error) => {
                tracing::debug!(%error, "cannot read the server's uptime; a lost lock's reason may be less precise");
                None
            }
        }
    }

    /// Renews `locks`, all of one kind, with that kind's renewal script; with `min` (a
    /// cluster's shards), each call followed by `WAIT` on its shard, and a renewal that fewer
    /// replicas acknowledged is not counted (`Unknown`): after a failover the old primary,
    /// which no replica follows any more, may still accept renewals that the new primary never
    /// sees, where the key runs out and another locker takes it. Counted, they would keep the
    /// old holder told "held".
    async fn renew_with(
        &self,
        script: RenewScript,
        locks: &[(&RedisKeys, &str)],
        lease: NewLease,
        min: Option<MinReplicas>,
        pool: Option<&WaitPool>,
        sent_at: &AtomicU64,
    ) -> Vec<Renewal> {
        // In a cluster a script's keys must share a slot: every lock is its own call there (all
        // sent at once, so each node still gets them in one pipelined write).
        let size = if self.conn.is_cluster() { 1 } else { BATCH };
        let calls = locks.chunks(size).map(|chunk| async move {
            let call = script.call(chunk, lease, self.fence_window);
            // Renewal is idempotent: retried at once after a dropped connection rather than at
            // the next tick, so connection resets do not eat into the lease.
            let reply = retry_dropped(|| {
                let mut conn = self.conn.clone();
                let call = &call;
                // The try whose answer is used records the generation it was sent at.
                let generation = self.conn.generation();
                async move {
                    let Some(min) = min else {
                        let reply = call.invoke(&mut conn).await?;
                        sent_at.fetch_min(generation, Ordering::SeqCst);
                        return Ok(reply);
                    };
                    let (cmd, lua) = call.command();
                    let key = chunk.first().map_or("", |(keys, _)| keys.lock.as_str());
                    let waited = self.send_with_wait(pool, cmd, Some(lua), key, min).await?;
                    let RenewReply(renewals) = call.decode(waited.reply)?;
                    let acked = waited.acked;
                    sent_at.fetch_min(waited.generation, Ordering::SeqCst);
                    Ok(RenewReply(if acked < min.replicas {
                        renewals.into_iter().map(Renewal::unreplicated).collect()
                    } else {
                        renewals
                    }))
                }
            })
            .await;
            match reply {
                Ok(RenewReply(renewals)) if renewals.len() == chunk.len() => renewals,
                Ok(_) => vec![Renewal::UNKNOWN; chunk.len()],
                Err(error) => {
                    tracing::warn!(%error, locks = chunk.len(), "lease renewal failed; retrying next tick");
                    let answer = if error.was_unsent() {
                        Renewal::Undecided(Undecided::Unsent)
                    } else {
                        Renewal::UNKNOWN
                    };
                    vec![answer; chunk.len()]
                }
            }
        });
        join_all(calls).await.into_iter().flatten().collect()
    }

    /// Raises the fence counter to at least `fence` (RedLock write-back).
    pub(crate) async fn raise_fence(
        &self,
        keys: &RedisKeys,
        fence: u64,
    ) -> Result<(), BackendError> {
        fence::raise_fence(keys, fence, self.fence_window)
            .invoke(&mut self.conn.clone())
            .await
            .map(drop)
    }

    /// Whether the lock key exists.
    pub(crate) async fn exists(&self, lock_key: &str) -> Result<bool, BackendError> {
        redis::cmd("EXISTS")
            .arg(lock_key)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(BackendError::redis)
    }

    /// Who holds the lock `lock` or the semaphore `semaphore` (the names of one user key), read
    /// in one call (see `scripts/inspect.lua`).
    pub(crate) async fn inspect(
        &self,
        lock: &RedisKeys,
        semaphore: &RedisKeys,
    ) -> Result<Option<Inspected>, BackendError> {
        inspect::inspect(lock, semaphore)
            .invoke(&mut self.conn.clone())
            .await
            .map(|InspectReply(found)| found)
    }

    /// Deletes the lock whoever holds it; whether there was one.
    pub(crate) async fn force_unlock(&self, keys: &RedisKeys) -> Result<bool, BackendError> {
        force_unlock::force_unlock(keys)
            .invoke(&mut self.conn.clone())
            .await
            .map(|deleted| deleted == 1)
    }

    /// Warns when the server may evict lock keys (`maxmemory-policy` other than `noeviction`):
    /// an evicted lock is a silent loss, noticed only at the next renewal. The policy is read
    /// from `INFO memory` (`maxmemory_policy`), which the minimal ACL allows: `CONFIG GET`
    /// would also hand out `requirepass` and `masterauth`. In a cluster every primary answers.
    /// Servers that refuse `INFO` are not checked.
    pub(crate) async fn warn_on_eviction_policy(&self) {
        let reply: RedisResult<Value> = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut self.conn.clone())
            .await;
        match reply {
            Ok(reply) => {
                let mut policies = eviction_policies(&reply);
                policies.sort();
                policies.dedup();
                for policy in policies.iter().filter(|p| p.as_str() != "noeviction") {
                    tracing::warn!(
                        %policy,
                        "redis may evict lock keys under memory pressure; set maxmemory-policy noeviction"
                    );
                }
            }
            Err(error) => tracing::debug!(
                %error,
                "cannot read maxmemory_policy (grant +info to check it); not checked"
            ),
        }
    }
}

/// The `maxmemory_policy` fields of an `INFO memory` reply: one server's, or a cluster's (one
/// per primary).
fn eviction_policies(reply: &Value) -> Vec<String> {
    server_version::info_replies(reply)
        .into_iter()
        .filter_map(|(_, info)| info.ok()?.get::<String>("maxmemory_policy"))
        .map(|policy| policy.trim().to_owned())
        .collect()
}

/// Runs `call` again (twice at most, shortly after) when it failed on a dropped or refused
/// connection, or the server refused it before it ran (a cluster's slot that moved or is
/// migrating, whose end the cluster client's own retries did not see; a primary demoted by a
/// failover, whose successor Sentinel names meanwhile); for idempotent calls only.
async fn retry_dropped<T, F, Fut>(call: F) -> Result<T, BackendError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BackendError>>,
{
    retry_dropped_noting(call, |_| ()).await
}

/// A call's answer to a check of the servers' versions: refused when one is too old.
fn refusal(too_old: Option<TooOld>) -> Result<(), BackendError> {
    match too_old {
        Some(too_old) => Err(BackendError::too_old(too_old)),
        None => Ok(()),
    }
}

/// [`retry_dropped`], telling `retrying_after` each error it retries after.
async fn retry_dropped_noting<T, F, Fut>(
    mut call: F,
    mut retrying_after: impl FnMut(&BackendError),
) -> Result<T, BackendError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BackendError>>,
{
    let mut result = call().await;
    for delay in [5, 50] {
        match &result {
            Err(e) if e.is_dropped_connection() || e.is_refusal() => {
                retrying_after(e);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                result = call().await;
            }
            _ => break,
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_policies_are_read_from_one_server_and_from_every_cluster_node() {
        let info = |policy: &str| {
            Value::BulkString(
                format!("# Memory\r\nused_memory:1\r\nmaxmemory_policy:{policy}\r\n").into_bytes(),
            )
        };
        assert_eq!(eviction_policies(&info("volatile-ttl")), ["volatile-ttl"]);
        let cluster = Value::Map(vec![
            (Value::SimpleString("a:1".into()), info("noeviction")),
            (Value::SimpleString("b:2".into()), info("allkeys-lru")),
        ]);
        assert_eq!(eviction_policies(&cluster), ["noeviction", "allkeys-lru"]);
        assert!(eviction_policies(&Value::Nil).is_empty());
    }
}
