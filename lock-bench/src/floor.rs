//! The raw floor: what a hand-rolled Redis lock does with the `redis` crate and nothing else.
//!
//! Acquire is `SET key token NX PX lease`; waiting is busy-retrying that `SET NX` until it
//! succeeds or the wait runs out; release is a compare-and-delete script by `EVALSHA`; all on
//! one multiplexed connection. No reentrancy, no fencing, no wake-ups, no watchdog: this is the
//! cheapest correct-looking lock, the baseline the kit's overhead is measured against.
//!
//! [`Floor::connect_guarded`] is the same lock with what the kit does for five of its
//! guarantees, written as a hand-rolled lock would (W1's fourth side, "floor+guarantees"): the
//! kit's Redis names, whose hash tag keeps a lock's keys in one Cluster slot
//! (`<prefix>{<16 hex digits of the key's SHA-1>}:lock:<key>`); the holder's name after the
//! token (`<token>|<host>:<pid>`), which answers "who holds it"; the release deleting the
//! lock's waiting marks with it (a second key), which wakes waiters of other processes; the
//! acquire's call bounded by a timer, which ends a wait on time however slow Redis is; and
//! `redis`'s `ConnectionManager` with the kit's timeouts, which comes back after a dropped
//! connection. What the kit costs above it is what its own structure costs.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{Cmd, FromRedisValue, Script, ScriptInvocation};
use sha1::Digest;
use tokio::time::Instant;

static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0",
    )
});

/// [`RELEASE`] that deletes the lock's waiting marks (`KEYS[2]`) with it.
static RELEASE_WITH_MARKS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1], KEYS[2]) end return 0",
    )
});

/// The kit's command timeout: the guarded floor's acquire calls end by the wait's deadline, or
/// this long after the acquire started when the wait is shorter (one try, as the kit's).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(3);

/// A hand-rolled lock client.
#[derive(Clone)]
pub(crate) struct Floor {
    conn: Conn,
    prefix: String,
    lease_ms: u64,
    retry: Duration,
    /// With the kit's five guarantees (see the module's documentation): the holder's name.
    guarded: Option<String>,
}

/// The floor's connection: a plain multiplexed one, or the guarded floor's reconnecting one.
#[derive(Clone)]
enum Conn {
    Plain(MultiplexedConnection),
    Managed(ConnectionManager),
}

impl Conn {
    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> redis::RedisResult<T> {
        match self {
            Self::Plain(conn) => cmd.query_async(&mut conn.clone()).await,
            Self::Managed(conn) => cmd.query_async(&mut conn.clone()).await,
        }
    }

    async fn invoke<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
    ) -> redis::RedisResult<T> {
        match self {
            Self::Plain(conn) => script.invoke_async(&mut conn.clone()).await,
            Self::Managed(conn) => script.invoke_async(&mut conn.clone()).await,
        }
    }
}

/// A held floor lock: its Redis key and token (and the guarded floor's waiting marks).
#[derive(Debug)]
pub(crate) struct FloorGuard {
    pub(crate) key: String,
    pub(crate) token: String,
    marks: Option<String>,
}

/// A 128-bit random token, as the kit makes them.
pub(crate) fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl Floor {
    pub(crate) async fn connect(
        url: &str,
        prefix: String,
        lease_ms: u64,
        retry: Duration,
    ) -> redis::RedisResult<Self> {
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Self {
            conn: Conn::Plain(conn),
            prefix,
            lease_ms,
            retry,
            guarded: None,
        })
    }

    /// The floor with the kit's five guarantees (see the module's documentation), on a
    /// `ConnectionManager` with the kit's timeouts and reconnect retries.
    pub(crate) async fn connect_guarded(
        url: &str,
        prefix: String,
        lease_ms: u64,
        retry: Duration,
    ) -> redis::RedisResult<Self> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_with_config(redis::Client::open(url)?, config).await?;
        // The kit's holder name: the host's name (the kernel's) and the process id.
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "localhost".to_owned());
        Ok(Self {
            conn: Conn::Managed(conn),
            prefix,
            lease_ms,
            retry,
            guarded: Some(format!("{host}:{}", std::process::id())),
        })
    }

    /// The lock's Redis name and, guarded, its waiting marks' name.
    fn names(&self, key: &str) -> (String, Option<String>) {
        if self.guarded.is_none() {
            return (format!("{}{key}", self.prefix), None);
        }
        let digest = sha1::Sha1::digest(key.as_bytes());
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&digest[..8]);
        let tag = u64::from_be_bytes(tag);
        let prefix = &self.prefix;
        (
            format!("{prefix}{{{tag:016x}}}:lock:{key}"),
            Some(format!("{prefix}{{{tag:016x}}}:waiters:{key}")),
        )
    }

    /// `SET NX PX`; the guarded floor's call ends by `bound`.
    async fn set_nx(&self, key: &str, token: &str, bound: Instant) -> redis::RedisResult<bool> {
        let mut set = redis::cmd("SET");
        set.arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(self.lease_ms);
        let reply: redis::Value = if self.guarded.is_some() {
            tokio::time::timeout_at(bound, self.conn.query(&set))
                .await
                .map_err(|_| {
                    redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
                })??
        } else {
            self.conn.query(&set).await?
        };
        Ok(!matches!(reply, redis::Value::Nil))
    }

    /// Acquires `key`, busy-retrying `SET NX` until `wait` has passed (`ZERO`: one try).
    /// `Ok(None)` when the wait ran out.
    pub(crate) async fn lock(
        &self,
        key: &str,
        wait: Duration,
    ) -> redis::RedisResult<Option<FloorGuard>> {
        let started = Instant::now();
        let deadline = started + wait;
        let bound = deadline.max(started + COMMAND_TIMEOUT);
        let (key, marks) = self.names(key);
        let mut token = token();
        if let Some(holder) = &self.guarded {
            token.push('|');
            token.push_str(holder);
        }
        loop {
            if self.set_nx(&key, &token, bound).await? {
                return Ok(Some(FloorGuard { key, token, marks }));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            if !self.retry.is_zero() {
                tokio::time::sleep(self.retry).await;
            }
        }
    }

    /// Compare-and-delete; `true` when the key was still ours.
    pub(crate) async fn unlock(&self, guard: &FloorGuard) -> redis::RedisResult<bool> {
        let deleted: i64 = match &guard.marks {
            Some(marks) => {
                let mut release = RELEASE_WITH_MARKS.key(&guard.key);
                release.key(marks).arg(&guard.token);
                self.conn.invoke(&release).await?
            }
            None => {
                let mut release = RELEASE.key(&guard.key);
                release.arg(&guard.token);
                self.conn.invoke(&release).await?
            }
        };
        Ok(deleted == 1)
    }

    /// Compare-and-pexpire with the floor's lease; `true` when the key was still ours.
    pub(crate) async fn renew(&self, guard: &FloorGuard) -> redis::RedisResult<bool> {
        let mut renew = RENEW.key(&guard.key);
        renew.arg(&guard.token).arg(self.lease_ms);
        let renewed: i64 = self.conn.invoke(&renew).await?;
        Ok(renewed == 1)
    }
}
