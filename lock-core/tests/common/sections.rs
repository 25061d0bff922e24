//! The lock cycles of the chaos soaks (`soak.rs`, `soak_sentinel.rs`): short sections on
//! `k0`.. and held ones ([`holds`]: long ones on `h0`.., and those `soak.rs` adds), each
//! through the double-holder oracle, which also records what each release answered.
#![allow(dead_code, unreachable_pub)]

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::{LockError, LockGuard, Locker};
use lock_testkit::oracle::{monotonic_ns, Entry, Kind, Oracle, Outcome, Release};
use rand::Rng;

/// What the tasks of a worker lock, and how.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Lock keys of the short sections: `k0`..
    pub keys: usize,
    /// Lock keys of the long sections: `h0`..
    pub hold_keys: usize,
    /// How long a long section holds its lock, in milliseconds.
    pub hold_ms: RangeInclusive<u64>,
    /// Longest wait of one acquire.
    pub wait: Duration,
    /// For the control: every n-th short cycle of a task enters without the lock (0: never).
    pub unlocked_every: u64,
}

/// Acquire latencies in quarter-octave buckets of microseconds.
pub const BUCKETS: usize = 112;

pub fn bucket(d: Duration) -> usize {
    let us = d.as_micros().max(1) as f64;
    ((us.log2() * 4.0) as usize).min(BUCKETS - 1)
}

pub fn bucket_upper(b: usize) -> Duration {
    Duration::from_micros(2f64.powf((b + 1) as f64 / 4.0) as u64)
}

/// A worker's counters, shared by its tasks.
#[derive(Default)]
pub struct WorkerStats {
    pub cycles: AtomicU64,
    pub completed: AtomicU64,
    pub lost: AtomicU64,
    pub release_failed: AtomicU64,
    pub busy: AtomicU64,
    pub acquire_errors: AtomicU64,
    pub writes: AtomicU64,
    pub writes_rejected: AtomicU64,
    pub resets: AtomicU64,
    /// Sections entered without asking for a fencing token.
    pub untokened: AtomicU64,
    /// Sections that extended their lock past the lease, and extensions that failed (not
    /// counting a lost lock).
    pub extended: AtomicU64,
    pub extend_failed: AtomicU64,
    pub latency: Mutex<Vec<u64>>,
}

impl WorkerStats {
    /// Zero counters and an empty latency histogram.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            latency: Mutex::new(vec![0; BUCKETS]),
            ..Self::default()
        })
    }
}

/// Acquires `key` and enters the oracle with the guard's fencing token, or with none
/// (`tokened` false: a user that never asks for one; such a holder learns nothing from
/// Redis before its first renewal); `None` (counted as busy or as an acquire error) when the
/// lock was not had.
async fn acquire_and_enter(
    locker: &Locker,
    oracle: &Oracle,
    stats: &WorkerStats,
    key: &str,
    wait: Duration,
    tokened: bool,
) -> Option<(LockGuard, Entry)> {
    let started = Instant::now();
    let guard = match locker.lock(key).wait(wait).await {
        Ok(guard) => guard,
        Err(e) if e.is_busy() => {
            stats.busy.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Err(_) => {
            stats.acquire_errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(10)).await;
            return None;
        }
    };
    // The grant stamp, before the token's round trip: a wipe landing in that round trip took
    // this holder's lock, and the oracle must know it was already ours.
    let granted_at = monotonic_ns();
    stats.latency.lock().unwrap()[bucket(started.elapsed())] += 1;
    // Under faults the token's round trip can fail like the acquire's (or find the lock lost):
    // no section then.
    let fence = if tokened {
        let Ok(fence) = guard.fencing_token().await else {
            stats.acquire_errors.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        fence
    } else {
        stats.untokened.fetch_add(1, Ordering::Relaxed);
        0
    };
    let entry = oracle
        .enter_granted(key, Kind::Exclusive, fence, granted_at, || guard.is_held())
        .await
        .expect("referee enter");
    Some((guard, entry))
}

/// What a release answered, for the oracle.
fn answer(result: &Result<(), LockError>) -> Release {
    match result {
        Ok(()) => Release::Ok,
        Err(e) if e.is_lost() => Release::Lost,
        Err(_) => Release::Failed,
    }
}

/// Ends a section: leaves the oracle (the exit stamped before the release is sent),
/// releases, records the release's answer and the outcome, counts it.
async fn end_section(oracle: &Oracle, stats: &WorkerStats, guard: LockGuard, mut entry: Entry) {
    oracle.leave(&mut entry).await.expect("referee leave");
    let released = guard.release().await;
    entry.record_release(answer(&released));
    let outcome = match released {
        _ if entry.lost_at().is_some() => Outcome::Lost,
        Ok(()) => Outcome::Completed,
        Err(e) if e.is_lost() => Outcome::Lost,
        Err(_) => Outcome::ReleaseFailed,
    };
    let counter = match outcome {
        Outcome::Completed => &stats.completed,
        Outcome::Lost => &stats.lost,
        _ => &stats.release_failed,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    stats.cycles.fetch_add(1, Ordering::Relaxed);
    oracle.finish(entry, outcome).await.expect("referee finish");
}

/// One task's lock cycles until `until`.
pub async fn cycles(
    locker: Locker,
    oracle: Oracle,
    stats: Arc<WorkerStats>,
    until: u64,
    workload: Workload,
) {
    let unlocked_every = workload.unlocked_every;
    let mut n = 0u64;
    while monotonic_ns() < until {
        n += 1;
        let (key, write, work) = {
            let mut rng = rand::rng();
            (
                format!("k{}", rng.random_range(0..workload.keys)),
                rng.random_ratio(1, 4),
                rng.random_range(0..8u8),
            )
        };
        if unlocked_every > 0 && n.is_multiple_of(unlocked_every) {
            // The control's broken client: no lock, a made-up token.
            let mut entry = oracle.enter(&key, 1, || true).await.expect("referee");
            tokio::time::sleep(Duration::from_millis(2)).await;
            oracle.write(&entry).await.expect("referee");
            entry.observe(|| true);
            oracle.leave(&mut entry).await.expect("referee");
            // ... and a release that claims success.
            entry.record_release(Release::Ok);
            oracle
                .finish(entry, Outcome::Completed)
                .await
                .expect("referee");
            continue;
        }
        let Some((guard, mut entry)) =
            acquire_and_enter(&locker, &oracle, &stats, &key, workload.wait, true).await
        else {
            continue;
        };

        // The critical section's work, abandoned when the lock is reported lost.
        let lost_inside = tokio::select! {
            biased;
            () = guard.lost() => true,
            () = async {
                match work {
                    0 => tokio::time::sleep(Duration::from_millis(1)).await,
                    1 => tokio::time::sleep(Duration::from_micros(200)).await,
                    _ => tokio::task::yield_now().await,
                }
            } => false,
        };
        if lost_inside {
            entry.mark_lost();
        }
        // Every fourth section writes to the fenced resource, and so does every holder that
        // finds its lock gone here: a holder paused just before its write sends it when it
        // resumes, before it could look (Kleppmann). The fence must reject those.
        let stale = !entry.observe(|| guard.is_held());
        if write || stale {
            let accepted = oracle.write(&entry).await.expect("referee write");
            stats.writes.fetch_add(1, Ordering::Relaxed);
            if !accepted {
                stats.writes_rejected.fetch_add(1, Ordering::Relaxed);
            }
        }
        entry.observe(|| guard.is_held());
        end_section(&oracle, &stats, guard, entry).await;
    }
}

/// Held sections on the keys `<stem>0`..: each holds its lock for a while, confirming
/// `is_held()` every `check_every` and writing through the fence every `write_every` checks,
/// as a holder that checks its lock before each step of a job. A loss ends the section (after
/// one more write, which the fence must reject).
#[derive(Debug, Clone)]
pub struct Holds {
    /// The keys: `<stem>0`..`<stem>{keys - 1}`.
    pub stem: &'static str,
    pub keys: usize,
    /// How long a section holds its lock, in milliseconds.
    pub hold_ms: RangeInclusive<u64>,
    pub check_every: Duration,
    pub write_every: u64,
    /// One section in this many enters without asking for a fencing token (0: none), and
    /// then never writes: such a holder is told nothing by Redis before its first renewal.
    pub untokened_one_in: u32,
    /// Each section extends its lock right after entering by this many leases (`None`: no
    /// extension), then keeps working past the lease.
    pub extend_leases: Option<RangeInclusive<u32>>,
    /// The watchdog lease the extensions are counted in.
    pub lease: Duration,
    /// Longest wait of one acquire.
    pub wait: Duration,
}

/// One task's held sections until `until` (see [`Holds`]).
pub async fn holds(
    locker: Locker,
    oracle: Oracle,
    stats: Arc<WorkerStats>,
    until: u64,
    spec: Holds,
) {
    while monotonic_ns() < until {
        let (key, hold, tokened, extend) = {
            let mut rng = rand::rng();
            (
                format!("{}{}", spec.stem, rng.random_range(0..spec.keys)),
                Duration::from_millis(rng.random_range(spec.hold_ms.clone())),
                spec.untokened_one_in == 0 || !rng.random_ratio(1, spec.untokened_one_in),
                spec.extend_leases
                    .clone()
                    .map(|leases| spec.lease * rng.random_range(leases)),
            )
        };
        let Some((guard, mut entry)) =
            acquire_and_enter(&locker, &oracle, &stats, &key, spec.wait, tokened).await
        else {
            continue;
        };
        let held_since = Instant::now();
        if let Some(by) = extend {
            // Past the lease: the lock must stay ours (or be reported lost) for all of it,
            // whatever the watchdog renews with meanwhile.
            match guard.extend(by).await {
                Ok(()) => stats.extended.fetch_add(1, Ordering::Relaxed),
                Err(e) if e.is_lost() => {
                    entry.mark_lost();
                    0
                }
                Err(_) => stats.extend_failed.fetch_add(1, Ordering::Relaxed),
            };
        }
        let mut step = 0u64;
        while held_since.elapsed() < hold {
            let lost = tokio::select! {
                biased;
                () = guard.lost() => true,
                () = tokio::time::sleep(spec.check_every) => false,
            };
            if lost {
                entry.mark_lost();
            }
            step += 1;
            let held = entry.observe(|| guard.is_held());
            if tokened && (!held || step.is_multiple_of(spec.write_every)) {
                let accepted = oracle.write(&entry).await.expect("referee write");
                stats.writes.fetch_add(1, Ordering::Relaxed);
                if !accepted {
                    stats.writes_rejected.fetch_add(1, Ordering::Relaxed);
                }
            }
            if !held {
                break;
            }
        }
        entry.observe(|| guard.is_held());
        end_section(&oracle, &stats, guard, entry).await;
    }
}

/// One task's long sections until `until`: a lock on `h0`.. held for `workload.hold_ms`
/// (past the lease, so the watchdog renews it), confirming `is_held()` every 10 ms and writing
/// to the fenced resource every 100 ms ([`holds`], every section with a token).
pub async fn long_holds(
    locker: Locker,
    oracle: Oracle,
    stats: Arc<WorkerStats>,
    until: u64,
    workload: Workload,
) {
    let spec = Holds {
        stem: "h",
        keys: workload.hold_keys,
        hold_ms: workload.hold_ms,
        check_every: Duration::from_millis(10),
        write_every: 10,
        untokened_one_in: 0,
        extend_leases: None,
        lease: Duration::ZERO,
        wait: workload.wait,
    };
    holds(locker, oracle, stats, until, spec).await;
}

/// The upper bound of the bucket holding the `p` quantile of `hist`.
pub fn percentile(hist: &[u64], p: f64) -> Duration {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return Duration::ZERO;
    }
    let rank = ((total as f64) * p).ceil() as u64;
    let mut seen = 0;
    for (b, n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return bucket_upper(b);
        }
    }
    bucket_upper(BUCKETS - 1)
}
