//! F22 with Sentinel: a smaller chaos soak whose faults are manual failovers. Two lockers (in
//! this process, each with its own connections) lock through Sentinel with
//! `min_replicas(1, ..)`: 6 tasks each run short sections on 4 keys, and one task each runs
//! long sections (0.3-2 s, past the 1 s lease, `is_held()` confirmed every 10 ms) on 2 other
//! keys, the same cycles as `soak.rs` (`common/sections.rs`). Every section goes through the
//! double-holder oracle on a separate referee server.
//!
//! The chaos: `SENTINEL FAILOVER <master>` 3 s in, then again once the previous failover is
//! over (the sentinels agree on the new master, it answers `ROLE` as master, and the old one
//! has been turned into its replica with the link up, so that the next failover has a
//! replica to promote), until 4 s before the end. After a manual failover the old primary
//! keeps answering as a master until the sentinels reconfigure it (seconds later): a locker
//! that has not yet asked Sentinel again still talks to it.
//!
//! At the end: a clean oracle report (no unsignalled overlap, no unexplained occupancy
//! collision, no fence regression, no stale write accepted), no overlap signalled later than
//! one renewal interval (the failover window of RELIABILITY.md S2), every section finished
//! (completed, lost or release failed), at least two failovers in a 20 s run, and nothing
//! left on the current master or in the lockers. One line starting with `SOAK SENTINEL:`
//! gives the figures (`--nocapture`, or the CI log via `lock_testkit::figure`).
//!
//! `LOCK_SOAK_SECS` sets the run time (default 22 s). `LOCK_SOAK_VERBOSE=1` prints the
//! failover timeline and the sections open around each failover.

use crate::common;
#[path = "../common/sections.rs"]
mod sections;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lock_core::Locker;
use lock_testkit::oracle::{monotonic_ns, Interval, Oracle, Outcome};
use lock_testkit::{RedisSentinel, RedisServer};
use rand::Rng;
use sections::{cycles, long_holds, percentile, WorkerStats, Workload, BUCKETS};

/// Lockers (each stands for one service instance).
const LOCKERS: usize = 2;
/// Short-section tasks per locker.
const TASKS: usize = 6;
/// The watchdog lease, as in `soak.rs`.
const LEASE: Duration = Duration::from_secs(1);
/// Prefix of every lock key of the soak.
const PREFIX: &str = "soak:";
/// The master name the sentinels monitor.
const MASTER: &str = "soak";
/// How long after a failover was observed the old master is made a replica of the new one,
/// in milliseconds.
const REJOIN_AFTER_MS: std::ops::RangeInclusive<u64> = 0..=500;
/// The pause between the end of a failover and the next one, in milliseconds.
const BETWEEN_MS: std::ops::RangeInclusive<u64> = 2000..=4000;

fn workload() -> Workload {
    Workload {
        keys: 4,
        hold_keys: 2,
        hold_ms: 300..=2000,
        wait: Duration::from_secs(5),
        unlocked_every: 0,
    }
}

async fn sentinel_locker(sentinel: &RedisSentinel) -> Locker {
    Locker::builder()
        .sentinel(sentinel.master_name(), sentinel.sentinel_urls())
        .prefix(PREFIX)
        .watchdog_lease(LEASE)
        .command_timeout(LEASE)
        .connect_timeout(Duration::from_millis(500))
        .fence_retention(LEASE * 2)
        .min_replicas(1, Duration::from_millis(300))
        .build()
        .await
        .expect("a Sentinel locker")
}

/// One manual failover, `CLOCK_MONOTONIC` ns.
struct Failover {
    /// Before `SENTINEL FAILOVER` was sent.
    asked: u64,
    /// When every sentinel reported the new master and it answered `ROLE` as master.
    promoted: u64,
    /// When the old master was a replica of the new one with its link up.
    rejoined: u64,
    old_port: u16,
    new_port: u16,
}

/// `SENTINEL FAILOVER` on the first sentinel that accepts it (one may refuse with `INPROG` or
/// `NOGOODSLAVE` for a moment after the previous failover); retried for up to 10 s.
fn ask_for_failover(sentinel: &RedisSentinel) {
    let started = Instant::now();
    loop {
        let mut last = String::new();
        for s in sentinel.sentinels() {
            match s.try_cmd::<String>(&["SENTINEL", "FAILOVER", MASTER]) {
                Ok(_) => return,
                Err(e) => last = format!("sentinel {}: {e}", s.port()),
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no sentinel accepted SENTINEL FAILOVER: {last}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until `server` is a replica of `master_port` with `master_link_status:up`.
fn wait_replica_of(server: &RedisServer, master_port: u16, limit: Duration) {
    let started = Instant::now();
    loop {
        let info: String = server.try_cmd(&["INFO", "replication"]).unwrap_or_default();
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
                .unwrap_or("")
                .to_owned()
        };
        if field("role") == "slave"
            && field("master_port") == master_port.to_string()
            && field("master_link_status") == "up"
        {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "port {} is not a replica of {master_port} after {limit:?}: {info}",
            server.port()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ms(ns: u64) -> u64 {
    ns / 1_000_000
}

#[test]
fn sentinel_failover_soak() {
    let secs: u64 = std::env::var("LOCK_SOAK_SECS")
        .ok()
        .map(|s| s.parse().expect("LOCK_SOAK_SECS is a number of seconds"))
        .unwrap_or(22);
    let verbose = std::env::var("LOCK_SOAK_VERBOSE").is_ok();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut sentinel = RedisSentinel::start(MASTER).expect("a Sentinel deployment");
    let referee = RedisServer::start().expect("redis-server");
    let run = format!("sentinel{}", std::process::id());
    let lockers: Vec<Locker> = (0..LOCKERS)
        .map(|_| rt.block_on(sentinel_locker(&sentinel)))
        .collect();
    let parent = rt
        .block_on(Oracle::connect(&referee.url(), &run, "parent"))
        .unwrap();

    let started_ns = monotonic_ns();
    let until = started_ns + secs * 1_000_000_000;
    let mut stats = Vec::new();
    let mut tasks = Vec::new();
    for (i, locker) in lockers.iter().enumerate() {
        let oracle = rt
            .block_on(Oracle::connect(&referee.url(), &run, &format!("w{i}")))
            .unwrap();
        let worker_stats = WorkerStats::new();
        for _ in 0..TASKS {
            let (locker, oracle, s) = (locker.clone(), oracle.clone(), worker_stats.clone());
            tasks.push(rt.spawn(cycles(locker, oracle, s, until, workload())));
        }
        let (locker, oracle, s) = (locker.clone(), oracle.clone(), worker_stats.clone());
        tasks.push(rt.spawn(long_holds(locker, oracle, s, until, workload())));
        stats.push(worker_stats);
    }

    // The chaos: manual failovers, one at a time.
    let chaos_end = until.saturating_sub(4_000_000_000);
    let mut failovers: Vec<Failover> = Vec::new();
    std::thread::sleep(Duration::from_secs(3));
    while monotonic_ns() < chaos_end {
        let old_port = sentinel.known_master_port();
        let asked = monotonic_ns();
        ask_for_failover(&sentinel);
        let new_port = sentinel
            .wait_for_failover(Duration::from_secs(15))
            .expect("the manual failover");
        let promoted = monotonic_ns();
        // Sentinel turns the old master into a replica of the new one about 10 s after a
        // manual failover; until then the new master has no replica and every min_replicas
        // acquire is refused, so no second holder can appear. Do it 0-500 ms after the
        // promotion instead, as Sentinel does with the other replicas of a deployment with
        // two: the new master can then grant replicated locks while lockers that have not yet
        // asked Sentinel again may still renew on the old one.
        let delay = rand::rng().random_range(REJOIN_AFTER_MS);
        std::thread::sleep(Duration::from_millis(delay));
        let old = sentinel.current_replica();
        let _: () = old
            .try_cmd(&["REPLICAOF", "127.0.0.1", &new_port.to_string()])
            .expect("REPLICAOF on the old master");
        wait_replica_of(old, new_port, Duration::from_secs(10));
        let rejoined = monotonic_ns();
        failovers.push(Failover {
            asked,
            promoted,
            rejoined,
            old_port,
            new_port,
        });
        std::thread::sleep(Duration::from_millis(rand::rng().random_range(BETWEEN_MS)));
    }

    // Drain: every task stops starting sections at `until`.
    for task in tasks {
        rt.block_on(task).expect("a soak task panicked");
    }
    let drained_ns = monotonic_ns();
    let intervals = rt.block_on(parent.intervals()).unwrap();
    let report = rt.block_on(parent.report()).unwrap();
    let elapsed_s = (drained_ns - started_ns) as f64 / 1e9;

    // Losses and their detection after a failover (from the promotion).
    let lost: Vec<&Interval> = intervals
        .iter()
        .filter(|iv| iv.outcome == Outcome::Lost)
        .collect();
    let long_sections = intervals
        .iter()
        .filter(|iv| iv.key.starts_with('h'))
        .count();
    let mut hist = vec![0u64; BUCKETS];
    let get = |f: fn(&WorkerStats) -> u64| stats.iter().map(|s| f(s)).sum::<u64>();
    for s in &stats {
        for (b, n) in s.latency.lock().unwrap().iter().enumerate() {
            hist[b] += n;
        }
    }
    if verbose || !report.is_clean() {
        eprintln!("times in ms from the start, CLOCK_MONOTONIC {started_ns} ns");
        for f in &failovers {
            eprintln!(
                "failover {} -> {}: asked {} promoted {} old master rejoined {}",
                f.old_port,
                f.new_port,
                ms(f.asked - started_ns),
                ms(f.promoted - started_ns),
                ms(f.rejoined - started_ns),
            );
        }
        for iv in intervals.iter().filter(|iv| iv.key.starts_with('h')) {
            eprintln!(
                "long {} {} fence {} enter {} last_held {:?} lost {:?} exit {} {:?}",
                iv.id,
                iv.key,
                iv.fence,
                ms(iv.t_enter - started_ns),
                iv.last_held.map(|t| ms(t - started_ns)),
                iv.lost_at.map(|t| ms(t - started_ns)),
                ms(iv.t_exit - started_ns),
                iv.outcome,
            );
        }
        for iv in &lost {
            eprintln!(
                "lost {} {} fence {} enter {} last_held {:?} lost {:?} exit {}",
                iv.id,
                iv.key,
                iv.fence,
                ms(iv.t_enter - started_ns),
                iv.last_held.map(|t| ms(t - started_ns)),
                iv.lost_at.map(|t| ms(t - started_ns)),
                ms(iv.t_exit - started_ns),
            );
        }
        for v in &report.violations {
            eprintln!("violation {v}");
        }
    }
    let promote_ms: Vec<u64> = failovers.iter().map(|f| ms(f.promoted - f.asked)).collect();
    let rejoin_ms: Vec<u64> = failovers
        .iter()
        .map(|f| ms(f.rejoined - f.promoted))
        .collect();
    lock_testkit::figure(&format!(
        "SOAK SENTINEL: secs={elapsed_s:.1} lockers={LOCKERS}x{TASKS}+1 keys=4+2 lease={}ms min_replicas=1 \
         failovers={} (asked->promoted ms {promote_ms:?}, promoted->old master rejoined ms {rejoin_ms:?}) \
         cycles={} cycles_per_s={:.0} long_sections={long_sections} completed={} lost={} release_failed={} \
         | overlaps={} signalled={} late_signalled={} unsignalled={} \
         occupancy_collisions={} occupancy_violations={} fence_regressions={} late_claims={} \
         | writes={} accepted={} stale_attempted={} stale_rejected={} stale_accepted={} \
         | acquire p50={:?} p99={:?} busy={} acquire_errors={}",
        LEASE.as_millis(),
        failovers.len(),
        report.cycles,
        report.cycles as f64 / elapsed_s,
        report.completed,
        report.lost,
        report.release_failed,
        report.overlaps,
        report.signalled_overlaps,
        report.late_signalled_overlaps,
        report.unsignalled_overlaps,
        report.occupancy_collisions,
        report.occupancy_violations,
        report.fence_regressions,
        report.late_claims,
        report.writes,
        report.writes_accepted,
        report.stale_attempted,
        report.stale_rejected,
        report.stale_accepted,
        percentile(&hist, 0.5),
        percentile(&hist, 0.99),
        get(|s| s.busy.load(Ordering::Relaxed)),
        get(|s| s.acquire_errors.load(Ordering::Relaxed)),
    ));

    // The documented failover window (RELIABILITY.md S2) can also leave a holder's
    // `is_held()` true after the promoted replica's key expired: renewals are not `WAIT`ed, so
    // the holder may count on a TTL up to one renewal interval (lease / 3) longer than the new
    // primary's. An overlap the holder did not see is that window when it is no longer than
    // one renewal interval and its stale write was fenced off; anything else is a bug. (Seen
    // once: 45.6 ms, both stale writes of the run rejected.)
    assert!(
        report.unsignalled_overlaps == 0 || report.max_overlap <= LEASE / 3,
        "an unseen overlap longer than one renewal interval: {report}\n{:#?}",
        report.violations
    );
    assert_eq!(report.over_limit, 0, "{report}");
    assert_eq!(report.fence_regressions, 0, "{report}");
    assert_eq!(report.occupancy_violations, 0, "{report}");
    assert_eq!(report.stale_accepted, 0, "{report}");
    // Nothing is paused or killed here. A late signal can still come from the documented
    // failover window (RELIABILITY.md S2): renewals are not `WAIT`ed, so the promoted replica
    // may hold a TTL up to one renewal interval (lease / 3) shorter than the one its holder
    // counts on; the holder learns it at its next renewal. Within that bound it is the window,
    // beyond it a bug. (Seen once in 14 runs: a signal 741 us late, the stale write fenced off.)
    assert_eq!(report.killed_overlaps, 0, "{report}");
    assert!(
        report.max_late_signal <= LEASE / 3,
        "a signal later than one renewal interval: {report}"
    );
    assert_eq!(report.unfinished, 0, "sections left open");
    assert_eq!(report.enters, report.cycles, "enters without a logged end");
    assert_eq!(report.killed, 0);
    assert_eq!(
        report.completed + report.lost + report.release_failed,
        report.cycles
    );
    assert!(report.cycles > 0);
    assert_eq!(
        get(|s| s.cycles.load(Ordering::Relaxed)),
        report.cycles,
        "sections counted by the tasks and by the referee"
    );
    if secs >= 20 {
        assert!(failovers.len() >= 2, "only {} failovers", failovers.len());
    }
    let master = sentinel.master();
    let refs: Vec<&Locker> = lockers.iter().collect();
    rt.block_on(common::assert_nothing_left_under(
        master,
        PREFIX,
        &[],
        &refs,
    ));
}
