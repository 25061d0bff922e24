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
//! as a hand-rolled lock would (`src/floor.rs`'s `Guarantees`):
//!
//! - `names`: the kit's Redis names (`<prefix>{<16 hex digits of the key's SHA-1>}:lock:<key>`),
//!   whose hash tag keeps a lock's keys in one Cluster slot;
//! - `holder`: the holder's name after the token in the stored value (`<token>|<host>:<pid>`),
//!   which answers "who holds it";
//! - `marks`: the release deletes the lock's waiting marks with it (`DEL lock marks`, the
//!   marks' name sent as a second key), which wakes waiters of other processes;
//! - `deadline`: the acquire's call bounded by a timer (tokio's `timeout_at`), which ends a wait
//!   on time however slow Redis is;
//! - `reconnect`: `redis`'s `ConnectionManager` (with the kit's timeouts and retries) instead
//!   of a plain multiplexed connection, which comes back after a dropped connection.
//!
//! All five are lock-bench's W1 side "floor+guarantees". The floor is the benchmark's own
//! `src/floor.rs`, taken as a module (the benchmark is a binary crate, with no library to
//! share it from).

use std::time::{Duration, Instant};

use lock_core::Locker;

// The benchmark's other uses of the floor (its renewal, W1's plain connect) are not this one's.
#[allow(dead_code)]
#[path = "../src/floor.rs"]
mod floor;

use floor::{Floor, Guarantees};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lease of every side's locks.
const LEASE: Duration = Duration::from_secs(30);
/// The wait of every side's acquires (its keys are fresh: never used).
const WAIT: Duration = Duration::from_secs(10);

/// One side.
#[derive(Clone)]
enum Side {
    Kit(Locker),
    Floor(Floor),
}

impl Side {
    async fn cycle(&self, key: String) -> Result<(), BoxError> {
        match self {
            Self::Kit(locker) => {
                let guard = locker.lock(key).wait(WAIT).await?;
                guard.release().await?;
            }
            Self::Floor(floor) => {
                let Some(guard) = floor.lock(&key, WAIT).await? else {
                    return Err(format!("fresh key {key} was busy").into());
                };
                floor.unlock(&guard).await?;
            }
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map_or("kit", String::as_str).to_owned();
    let tasks: usize = args.get(2).map_or(Ok(64), |a| a.parse())?;
    let cycles: usize = args.get(3).map_or(Ok(200), |a| a.parse())?;
    let url = std::env::var("REDIS_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let run = rand::random::<u32>();
    let prefix = format!("cycleprof:{run}");
    let side = if name == "kit" {
        Side::Kit(
            Locker::builder()
                .url(&url)
                .prefix(&prefix)
                .fence_retention(Duration::from_secs(120))
                .build()
                .await?,
        )
    } else if let Some(adds) = name.strip_prefix("floor") {
        let adds = match adds {
            "" => Guarantees::default(),
            adds => Guarantees::parse(adds.strip_prefix('+').ok_or("a side is floor+...")?)?,
        };
        let (prefix, lease_ms) = (format!("{prefix}:"), LEASE.as_millis() as u64);
        Side::Floor(Floor::connect_with(&url, prefix, lease_ms, Duration::ZERO, adds).await?)
    } else {
        return Err(format!("unknown side {name:?}").into());
    };
    let started = Instant::now();
    let workers: Vec<_> = (0..tasks)
        .map(|t| {
            let side = side.clone();
            tokio::spawn(async move {
                for i in 0..cycles {
                    side.cycle(format!("t{t}:{i}")).await?;
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
