//! The raw floor: what a hand-rolled Redis lock does with the `redis` crate and nothing else.
//!
//! Acquire is `SET key token NX PX lease`; waiting is busy-retrying that `SET NX` until it
//! succeeds or the wait runs out; release is a compare-and-delete script by `EVALSHA`; all on
//! one multiplexed connection. No reentrancy, no fencing, no wake-ups, no watchdog: this is the
//! cheapest correct-looking lock, the baseline the kit's overhead is measured against.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Script;
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

/// A hand-rolled lock client.
#[derive(Clone)]
pub(crate) struct Floor {
    conn: MultiplexedConnection,
    prefix: String,
    lease_ms: u64,
    retry: Duration,
}

/// A held floor lock: its Redis key and token.
#[derive(Debug)]
pub(crate) struct FloorGuard {
    pub(crate) key: String,
    pub(crate) token: String,
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
            conn,
            prefix,
            lease_ms,
            retry,
        })
    }

    async fn set_nx(&self, key: &str, token: &str) -> redis::RedisResult<bool> {
        let reply: redis::Value = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(self.lease_ms)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(!matches!(reply, redis::Value::Nil))
    }

    /// Acquires `key`, busy-retrying `SET NX` until `wait` has passed (`ZERO`: one try).
    /// `Ok(None)` when the wait ran out.
    pub(crate) async fn lock(
        &self,
        key: &str,
        wait: Duration,
    ) -> redis::RedisResult<Option<FloorGuard>> {
        let deadline = Instant::now() + wait;
        let key = format!("{}{key}", self.prefix);
        let token = token();
        loop {
            if self.set_nx(&key, &token).await? {
                return Ok(Some(FloorGuard { key, token }));
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
        let deleted: i64 = RELEASE
            .key(&guard.key)
            .arg(&guard.token)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(deleted == 1)
    }

    /// Compare-and-pexpire with the floor's lease; `true` when the key was still ours.
    pub(crate) async fn renew(&self, guard: &FloorGuard) -> redis::RedisResult<bool> {
        let renewed: i64 = RENEW
            .key(&guard.key)
            .arg(&guard.token)
            .arg(self.lease_ms)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(renewed == 1)
    }
}
