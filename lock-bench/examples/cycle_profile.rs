//! W1/W2's uncontended cycle (acquire a fresh key, release it) for one side at a time, a
//! fixed number of cycles, for an instruction count under `valgrind --tool=callgrind` (of this
//! process, or of a `redis-server` run under it) or a `perf stat -e task-clock` (the
//! difference of two cycle counts cancels the start-up).
//!
//! `cargo build --release -p lock-bench --example cycle_profile`, then, with a `redis-server`
//! on `REDIS_URL`: `valgrind --tool=callgrind target/release/examples/cycle_profile kit 64 200`
//! (side; tasks; cycles per task). It prints the cycles per second of the run.
//!
//! Sides: `kit`, or `floor` (`src/floor.rs`'s acquire and release: `SET NX PX` with a random
//! token, compare-and-delete by `EVALSHA`, one multiplexed connection) with any of these added,
//! joined by `+` (`floor+names+holder`), each one thing the kit does for a guarantee, written
//! as a hand-rolled lock would:
//!
//! - `names`: the kit's Redis names (`<prefix>{<16 hex digits of the key's SHA-1>}:lock:<key>`),
//!   whose hash tag keeps a lock's keys in one Cluster slot;
//! - `holder`: the holder's name after the token in the stored value (`<token>|<host>:<pid>`),
//!   which answers "who holds it";
//! - `marks`: the release deletes the lock's waiting marks with it (`DEL lock marks`, the
//!   marks' name sent as a second key), which wakes waiters of other processes;
//! - `deadline`: the acquire's call bounded by a timer (tokio's `timeout`), which ends a wait
//!   on time however slow Redis is;
//! - `reconnect`: `redis`'s `ConnectionManager` (with the kit's timeouts and retries) instead
//!   of a plain multiplexed connection, which comes back after a dropped connection.
//!
//! The floor repeats `src/floor.rs`: the benchmark is a binary crate, with no library to share
//! it from.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use lock_core::Locker;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use sha1::Digest;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

/// `RELEASE` that deletes the waiting marks (KEYS[2]) with the lock.
static RELEASE_WITH_MARKS: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1], KEYS[2]) end return 0",
    )
});

/// What the floor adds of the kit's work (see the module's documentation).
#[derive(Debug, Clone, Copy, Default)]
struct Adds {
    names: bool,
    holder: bool,
    marks: bool,
    deadline: bool,
    reconnect: bool,
}

impl Adds {
    fn parse(side: &str) -> Result<Self, BoxError> {
        let mut adds = Self::default();
        for part in side.split('+').skip(1) {
            match part {
                "names" => adds.names = true,
                "holder" => adds.holder = true,
                "marks" => adds.marks = true,
                "deadline" => adds.deadline = true,
                "reconnect" => adds.reconnect = true,
                other => return Err(format!("unknown addition {other:?}").into()),
            }
        }
        Ok(adds)
    }
}

/// The floor's names for `key`: the lock's and, with `marks` only, its waiting marks' (built
/// only where they are sent, as the kit builds its names).
fn floor_names(prefix: &str, key: &str, adds: Adds) -> (String, Option<String>) {
    if !adds.names {
        let marks = adds.marks.then(|| format!("{prefix}:waiters:{key}"));
        return (format!("{prefix}:{key}"), marks);
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

async fn floor_cycle<C: ConnectionLike + Clone>(
    conn: &C,
    adds: Adds,
    prefix: &str,
    key: &str,
    holder: &str,
) -> Result<(), BoxError> {
    let (lock, marks) = floor_names(prefix, key, adds);
    let mut token = format!("{:032x}", rand::random::<u128>());
    if adds.holder {
        token.push('|');
        token.push_str(holder);
    }
    let mut set = redis::cmd("SET");
    set.arg(&lock).arg(&token).arg("NX").arg("PX").arg(30_000);
    let mut c = conn.clone();
    let reply: redis::Value = if adds.deadline {
        tokio::time::timeout(Duration::from_secs(10), set.query_async(&mut c))
            .await
            .map_err(|_| "deadline")??
    } else {
        set.query_async(&mut c).await?
    };
    if matches!(reply, redis::Value::Nil) {
        return Err(format!("fresh key {lock} was busy").into());
    }
    let _: i64 = if let Some(marks) = &marks {
        RELEASE_WITH_MARKS
            .key(&lock)
            .key(marks)
            .arg(&token)
            .invoke_async(&mut conn.clone())
            .await?
    } else {
        RELEASE
            .key(&lock)
            .arg(&token)
            .invoke_async(&mut conn.clone())
            .await?
    };
    Ok(())
}

async fn kit_cycle(locker: &Locker, key: String) -> Result<(), BoxError> {
    let guard = locker.lock(key).wait(Duration::from_secs(10)).await?;
    guard.release().await?;
    Ok(())
}

/// One side's connection.
#[derive(Clone)]
enum Side {
    Kit(Locker),
    Floor(redis::aio::MultiplexedConnection, Adds),
    Managed(ConnectionManager, Adds),
}

impl Side {
    async fn cycle(&self, prefix: &str, key: String, holder: &str) -> Result<(), BoxError> {
        match self {
            Self::Kit(locker) => kit_cycle(locker, key).await,
            Self::Floor(conn, adds) => floor_cycle(conn, *adds, prefix, &key, holder).await,
            Self::Managed(conn, adds) => floor_cycle(conn, *adds, prefix, &key, holder).await,
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map_or("kit", String::as_str).to_owned();
    let tasks: usize = args.get(2).map_or(Ok(64), |a| a.parse())?;
    let cycles: usize = args.get(3).map_or(Ok(200), |a| a.parse())?;
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let run = rand::random::<u32>();
    let prefix = format!("cycleprof:{run}");
    let holder = format!("{}:{}", "vm", std::process::id());
    let client = redis::Client::open(url.as_str())?;
    let side = if name == "kit" {
        Side::Kit(
            Locker::builder()
                .url(&url)
                .prefix(&prefix)
                .fence_retention(Duration::from_secs(120))
                .build()
                .await?,
        )
    } else if name == "floor" || name.starts_with("floor+") {
        let adds = Adds::parse(&name)?;
        if adds.reconnect {
            // The kit's: connect 5 s, command 3 s, two retries of a reconnect.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(5)))
                .set_response_timeout(Some(Duration::from_secs(3)))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_secs(1));
            Side::Managed(
                ConnectionManager::new_with_config(client, config).await?,
                adds,
            )
        } else {
            Side::Floor(client.get_multiplexed_async_connection().await?, adds)
        }
    } else {
        return Err(format!("unknown side {name:?}").into());
    };
    let started = Instant::now();
    let workers: Vec<_> = (0..tasks)
        .map(|t| {
            let (side, prefix, holder) = (side.clone(), prefix.clone(), holder.clone());
            tokio::spawn(async move {
                for i in 0..cycles {
                    side.cycle(&prefix, format!("t{t}:{i}"), &holder).await?;
                }
                Ok::<(), BoxError>(())
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    let n = tasks * cycles;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    println!("{name}: {n} cycles, {rate:.0} cycles/s");
    Ok(())
}
