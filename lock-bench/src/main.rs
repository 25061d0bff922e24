//! `lock-bench`: the lock kit against the raw floor, workload by workload, in one run.
//!
//! ```text
//! cargo run --release -p lock-bench                 # full run (a few minutes)
//! cargo run --release -p lock-bench -- --quick      # smoke run (well under a minute)
//! cargo run --release -p lock-bench -- --only w1,w3 --w3-secs 5 --json /tmp/bench.json
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release -p lock-bench
//! ```
//!
//! Without `REDIS_URL` the benchmark starts its own `redis-server` on a free loopback port.
//! Every workload runs for the kit (`lock_core`) and for the floor (bare `SET NX PX` plus a
//! compare-and-delete `EVALSHA` on one multiplexed connection, busy-retrying `SET NX` to
//! wait), alternating kit, floor, kit, floor, ..., and reports the median of the runs, so that
//! the ratio holds on a noisy machine. W1-W3 run the `rslock` crate as a third side (kit,
//! floor, rslock, ...), in rows whose floor column is rslock's. The table goes to stdout (progress to stderr), the JSON
//! with every run's value to `--json`, and SVG charts next to it (`<json stem>-*.svg`).

mod charts;
mod correctness;
mod floor;
mod hot_key;
mod http;
mod lock;
mod lock_kinds;
mod params;
mod redis_stats;
mod reentrancy;
mod report;
mod residue;
mod rslock;
mod stats;
mod sys;
mod uncontended;
mod watchdog;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand, ValueEnum};
use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::lock::{BoxError, Lock};
use crate::params::{Overrides, Params};
use crate::redis_stats::CommandStats;
use crate::report::Row;

/// Benchmark of the Redis lock kit against the raw `SET NX PX` + `EVALSHA` floor.
#[derive(Debug, Parser)]
#[command(name = "lock-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Smaller sizes for a smoke run (flags below still override them).
    #[arg(long)]
    quick: bool,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench.json")]
    json: PathBuf,
    /// Redis to run against; without it (or with an empty value, as `REDIS_URL=` gives) a
    /// `redis-server` is started on a free port.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// Run only these workloads (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<Workload>,
    #[command(flatten)]
    overrides: Overrides,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// W3 across processes: one worker process (started by the benchmark itself).
    #[command(hide = true)]
    HotKeyWorker(hot_key::WorkerArgs),
    /// W6: the watchdog-scale measurement in a fresh process (started by the benchmark itself).
    #[command(hide = true)]
    WatchdogWorker(watchdog::WorkerArgs),
}

/// The workloads, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Workload {
    /// Uncontended acquire+release latency, one task.
    W1,
    /// Throughput, 64 tasks on distinct keys.
    W2,
    /// One hot key, 16 tasks in one process.
    W3,
    /// One hot key, 4 processes x 4 tasks.
    W3x,
    /// Correctness of a read-modify-write under the lock, and the unlocked control.
    W4,
    /// Reentrancy: nested acquire+release of a held key.
    W5,
    /// Watchdog renewal of 10,000 held locks.
    W6,
    /// The tower layer on an axum route.
    W7,
    /// Semaphore of 3 permits on one name, 16 tasks and 4 processes x 4 tasks.
    W8,
    /// Read-write lock: 16 tasks, 90 % reads, against the mutex for all.
    W9,
    /// Multi-key lock: `lock_all` of two keys against two mutex locks and the floor.
    W10,
    /// Fair lock: one hot key, 4 processes x 4 tasks.
    W11,
    /// Residue: keys and bytes that releases leave in Redis, at once and later.
    W12,
}

/// Which side of a comparison runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub(crate) enum Side {
    /// `lock_core`.
    Kit,
    /// Bare `SET NX PX` + compare-and-delete `EVALSHA`.
    Floor,
    /// The `rslock` crate (W1-W3 only).
    Rslock,
    /// The floor with what the kit does for five of its guarantees (W1, W2 and W7; see
    /// `floor.rs`).
    Guarded,
}

impl Side {
    /// The alternation order within one repetition.
    pub(crate) const BOTH: [Self; 2] = [Self::Kit, Self::Floor];
    /// The alternation order of the workloads that run rslock too.
    pub(crate) const WITH_RSLOCK: [Self; 3] = [Self::Kit, Self::Floor, Self::Rslock];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Kit => "kit",
            Self::Floor => "floor",
            Self::Rslock => "rslock",
            Self::Guarded => "floor+guarantees",
        }
    }
}

/// CPU seconds of this process and of the Redis server at one moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cpu {
    pub(crate) client: f64,
    pub(crate) server: f64,
}

/// What every workload needs: where Redis is, the parameters, a monitoring connection.
pub(crate) struct Ctx {
    pub(crate) url: String,
    pub(crate) params: Params,
    run: String,
    monitor: MultiplexedConnection,
}

impl Ctx {
    /// A fresh key prefix for one run of one workload on one side.
    pub(crate) fn prefix(&self, workload: &str, rep: usize, side: Side) -> String {
        format!("bench:{}:{workload}:{rep}:{}:", self.run, side.name())
    }

    /// Four hex digits that tell this run's keys from another run's.
    pub(crate) fn short_tag(&self) -> String {
        let sum = self
            .run
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        format!("{:04x}", sum & 0xffff)
    }

    /// `INFO commandstats` now.
    pub(crate) async fn stats(&self) -> Result<CommandStats, BoxError> {
        Ok(CommandStats::read(&mut self.monitor.clone()).await?)
    }

    /// CPU seconds used so far by this process and by the Redis server.
    pub(crate) async fn cpu(&self) -> Result<Cpu, BoxError> {
        Ok(Cpu {
            client: sys::cpu_seconds(),
            server: redis_stats::server_cpu(&mut self.monitor.clone()).await?,
        })
    }

    /// A monitoring connection (not used by either lock client).
    pub(crate) fn conn(&self) -> MultiplexedConnection {
        self.monitor.clone()
    }

    /// The floor's pause between `SET NX` retries.
    pub(crate) fn floor_retry(&self) -> Duration {
        Duration::from_micros(self.params.floor_retry_us)
    }

    /// The longest wait of an acquire (W3, W4 and everywhere else).
    pub(crate) fn wait(&self) -> Duration {
        Duration::from_secs_f64(self.params.w3_wait_secs)
    }

    /// A lock client of `side` under `prefix`, warmed up.
    pub(crate) async fn open(&self, side: Side, prefix: &str) -> Result<Lock, BoxError> {
        let lock = Lock::open(
            side,
            &self.url,
            prefix,
            self.params.floor_lease_ms,
            self.floor_retry(),
        )
        .await?;
        lock.warm_up("warm-up").await?;
        Ok(lock)
    }

    /// One progress line on stderr.
    pub(crate) fn progress(&self, workload: &str, rep: usize, side: Side, what: &str) {
        eprintln!(
            "[{workload}] run {}/{} {:<6} {what}",
            rep + 1,
            self.params.reps,
            side.name()
        );
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lock-bench: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Everything runs in a spawned task, as a service's handlers do (locks are owned per task).
    let result = runtime.block_on(async move {
        tokio::spawn(async move {
            match cli.command {
                Some(Command::HotKeyWorker(args)) => hot_key::worker(args).await,
                Some(Command::WatchdogWorker(args)) => watchdog::worker(args).await,
                None => bench(cli).await,
            }
        })
        .await
        .map_err(BoxError::from)
        .and_then(|r| r)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lock-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn bench(cli: Cli) -> Result<(), BoxError> {
    let params = Params::resolve(cli.quick, &cli.overrides);
    if params.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    let (url, _server) = match cli.redis_url.clone().filter(|url| !url.is_empty()) {
        Some(url) => (url, None),
        None => {
            let server = lock_testkit::RedisServer::start()?;
            (server.url(), Some(server))
        }
    };
    let mut monitor = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let info: redis::InfoDict = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut monitor)
        .await?;
    let redis_version = info
        .get::<String>("redis_version")
        .map_or_else(|| "?".to_owned(), |v| v.trim().to_owned());
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let ctx = Ctx {
        url: url.clone(),
        params,
        run: format!("{started}-{}", std::process::id()),
        monitor,
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "lock-bench: redis {redis_version} at {}, {cpus} CPUs, {} sizes, {} runs per side",
        redact(&url),
        if ctx.params.quick { "quick" } else { "full" },
        ctx.params.reps
    );
    if let Ok(window) = std::env::var(lock::RELEASE_WINDOW_ENV) {
        eprintln!("lock-bench: the kit's release retry window is {window} ms");
    }

    let selected = |w: Workload| cli.only.is_empty() || cli.only.contains(&w);
    let clock = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    let mut details = Vec::new();
    if selected(Workload::W1) {
        rows.extend(uncontended::w1(&ctx).await?);
    }
    if selected(Workload::W2) {
        rows.extend(uncontended::w2(&ctx).await?);
    }
    if selected(Workload::W3) {
        let (w3, detail) = hot_key::in_process(&ctx).await?;
        rows.extend(w3);
        details.push(detail);
    }
    if selected(Workload::W3x) {
        let (w3x, detail) = hot_key::cross_process(&ctx).await?;
        rows.extend(w3x);
        details.push(detail);
    }
    if selected(Workload::W4) {
        rows.extend(correctness::run(&ctx).await?);
    }
    if selected(Workload::W5) {
        rows.extend(reentrancy::run(&ctx).await?);
    }
    if selected(Workload::W6) {
        rows.extend(watchdog::run(&ctx).await?);
    }
    if selected(Workload::W7) {
        rows.extend(http::run(&ctx).await?);
    }
    if selected(Workload::W8) {
        rows.extend(hot_key::semaphore(&ctx).await?);
    }
    if selected(Workload::W9) {
        rows.extend(lock_kinds::read_write(&ctx).await?);
    }
    if selected(Workload::W10) {
        rows.extend(lock_kinds::multi_key(&ctx).await?);
    }
    if selected(Workload::W11) {
        rows.extend(hot_key::fair(&ctx).await?);
    }
    if selected(Workload::W12) {
        rows.extend(residue::run(&ctx).await?);
    }
    let elapsed = clock.elapsed().as_secs_f64();

    let table = report::markdown(&rows);
    println!(
        "\nlock-bench: kit vs floor (and vs rslock in W1-W3, rows \"floor column: rslock\"), medians of {} alternating runs each (kit/floor: median of the per-pair ratios); redis {redis_version}, {cpus} CPUs, {} sizes, {elapsed:.0} s\n",
        ctx.params.reps,
        if ctx.params.quick { "quick" } else { "full" },
    );
    print!("{table}");
    let header = json!({
        "tool": "lock-bench",
        "started_unix": started,
        "elapsed_secs": elapsed,
        "redis_version": redis_version,
        "redis_url": redact(&url),
        "cpus": cpus,
        "params": ctx.params,
    });
    let doc = report::json(&rows, header);
    if let Some(dir) = cli.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&cli.json, serde_json::to_string_pretty(&doc)?)?;
    for chart in charts::write(&cli.json, &rows, &details)? {
        eprintln!("lock-bench: chart {}", chart.display());
    }
    eprintln!(
        "lock-bench: {} of {} targets met; JSON in {}",
        doc["summary"]["passed"],
        doc["summary"]["targets"],
        cli.json.display()
    );
    Ok(())
}

/// The URL without its password, for output.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}
