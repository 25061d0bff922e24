//! The `WAIT`s of one server's connection, shared by every call that needs its writes on
//! replicas (`min_replicas`): a group commit.
//!
//! `WAIT` blocks the connection it is sent on in Redis until the replicas acknowledge (or its
//! timeout), and everything sent after it on that connection queues behind it. Sent once per
//! acquire, a burst of acquires while a replica is slow to acknowledge held up every other
//! command of the locker for the sum of their waits, its renewals included (RELIABILITY N4).
//! One `WAIT` covers every write sent before it on its connection, so the calls share them:
//! at most one is under way, and a call whose write was answered before a `WAIT` was sent
//! takes that `WAIT`'s answer.

use std::sync::atomic::{AtomicU64, Ordering};

use redis::Value;

use super::MinReplicas;
use crate::connection::Connection;

/// The `WAIT`s of one node's connection.
#[derive(Debug, Default)]
pub(crate) struct ReplicaWaits {
    /// How many `WAIT`s were sent: the number of the last one.
    sent: AtomicU64,
    /// The last `WAIT`'s answer, locked while the next one is under way.
    last: tokio::sync::Mutex<LastWait>,
}

/// What one `WAIT` answered.
#[derive(Debug, Default)]
struct LastWait {
    /// Its number (see `ReplicaWaits::sent`); 0 before the first.
    number: u64,
    /// The connection it ran on (`CLIENT ID`); `None` when it failed.
    client: Option<i64>,
    /// The connection's generation (a Sentinel primary's switches) when it was answered.
    generation: u64,
    /// How many replicas acknowledged every write sent before it on its connection.
    acked: u64,
}

impl ReplicaWaits {
    /// How many replicas acknowledged a write already answered on `conn`: the answer of the
    /// first `WAIT` sent after now, on the same connection. `client` is the `CLIENT ID` the
    /// write ran on (`None`: the caller does not know it, and takes any connection's, as a
    /// `WAIT` of its own would), `generation` the connection's generation before the write
    /// was sent. 0 when nothing is known to have reached the replicas: the `WAIT` failed, or
    /// ran on another connection than the write (a reconnection: a fresh connection's `WAIT`
    /// counts none of the old one's writes) or another server (a failover in between).
    pub(crate) async fn acked_after(
        &self,
        conn: &Connection,
        client: Option<i64>,
        generation: u64,
        min: MinReplicas,
    ) -> u64 {
        // A `WAIT` numbered above this one is sent after the write was answered.
        let after = self.sent.load(Ordering::SeqCst);
        let mut last = self.last.lock().await;
        if last.number <= after {
            let number = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
            let (client, acked) = send(conn, min).await;
            // Written whole once answered: a call dropped while its `WAIT` is under way leaves
            // the last answer as it was, and the next caller sends one of its own.
            *last = LastWait {
                number,
                client,
                generation: conn.generation(),
                acked,
            };
        }
        let same_connection = client.is_none_or(|client| last.client == Some(client));
        if same_connection && last.generation == generation {
            last.acked
        } else {
            0
        }
    }
}

/// `CLIENT ID` and `WAIT` in one pipeline: the connection it ran on and how many replicas
/// acknowledged its writes; `(None, 0)` when it failed.
async fn send(conn: &Connection, min: MinReplicas) -> (Option<i64>, u64) {
    let mut pipe = redis::pipe();
    pipe.add_command(client_id()).add_command(min.wait());
    let reply: redis::RedisResult<(i64, u64)> = pipe.query_async(&mut conn.clone()).await;
    match reply {
        Ok((client, acked)) => (Some(client), acked),
        Err(error) => {
            tracing::debug!(%error, "WAIT failed; the writes before it are not counted as replicated");
            (None, 0)
        }
    }
}

/// `CLIENT ID`: the connection a pipeline runs on, unique while the server runs.
pub(crate) fn client_id() -> redis::Cmd {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("ID");
    cmd
}

/// The id of a `CLIENT ID` reply.
pub(crate) fn client_of(reply: Value) -> Option<i64> {
    redis::from_redis_value(reply).ok()
}
