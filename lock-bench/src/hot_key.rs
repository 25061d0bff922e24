//! W3: one hot key. Tasks loop acquire (waiting up to 10 s), hold 1 ms, release, for a fixed
//! time; in one process (16 tasks) and across processes (4 processes x 4 tasks, the benchmark
//! re-executing itself as `hot-key-worker`). The same harness runs the other kinds of lock on
//! one hot name: W8, a semaphore of 3 permits (against the permit-limited maximum, permits /
//! measured hold), and W11, the fair lock across processes (against the floor). W3 runs
//! rslock as a third side, busy-retrying its one-try acquire as the floor retries `SET NX`.
//!
//! Every acquisition is recorded with `CLOCK_MONOTONIC` timestamps (comparable across
//! processes): when the acquire returned, when release was called, when it returned. Sorted by
//! acquisition time they give the handoff gap (acquired N+1 minus release called N), who got
//! the lock next, and a mutual-exclusion check (acquired N+1 before release called N).

use std::process::Stdio;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

use crate::lock::{BoxError, KitKind, Lock};
use crate::redis_stats::CommandStats;
use crate::report::{Check, Row};
use crate::stats::percentile;
use crate::sys::mono_ns;
use crate::{Ctx, Side};

/// `GET`s timed before each hot-key run for its round trip.
const ROUND_TRIPS: usize = 300;

/// One acquisition, in `CLOCK_MONOTONIC` nanoseconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Event {
    task: u32,
    acquired: u64,
    release_called: u64,
    released: u64,
}

/// What a group of tasks did.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Outcome {
    events: Vec<Event>,
    timeouts: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Outcome {
    fn merge(&mut self, other: Self) {
        self.events.extend(other.events);
        self.timeouts += other.timeouts;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// One contention run: `tasks` tasks numbered from `first_task`, on one key.
#[derive(Debug, Clone)]
struct Spec {
    key: String,
    kind: KitKind,
    /// Holders allowed at once (a semaphore's permits; 1 for locks).
    permits: u32,
    first_task: u32,
    tasks: usize,
    secs: f64,
    hold: Duration,
    wait: Duration,
}

/// Holds the lock for `d` like a critical section whose I/O completes after `d`: a blocking-pool
/// thread sleeps (`nanosleep`, precise to tens of µs) and wakes the task. `tokio::time::sleep`
/// is not used because its 1 ms timer wheel turns a 1 ms sleep into 1-2 ms depending on how
/// busy the runtime is, which would give the busy floor shorter holds than the idle kit.
pub(crate) async fn hold(d: Duration) {
    let _ = tokio::task::spawn_blocking(move || std::thread::sleep(d)).await;
}

async fn contend(lock: &Lock, spec: &Spec) -> Result<Outcome, BoxError> {
    let end = Instant::now() + Duration::from_secs_f64(spec.secs);
    let tasks: Vec<_> = (0..spec.tasks)
        .map(|t| {
            let lock = lock.clone();
            let spec = spec.clone();
            tokio::spawn(async move {
                let task = spec.first_task + t as u32;
                let mut out = Outcome::default();
                while Instant::now() < end {
                    match lock
                        .acquire_as(&spec.key, spec.wait, spec.kind, spec.permits)
                        .await
                    {
                        Ok(Some(held)) => {
                            let acquired = mono_ns();
                            hold(spec.hold).await;
                            let release_called = mono_ns();
                            let result = lock.release(held).await;
                            let released = mono_ns();
                            if let Err(e) = result {
                                out.errors += 1;
                                out.first_error.get_or_insert_with(|| e.to_string());
                            }
                            out.events.push(Event {
                                task,
                                acquired,
                                release_called,
                                released,
                            });
                        }
                        Ok(None) => out.timeouts += 1,
                        Err(e) => {
                            out.errors += 1;
                            out.first_error.get_or_insert_with(|| e.to_string());
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                out
            })
        })
        .collect();
    let mut outcome = Outcome::default();
    for task in tasks {
        outcome.merge(task.await?);
    }
    Ok(outcome)
}

/// The median round trip of a `GET` (of a key nobody writes) sent right after a hold as the
/// workers hold, in µs: the floor of a local handoff, which waits for one `GET` sent by a task
/// that just came back from its hold (runtime threads that idled through the hold answer later
/// than busy ones). Measured before a run's command counts are taken, so not counted.
async fn get_after_hold_us(ctx: &Ctx, hold_for: Duration) -> Result<f64, BoxError> {
    let mut conn = ctx.conn();
    let mut times = Vec::with_capacity(ROUND_TRIPS);
    for _ in 0..ROUND_TRIPS {
        hold(hold_for).await;
        let sent = mono_ns();
        let _: Option<String> = redis::cmd("GET")
            .arg("lock-bench:round-trip")
            .query_async(&mut conn)
            .await?;
        times.push(mono_ns().saturating_sub(sent));
    }
    Ok(percentile(&mut times, 50.0) / 1e3)
}

/// The metrics of one run.
#[derive(Debug, Clone)]
struct Metrics {
    per_task: Vec<u64>,
    /// Every handoff gap of the run (ns), for the charts.
    gaps_ns: Vec<u64>,
    hold_mean_us: f64,
    gap_mean_us: f64,
    redis_cpu_pct: f64,
    per_sec: f64,
    gap_p50_us: f64,
    gap_p99_us: f64,
    /// A `GET`'s round trip p50 right after a hold, just before the run: the local handoff's
    /// confirmation costs one.
    round_trip_us: f64,
    other_task_pct: f64,
    min_max: f64,
    cmds_all: f64,
    cmds_client: f64,
    failures: f64,
}

/// What the Redis server showed of one run.
struct ServerSide<'a> {
    /// Its commands during the run.
    stats: &'a CommandStats,
    /// Its CPU time during the run.
    cpu_secs: f64,
    /// [`get_after_hold_us`], just before the run.
    round_trip_us: f64,
}

fn analyze(
    mut outcome: Outcome,
    tasks: usize,
    permits: u32,
    go_ns: u64,
    server: ServerSide<'_>,
    side: Side,
) -> Metrics {
    let stats = server.stats;
    let events = &mut outcome.events;
    events.sort_by_key(|e| e.acquired);
    let n = events.len();
    let end = events.iter().map(|e| e.released).max().unwrap_or(go_ns);
    let per_sec = n as f64 / ((end.saturating_sub(go_ns)) as f64 / 1e9).max(1e-9);
    let mut gaps = Vec::with_capacity(n);
    let mut other = 0u64;
    for pair in events.windows(2) {
        let (prev, next) = (pair[0], pair[1]);
        if let Some(gap) = next.acquired.checked_sub(prev.release_called) {
            gaps.push(gap);
        }
        if next.task != prev.task {
            other += 1;
        }
    }
    let overlaps = over_limit(events, permits);
    let mut counts = vec![0u64; tasks];
    for e in events.iter() {
        if let Some(c) = counts.get_mut(e.task as usize) {
            *c += 1;
        }
    }
    let (min, max) = (
        counts.iter().copied().min().unwrap_or(0),
        counts.iter().copied().max().unwrap_or(0),
    );
    let handoffs = n.saturating_sub(1).max(1) as f64;
    let acquisitions = n.max(1) as f64;
    if overlaps > 0 {
        eprintln!(
            "[W3] {}: {overlaps} acquisitions with {permits} holders already inside (exclusion violated)",
            side.name()
        );
    }
    if let Some(e) = &outcome.first_error {
        eprintln!("[W3] {} error: {e}", side.name());
    }
    let secs = (end.saturating_sub(go_ns) as f64 / 1e9).max(1e-9);
    let mean = |v: &mut dyn Iterator<Item = u64>| {
        let (sum, count) = v.fold((0u64, 0u64), |(s, c), x| (s + x, c + 1));
        sum as f64 / count.max(1) as f64 / 1e3
    };
    Metrics {
        hold_mean_us: mean(&mut events.iter().map(|e| e.release_called - e.acquired)),
        gap_mean_us: mean(&mut gaps.iter().copied()),
        redis_cpu_pct: server.cpu_secs / secs * 100.0,
        per_sec,
        gap_p50_us: percentile(&mut gaps, 50.0) / 1e3,
        gap_p99_us: percentile(&mut gaps, 99.0) / 1e3,
        round_trip_us: server.round_trip_us,
        other_task_pct: other as f64 / handoffs * 100.0,
        min_max: if max == 0 {
            0.0
        } else {
            min as f64 / max as f64
        },
        cmds_all: stats.all() as f64 / acquisitions,
        cmds_client: stats.client_sent(side) as f64 / acquisitions,
        failures: (outcome.timeouts + outcome.errors + overlaps) as f64,
        per_task: counts,
        gaps_ns: gaps,
    }
}

/// Acquisitions that found `permits` holders already inside (holding from acquired to release
/// called): a sweep over the acquisitions in time order with the current holders' ends.
fn over_limit(events: &[Event], permits: u32) -> u64 {
    let mut inside = std::collections::BinaryHeap::new();
    let mut over = 0;
    for e in events {
        while inside
            .peek()
            .is_some_and(|std::cmp::Reverse(end)| *end <= e.acquired)
        {
            inside.pop();
        }
        if inside.len() >= permits as usize {
            over += 1;
        }
        inside.push(std::cmp::Reverse(e.release_called));
    }
    over
}

fn progress(ctx: &Ctx, w: &str, rep: usize, side: Side, m: &Metrics, stats: &CommandStats) {
    ctx.progress(
        w,
        rep,
        side,
        &format!(
            "{:.0} acq/s, hold {:.0} µs, gap mean {:.0} p50 {:.0} µs p99 {:.0} µs, {:.1}% to another task, min/max {:.2}, {:.1} cmds/acq ({:.1} client-sent), Redis CPU {:.0}%, {} failures; per task {:?}; {}",
            m.per_sec, m.hold_mean_us, m.gap_mean_us, m.gap_p50_us, m.gap_p99_us, m.other_task_pct, m.min_max, m.cmds_all, m.cmds_client, m.redis_cpu_pct, m.failures, m.per_task, stats.to_json()
        ),
    );
}

/// What a hot-key run must reach (the performance issue's targets).
struct Targets {
    /// Acquisitions/s against the floor's.
    rate: Check,
    gap_p50_us: f64,
    min_max: f64,
    /// Redis commands per acquisition (either count); the fair lock has none (the issue
    /// that asked for it sets none: it buys exact turns with a line in Redis).
    commands: Check,
}

/// What the charts show of a hot-key workload: every handoff gap and each task's
/// acquisitions, per side (kit, floor), over all runs.
#[derive(Debug, Clone)]
pub(crate) struct HotKeyDetail {
    pub(crate) workload: String,
    /// Handoff gaps in ns, every run's, per side.
    pub(crate) gaps_ns: [Vec<u64>; 2],
    /// Acquisitions per task, summed over the runs, per side.
    pub(crate) per_task: [Vec<u64>; 2],
    pub(crate) runs: usize,
}

impl HotKeyDetail {
    fn new(workload: &str, runs: &[Vec<Metrics>; 2]) -> Self {
        let gaps = |side: &Vec<Metrics>| {
            side.iter()
                .flat_map(|m| m.gaps_ns.iter().copied())
                .collect()
        };
        let per_task = |side: &Vec<Metrics>| {
            let mut sum = vec![0u64; side.iter().map(|m| m.per_task.len()).max().unwrap_or(0)];
            for m in side {
                for (total, n) in sum.iter_mut().zip(&m.per_task) {
                    *total += n;
                }
            }
            sum
        };
        Self {
            workload: workload.to_owned(),
            gaps_ns: [gaps(&runs[0]), gaps(&runs[1])],
            per_task: [per_task(&runs[0]), per_task(&runs[1])],
            runs: runs[0].len(),
        }
    }
}

fn rows(workload: &str, targets: Targets, runs: [Vec<Metrics>; 2]) -> Vec<Row> {
    let pick = |f: fn(&Metrics) -> f64| -> (Vec<f64>, Vec<f64>) {
        (
            runs[0].iter().map(f).collect(),
            runs[1].iter().map(f).collect(),
        )
    };
    let row = |metric: &str, unit: &'static str, f: fn(&Metrics) -> f64, check: Check| {
        let (k, fl) = pick(f);
        Row::new(workload, metric, unit, k, fl, check)
    };
    // What the hold allows: one holder at a time, each for the measured hold.
    let allowed = Row::new(
        workload,
        "acquisitions/s (second column: 1 / measured hold)",
        "",
        runs[0].iter().map(|m| m.per_sec).collect(),
        runs[0]
            .iter()
            .map(|m| 1e6 / m.hold_mean_us.max(1.0))
            .collect(),
        Check::RatioAtLeast(0.95),
    )
    .target("≥ 0.95x 1 / hold");
    vec![
        row("acquisitions/s", "", |m| m.per_sec, targets.rate),
        allowed,
        row(
            "handoff gap p50",
            "µs",
            |m| m.gap_p50_us,
            Check::KitAtMost(targets.gap_p50_us),
        ),
        row("handoff gap p99", "µs", |m| m.gap_p99_us, Check::Info),
        row("handoff gap mean", "µs", |m| m.gap_mean_us, Check::Info),
        row(
            "a GET's round trip p50 after a hold, just before the run",
            "µs",
            |m| m.round_trip_us,
            Check::Info,
        ),
        row(
            "hold as measured (mean)",
            "µs",
            |m| m.hold_mean_us,
            Check::Info,
        ),
        row(
            "handoffs to another task",
            "%",
            |m| m.other_task_pct,
            Check::KitAbove(90.0),
        ),
        row(
            "per-task acquisitions min/max",
            "",
            |m| m.min_max,
            Check::KitAtLeast(targets.min_max),
        ),
        row(
            "Redis commands/acquisition (commandstats, incl. inside scripts)",
            "",
            |m| m.cmds_all,
            targets.commands,
        ),
        row(
            "client-sent commands/acquisition (at most)",
            "",
            |m| m.cmds_client,
            targets.commands,
        ),
        row(
            "timeouts + errors + exclusion violations",
            "",
            |m| m.failures,
            Check::KitAllEqual(0.0),
        ),
    ]
}

/// The kit against rslock (informational: the targets are the floor's and the hold's).
fn rslock_rows(workload: &str, kit: &[Metrics], rslock: &[Metrics]) -> Vec<Row> {
    let row = |metric: &str, unit: &'static str, f: fn(&Metrics) -> f64| {
        Row::new(
            workload,
            &format!("{metric} (floor column: rslock)"),
            unit,
            kit.iter().map(f).collect(),
            rslock.iter().map(f).collect(),
            Check::Info,
        )
    };
    vec![
        row("acquisitions/s", "", |m| m.per_sec),
        row("handoff gap p50", "µs", |m| m.gap_p50_us),
        row("per-task acquisitions min/max", "", |m| m.min_max),
        row(
            "Redis commands/acquisition, incl. inside scripts",
            "",
            |m| m.cmds_all,
        ),
        row("timeouts + errors + exclusion violations", "", |m| {
            m.failures
        }),
    ]
}

/// The rows of a semaphore run. There is no floor for it: the second column is the
/// permit-limited maximum of each run, permits / measured hold.
fn semaphore_rows(workload: &str, permits: u32, kit: &[Metrics]) -> Vec<Row> {
    let values = |f: fn(&Metrics) -> f64| kit.iter().map(f).collect::<Vec<_>>();
    let most: Vec<f64> = kit
        .iter()
        .map(|m| f64::from(permits) * 1e6 / m.hold_mean_us.max(1.0))
        .collect();
    vec![
        Row::new(
            workload,
            "acquisitions/s (second column: permits / measured hold)",
            "",
            values(|m| m.per_sec),
            most,
            Check::RatioAtLeast(0.85),
        )
        .target("≥ 0.85x permits / hold"),
        Row::new(
            workload,
            "hold as measured (mean)",
            "µs",
            values(|m| m.hold_mean_us),
            vec![],
            Check::Info,
        ),
        Row::new(
            workload,
            "per-task acquisitions min/max",
            "",
            values(|m| m.min_max),
            vec![],
            Check::KitAtLeast(0.8),
        ),
        Row::new(
            workload,
            "Redis commands/acquisition (commandstats, incl. inside scripts)",
            "",
            values(|m| m.cmds_all),
            vec![],
            Check::KitAtMost(6.0),
        ),
        Row::new(
            workload,
            "timeouts + errors + holders over the permits",
            "",
            values(|m| m.failures),
            vec![],
            Check::KitAllEqual(0.0),
        ),
    ]
}

/// The lock a hot-key workload takes, and which sides it runs.
#[derive(Debug, Clone, Copy)]
struct Taken {
    /// The prefix tag and progress name (`w3`, `w8`, ...).
    tag: &'static str,
    kind: KitKind,
    permits: u32,
    sides: &'static [Side],
}

const MUTEX: Taken = Taken {
    tag: "w3",
    kind: KitKind::Mutex,
    permits: 1,
    sides: &Side::WITH_RSLOCK,
};

impl Ctx {
    fn hot_key_spec(&self, taken: Taken, first_task: u32, tasks: usize) -> Spec {
        Spec {
            key: "hot".to_owned(),
            kind: taken.kind,
            permits: taken.permits,
            first_task,
            tasks,
            secs: self.params.w3_secs,
            hold: Duration::from_micros(self.params.w3_hold_us),
            wait: self.wait(),
        }
    }
}

/// What a hot-key run measures around it: started just before the tasks go, finished when
/// their outcome is in.
struct RunMeter {
    round_trip_us: f64,
    stats: CommandStats,
    server_cpu: f64,
    go: u64,
}

impl RunMeter {
    /// Times a `GET` after a hold (see [`get_after_hold_us`]), then reads the server's command
    /// counts and CPU and the clock the run starts at.
    async fn start(ctx: &Ctx, hold_for: Duration) -> Result<Self, BoxError> {
        let round_trip_us = get_after_hold_us(ctx, hold_for).await?;
        let stats = ctx.stats().await?;
        let server_cpu = ctx.cpu().await?.server;
        Ok(Self {
            round_trip_us,
            stats,
            server_cpu,
            go: mono_ns(),
        })
    }

    /// The run's metrics from its outcome and what the server did since the start; reported
    /// as progress.
    async fn finish(
        self,
        ctx: &Ctx,
        outcome: Outcome,
        tasks: usize,
        taken: Taken,
        rep: usize,
        side: Side,
    ) -> Result<Metrics, BoxError> {
        let cpu_secs = ctx.cpu().await?.server - self.server_cpu;
        let stats = ctx.stats().await?.since(&self.stats);
        let server = ServerSide {
            stats: &stats,
            cpu_secs,
            round_trip_us: self.round_trip_us,
        };
        let m = analyze(outcome, tasks, taken.permits, self.go, server, side);
        progress(ctx, &taken.tag.to_uppercase(), rep, side, &m, &stats);
        Ok(m)
    }
}

/// The runs of one process of `w3_tasks` tasks, per side (kit, floor, rslock; empty when not
/// taken).
async fn one_process(ctx: &Ctx, taken: Taken) -> Result<[Vec<Metrics>; 3], BoxError> {
    let p = &ctx.params;
    let mut runs = [vec![], vec![], vec![]];
    for rep in 0..p.reps {
        for (s, side) in Side::WITH_RSLOCK.into_iter().enumerate() {
            if !taken.sides.contains(&side) {
                continue;
            }
            let lock = ctx.open(side, &ctx.prefix(taken.tag, rep, side)).await?;
            let spec = ctx.hot_key_spec(taken, 0, p.w3_tasks);
            let meter = RunMeter::start(ctx, spec.hold).await?;
            let outcome = contend(&lock, &spec).await?;
            let m = meter
                .finish(ctx, outcome, p.w3_tasks, taken, rep, side)
                .await?;
            runs[s].push(m);
        }
    }
    Ok(runs)
}

/// W3 in one process.
pub(crate) async fn in_process(ctx: &Ctx) -> Result<(Vec<Row>, HotKeyDetail), BoxError> {
    let [kit, floor, rslock] = one_process(ctx, MUTEX).await?;
    let workload = format!("W3 hot key, 1 process x {} tasks", ctx.params.w3_tasks);
    let against_rslock = rslock_rows(&workload, &kit, &rslock);
    let runs = [kit, floor];
    let detail = HotKeyDetail::new(&workload, &runs);
    let mut rows = rows(
        &workload,
        Targets {
            rate: Check::Info,
            gap_p50_us: 50.0,
            min_max: 0.8,
            commands: Check::KitAtMost(6.0),
        },
        runs,
    );
    rows.extend(against_rslock);
    Ok((rows, detail))
}

/// W8: a semaphore of `w8_permits` permits on one name, in one process and across processes.
pub(crate) async fn semaphore(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    let permits = p.w8_permits;
    let mut taken = Taken {
        tag: "w8",
        kind: KitKind::Semaphore,
        permits,
        sides: &[Side::Kit],
    };
    let [kit, ..] = one_process(ctx, taken).await?;
    let mut rows = semaphore_rows(
        &format!(
            "W8 semaphore of {permits}, 1 process x {} tasks",
            p.w3_tasks
        ),
        permits,
        &kit,
    );
    taken.tag = "w8x";
    let [kit, ..] = processes(ctx, taken).await?;
    rows.extend(semaphore_rows(
        &format!(
            "W8 semaphore of {permits}, {} processes x {} tasks",
            p.w3_procs, p.w3_tasks_per_proc
        ),
        permits,
        &kit,
    ));
    Ok(rows)
}

/// W11: the fair lock across processes, against the floor's mutex.
pub(crate) async fn fair(ctx: &Ctx) -> Result<Vec<Row>, BoxError> {
    let p = &ctx.params;
    let taken = Taken {
        tag: "w11",
        kind: KitKind::Fair,
        permits: 1,
        sides: &Side::BOTH,
    };
    let [kit, floor, _] = processes(ctx, taken).await?;
    let runs = [kit, floor];
    Ok(rows(
        &format!(
            "W11 fair lock, {} processes x {} tasks",
            p.w3_procs, p.w3_tasks_per_proc
        ),
        Targets {
            rate: Check::Info,
            gap_p50_us: 1_000.0,
            min_max: 0.9,
            commands: Check::Info,
        },
        runs,
    ))
}

/// Arguments of one `hot-key-worker` process.
#[derive(Debug, Clone, Args)]
pub(crate) struct WorkerArgs {
    #[arg(long)]
    url: String,
    #[arg(long, value_enum)]
    side: Side,
    #[arg(long)]
    prefix: String,
    #[arg(long)]
    key: String,
    #[arg(long, value_enum)]
    kind: KitKind,
    #[arg(long)]
    permits: u32,
    #[arg(long)]
    first_task: u32,
    #[arg(long)]
    tasks: usize,
    #[arg(long)]
    secs: f64,
    #[arg(long)]
    hold_us: u64,
    #[arg(long)]
    wait_secs: f64,
    #[arg(long)]
    floor_lease_ms: u64,
    #[arg(long)]
    floor_retry_us: u64,
}

/// The worker process: connect, warm up, print `ready`, wait for `go` on stdin, contend, print
/// the [`Outcome`] as one JSON line.
pub(crate) async fn worker(args: WorkerArgs) -> Result<(), BoxError> {
    let lock = Lock::open(
        args.side,
        &args.url,
        &args.prefix,
        args.floor_lease_ms,
        Duration::from_micros(args.floor_retry_us),
    )
    .await?;
    lock.warm_up(&format!("warm-up:{}", args.first_task))
        .await?;
    let spec = Spec {
        key: args.key,
        kind: args.kind,
        permits: args.permits,
        first_task: args.first_task,
        tasks: args.tasks,
        secs: args.secs,
        hold: Duration::from_micros(args.hold_us),
        wait: Duration::from_secs_f64(args.wait_secs),
    };
    println!("ready");
    let mut line = String::new();
    BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await?;
    if line.trim() != "go" {
        return Err(format!("expected `go`, got {line:?}").into());
    }
    let outcome = contend(&lock, &spec).await?;
    println!("{}", serde_json::to_string(&outcome)?);
    Ok(())
}

/// W3 across processes.
pub(crate) async fn cross_process(ctx: &Ctx) -> Result<(Vec<Row>, HotKeyDetail), BoxError> {
    let p = &ctx.params;
    let taken = Taken {
        tag: "w3x",
        ..MUTEX
    };
    let [kit, floor, rslock] = processes(ctx, taken).await?;
    let workload = format!(
        "W3 hot key, {} processes x {} tasks",
        p.w3_procs, p.w3_tasks_per_proc
    );
    let against_rslock = rslock_rows(&workload, &kit, &rslock);
    let runs = [kit, floor];
    let detail = HotKeyDetail::new(&workload, &runs);
    let mut rows = rows(
        &workload,
        Targets {
            rate: Check::Info,
            gap_p50_us: 50.0,
            min_max: 0.8,
            commands: Check::KitAtMost(6.0),
        },
        runs,
    );
    rows.extend(against_rslock);
    Ok((rows, detail))
}

/// The runs of `w3_procs` worker processes of `w3_tasks_per_proc` tasks each, per side (kit,
/// floor, rslock; empty when not taken).
async fn processes(ctx: &Ctx, taken: Taken) -> Result<[Vec<Metrics>; 3], BoxError> {
    let p = &ctx.params;
    let exe = std::env::current_exe()?;
    let total = p.w3_procs * p.w3_tasks_per_proc;
    let mut runs = [vec![], vec![], vec![]];
    for rep in 0..p.reps {
        for (s, side) in Side::WITH_RSLOCK.into_iter().enumerate() {
            if !taken.sides.contains(&side) {
                continue;
            }
            let prefix = ctx.prefix(taken.tag, rep, side);
            let mut workers = Vec::new();
            for proc in 0..p.w3_procs {
                let mut child = tokio::process::Command::new(&exe)
                    .arg("hot-key-worker")
                    .args([
                        "--url",
                        &ctx.url,
                        "--side",
                        side.name(),
                        "--prefix",
                        &prefix,
                    ])
                    .args(["--key", "hot"])
                    .args([
                        "--kind",
                        taken
                            .kind
                            .to_possible_value()
                            .ok_or("kind name")?
                            .get_name(),
                    ])
                    .args(["--permits", &taken.permits.to_string()])
                    .args(["--first-task", &(proc * p.w3_tasks_per_proc).to_string()])
                    .args(["--tasks", &p.w3_tasks_per_proc.to_string()])
                    .args(["--secs", &p.w3_secs.to_string()])
                    .args(["--hold-us", &p.w3_hold_us.to_string()])
                    .args(["--wait-secs", &p.w3_wait_secs.to_string()])
                    .args(["--floor-lease-ms", &p.floor_lease_ms.to_string()])
                    .args(["--floor-retry-us", &p.floor_retry_us.to_string()])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .kill_on_drop(true)
                    .spawn()?;
                let stdin = child.stdin.take().ok_or("worker stdin")?;
                let stdout = BufReader::new(child.stdout.take().ok_or("worker stdout")?).lines();
                workers.push((child, stdin, stdout));
            }
            for (_, _, stdout) in &mut workers {
                let line = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
                    .await
                    .map_err(|_| "worker did not get ready in 30 s")??;
                if line.as_deref() != Some("ready") {
                    return Err(format!("worker said {line:?} instead of ready").into());
                }
            }
            let meter = RunMeter::start(ctx, Duration::from_micros(p.w3_hold_us)).await?;
            for (_, stdin, _) in &mut workers {
                stdin.write_all(b"go\n").await?;
                stdin.flush().await?;
            }
            let mut outcome = Outcome::default();
            for (mut child, _, mut stdout) in workers {
                let line = stdout
                    .next_line()
                    .await?
                    .ok_or("worker exited without a result")?;
                outcome.merge(serde_json::from_str(&line)?);
                let status = child.wait().await?;
                if !status.success() {
                    return Err(format!("worker failed: {status}").into());
                }
            }
            let m = meter.finish(ctx, outcome, total, taken, rep, side).await?;
            runs[s].push(m);
        }
    }
    Ok(runs)
}
