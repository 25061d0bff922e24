//! W1 (uncontended latency, one task) and W2 (throughput, many tasks on distinct keys), each
//! for the kit, the floor and rslock, alternating.

use std::time::Duration;

use tokio::time::Instant;

use crate::lock::{BoxError, Lock};
use crate::report::{Check, Row};
use crate::stats::percentile;
use crate::{Ctx, Side};

pub(crate) async fn cycle(lock: &Lock, key: &str, wait: Duration) -> Result<(), BoxError> {
    let held = lock
        .acquire(key, wait)
        .await?
        .ok_or_else(|| format!("fresh key {key} was busy"))?;
    lock.release(held).await
}

/// The sides of W1 and W2, in the order of their per-side arrays.
const SIDES: [Side; 4] = [Side::Kit, Side::Floor, Side::Rslock, Side::Guarded];

/// Per-run values of one metric, per side (in the order of [`SIDES`]).
type PerSide = [Vec<f64>; 4];

/// The kit against rslock: a row whose floor column is rslock's.
fn vs_rslock(w: &str, metric: &str, unit: &'static str, values: &[Vec<f64>], check: Check) -> Row {
    let row = Row::new(
        w,
        &format!("{metric} (floor column: rslock)"),
        unit,
        values[0].clone(),
        values[2].clone(),
        check,
    );
    match check {
        Check::RatioAtMost(x) => row.target(&format!("≤ {x:.1}x rslock")),
        Check::RatioAtLeast(x) => row.target(&format!("≥ {x:.1}x rslock")),
        _ => row,
    }
}

/// What the kit costs above a hand-rolled lock with its guarantees (sides 0 and 3 of
/// [`SIDES`]), and what those cost (sides 3 and 1): two rows for each of `metrics` (name,
/// unit, values).
fn vs_guarded(w: &str, metrics: &[(&str, &'static str, &PerSide)]) -> Vec<Row> {
    let guarded = "floor column: the floor with the kit's guarantees";
    let guarded_alone = "kit column: the floor with the kit's guarantees";
    let mut rows = Vec::new();
    for (note, (kit, floor)) in [(guarded, (0, 3)), (guarded_alone, (3, 1))] {
        for (metric, unit, values) in metrics {
            rows.push(Row::new(
                w,
                &format!("{metric} ({note})"),
                unit,
                values[kit].clone(),
                values[floor].clone(),
                Check::Info,
            ));
        }
    }
    rows
}

/// One side's cycles over a W1 repetition: the sums of its slices.
#[derive(Default)]
struct Cycles {
    latencies: Vec<u64>,
    acquires: Vec<u64>,
    releases: Vec<u64>,
    secs: f64,
    client_cpu_s: f64,
    redis_cpu_s: f64,
}

impl Cycles {
    /// Runs `keys` one cycle after another on `lock`, adding their times and CPU.
    async fn run(
        &mut self,
        ctx: &Ctx,
        lock: &Lock,
        keys: &[String],
        wait: Duration,
    ) -> Result<(), BoxError> {
        let cpu0 = ctx.cpu().await?;
        let started = Instant::now();
        for key in keys {
            let t = Instant::now();
            let held = lock
                .acquire(key, wait)
                .await?
                .ok_or_else(|| format!("fresh key {key} was busy"))?;
            let t1 = Instant::now();
            lock.release(held).await?;
            let t2 = Instant::now();
            self.latencies.push((t2 - t).as_nanos() as u64);
            self.acquires.push((t1 - t).as_nanos() as u64);
            self.releases.push((t2 - t1).as_nanos() as u64);
        }
        self.secs += started.elapsed().as_secs_f64();
        let cpu = ctx.cpu().await?;
        self.client_cpu_s += cpu.client - cpu0.client;
        self.redis_cpu_s += cpu.server - cpu0.server;
        Ok(())
    }
}

/// W1: one task, acquire+release cycles on fresh keys. Each repetition cuts every side's
/// cycles into slices and runs them taking turns, the order rotated each slice (as W7's
/// routes): on a shared machine whose load swings over seconds, the sides then sample the
/// same swings, where one side's whole run after the other's compared two moments.
pub(crate) async fn w1(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    let wait = ctx.wait();
    let sides = SIDES;
    let slices = p.w1_slices.clamp(1, p.w1_cycles.max(1));
    let per_slice = p.w1_cycles.div_ceil(slices);
    // [side] -> per-run values
    let (mut p50, mut p99, mut rate) = (PerSide::default(), PerSide::default(), PerSide::default());
    let (mut client, mut server) = (PerSide::default(), PerSide::default());
    let (mut acq50, mut rel50) = (PerSide::default(), PerSide::default());
    for rep in 0..p.reps {
        let mut locks = Vec::with_capacity(sides.len());
        for side in sides {
            let lock = ctx.open(side, &ctx.prefix("w1", rep, side)).await?;
            for i in 0..p.w1_warmup {
                cycle(&lock, &format!("warm:{i}"), wait).await?;
            }
            locks.push(lock);
        }
        // Keys are made before the clock starts: every side gets the same strings (under its
        // own prefix).
        let keys: Vec<String> = (0..p.w1_cycles).map(|i| format!("key:{i}")).collect();
        let mut runs: [Cycles; 4] = Default::default();
        for (slice, keys) in keys.chunks(per_slice).enumerate() {
            for turn in 0..sides.len() {
                let s = (slice + turn) % sides.len();
                runs[s].run(ctx, &locks[s], keys, wait).await?;
            }
        }
        for (s, mut run) in runs.into_iter().enumerate() {
            let cycles = run.latencies.len().max(1) as f64;
            let (c, sv) = (
                run.client_cpu_s * 1e6 / cycles,
                run.redis_cpu_s * 1e6 / cycles,
            );
            let (a, b) = (
                percentile(&mut run.latencies, 50.0) / 1e3,
                percentile(&mut run.latencies, 99.0) / 1e3,
            );
            let r = cycles / run.secs;
            ctx.progress(
                "W1",
                rep,
                sides[s],
                &format!("p50 {a:.1} µs, p99 {b:.1} µs, {r:.0} cycles/s, CPU per cycle: client {c:.1} µs, Redis {sv:.1} µs"),
            );
            client[s].push(c);
            server[s].push(sv);
            acq50[s].push(percentile(&mut run.acquires, 50.0) / 1e3);
            rel50[s].push(percentile(&mut run.releases, 50.0) / 1e3);
            p50[s].push(a);
            p99[s].push(b);
            rate[s].push(r);
        }
    }
    let w = "W1 uncontended, 1 task";
    let against_rslock = [
        vs_rslock(
            w,
            "acquire+release p50",
            "µs",
            &p50,
            Check::RatioAtMost(1.0),
        ),
        vs_rslock(w, "acquire+release p99", "µs", &p99, Check::Info),
        vs_rslock(w, "acquire alone p50", "µs", &acq50, Check::Info),
        vs_rslock(w, "release alone p50", "µs", &rel50, Check::Info),
        vs_rslock(w, "client CPU per cycle", "µs", &client, Check::Info),
        vs_rslock(w, "Redis CPU per cycle", "µs", &server, Check::Info),
    ];
    let against_guarded = vs_guarded(
        w,
        &[
            ("acquire+release p50", "µs", &p50),
            ("client CPU per cycle", "µs", &client),
        ],
    );
    let [k50, f50, _, _] = p50;
    let [k99, f99, _, _] = p99;
    let [kr, fr, _, _] = rate;
    let [kc, fc, _, _] = client;
    let [ks, fs, _, _] = server;
    let [ka, fa, _, _] = acq50;
    let [kl, fl, _, _] = rel50;
    let mut rows = vec![
        Row::new(
            w,
            "acquire+release p50",
            "µs",
            k50,
            f50,
            Check::RatioAtMost(1.10),
        ),
        Row::new(w, "acquire+release p99", "µs", k99, f99, Check::Info),
        Row::new(w, "acquire alone p50", "µs", ka, fa, Check::Info),
        Row::new(w, "release alone p50", "µs", kl, fl, Check::Info),
        Row::new(w, "cycles/s", "", kr, fr, Check::Info),
        Row::new(w, "client CPU per cycle", "µs", kc, fc, Check::Info),
        Row::new(w, "Redis CPU per cycle", "µs", ks, fs, Check::Info),
    ];
    rows.extend(against_rslock);
    rows.extend(against_guarded);
    Ok(rows)
}

/// One side's cycles over a W2 repetition: the sums of its slices.
#[derive(Default)]
struct Throughput {
    done: u64,
    failed: u64,
    secs: f64,
    client_cpu_s: f64,
    redis_cpu_s: f64,
    first_error: Option<String>,
}

impl Throughput {
    /// Runs `tasks` tasks on `lock` for `secs`, each cycling on fresh keys of slice `slice`,
    /// adding their cycles, time and CPU.
    async fn run(
        &mut self,
        ctx: &Ctx,
        lock: &Lock,
        tasks: usize,
        slice: usize,
        secs: f64,
    ) -> Result<(), BoxError> {
        let wait = ctx.wait();
        let cpu0 = ctx.cpu().await?;
        let started = Instant::now();
        let end = started + Duration::from_secs_f64(secs);
        let tasks: Vec<_> = (0..tasks)
            .map(|t| {
                let lock = lock.clone();
                tokio::spawn(async move {
                    let (mut done, mut failed) = (0u64, 0u64);
                    let mut first_error = None;
                    while Instant::now() < end {
                        let key = format!("s{slice}:t{t}:{done}:{failed}");
                        match cycle(&lock, &key, wait).await {
                            Ok(()) => done += 1,
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
        for task in tasks {
            let (done, failed, error) = task.await?;
            self.done += done;
            self.failed += failed;
            if self.first_error.is_none() {
                self.first_error = error;
            }
        }
        self.secs += started.elapsed().as_secs_f64();
        let cpu = ctx.cpu().await?;
        self.client_cpu_s += cpu.client - cpu0.client;
        self.redis_cpu_s += cpu.server - cpu0.server;
        Ok(())
    }
}

/// W2: many tasks, each cycling on its own fresh keys, for a fixed time; the sides of W1,
/// the floor with the kit's guarantees among them. As in W1, each repetition cuts every
/// side's time into slices that the sides take in turns, the order rotated each slice: one
/// side's whole run after the other's put a swing of the machine's load on one side.
pub(crate) async fn w2(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    let sides = SIDES;
    let slices = p.w2_slices.max(1);
    let slice_secs = p.w2_secs / slices as f64;
    let (mut rate, mut failures) = (PerSide::default(), PerSide::default());
    let (mut client, mut server) = (PerSide::default(), PerSide::default());
    for rep in 0..p.reps {
        let mut locks = Vec::with_capacity(sides.len());
        for side in sides {
            locks.push(ctx.open(side, &ctx.prefix("w2", rep, side)).await?);
        }
        let mut runs: [Throughput; 4] = Default::default();
        for slice in 0..slices {
            for turn in 0..sides.len() {
                let s = (slice + turn) % sides.len();
                runs[s]
                    .run(ctx, &locks[s], p.w2_tasks, slice, slice_secs)
                    .await?;
            }
        }
        for (s, run) in runs.into_iter().enumerate() {
            if let Some(e) = &run.first_error {
                eprintln!("[W2] {} error: {e}", sides[s].name());
            }
            let cycles = run.done.max(1) as f64;
            let r = run.done as f64 / run.secs;
            let (c, sv) = (
                run.client_cpu_s * 1e6 / cycles,
                run.redis_cpu_s * 1e6 / cycles,
            );
            ctx.progress(
                "W2",
                rep,
                sides[s],
                &format!(
                    "{r:.0} cycles/s, {} failed, CPU per cycle: client {c:.1} µs, Redis {sv:.1} µs",
                    run.failed
                ),
            );
            client[s].push(c);
            server[s].push(sv);
            rate[s].push(r);
            failures[s].push(run.failed as f64);
        }
    }
    let w = format!("W2 parallel, {} tasks", p.w2_tasks);
    let against_rslock = [
        vs_rslock(&w, "cycles/s", "", &rate, Check::RatioAtLeast(1.0)),
        vs_rslock(&w, "client CPU per cycle", "µs", &client, Check::Info),
        vs_rslock(&w, "Redis CPU per cycle", "µs", &server, Check::Info),
        // rslock reports an unreachable server as a busy key: a failed cycle here is either.
        vs_rslock(&w, "failed cycles", "", &failures, Check::Info),
    ];
    let against_guarded = vs_guarded(
        &w,
        &[
            ("cycles/s", "", &rate),
            ("client CPU per cycle", "µs", &client),
            ("Redis CPU per cycle", "µs", &server),
        ],
    );
    let [kr, fr, _, _] = rate;
    let [kf, ff, _, _] = failures;
    let [kc, fc, _, _] = client;
    let [ks, fs, _, _] = server;
    let mut rows = vec![
        Row::new(&w, "cycles/s", "", kr, fr, Check::RatioAtLeast(0.8)),
        Row::new(
            &w,
            "client CPU per cycle",
            "µs",
            kc,
            fc,
            Check::RatioAtMost(1.3),
        ),
        Row::new(
            &w,
            "Redis CPU per cycle",
            "µs",
            ks,
            fs,
            Check::RatioAtMost(1.5),
        ),
        Row::new(&w, "failed cycles", "", kf, ff, Check::KitAllEqual(0.0)),
    ];
    rows.extend(against_rslock);
    rows.extend(against_guarded);
    Ok(rows)
}
