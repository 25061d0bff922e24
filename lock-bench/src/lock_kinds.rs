//! W9 (read-write lock) and W10 (multi-key lock): what the other lock kinds cost and gain against
//! the mutex, and against the floor doing the same shape by hand.
//!
//! W9: tasks loop on one key for a fixed time; each cycle reads (90 %) or writes, holding the
//! lock 1 ms. Three arms alternate: the kit's read/write lock (readers share), the kit's mutex
//! for every cycle, and the floor's mutex for every cycle (a hand-rolled lock has no read side).
//!
//! W10: two keys at once. Uncontended: one task, acquire+release of fresh key pairs. Contended:
//! transfers between random pairs of a few accounts, naming the keys in random order, 1 ms
//! holds. Arms: the kit's `lock_all`, the kit's mutex on each key one after the other (sorted,
//! so they cannot deadlock), and the floor doing the same with `SET NX` (sorted, busy retry).

use std::time::Duration;

use lock_core::{LockError, MultiLockGuard};
use rand::Rng;
use tokio::time::Instant;

use crate::hot_key::hold;
use crate::lock::{BoxError, Held, Lock};
use crate::report::{Check, Row};
use crate::stats::percentile;
use crate::{Ctx, Side};

/// The lock of one W9 arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rw {
    /// The kit's read lock for reads, its write lock for writes.
    ReadWrite,
    /// The kit's mutex for every cycle.
    KitMutex,
    /// The floor's mutex for every cycle.
    Floor,
}

impl Rw {
    const ALL: [Self; 3] = [Self::ReadWrite, Self::KitMutex, Self::Floor];

    fn side(self) -> Side {
        match self {
            Self::ReadWrite | Self::KitMutex => Side::Kit,
            Self::Floor => Side::Floor,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::ReadWrite => "read/write",
            Self::KitMutex => "kit mutex",
            Self::Floor => "floor mutex",
        }
    }
}

/// What the tasks of one W9 run did.
#[derive(Debug, Default)]
struct RwOutcome {
    reads: u64,
    writes: u64,
    /// How long each write waited for its lock, ns.
    write_waits: Vec<u64>,
    failed: u64,
    first_error: Option<String>,
}

impl RwOutcome {
    fn failed(&mut self, e: impl ToString) {
        self.failed += 1;
        self.first_error.get_or_insert_with(|| e.to_string());
    }
}

/// One lock cycle of `arm`: acquire (read or write), hold, release.
async fn rw_cycle(
    arm: Rw,
    lock: &Lock,
    write: bool,
    hold_for: Duration,
    wait: Duration,
) -> Result<bool, BoxError> {
    const KEY: &str = "catalogue";
    match (arm, lock) {
        (Rw::ReadWrite, Lock::Kit(locker)) => {
            let acquire = if write {
                locker.write(KEY)
            } else {
                locker.read(KEY)
            };
            let guard = match acquire.wait(wait).await {
                Ok(guard) => guard,
                Err(LockError::Busy { .. }) => return Ok(false),
                Err(e) => return Err(e.into()),
            };
            hold(hold_for).await;
            guard.release().await?;
            Ok(true)
        }
        _ => {
            let Some(held) = lock.acquire(KEY, wait).await? else {
                return Ok(false);
            };
            hold(hold_for).await;
            lock.release(held).await?;
            Ok(true)
        }
    }
}

async fn rw_run(ctx: &Ctx, arm: Rw, lock: &Lock) -> Result<(f64, RwOutcome), BoxError> {
    let p = &ctx.params;
    let (hold_for, wait) = (Duration::from_micros(p.w9_hold_us), ctx.wait());
    let read_pct = p.w9_read_pct.min(100);
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(p.w9_secs);
    let tasks: Vec<_> = (0..p.w9_tasks)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move {
                let mut out = RwOutcome::default();
                while Instant::now() < end {
                    let write = rand::rng().random_range(0..100u32) >= read_pct;
                    let asked = Instant::now();
                    match rw_cycle(arm, &lock, write, hold_for, wait).await {
                        Ok(true) if write => {
                            out.writes += 1;
                            // The wait ends where the hold begins: hold and release are fixed.
                            let cycle = asked.elapsed().saturating_sub(hold_for);
                            out.write_waits.push(cycle.as_nanos() as u64);
                        }
                        Ok(true) => out.reads += 1,
                        Ok(false) => out.failed("wait ran out"),
                        Err(e) => {
                            out.failed(e);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                out
            })
        })
        .collect();
    let mut all = RwOutcome::default();
    for task in tasks {
        let out = task.await?;
        all.reads += out.reads;
        all.writes += out.writes;
        all.write_waits.extend(out.write_waits);
        all.failed += out.failed;
        if all.first_error.is_none() {
            all.first_error = out.first_error;
        }
    }
    Ok((started.elapsed().as_secs_f64(), all))
}

/// W9: the read-write lock against the mutex for all, kit and floor.
pub(crate) async fn read_write(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    // [arm] -> per-run values
    let (mut rate, mut write_p99, mut failed) = (
        [vec![], vec![], vec![]],
        [vec![], vec![], vec![]],
        [vec![], vec![], vec![]],
    );
    for rep in 0..p.reps {
        for (a, arm) in Rw::ALL.into_iter().enumerate() {
            let prefix = format!("{}{}:", ctx.prefix("w9", rep, arm.side()), a);
            let lock = ctx.open(arm.side(), &prefix).await?;
            let (secs, mut out) = rw_run(ctx, arm, &lock).await?;
            let r = (out.reads + out.writes) as f64 / secs;
            let w109 = percentile(&mut out.write_waits, 99.0) / 1e6;
            ctx.progress(
                "W9",
                rep,
                arm.side(),
                &format!(
                    "{}: {r:.0} acquisitions/s ({} reads, {} writes), write wait p99 {w109:.1} ms, {} failed{}",
                    arm.name(),
                    out.reads,
                    out.writes,
                    out.failed,
                    out.first_error.map(|e| format!(" ({e})")).unwrap_or_default()
                ),
            );
            rate[a].push(r);
            write_p99[a].push(w109);
            failed[a].push(out.failed as f64);
        }
    }
    let w = format!(
        "W9 read-write, {} tasks, {} % reads, {} ms holds",
        p.w9_tasks,
        p.w9_read_pct.min(100),
        p.w9_hold_us as f64 / 1e3
    );
    let [rw_rate, mutex_rate, floor_rate] = rate;
    let gain: Vec<f64> = rw_rate
        .iter()
        .zip(&mutex_rate)
        .map(|(r, m)| r / m)
        .collect();
    let [rw_w109, mutex_w109, floor_w109] = write_p99;
    let [rw_failed, mutex_failed, _] = failed;
    let kit_failed: Vec<f64> = rw_failed
        .iter()
        .zip(&mutex_failed)
        .map(|(a, b)| a + b)
        .collect();
    Ok(vec![
        Row::new(
            &w,
            "acquisitions/s, read/write lock",
            "",
            rw_rate,
            vec![],
            Check::Info,
        )
        .floor_note("no read lock"),
        Row::new(
            &w,
            "acquisitions/s, mutex for all",
            "",
            mutex_rate,
            floor_rate,
            Check::Info,
        ),
        // The point of the lock kind: readers holding together get more done than one at a
        // time.
        Row::new(
            &w,
            "read/write ÷ mutex acquisitions/s",
            "x",
            gain,
            vec![],
            Check::KitAbove(1.0),
        )
        .target("> 1 (readers share)")
        .floor_note("no read lock"),
        Row::new(
            &w,
            "write wait p99, read/write lock",
            "ms",
            rw_w109,
            vec![],
            Check::Info,
        )
        .floor_note("no read lock"),
        Row::new(
            &w,
            "write wait p99, mutex for all",
            "ms",
            mutex_w109,
            floor_w109,
            Check::Info,
        ),
        Row::new(
            &w,
            "failed acquires (kit)",
            "",
            kit_failed,
            vec![],
            Check::KitAllEqual(0.0),
        ),
    ])
}

/// The lock of one W10 arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pair {
    /// The kit's `lock_all` of both keys.
    LockAll,
    /// The kit's mutex on each key, one after the other in sorted order.
    KitSequential,
    /// The floor's `SET NX` on each key, one after the other in sorted order.
    Floor,
}

impl Pair {
    const ALL: [Self; 3] = [Self::LockAll, Self::KitSequential, Self::Floor];

    fn side(self) -> Side {
        match self {
            Self::LockAll | Self::KitSequential => Side::Kit,
            Self::Floor => Side::Floor,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::LockAll => "lock_all",
            Self::KitSequential => "kit 2 x lock",
            Self::Floor => "floor 2 x SET NX",
        }
    }
}

/// Two held keys.
enum HeldPair {
    All(MultiLockGuard),
    Each(Held, Held),
}

/// Acquires both `keys` with `arm`; `None` when the wait ran out (nothing is left held).
async fn acquire_pair(
    arm: Pair,
    lock: &Lock,
    keys: [&str; 2],
    wait: Duration,
) -> Result<Option<HeldPair>, BoxError> {
    if let (Pair::LockAll, Lock::Kit(locker)) = (arm, lock) {
        return match locker.lock_all(keys).wait(wait).await {
            Ok(guard) => Ok(Some(HeldPair::All(guard))),
            Err(LockError::Busy { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        };
    }
    let mut sorted = keys;
    sorted.sort_unstable();
    let deadline = Instant::now() + wait;
    let Some(first) = lock.acquire(sorted[0], wait).await? else {
        return Ok(None);
    };
    let left = deadline.saturating_duration_since(Instant::now());
    match lock.acquire(sorted[1], left).await {
        Ok(Some(second)) => Ok(Some(HeldPair::Each(first, second))),
        Ok(None) => {
            lock.release(first).await?;
            Ok(None)
        }
        Err(e) => {
            let _ = lock.release(first).await;
            Err(e)
        }
    }
}

async fn release_pair(lock: &Lock, held: HeldPair) -> Result<(), BoxError> {
    match held {
        HeldPair::All(guard) => Ok(guard.release().await?),
        HeldPair::Each(first, second) => {
            lock.release(second).await?;
            lock.release(first).await
        }
    }
}

/// W10: two keys at once, uncontended and contended.
pub(crate) async fn multi_key(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    let wait = ctx.wait();
    let (mut p50, mut rate, mut failed) = (
        [vec![], vec![], vec![]],
        [vec![], vec![], vec![]],
        [vec![], vec![], vec![]],
    );
    for rep in 0..p.reps {
        for (a, arm) in Pair::ALL.into_iter().enumerate() {
            let prefix = format!("{}{}:", ctx.prefix("w10", rep, arm.side()), a);
            let lock = ctx.open(arm.side(), &prefix).await?;
            // Uncontended: fresh pairs, one task.
            let pairs: Vec<[String; 2]> = (0..p.w10_cycles)
                .map(|i| [format!("to:{i}"), format!("from:{i}")])
                .collect();
            let mut latencies = Vec::with_capacity(pairs.len());
            for [x, y] in &pairs {
                let t = Instant::now();
                let held = acquire_pair(arm, &lock, [x, y], wait)
                    .await?
                    .ok_or_else(|| format!("fresh keys {x}, {y} were busy"))?;
                release_pair(&lock, held).await?;
                latencies.push(t.elapsed().as_nanos() as u64);
            }
            let lat = percentile(&mut latencies, 50.0) / 1e3;

            // Contended: transfers between random pairs of accounts.
            let hold_for = Duration::from_micros(p.w10_hold_us);
            let accounts = p.w10_accounts.max(2);
            let started = Instant::now();
            let end = started + Duration::from_secs_f64(p.w10_secs);
            let tasks: Vec<_> = (0..p.w10_tasks)
                .map(|_| {
                    let lock = lock.clone();
                    tokio::spawn(async move {
                        let (mut done, mut failed, mut first_error) = (0u64, 0u64, None);
                        while Instant::now() < end {
                            let (x, y) = {
                                let mut rng = rand::rng();
                                let x = rng.random_range(0..accounts);
                                (x, (x + rng.random_range(1..accounts)) % accounts)
                            };
                            let (x, y) = (format!("account:{x}"), format!("account:{y}"));
                            let result = match acquire_pair(arm, &lock, [&x, &y], wait).await {
                                Ok(Some(held)) => {
                                    hold(hold_for).await;
                                    release_pair(&lock, held).await.map(|()| true)
                                }
                                Ok(None) => Ok(false),
                                Err(e) => Err(e),
                            };
                            match result {
                                Ok(true) => done += 1,
                                Ok(false) => {
                                    failed += 1;
                                    first_error.get_or_insert_with(|| "wait ran out".to_owned());
                                }
                                Err(e) => {
                                    failed += 1;
                                    first_error.get_or_insert_with(|| e.to_string());
                                    tokio::time::sleep(Duration::from_millis(10)).await;
                                }
                            }
                        }
                        (done, failed, first_error)
                    })
                })
                .collect();
            let (mut done, mut fails, mut first_error) = (0, 0, None);
            for task in tasks {
                let (d, f, e) = task.await?;
                done += d;
                fails += f;
                first_error = first_error.or(e);
            }
            let r = done as f64 / started.elapsed().as_secs_f64();
            ctx.progress(
                "W10",
                rep,
                arm.side(),
                &format!(
                    "{}: uncontended p50 {lat:.1} µs; contended {r:.0} transfers/s, {fails} failed{}",
                    arm.name(),
                    first_error.map(|e| format!(" ({e})")).unwrap_or_default()
                ),
            );
            p50[a].push(lat);
            rate[a].push(r);
            failed[a].push(fails as f64);
        }
    }
    let w = format!(
        "W10 two keys at once; contended: {} tasks, {} accounts, {} ms holds",
        p.w10_tasks,
        p.w10_accounts.max(2),
        p.w10_hold_us as f64 / 1e3
    );
    let [all50, seq50, floor50] = p50;
    let [all_rate, seq_rate, floor_rate] = rate;
    let [all_failed, seq_failed, _] = failed;
    // lock_all against the same two keys taken one by one with the kit's own mutex, per run.
    let vs_seq: Vec<f64> = all50.iter().zip(&seq50).map(|(a, s)| a / s).collect();
    let kit_failed: Vec<f64> = all_failed
        .iter()
        .zip(&seq_failed)
        .map(|(a, b)| a + b)
        .collect();
    Ok(vec![
        Row::new(
            &w,
            "uncontended acquire+release p50, lock_all",
            "µs",
            all50,
            floor50.clone(),
            Check::Info,
        ),
        Row::new(
            &w,
            "uncontended acquire+release p50, 2 x lock",
            "µs",
            seq50,
            floor50,
            Check::Info,
        ),
        Row::new(
            &w,
            "lock_all ÷ 2 x lock, uncontended p50",
            "x",
            vs_seq,
            vec![],
            Check::Info,
        ),
        Row::new(
            &w,
            "transfers/s, lock_all",
            "",
            all_rate,
            floor_rate.clone(),
            Check::Info,
        ),
        Row::new(
            &w,
            "transfers/s, 2 x lock",
            "",
            seq_rate,
            floor_rate,
            Check::Info,
        ),
        Row::new(
            &w,
            "failed transfers (kit)",
            "",
            kit_failed,
            vec![],
            Check::KitAllEqual(0.0),
        ),
    ])
}
