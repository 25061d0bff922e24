//! Writes followed by `WAIT` (`min_replicas`): the pipeline that sends them, and the
//! connections of their own that acquires, extensions, handoff renewals and Sentinel
//! releases send it on.
//!
//! `WAIT` blocks the connection it is sent on, in Redis, until enough replicas acknowledge or
//! its timeout passes. On the locker's one shared connection, a burst of acquires while a
//! replica lags queued their `WAIT`s one after another, and every other
//! command of the locker, the watchdog's renewals among them, waited behind their sum: locks
//! held all along were lost (RELIABILITY.md, N4). So each such call borrows a connection of
//! its own from a [`WaitPool`], at most [`WAIT_CONNECTIONS`] at once, and the shared
//! connection carries one `WAIT` a watchdog round, as before. An explicit extension sets a
//! lease exactly, and a round sent while it waits here may run before it in Redis: the hold
//! orders it by its answer, not its sending (`held.rs`, `Extended`; RELIABILITY.md, E1, E2,
//! S4).
//!
//! A `WAIT` counts the writes sent before it on its own connection, so the write and its
//! `WAIT` go in one pipeline on one connection, pinned to one server: both run on the same
//! primary, whatever Sentinel does meanwhile. A connection whose call did not end with an
//! answer (an error, a timeout, a caller that went away mid-call) is closed, never lent
//! again: its `WAIT` may still block it in Redis, and its next reply could be the old call's.
//! A connection found dropped closes the idle ones with it: what closed one (a restart, the
//! server's idle `timeout`, a network cut) most likely closed them all, and each would cost a
//! call a failed try. A connection idle for more than [`IDLE_CHECK`] answers a `PING` before
//! it is lent: a gateway or firewall on the way may have forgotten it silently, and a call
//! on it would wait out the command timeout instead.
//!
//! A cluster has no pool: there the shared connection is one connection to each primary, so
//! a shard's `WAIT`s hold up that shard's calls only, while a pool's connections (each one to
//! every primary, lent whole) would let one frozen shard hold all of them and the healthy
//! shards' calls wait (RELIABILITY.md, X3).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionLike, ConnectionManager};
#[cfg(feature = "cluster")]
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, RedisResult, Value};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use super::calls::{self, LoadOn};
use super::MinReplicas;
use crate::backend_error::BackendError;
#[cfg(feature = "sentinel")]
use crate::connection::SentinelPrimary;
use crate::connection::{Connection, Timeouts};
use crate::scripts::Lua;

/// How many writes with their `WAIT` one locker has in flight at once; more wait for a
/// connection. Each is a connection to Redis, opened on first need and kept while idle.
pub(crate) const WAIT_CONNECTIONS: usize = 8;

/// An idle connection used less recently than this is checked (`PING`) before it is lent.
/// Busy connections (a burst) skip the check; after a quiet spell the first call pays one
/// round trip for it.
const IDLE_CHECK: Duration = Duration::from_millis(500);

/// The first pause between connect tries (doubled after each, up to [`LONGEST_CONNECT_PAUSE`]):
/// a server restarting, or a proxy in front of it, refuses connections for a moment.
const FIRST_CONNECT_PAUSE: Duration = Duration::from_millis(10);

/// The longest pause between connect tries.
const LONGEST_CONNECT_PAUSE: Duration = Duration::from_millis(200);

/// [`WaitPool::send`]'s future, boxed behind a vtable: with the making of connections and
/// Sentinel's questions inside, the compiler's proof that a caller's future (a release's,
/// a renewal's) is `Send` would overflow. Its cost is one allocation beside a `WAIT`.
type Sending<'a> = Pin<Box<dyn Future<Output = Result<Waited, BackendError>> + Send + 'a>>;

/// The answer to a write and its `WAIT`.
#[derive(Debug)]
pub(crate) struct Waited {
    /// The write's reply.
    pub(crate) reply: Value,
    /// How many replicas acknowledged it.
    pub(crate) acked: u64,
    /// The generation of the connection it ran on (see `Connection::generation`): the
    /// Sentinel primary it reached.
    pub(crate) generation: u64,
}

/// Connections of their own for writes followed by `WAIT`, to the deployment a locker's
/// shared connection goes to (for Sentinel: the primary it names now).
pub(crate) struct WaitPool {
    opener: Opener,
    timeouts: Timeouts,
    /// Connections that answered their last call.
    idle: Mutex<Vec<Idle>>,
    /// One permit for each connection lent.
    lending: Semaphore,
}

/// How a [`WaitPool`] opens a connection.
pub(crate) enum Opener {
    /// One server, with the client (its TLS and credentials) the shared connection was
    /// made from.
    Server(Box<redis::Client>),
    /// The primary a Sentinel names now.
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<SentinelPrimary>),
}

impl std::fmt::Debug for WaitPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitPool")
            .field("idle", &self.idle.lock().len())
            .field("free", &self.lending.available_permits())
            .finish_non_exhaustive()
    }
}

/// A connection of a [`WaitPool`] waiting to be lent.
struct Idle {
    conn: Connection,
    /// The generation it was opened at (the Sentinel primary it goes to).
    generation: u64,
    /// When it was given back.
    since: Instant,
}

/// A connection lent by a [`WaitPool`], with the generation it was opened at; closed when
/// dropped, unless given back.
struct Lent<'a> {
    pool: &'a WaitPool,
    conn: Connection,
    generation: u64,
    _permit: SemaphorePermit<'a>,
}

impl Lent<'_> {
    /// The call ended with an answer: the connection may be lent again.
    fn give_back(self) {
        let Lent {
            pool,
            conn,
            generation,
            _permit,
        } = self;
        pool.idle.lock().push(Idle {
            conn,
            generation,
            since: Instant::now(),
        });
    }
}

impl WaitPool {
    pub(crate) fn new(opener: Opener, timeouts: Timeouts) -> Arc<Self> {
        Arc::new(Self {
            opener,
            timeouts,
            idle: Mutex::default(),
            lending: Semaphore::new(WAIT_CONNECTIONS),
        })
    }

    /// Sends `cmd` and `WAIT` (see [`with_wait`]) on a connection of their own, waiting for
    /// one while [`WAIT_CONNECTIONS`] are lent.
    pub(crate) fn send<'a>(
        &'a self,
        cmd: &'a Cmd,
        script: Option<&'a Lua>,
        lock_key: &'a str,
        min: MinReplicas,
    ) -> Sending<'a> {
        Box::pin(self.send_now(cmd, script, lock_key, min))
    }

    async fn send_now(
        &self,
        cmd: &Cmd,
        script: Option<&Lua>,
        lock_key: &str,
        min: MinReplicas,
    ) -> Result<Waited, BackendError> {
        let mut lent = match self.lend().await {
            Ok(lent) => lent,
            Err(error) => {
                self.failed().await;
                // No connection: nothing was written.
                return Err(error.unsent());
            }
        };
        let generation = lent.generation;
        match with_wait(&mut lent.conn, cmd.clone(), script, lock_key, min).await {
            Ok((reply, acked)) => {
                lent.give_back();
                Ok(Waited {
                    reply,
                    acked,
                    generation,
                })
            }
            Err(error) => {
                drop(lent);
                if error.is_dropped_connection() {
                    self.idle.lock().clear();
                }
                self.failed().await;
                Err(error)
            }
        }
    }

    /// A connection: an idle one to where the locker's connection goes now, or a new one.
    async fn lend(&self) -> Result<Lent<'_>, BackendError> {
        let permit = self
            .lending
            .acquire()
            .await
            .map_err(|_| BackendError::undecided("the WAIT connections were closed"))?;
        // Checking an idle connection and opening one take the connect timeout in all: through
        // a partition a call waits no longer than the one that first opened a connection.
        let until = Instant::now() + self.timeouts.connect;
        let now = self.generation();
        let idle = {
            let mut idle = self.idle.lock();
            // Connections to a primary Sentinel no longer names are closed.
            idle.retain(|idle| idle.generation == now);
            idle.pop()
        };
        let (conn, generation) = match idle {
            Some(idle) if idle.since.elapsed() < IDLE_CHECK => (idle.conn, idle.generation),
            Some(Idle {
                mut conn,
                generation,
                ..
            }) => {
                // At most half the budget, so that a new connection has the other half.
                let within = self.timeouts.command.min(self.timeouts.connect / 2);
                let ping = redis::cmd("PING");
                let pinged = tokio::time::timeout(within, ping.query_async::<Value>(&mut conn));
                if let Ok(Ok(_)) = pinged.await {
                    (conn, generation)
                } else {
                    // The others idle as long or longer went the same way, most likely.
                    self.idle
                        .lock()
                        .retain(|idle| idle.since.elapsed() < IDLE_CHECK);
                    self.open(until).await?
                }
            }
            None => self.open(until).await?,
        };
        Ok(Lent {
            pool: self,
            conn,
            generation,
            _permit: permit,
        })
    }

    /// The generation of the locker's connection (a Sentinel primary's switches).
    fn generation(&self) -> u64 {
        match &self.opener {
            #[cfg(feature = "sentinel")]
            Opener::Sentinel(primary) => primary.generation(),
            _ => 0,
        }
    }

    /// Opens a connection, with the generation it goes to, by `until`: a refused or dropped
    /// try is tried again after a short pause (a restart, a proxy restarting) while time is
    /// left. (The shared connection's manager tries three times, each within the connect
    /// timeout, in the background; here a caller waits, and through a partition every call
    /// would wait for all three.) Refused until the end, it answers a timeout, not a dropped
    /// connection: a caller's retry would wait as long again.
    async fn open(&self, until: Instant) -> Result<(Connection, u64), BackendError> {
        const GAVE_UP: &str = "connecting for a write and its WAIT (refused or dropped until \
                               the connect timeout)";
        let mut pause = FIRST_CONNECT_PAUSE;
        loop {
            let (client, generation) = match &self.opener {
                Opener::Server(client) => ((**client).clone(), 0),
                #[cfg(feature = "sentinel")]
                Opener::Sentinel(primary) => primary.current_client(),
            };
            let left = until.saturating_duration_since(Instant::now());
            let config = self.timeouts.manager_config().set_number_of_retries(0);
            let connecting = ConnectionManager::new_with_config(client, config);
            let error = match tokio::time::timeout(left, connecting).await {
                Ok(Ok(conn)) => return Ok((Connection::Server(conn), generation)),
                Ok(Err(error)) => error,
                Err(_) => {
                    return Err(BackendError::timed_out(
                        "connecting for a write and its WAIT",
                    ))
                }
            };
            let passing = error.is_connection_refusal()
                || error.is_connection_dropped()
                || error.is_io_error() && !error.is_timeout()
                || error.code() == Some("LOADING");
            if !passing {
                return Err(BackendError::redis(error));
            }
            if until.saturating_duration_since(Instant::now()) <= pause {
                return Err(BackendError::timed_out(GAVE_UP));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LONGEST_CONNECT_PAUSE);
        }
    }

    /// A call failed: a Sentinel primary that stopped answering, or answers as a replica,
    /// may have moved (Sentinel is asked, unless it was just asked).
    async fn failed(&self) {
        #[cfg(feature = "sentinel")]
        if let Opener::Sentinel(primary) = &self.opener {
            primary.after_error().await;
        }
    }
}

/// Runs `cmd` and `WAIT replicas timeout` in one pipeline on the connection of the node that
/// holds `lock_key`; returns the command's reply and the number of replicas that acknowledged.
/// `script` is the script `cmd` calls, loaded and sent again after `NOSCRIPT`. The pipeline is
/// built once and sent as it is again.
pub(crate) async fn with_wait(
    conn: &mut Connection,
    cmd: Cmd,
    script: Option<&Lua>,
    lock_key: &str,
    min: MinReplicas,
) -> Result<(Value, u64), BackendError> {
    let mut pipe = redis::pipe();
    pipe.add_command(cmd).add_command(min.wait());
    // Where a missing script is loaded, in turn: the key's server, then (a migrating slot's
    // `ASK` sends the call to another primary) every primary.
    let mut loads = [LoadOn::KeysServer(lock_key.as_bytes()), LoadOn::Everywhere].into_iter();
    loop {
        let values = send_to_holder(conn, &pipe, lock_key).await;
        // An error comes back for the whole pipeline or as the command's own reply.
        let mut values = values.map_err(BackendError::redis)?.into_iter();
        let (Some(reply), Some(acked)) = (values.next(), values.next()) else {
            return Err(BackendError::unexpected_reply(
                "a command and WAIT",
                "fewer than two replies".into(),
            ));
        };
        match (reply.extract_error(), script) {
            // The script cache was flushed (or the server restarted): load it and send both
            // again; the WAIT that ran alone counted nothing of ours.
            (Err(error), Some(script)) if calls::is_no_script(&error) => {
                let Some(on) = loads.next() else {
                    return Err(BackendError::redis(error));
                };
                calls::load(script, conn, on)
                    .await
                    .map_err(BackendError::redis)?;
            }
            (Err(error), _) => return Err(BackendError::redis(error)),
            (Ok(reply), _) => {
                let acked = acked.extract_error().map_err(BackendError::redis)?;
                let acked = redis::from_redis_value(acked)
                    .map_err(|e| BackendError::unexpected_reply("WAIT", e))?;
                return Ok((reply, acked));
            }
        }
    }
}

/// Sends `pipe` (a command and `WAIT`) to the node that holds `lock_key`: in a cluster, WAIT
/// must reach that node, so the pipeline is routed by the key (on its own, WAIT has no key and
/// would go to any node).
async fn send_to_holder(
    conn: &mut Connection,
    pipe: &redis::Pipeline,
    lock_key: &str,
) -> RedisResult<Vec<Value>> {
    #[cfg(feature = "cluster")]
    if let Connection::Cluster(cluster) = conn {
        let route = Route::with_key(lock_key, SlotAddr::Master);
        let route = SingleNodeRoutingInfo::SpecificNode(route);
        return cluster.route_pipeline(pipe.clone(), 0, 2, route).await;
    }
    let _ = lock_key; // one node: nothing to route
    conn.req_packed_commands(pipe, 0, 2).await
}
