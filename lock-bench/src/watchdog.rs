//! W6: many locks held by one client for several lease periods, kept alive by renewal.
//!
//! The kit: one `Locker` with a short watchdog lease; its one watchdog task renews every held
//! lock each lease/3 in batches. The floor: what a hand-rolled lock does to keep a lock alive,
//! one timer task per lock sending its own compare-and-`PEXPIRE` script each lease/3.
//!
//! Each run happens in a fresh process (the benchmark re-executes itself as
//! `watchdog-worker`), so RSS growth and CPU time belong to this workload alone.

use std::future::IntoFuture;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::floor::Floor;
use crate::lock::{kit_locker, BoxError, Lock};
use crate::redis_stats::CommandStats;
use crate::report::{Check, Row};
use crate::sys::{cpu_seconds, rss_bytes};
use crate::{Ctx, Side};

/// Keys per renewal script call in `lock_core` (its `store::BATCH`, not public).
const KIT_BATCH: usize = 500;

/// Concurrent acquires while taking the locks.
const ACQUIRE_CONCURRENCY: usize = 64;

/// Arguments of one `watchdog-worker` process.
#[derive(Debug, Clone, Args)]
pub(crate) struct WorkerArgs {
    #[arg(long)]
    url: String,
    #[arg(long, value_enum)]
    side: Side,
    #[arg(long)]
    prefix: String,
    #[arg(long)]
    locks: usize,
    #[arg(long)]
    lease_ms: u64,
    #[arg(long)]
    periods: u32,
}

/// What one worker measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Measured {
    locks: usize,
    acquire_secs: f64,
    bytes_per_lock: f64,
    window_secs: f64,
    ticks: f64,
    renew_calls: u64,
    calls_per_tick: f64,
    server_evalsha_per_tick: f64,
    server_ms_per_tick: f64,
    cpu_pct: f64,
    /// Locks found lost (kit: guard not held or dropped by the watchdog; floor: a renewal
    /// found the key gone or another token).
    lost: u64,
    /// Renewal calls that failed (timeouts, connection errors): the floor counts them; the kit
    /// only logs them, and shows their effect as `lost` when the lease runs out.
    renew_errors: u64,
}

/// Holds for `window`, sampling the renewal counter every 10 ms (the same polling on both sides,
/// so its own cost is the same); then reads the server's counters and samples once more, so a
/// tick that lands between the last poll and the closing `INFO` is counted on both sides.
/// Returns (renewal calls, ticks seen, server stats delta, CPU seconds, elapsed seconds).
async fn hold_window(
    window: Duration,
    monitor: &mut redis::aio::MultiplexedConnection,
    calls: impl Fn() -> u64,
) -> Result<(u64, u64, CommandStats, f64, f64), BoxError> {
    let stats0 = CommandStats::read(monitor).await?;
    let first = calls();
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let (mut last, mut changes) = (first, 0u64);
    while started.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = calls();
        if now != last {
            changes += 1;
            last = now;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let stats = CommandStats::read(monitor).await?.since(&stats0);
    let end = calls();
    if end != last {
        changes += 1;
    }
    Ok((end - first, changes, stats, cpu, elapsed))
}

pub(crate) async fn worker(args: WorkerArgs) -> Result<(), BoxError> {
    let lease = Duration::from_millis(args.lease_ms);
    let interval = lease / 3;
    let window = lease * args.periods;
    let mut monitor = redis::Client::open(args.url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let keys: Vec<String> = (0..args.locks).map(|i| format!("key:{i}")).collect();

    let measured = match args.side {
        Side::Kit => {
            let locker = kit_locker(&args.url, &args.prefix, Some(lease)).await?;
            Lock::Kit(locker.clone()).warm_up("warm-up").await?;
            let mut guards = Vec::with_capacity(args.locks);
            let rss_before = rss_bytes();
            let started = Instant::now();
            let mut acquires = futures_util::stream::iter(keys)
                .map(|k| locker.lock(k).wait(Duration::ZERO).into_future())
                .buffer_unordered(ACQUIRE_CONCURRENCY);
            while let Some(guard) = acquires.next().await {
                guards.push(guard?);
            }
            drop(acquires);
            let acquire_secs = started.elapsed().as_secs_f64();
            let rss_after = rss_bytes();

            let (renew_calls, ticks, stats, cpu, elapsed) =
                hold_window(window, &mut monitor, || locker.stats().renewal_calls).await?;
            let lost = guards.iter().filter(|g| !g.is_held()).count()
                + args.locks.saturating_sub(locker.stats().watchdog_locks);
            let mut releases = futures_util::stream::iter(guards)
                .map(|g| g.release())
                .buffer_unordered(ACQUIRE_CONCURRENCY);
            while releases.next().await.is_some() {}
            let ticks = ticks as f64;
            Measured {
                locks: args.locks,
                acquire_secs,
                bytes_per_lock: (rss_after as f64 - rss_before as f64) / args.locks as f64,
                window_secs: elapsed,
                ticks,
                renew_calls,
                calls_per_tick: renew_calls as f64 / ticks.max(1.0),
                server_evalsha_per_tick: stats.calls("evalsha") as f64 / ticks.max(1.0),
                server_ms_per_tick: stats.usec("evalsha") as f64 / 1e3 / ticks.max(1.0),
                cpu_pct: cpu / elapsed * 100.0,
                lost: lost as u64,
                renew_errors: 0,
            }
        }
        Side::Floor => {
            let floor = Floor::connect(
                &args.url,
                args.prefix.clone(),
                args.lease_ms,
                Duration::ZERO,
            )
            .await?;
            Lock::Floor(floor.clone()).warm_up("warm-up").await?;
            let renewals = Arc::new(AtomicU64::new(0));
            let lost = Arc::new(AtomicU64::new(0));
            let errors = Arc::new(AtomicU64::new(0));
            let mut held = Vec::with_capacity(args.locks);
            let rss_before = rss_bytes();
            let started = Instant::now();
            let mut acquires = futures_util::stream::iter(keys)
                .map(|k| {
                    let floor = floor.clone();
                    async move { floor.lock(&k, Duration::ZERO).await }
                })
                .buffer_unordered(ACQUIRE_CONCURRENCY);
            while let Some(guard) = acquires.next().await {
                let guard = Arc::new(guard?.ok_or("a fresh floor key was busy")?);
                // The hand-rolled watchdog: a timer task per lock.
                let timer = tokio::spawn({
                    let (floor, guard) = (floor.clone(), guard.clone());
                    let (renewals, lost, errors) = (renewals.clone(), lost.clone(), errors.clone());
                    async move {
                        let mut ticks =
                            tokio::time::interval_at(Instant::now() + interval, interval);
                        loop {
                            ticks.tick().await;
                            renewals.fetch_add(1, Ordering::Relaxed);
                            match floor.renew(&guard).await {
                                Ok(true) => {}
                                Ok(false) => {
                                    lost.fetch_add(1, Ordering::Relaxed);
                                    return;
                                }
                                Err(_) => {
                                    errors.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                    }
                });
                held.push((guard, timer));
            }
            drop(acquires);
            let acquire_secs = started.elapsed().as_secs_f64();
            let rss_after = rss_bytes();

            let (renew_calls, _, stats, cpu, elapsed) =
                hold_window(window, &mut monitor, || renewals.load(Ordering::Relaxed)).await?;
            // Timers are not aligned: a tick is one interval of wall time.
            let ticks = elapsed / interval.as_secs_f64();
            let mut releases = futures_util::stream::iter(held)
                .map(|(guard, timer)| {
                    timer.abort();
                    let floor = floor.clone();
                    async move { floor.unlock(&guard).await }
                })
                .buffer_unordered(ACQUIRE_CONCURRENCY);
            while releases.next().await.is_some() {}
            Measured {
                locks: args.locks,
                acquire_secs,
                bytes_per_lock: (rss_after as f64 - rss_before as f64) / args.locks as f64,
                window_secs: elapsed,
                ticks,
                renew_calls,
                calls_per_tick: renew_calls as f64 / ticks,
                server_evalsha_per_tick: stats.calls("evalsha") as f64 / ticks,
                server_ms_per_tick: stats.usec("evalsha") as f64 / 1e3 / ticks,
                cpu_pct: cpu / elapsed * 100.0,
                lost: lost.load(Ordering::Relaxed),
                renew_errors: errors.load(Ordering::Relaxed),
            }
        }
        // rslock renews only inside its `using` (one timer per lock): not a side of W6.
        Side::Rslock | Side::Guarded => return Err("W6 has no rslock or guarded floor side".into()),
    };
    println!("{}", serde_json::to_string(&measured)?);
    Ok(())
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    let exe = std::env::current_exe()?;
    let mut runs: [Vec<Measured>; 2] = [vec![], vec![]];
    for rep in 0..p.reps {
        for (s, side) in Side::BOTH.into_iter().enumerate() {
            let output = tokio::process::Command::new(&exe)
                .arg("watchdog-worker")
                .args(["--url", &ctx.url, "--side", side.name()])
                // A short prefix like the default `lock:`: the kit stores it in three names per
                // lock, and the benchmark's long run prefix would inflate the memory per lock.
                .args([
                    "--prefix",
                    &format!("w6{}{rep}{}:", ctx.short_tag(), &side.name()[..1]),
                ])
                .args(["--locks", &p.w6_locks.to_string()])
                .args(["--lease-ms", &p.w6_lease_ms.to_string()])
                .args(["--periods", &p.w6_periods.to_string()])
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .output()
                .await?;
            if !output.status.success() {
                return Err(format!("watchdog worker failed: {}", output.status).into());
            }
            let stdout = String::from_utf8(output.stdout)?;
            let line = stdout
                .lines()
                .last()
                .ok_or("watchdog worker printed nothing")?;
            let m: Measured = serde_json::from_str(line)?;
            ctx.progress(
                "W6",
                rep,
                side,
                &format!(
                    "{} locks taken in {:.2} s, {:.0} B/lock, {:.1} ticks in {:.1} s, {:.1} renew calls/tick ({:.1} EVALSHA/tick at the server, {:.2} ms Redis time/tick), client CPU {:.1}%, {} lost, {} renewal errors",
                    m.locks, m.acquire_secs, m.bytes_per_lock, m.ticks, m.window_secs, m.calls_per_tick,
                    m.server_evalsha_per_tick, m.server_ms_per_tick, m.cpu_pct, m.lost, m.renew_errors
                ),
            );
            runs[s].push(m);
        }
    }
    let w = format!(
        "W6 watchdog, {} locks, lease {} ms, {} periods",
        p.w6_locks, p.w6_lease_ms, p.w6_periods
    );
    let batches = p.w6_locks.div_ceil(KIT_BATCH) as f64;
    let pick = |f: fn(&Measured) -> f64| -> (Vec<f64>, Vec<f64>) {
        (
            runs[0].iter().map(f).collect(),
            runs[1].iter().map(f).collect(),
        )
    };
    let row = |metric: &str, unit: &'static str, f: fn(&Measured) -> f64, check: Check| {
        let (k, fl) = pick(f);
        Row::new(&w, metric, unit, k, fl, check)
    };
    Ok(vec![
        row(
            "renewal calls per tick (client counter)",
            "",
            |m| m.calls_per_tick,
            Check::KitAtMost(batches),
        )
        .target(&format!(
            "1 pipelined flight/tick on 1 connection: ≤ {batches} batch calls"
        )),
        row(
            "renewal EVALSHA per tick (server)",
            "",
            |m| m.server_evalsha_per_tick,
            Check::KitAtMost(batches),
        ),
        row(
            "Redis time in renewals per tick",
            "ms",
            |m| m.server_ms_per_tick,
            Check::Info,
        ),
        row("client CPU while holding", "%", |m| m.cpu_pct, Check::Info),
        row(
            "client RSS growth per held lock",
            "B",
            |m| m.bytes_per_lock,
            Check::KitAtMost(512.0),
        ),
        row(
            "time to take all locks (64 concurrent)",
            "s",
            |m| m.acquire_secs,
            Check::Info,
        ),
        row(
            "locks lost while held",
            "",
            |m| m.lost as f64,
            Check::KitAllEqual(0.0),
        ),
        Row::new(
            &w,
            "renewal calls that failed (timeouts; the kit only logs them)",
            "",
            vec![],
            runs[1].iter().map(|m| m.renew_errors as f64).collect(),
            Check::Info,
        ),
    ])
}
