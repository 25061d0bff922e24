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
//!
//! Each of the five can also be added alone ([`Guarantees`], [`Floor::connect_with`]):
//! `examples/cycle_profile.rs` takes this file as a module of its own and adds them one at a
//! time, to count what each costs.

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

/// The kit's command timeout: with the deadline, the floor's acquire calls end by the wait's
/// deadline, or this long after the acquire started when the wait is shorter (one try, as the
/// kit's).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(3);

/// What the floor adds of the kit's work (see the module's documentation), each one thing the
/// kit does for a guarantee.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Guarantees {
    /// The kit's Redis names: `<prefix>{<16 hex digits of the key's SHA-1>}:lock:<key>`.
    pub(crate) names: bool,
    /// `<token>|<host>:<pid>` as the stored value.
    pub(crate) holder: bool,
    /// The release deletes the lock's waiting marks (a second key) with it.
    pub(crate) marks: bool,
    /// The acquire's calls end by the wait's deadline (a timer).
    pub(crate) deadline: bool,
    /// `redis`'s `ConnectionManager` with the kit's timeouts and reconnect retries.
    pub(crate) reconnect: bool,
}

impl Guarantees {
    /// All five: the floor with the kit's guarantees.
    pub(crate) const ALL: Self = Self {
        names: true,
        holder: true,
        marks: true,
        deadline: true,
        reconnect: true,
    };

    /// The ones named in `names`, joined by `+` (`names+holder`); `Err` with an unknown name.
    #[cfg_attr(not(test), allow(dead_code))] // the benchmark adds all or none
    pub(crate) fn parse(names: &str) -> Result<Self, String> {
        let mut adds = Self::default();
        for name in names.split('+').filter(|n| !n.is_empty()) {
            let add = match name {
                "names" => &mut adds.names,
                "holder" => &mut adds.holder,
                "marks" => &mut adds.marks,
                "deadline" => &mut adds.deadline,
                "reconnect" => &mut adds.reconnect,
                other => return Err(format!("unknown guarantee {other:?}")),
            };
            *add = true;
        }
        Ok(adds)
    }
}

/// A hand-rolled lock client.
#[derive(Clone)]
pub(crate) struct Floor {
    conn: Conn,
    prefix: String,
    lease_ms: u64,
    retry: Duration,
    adds: Guarantees,
    /// With [`Guarantees::holder`]: the holder's name.
    holder: Option<String>,
}

/// The floor's connection: a plain multiplexed one, or (with [`Guarantees::reconnect`]) a
/// `ConnectionManager`.
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

/// A held floor lock: its Redis key and token (and, with [`Guarantees::marks`], its waiting
/// marks' name).
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
        Self::connect_with(url, prefix, lease_ms, retry, Guarantees::default()).await
    }

    /// The floor with the kit's five guarantees (see the module's documentation), on a
    /// `ConnectionManager` with the kit's timeouts and reconnect retries.
    pub(crate) async fn connect_guarded(
        url: &str,
        prefix: String,
        lease_ms: u64,
        retry: Duration,
    ) -> redis::RedisResult<Self> {
        Self::connect_with(url, prefix, lease_ms, retry, Guarantees::ALL).await
    }

    /// The floor with `adds` of the kit's guarantees.
    pub(crate) async fn connect_with(
        url: &str,
        prefix: String,
        lease_ms: u64,
        retry: Duration,
        adds: Guarantees,
    ) -> redis::RedisResult<Self> {
        let client = redis::Client::open(url)?;
        let conn = if adds.reconnect {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(5)))
                .set_response_timeout(Some(COMMAND_TIMEOUT))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_secs(1));
            Conn::Managed(ConnectionManager::new_with_config(client, config).await?)
        } else {
            Conn::Plain(client.get_multiplexed_async_connection().await?)
        };
        // The kit's holder name: the host's name (the kernel's) and the process id.
        let holder = adds.holder.then(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "localhost".to_owned());
            format!("{host}:{}", std::process::id())
        });
        Ok(Self {
            conn,
            prefix,
            lease_ms,
            retry,
            adds,
            holder,
        })
    }

    /// `SET NX PX`; with the deadline, the call ends by `bound`.
    async fn set_nx(&self, key: &str, token: &str, bound: Instant) -> redis::RedisResult<bool> {
        let mut set = redis::cmd("SET");
        set.arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(self.lease_ms);
        let reply: redis::Value = if self.adds.deadline {
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
        let (key, marks) = names(&self.prefix, key, self.adds);
        let mut token = token();
        if let Some(holder) = &self.holder {
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

/// The Redis name of `key`'s lock under `prefix` and, with the marks, its waiting marks' name
/// (built only where they are sent, as the kit builds its names).
fn names(prefix: &str, key: &str, adds: Guarantees) -> (String, Option<String>) {
    if !adds.names {
        let marks = adds.marks.then(|| format!("{prefix}waiters:{key}"));
        return (format!("{prefix}{key}"), marks);
    }
    let digest = sha1::Sha1::digest(key.as_bytes());
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&digest[..8]);
    let tag = u64::from_be_bytes(tag);
    let marks = adds
        .marks
        .then(|| format!("{prefix}{{{tag:016x}}}:waiters:{key}"));
    (format!("{prefix}{{{tag:016x}}}:lock:{key}"), marks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guarantees_parse_by_name() {
        let adds = Guarantees::parse("names+deadline").expect("known names");
        assert!(adds.names && adds.deadline);
        assert!(!(adds.holder || adds.marks || adds.reconnect));
        assert_eq!(Guarantees::parse(""), Ok(Guarantees::default()));
        assert_eq!(
            Guarantees::parse("names+holder+marks+deadline+reconnect"),
            Ok(Guarantees::ALL)
        );
        assert!(Guarantees::parse("names+fencing").is_err());
    }

    #[test]
    fn names_follow_the_kits_only_with_names() {
        let plain = Guarantees::default();
        assert_eq!(names("p:", "k", plain), ("p:k".to_owned(), None));
        let marks = Guarantees {
            marks: true,
            ..plain
        };
        assert_eq!(names("p:", "k", marks).1.as_deref(), Some("p:waiters:k"));
        let (lock, marks) = names("p:", "k", Guarantees::ALL);
        // SHA-1("k") starts 13fbd79c3d390e5d.
        assert_eq!(lock, "p:{13fbd79c3d390e5d}:lock:k");
        assert_eq!(marks.as_deref(), Some("p:{13fbd79c3d390e5d}:waiters:k"));
    }
}
