//! Read-write locks against a real redis-server: readers share, a writer excludes everyone, a
//! waiting writer is not starved, reentrancy rules, per-reader leases, loss, cancellation.
//! The concurrent runs go through the double-holder oracle in its readers-xor-writer mode,
//! and each has a control run (writers taking only the read lock) that the checks must fail.
//! Several-process runs re-execute this test binary as workers (`child_worker`).

use crate::common;

use std::future::IntoFuture;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::child::{spawn_child, wait_for_line, MODE, REFEREE, URL};
use common::{eventually, keys, locker, server};
use lock_core::{LockError, Locker};
use lock_testkit::oracle::{Oracle, Outcome, Report};
use lock_testkit::RedisServer;
use redis::AsyncCommands;

#[tokio::test]
async fn readers_share_and_a_writer_waits_for_all_of_them() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let c = locker(&server).await;
    let r1 = a.read("cat").wait(Duration::ZERO).await.unwrap();
    let r2 = b.read("cat").wait(Duration::ZERO).await.unwrap();
    assert!(r1.is_shared() && r2.is_shared());
    let busy = c.write("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    let busy = c.lock("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    r1.release().await.unwrap();
    let busy = c.write("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    let writer = tokio::spawn({
        let c = c.clone();
        async move { c.write("cat").wait(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A writer waits: a new reader must not overtake it.
    let busy = a.read("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    r2.release().await.unwrap();
    let w = writer.await.unwrap().unwrap();
    assert!(!w.is_shared());
    assert!(w.fencing_token().await.unwrap() > 0);
    let busy = b.read("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    let reader = tokio::spawn({
        let b = b.clone();
        async move { b.read("cat").wait(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    w.release().await.unwrap();
    let r = reader.await.unwrap().unwrap();
    assert!(matches!(
        r.fencing_token().await,
        Err(LockError::NotExclusive { .. })
    ));
    r.release().await.unwrap();
    assert!(
        server
            .keys("lock:*")
            .iter()
            .all(|k| !k.contains(":lock:") && !k.contains(":readers:")),
        "{:?}",
        server.keys("lock:*")
    );
    common::assert_nothing_left(&server, &[&a, &b, &c]).await;
}

#[tokio::test]
async fn reentrancy_read_in_write_is_nested_write_in_read_is_refused() {
    let server = server();
    let a = locker(&server).await;
    let w = a.write("k").await.unwrap();
    let r = a.read("k").wait(Duration::ZERO).await.unwrap();
    assert!(
        !r.is_shared(),
        "a read inside a write shares the write lock"
    );
    r.release().await.unwrap();
    w.release().await.unwrap();
    let r = a.read("k").await.unwrap();
    let again = a.read("k").wait(Duration::ZERO).await.unwrap();
    let err = a.write("k").wait(Duration::from_secs(1)).await.unwrap_err();
    assert!(matches!(err, LockError::WriteInsideRead { .. }), "{err}");
    again.release().await.unwrap();
    r.release().await.unwrap();
    a.write("k")
        .wait(Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    common::assert_nothing_left(&server, &[&a]).await;
}

#[tokio::test]
async fn lock_all_takes_every_key_or_none() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let both = a
        .lock_all(["y", "x", "y"])
        .wait(Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(both.keys().collect::<Vec<_>>(), ["x", "y"]);
    assert!(b.is_locked("x").await.unwrap() && b.is_locked("y").await.unwrap());
    both.release().await.unwrap();
    let held = b.lock("y").await.unwrap();
    let err = a
        .lock_all(["x", "y"])
        .wait(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Busy { ref key, .. } if key == "y"),
        "{err}"
    );
    assert!(!b.is_locked("x").await.unwrap(), "x was rolled back");
    held.release().await.unwrap();
    assert!(matches!(
        a.lock_all(Vec::<String>::new()).await,
        Err(LockError::NoKeys)
    ));
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

// ---------------------------------------------------------------------------------------------
// Readers and writers of one key under the oracle, in one process and in several.

/// The key every reader and writer of the concurrent runs locks.
const CATALOGUE: &str = "catalogue";

/// How the writers of a run lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writers {
    /// With the write lock (the kit under test).
    WriteLock,
    /// The control: with the read lock only, so they share the key with readers and with
    /// each other. Every check below must see it.
    ReadLockOnly,
}

/// `tasks` tasks of `locker`, `cycles` lock cycles each on `key`; one cycle in four writes,
/// the others read. The protected data are two keys of the Redis at `url`, `<key>-a` and
/// `<key>-b`: a writer reads `-a`, pauses, writes it + 1, pauses, writes the same to `-b`,
/// then counts itself in `<key>-writes`; a reader reads `-a`, pauses, reads `-b` and counts a
/// torn read (the halves differ: it saw a write half done) in `<key>-torn`. Every section goes through
/// `oracle`: writers exclusive with their fencing token (the control's with made-up rising
/// tokens, since readers have none), readers shared.
async fn rw_cycles(
    locker: &Locker,
    url: &str,
    oracle: &Oracle,
    key: &str,
    tasks: usize,
    cycles: usize,
    writers: Writers,
) {
    let client = redis::Client::open(url).unwrap();
    let made_up_fence = Arc::new(AtomicU64::new(u64::from(std::process::id()) << 20));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (locker, client, oracle) = (locker.clone(), client.clone(), oracle.clone());
        let made_up_fence = made_up_fence.clone();
        let key = key.to_owned();
        let [half_a, half_b, writes, torn] =
            ["a", "b", "writes", "torn"].map(|s| format!("{key}-{s}"));
        handles.push(tokio::spawn(async move {
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let pause = Duration::from_micros(300);
            for i in 0..cycles {
                let write = (t * 7 + i) % 4 == 0;
                let wait = Duration::from_secs(60);
                if !write {
                    let guard = locker.read(key.as_str()).wait(wait).await.unwrap();
                    let mut entry = oracle.enter_shared(&key, || guard.is_held()).await.unwrap();
                    let a: i64 = conn.get(&half_a).await.unwrap_or(0);
                    tokio::time::sleep(pause).await;
                    let b: i64 = conn.get(&half_b).await.unwrap_or(0);
                    if a != b {
                        let _: i64 = conn.incr(&torn, 1).await.unwrap();
                    }
                    entry.observe(|| guard.is_held());
                    oracle.leave(&mut entry).await.unwrap();
                    guard.release().await.unwrap();
                    oracle.finish(entry, Outcome::Completed).await.unwrap();
                    continue;
                }
                let (guard, fence) = match writers {
                    Writers::WriteLock => {
                        let guard = locker.write(key.as_str()).wait(wait).await.unwrap();
                        let fence = guard.fencing_token().await.unwrap();
                        (guard, fence)
                    }
                    Writers::ReadLockOnly => {
                        let guard = locker.read(key.as_str()).wait(wait).await.unwrap();
                        (guard, made_up_fence.fetch_add(1, Ordering::Relaxed) + 1)
                    }
                };
                let mut entry = oracle.enter(&key, fence, || guard.is_held()).await.unwrap();
                let a: i64 = conn.get(&half_a).await.unwrap_or(0);
                tokio::time::sleep(pause).await;
                let _: () = conn.set(&half_a, a + 1).await.unwrap();
                tokio::time::sleep(pause).await;
                let _: () = conn.set(&half_b, a + 1).await.unwrap();
                entry.observe(|| guard.is_held());
                let accepted = oracle.write(&entry).await.unwrap();
                if writers == Writers::WriteLock {
                    assert!(accepted, "the writer's fenced write was rejected");
                }
                oracle.leave(&mut entry).await.unwrap();
                guard.release().await.unwrap();
                oracle.finish(entry, Outcome::Completed).await.unwrap();
                let _: i64 = conn.incr(&writes, 1).await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
}

/// What a run left in the protected data of `key`: (`-a`, `-writes`, `-torn`).
fn rw_data(server: &RedisServer, key: &str) -> (i64, i64, i64) {
    let get = |k: &str| -> i64 {
        let k = format!("{key}-{k}");
        server.cmd::<Option<i64>>(&["GET", &k]).unwrap_or_default()
    };
    (get("a"), get("writes"), get("torn"))
}

/// `lockers` lockers in this process, `tasks` tasks on each.
async fn rw_run_in_process(
    writers: Writers,
    lockers: usize,
    tasks: usize,
) -> (Report, (i64, i64, i64)) {
    let (server, referee) = (server(), server());
    let oracle = Oracle::connect(&referee.url(), "rw", "main").await.unwrap();
    let url = server.url();
    let mut all = Vec::new();
    for _ in 0..lockers {
        all.push(locker(&server).await);
    }
    let runs = all
        .iter()
        .map(|l| rw_cycles(l, &url, &oracle, CATALOGUE, tasks, 20, writers));
    tokio::time::timeout(
        Duration::from_secs(120),
        futures_util::future::join_all(runs),
    )
    .await
    .expect("the run finished (no deadlock)");
    let report = oracle.report().await.unwrap();
    let refs: Vec<&Locker> = all.iter().collect();
    common::assert_nothing_left(&server, &refs).await;
    (report, rw_data(&server, CATALOGUE))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_readers_and_writers_keep_readers_xor_one_writer() {
    let (report, (a, writes, torn)) = rw_run_in_process(Writers::WriteLock, 4, 8).await;
    lock_testkit::figure(&format!(
        "read-write lock, 32 tasks in 4 lockers, 640 cycles (1/4 writes): {report}"
    ));
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.cycles, 640, "{report}");
    assert_eq!(report.overlaps, 0, "{report}");
    assert_eq!(
        (a, writes, torn),
        (160, 160, 0),
        "lost updates or torn reads"
    );
    // The readers really shared the key (else a mutex would pass this test too).
    assert!(
        report.shared_overlaps > 0 && report.max_inside >= 2,
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_writers_with_only_the_read_lock_are_caught() {
    let (report, (a, writes, torn)) = rw_run_in_process(Writers::ReadLockOnly, 4, 8).await;
    lock_testkit::figure(&format!(
        "read-write control (writers take the read lock), 32 tasks: {report}; rw-a {a} of {writes} writes, {torn} torn reads"
    ));
    assert!(!report.is_clean(), "{report}");
    assert!(report.unsignalled_overlaps > 0, "{report}");
    assert!(report.occupancy_violations > 0, "{report}");
    assert!(
        a < writes || torn > 0,
        "no lost update and no torn read: {a} {writes} {torn}"
    );
}

/// The worker side. Does nothing unless started by a test of this file.
#[test]
#[ignore = "run as a child process by the tests of this file"]
fn child_worker() {
    let (Ok(mode), Ok(url)) = (std::env::var(MODE), std::env::var(URL)) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        match mode.as_str() {
            "rw-locked" | "rw-control" => {
                let locker = Locker::connect(&url).await.unwrap();
                let referee = std::env::var(REFEREE).unwrap();
                let worker = std::process::id().to_string();
                let oracle = Oracle::connect(&referee, "rw-processes", &worker)
                    .await
                    .unwrap();
                let writers = if mode == "rw-locked" {
                    Writers::WriteLock
                } else {
                    Writers::ReadLockOnly
                };
                rw_cycles(&locker, &url, &oracle, CATALOGUE, 6, 16, writers).await;
            }
            "read-watchdog" => {
                let locker = Locker::builder()
                    .url(url)
                    .watchdog_lease(Duration::from_secs(1))
                    .build()
                    .await
                    .unwrap();
                let _guard = locker.read("shared").await.unwrap();
                println!("HELD");
                std::future::pending::<()>().await;
            }
            "read-fixed" => {
                let locker = Locker::connect(&url).await.unwrap();
                let _guard = locker
                    .read("shared")
                    .lease(Duration::from_secs(2))
                    .await
                    .unwrap();
                println!("HELD");
                std::future::pending::<()>().await;
            }
            other => panic!("unknown mode {other}"),
        }
    });
}

/// Three child processes of 6 tasks each run [`rw_cycles`].
fn rw_run_in_processes(mode: &str) -> (Report, (i64, i64, i64)) {
    let (server, referee) = (server(), server());
    let children: Vec<Child> = (0..3)
        .map(|_| spawn_child(module_path!(), mode, &server.url(), &referee.url()))
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(common::assert_nothing_left(&server, &[]));
    let report = rt.block_on(async {
        let oracle = Oracle::connect(&referee.url(), "rw-processes", "parent")
            .await
            .unwrap();
        oracle.report().await.unwrap()
    });
    (report, rw_data(&server, CATALOGUE))
}

#[test]
fn three_processes_of_readers_and_writers_keep_readers_xor_one_writer() {
    let (report, (a, writes, torn)) = rw_run_in_processes("rw-locked");
    lock_testkit::figure(&format!(
        "read-write lock, 3 processes x 6 tasks, 288 cycles: {report}"
    ));
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        (report.cycles, report.overlaps),
        (3 * 6 * 16, 0),
        "{report}"
    );
    assert_eq!((a, writes, torn), (72, 72, 0), "lost updates or torn reads");
    assert!(report.shared_overlaps > 0, "{report}");
}

#[test]
fn control_three_processes_with_writers_on_the_read_lock_are_caught() {
    let (report, (a, writes, torn)) = rw_run_in_processes("rw-control");
    lock_testkit::figure(&format!(
        "read-write control, 3 processes: {report}; rw-a {a} of {writes} writes, {torn} torn reads"
    ));
    assert!(report.unsignalled_overlaps > 0, "{report}");
    assert!(report.occupancy_violations > 0, "{report}");
    assert!(
        a < writes || torn > 0,
        "no lost update and no torn read: {a} {writes} {torn}"
    );
}

// ---------------------------------------------------------------------------------------------
// Sharing, writer preference, reentrancy.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_readers_of_two_lockers_are_inside_at_once() {
    let (server, referee) = (server(), server());
    let lockers = [locker(&server).await, locker(&server).await];
    let oracle = Oracle::connect(&referee.url(), "share", "main")
        .await
        .unwrap();
    // Each reader waits inside its section until all eight are inside: only possible if they
    // hold the read lock together.
    let all_inside = Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (locker, oracle, all_inside) =
            (lockers[i % 2].clone(), oracle.clone(), all_inside.clone());
        tasks.push(tokio::spawn(async move {
            let guard = locker
                .read("doc")
                .wait(Duration::from_secs(5))
                .await
                .unwrap();
            let mut entry = oracle
                .enter_shared("doc", || guard.is_held())
                .await
                .unwrap();
            tokio::time::timeout(Duration::from_secs(5), all_inside.wait())
                .await
                .expect("all eight readers inside together");
            entry.observe(|| guard.is_held());
            oracle.leave(&mut entry).await.unwrap();
            guard.release().await.unwrap();
            oracle.finish(entry, Outcome::Completed).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = oracle.report().await.unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.max_inside, 8, "{report}");
    assert_eq!(report.shared_overlaps, 8 * 7 / 2, "{report}");
    assert_eq!(oracle.counters().await.unwrap()["max_occupancy"], 8);
    common::assert_nothing_left(&server, &[&lockers[0], &lockers[1]]).await;
}

/// Twelve readers of two lockers hold `doc` in a continuous stream (staggered, 30-40 ms each,
/// taking it again at once); then `writer` asks for the write lock. Returns how long the
/// writer waited.
///
/// Checked: no read acquire that began after the writer's entry appeared among the waiting
/// writers was granted before the writer got in (readers defer to a waiting writer). The
/// entry's first appearance is seen by a thread polling Redis every millisecond, so the
/// instant recorded is at or after the real one: a reader that began after it surely found the
/// writer waiting.
async fn writer_against_a_stream_of_readers(
    server: &RedisServer,
    readers: [&Locker; 2],
    writer: &Locker,
) -> Duration {
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    // (began, granted) of every read acquire.
    let granted: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..12u64 {
        let (locker, stop, reads, granted) = (
            readers[(i % 2) as usize].clone(),
            stop.clone(),
            reads.clone(),
            granted.clone(),
        );
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(3 * i)).await;
            while !stop.load(Ordering::Relaxed) {
                let began = Instant::now();
                let guard = locker
                    .read("doc")
                    .wait(Duration::from_secs(30))
                    .await
                    .unwrap();
                granted.lock().unwrap().push((began, Instant::now()));
                tokio::time::sleep(Duration::from_millis(30 + (i * 7) % 10)).await;
                guard.release().await.unwrap();
                reads.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The stream leaves no gap: a writer that does not wait (and so joins no waiting writers)
    // almost never finds the key free.
    let mut free = 0;
    for _ in 0..20 {
        match writer.write("doc").wait(Duration::ZERO).await {
            Ok(g) => {
                free += 1;
                g.release().await.unwrap();
            }
            Err(e) => assert!(e.is_busy(), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(7)).await;
    }
    assert!(
        free <= 2,
        "the readers' stream had gaps: {free} of 20 zero-wait writes got in"
    );
    let waiters = common::lock_key(server, "doc").replace(":lock:doc", ":waiters:doc");
    // A writer whose first try finds a gap never waits: ask again (a few times at most). The
    // wait is short enough for a starved writer to fail the checks below soon.
    let (asked, in_at, waits_from, acquired) = {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let watching = Arc::new(AtomicBool::new(true));
            let watcher = first_seen(server.url(), waiters.clone(), watching.clone());
            let asked = Instant::now();
            let acquired = writer.write("doc").wait(Duration::from_secs(1)).await;
            let in_at = Instant::now();
            watching.store(false, Ordering::Relaxed);
            match (watcher.join().unwrap(), acquired) {
                // A wait of a few milliseconds leaves no time for a reader to begin (the check
                // of held-back reads below would be vacuous): ask again.
                (Some(waits_from), acquired)
                    if attempts >= 5 || in_at - waits_from >= Duration::from_millis(20) =>
                {
                    break (asked, in_at, waits_from, acquired)
                }
                (_, Ok(guard)) if attempts < 5 => guard.release().await.unwrap(),
                (Some(waits_from), acquired) => break (asked, in_at, waits_from, acquired),
                (None, acquired) => panic!("the writer never waited: {acquired:?}"),
            }
        }
    };
    let took = in_at - asked;
    // Reads that began after the writer was seen waiting and were let in before it got in (or
    // gave up).
    let overtook = granted
        .lock()
        .unwrap()
        .iter()
        .filter(|(began, got)| *began > waits_from && *got < in_at)
        .count();
    assert_eq!(
        overtook,
        0,
        "{overtook} reads that began after the writer was seen waiting ({:?} after it asked) \
         got in before it (in or given up after {took:?}: {:?})",
        waits_from - asked,
        acquired.as_ref().map(|_| "in")
    );
    let guard = acquired.unwrap();
    // While the writer holds, no reader gets in (one that released just before may still
    // count itself: look after a moment).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = reads.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        reads.load(Ordering::Relaxed),
        before,
        "a reader got in under the writer"
    );
    guard.release().await.unwrap();
    // And the readers go on after it.
    assert!(
        eventually(Duration::from_secs(5), || reads.load(Ordering::Relaxed)
            > before + 12)
        .await,
        "the readers did not resume after the writer"
    );
    // Every read that began while the writer waited got in after it (not vacuous: some did).
    let held_back = granted
        .lock()
        .unwrap()
        .iter()
        .filter(|(began, got)| *began > waits_from && *began < in_at && *got > in_at)
        .count();
    assert!(held_back > 0, "no reader began while the writer waited");
    lock_testkit::figure(&format!(
        "writer seen waiting {:?} after it asked, in after {took:?}; {held_back} reads began in between, all let in after it",
        waits_from - asked
    ));
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    took
}

/// The first instant `key` is seen to exist, polled every millisecond on a thread of its own
/// while `watching`; `None` if it never was.
fn first_seen(
    url: String,
    key: String,
    watching: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Option<Instant>> {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    std::thread::spawn(move || {
        while watching.load(Ordering::Relaxed) {
            let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut conn).unwrap();
            if exists {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_is_not_starved_by_a_stream_of_readers() {
    let server = server();
    let (a, b, c) = (
        locker(&server).await,
        locker(&server).await,
        locker(&server).await,
    );
    // A writer of another locker, then one of the readers' own locker (its readers do not queue
    // behind it locally: only its entry in Redis holds them back).
    let remote = writer_against_a_stream_of_readers(&server, [&a, &b], &c).await;
    let local = writer_against_a_stream_of_readers(&server, [&a, &b], &a).await;
    lock_testkit::figure(&format!(
        "writer against a stream of 12 readers (30-40 ms holds): in after {remote:?} (other locker), {local:?} (readers' locker)"
    ));
    // The readers inside when it starts waiting leave within one hold (40 ms); 300 ms leaves
    // room for wake-up and scheduling. Without writer preference the stream never leaves it a
    // gap (it was still out after 20 s).
    for took in [remote, local] {
        assert!(
            took < Duration::from_millis(300),
            "the writer waited {took:?}"
        );
    }
    common::assert_nothing_left(&server, &[&a, &b, &c]).await;
}

/// K23 (review item K1), the stream of readers on RedLock (3 nodes): a waiting writer's entry
/// among the waiting writers stays on every node while it waits (the undo of a try that won
/// no majority deletes only its grant), so readers let it go first there too. The entry is
/// watched on node 0. Before: every busy try of the writer was undone on every node by the
/// release script, which took the entry out with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_a_waiting_writer_is_not_starved_by_a_stream_of_readers() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let build = || async {
        Locker::builder()
            .redlock(nodes.iter().map(RedisServer::url).collect::<Vec<_>>())
            .build()
            .await
            .unwrap()
    };
    let (a, b, c) = (build().await, build().await, build().await);
    let took = writer_against_a_stream_of_readers(&nodes[0], [&a, &b], &c).await;
    lock_testkit::figure(&format!(
        "redlock (3 nodes): writer against a stream of 12 readers in after {took:?}"
    ));
    assert!(
        took < Duration::from_millis(300),
        "the writer waited {took:?}"
    );
    for node in &nodes {
        common::assert_nothing_left(node, &[&a, &b, &c]).await;
    }
}

#[tokio::test]
async fn reentrancy_is_per_task_and_a_write_nests_inside_a_read_inside_a_write() {
    let server = server();
    let a = locker(&server).await;
    // write > read > write: the read shares the write lock, so the inner write nests too.
    let w = a.write("k").await.unwrap();
    let token = w.fencing_token().await.unwrap();
    let r = a.read("k").wait(Duration::ZERO).await.unwrap();
    let inner = a.write("k").wait(Duration::ZERO).await.unwrap();
    assert_eq!(inner.fencing_token().await.unwrap(), token, "the same lock");
    inner.release().await.unwrap();
    r.release().await.unwrap();
    assert!(w.is_held() && a.is_locked("k").await.unwrap());
    w.release().await.unwrap();
    assert!(!a.is_locked("k").await.unwrap());

    // Nested reads, then a write of another task of the same locker: it waits for the reader
    // (Busy), it is not refused as a write inside a read.
    let r1 = a.read("k").await.unwrap();
    let r2 = a.read("k").wait(Duration::ZERO).await.unwrap();
    let other = tokio::spawn({
        let a = a.clone();
        async move { a.write("k").wait(Duration::from_millis(200)).await }
    })
    .await
    .unwrap()
    .unwrap_err();
    assert!(other.is_busy(), "{other}");
    let own = a.write("k").wait(Duration::ZERO).await.unwrap_err();
    assert!(
        matches!(own, LockError::WriteInsideRead { ref key } if key == "k"),
        "{own}"
    );
    // A read of another task shares the lock. Not with a zero wait: the writer that gave up
    // leaves the waiting writers in the background, and until then readers let it go first
    // (its withdrawal wakes them).
    let shared = tokio::spawn({
        let a = a.clone();
        async move {
            let g = a.read("k").wait(Duration::from_secs(5)).await?;
            let shared = g.is_shared();
            g.release().await.map(|()| shared)
        }
    })
    .await
    .unwrap()
    .unwrap();
    assert!(shared);
    r2.release().await.unwrap();
    assert!(
        r1.is_held(),
        "the outer read still holds after the nested one left"
    );
    let own = a.write("k").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(own, LockError::WriteInsideRead { .. }), "{own}");
    r1.release().await.unwrap();
    a.write("k")
        .wait(Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    common::assert_nothing_left(&server, &[&a]).await;
}

// ---------------------------------------------------------------------------------------------
// Per-reader leases, loss, cancellation, wrong type.

/// A reader of a child process holds `shared`; this process holds it too; the child is
/// SIGKILLed. Returns the lockers, the parent's reader guard and when the child died.
async fn reader_killed_beside_a_live_reader(
    server: &RedisServer,
    mode: &str,
) -> (Locker, Locker, lock_core::LockGuard, Instant) {
    let mut child = spawn_child(module_path!(), mode, &server.url(), "");
    wait_for_line(&mut child, "HELD");
    let reader = common::locker_with_lease(server, Duration::from_secs(1)).await;
    let guard = reader.read("shared").wait(Duration::ZERO).await.unwrap();
    let writer = locker(server).await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    (reader, writer, guard, Instant::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_readers_hold_ends_with_its_own_lease_not_the_others() {
    let server = server();
    let (reader, writer, guard, killed) =
        reader_killed_beside_a_live_reader(&server, "read-watchdog").await;
    // Past the dead reader's 1 s lease: the live reader's hold is renewed and stays.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(guard.is_held());
    assert!(writer
        .write("shared")
        .wait(Duration::ZERO)
        .await
        .unwrap_err()
        .is_busy());
    let waiting = tokio::spawn({
        let writer = writer.clone();
        async move { writer.write("shared").wait(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "the writer got in beside a live reader"
    );
    // The live reader leaves; the dead one's lease has ended on its own, so nobody is left
    // and the writer gets in at once (woken by the release, not by a lease running out).
    let released = Instant::now();
    guard.release().await.unwrap();
    let w = waiting.await.unwrap().unwrap();
    let took = released.elapsed();
    lock_testkit::figure(&format!(
        "writer after the last live reader left, a SIGKILLed reader {:?} earlier: {took:?}",
        released - killed
    ));
    assert!(
        took < Duration::from_millis(500),
        "the writer waited {took:?}"
    );
    w.release().await.unwrap();
    common::assert_nothing_left(&server, &[&reader, &writer]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_reader_keeps_its_hold_until_its_lease_ends_then_a_writer_gets_in() {
    let server = server();
    // The child reads with a fixed 2 s lease; the live reader leaves at once after the kill.
    let (reader, writer, guard, killed) =
        reader_killed_beside_a_live_reader(&server, "read-fixed").await;
    guard.release().await.unwrap();
    let w = writer
        .write("shared")
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    let took = killed.elapsed();
    lock_testkit::figure(&format!(
        "writer after a SIGKILLed reader with a 2 s fixed lease: in {took:?} after the kill"
    ));
    // The dead reader was still inside until its lease ended (taken under 2 s before the
    // kill: by the set-up's time, under a second even on a busy machine), and not much
    // longer.
    assert!(
        took >= Duration::from_millis(1000),
        "the writer got in beside the dead reader after {took:?}"
    );
    assert!(
        took <= Duration::from_millis(3200),
        "the dead reader's hold outlived its lease: {took:?}"
    );
    w.release().await.unwrap();
    common::assert_nothing_left(&server, &[&reader, &writer]).await;
}

#[tokio::test]
async fn a_force_unlocked_read_lock_is_lost_by_every_reader() {
    let server = server();
    let a = common::locker_with_lease(&server, Duration::from_millis(300)).await;
    let b = common::locker_with_lease(&server, Duration::from_millis(300)).await;
    let admin = locker(&server).await;
    let ra = a.read("k").await.unwrap();
    let rb = b.read("k").await.unwrap();
    assert!(admin.force_unlock("k").await.unwrap());
    for guard in [&ra, &rb] {
        tokio::time::timeout(Duration::from_secs(2), guard.lost())
            .await
            .expect("a reader notices the loss");
        assert!(!guard.is_held());
    }
    assert!(ra.release().await.unwrap_err().is_lost());
    assert!(rb.release().await.unwrap_err().is_lost());
    // The key is free for a writer.
    admin
        .write("k")
        .wait(Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    common::assert_nothing_left(&server, &[&a, &b, &admin]).await;
}

#[tokio::test]
async fn readers_and_a_writer_learn_of_a_flushall() {
    let server = server();
    let a = common::locker_with_lease(&server, Duration::from_millis(300)).await;
    let r1 = a.read("r").await.unwrap();
    let r2 = tokio::spawn({
        let a = a.clone();
        async move { a.read("r").await.unwrap() }
    })
    .await
    .unwrap();
    let w = a.write("w").await.unwrap();
    let _: () = server.cmd(&["FLUSHALL"]);
    let flushed = Instant::now();
    for guard in [&r1, &r2, &w] {
        tokio::time::timeout(Duration::from_secs(2), guard.lost())
            .await
            .expect("the holder notices the loss");
    }
    lock_testkit::figure(&format!(
        "loss of two read locks and a write lock after FLUSHALL noticed in {:?} (lease 300 ms)",
        flushed.elapsed()
    ));
    for guard in [r1, r2, w] {
        assert!(guard.release().await.unwrap_err().is_lost());
    }
    common::assert_nothing_left(&server, &[&a]).await;
}

/// Polls until every key under `lock:` is a fence counter or a release latch (both outlive
/// a lock by design, with a TTL): abandoned writers' waiting entries, which hold back new
/// readers, and their waiting flags must be gone.
async fn only_fences_left(server: &RedisServer, limit: Duration) {
    let only_fences = || {
        keys(server, "lock:")
            .iter()
            .all(|k| k.contains(":fence:") || k.contains(":unlocked:"))
    };
    assert!(
        eventually(limit, only_fences).await,
        "left: {:?}",
        keys(server, "lock:")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_reads_writes_and_lock_alls_leave_nothing_behind() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    // A writer holds `k` and a reader holds `r`: reads and writes of `k`, writes of `r` and
    // lock_alls over both wait, and are abandoned mid-wait; on `k0`..`k4` they are abandoned
    // at any point, the commands in flight included.
    let writer = a.write("k").await.unwrap();
    let reader = a.read("r").await.unwrap();
    let mut handles = Vec::new();
    for i in 0..240u64 {
        let b = b.clone();
        handles.push(tokio::spawn(async move {
            let key = if i % 2 == 0 {
                "k".to_owned()
            } else {
                format!("k{}", i % 5)
            };
            let wait = Duration::from_secs(10);
            let cut = Duration::from_millis(1 + i % 20);
            let _ = match i % 4 {
                0 => tokio::time::timeout(cut, b.read(key).wait(wait))
                    .await
                    .map(drop),
                1 => tokio::time::timeout(cut, b.write(key).wait(wait))
                    .await
                    .map(drop),
                2 => tokio::time::timeout(cut, b.write("r").wait(wait))
                    .await
                    .map(drop),
                _ => tokio::time::timeout(cut, b.lock_all([key.as_str(), "r", "k"]).wait(wait))
                    .await
                    .map(drop),
            };
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    writer.release().await.unwrap();
    reader.release().await.unwrap();
    common::assert_nothing_left(&server, &[&a, &b]).await;
    let stats = b.stats();
    assert_eq!(
        (stats.watchdog_locks, stats.local_keys, stats.subscriptions),
        (0, 0, 0)
    );
    // The abandoned writers withdrew from the waiting writers in the background (their flags
    // used to stay for their TTL, 3 fallback retries).
    only_fences_left(&server, Duration::from_millis(500)).await;
}

#[tokio::test]
async fn a_read_of_a_lock_key_of_another_type_is_wrong_type_and_the_key_survives() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker.lock("k").await.unwrap();
    let name = common::lock_key(&server, "k");
    guard.release().await.unwrap();
    let _: () = server.cmd(&["HSET", &name, "field", "1"]);
    let started = Instant::now();
    let err = locker
        .read("k")
        .wait(Duration::from_secs(5))
        .await
        .unwrap_err();
    match &err {
        LockError::WrongType { key, redis_key, .. } => {
            assert_eq!(key, "k");
            assert_eq!(redis_key.as_deref(), Some(name.as_str()));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "did not wait for the deadline"
    );
    let kind: String = server.cmd(&["TYPE", &name]);
    assert_eq!(kind, "hash");
    let _: () = server.cmd(&["DEL", &name]);
    common::assert_nothing_left(&server, &[&locker]).await;
}

// ---------------------------------------------------------------------------------------------
// Cluster (keys on every shard) and RedLock.

/// Readers of `readers` share `key`, `writer` is kept out until they leave, then gets in with
/// a fencing token, and keeps new readers out.
async fn share_then_exclude(readers: [&Locker; 2], writer: &Locker, key: &str) {
    let r1 = readers[0].read(key).wait(Duration::ZERO).await.unwrap();
    let r2 = readers[1].read(key).wait(Duration::ZERO).await.unwrap();
    assert!(r1.is_shared() && r2.is_shared());
    let busy = writer.write(key).wait(Duration::ZERO).await.unwrap_err();
    assert!(busy.is_busy(), "{busy}");
    let waiting = tokio::spawn({
        let (writer, key) = (writer.clone(), key.to_owned());
        async move { writer.write(key).wait(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "a writer got in beside readers");
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = waiting.await.unwrap().unwrap();
    assert!(w.fencing_token().await.unwrap() > 0);
    let busy = readers[0].read(key).wait(Duration::ZERO).await.unwrap_err();
    assert!(busy.is_busy(), "{busy}");
    w.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_readers_and_writers_on_every_shard_keep_readers_xor_one_writer() {
    let cluster = lock_testkit::RedisCluster::start(3, 0).unwrap();
    let (data, referee) = (server(), server());
    let build = || async {
        Locker::builder()
            .cluster(cluster.urls())
            .watchdog_lease(Duration::from_secs(2))
            .build()
            .await
            .unwrap()
    };
    let (a, b, c) = (build().await, build().await, build().await);
    let keys: Vec<String> = common::keys_on_every_shard(&cluster, "catalogue:", 1)
        .into_iter()
        .flatten()
        .collect();
    for key in &keys {
        share_then_exclude([&a, &b], &c, key).await;
    }
    // Held on every shard at once, each where its slot says.
    let readers =
        futures_util::future::try_join_all(keys.iter().map(|k| a.read(k.as_str()).into_future()))
            .await
            .unwrap();
    common::assert_locks_on_their_shards(&cluster, &keys);
    for r in readers {
        r.release().await.unwrap();
    }

    // Readers and writers of two lockers on the three keys at once, under the oracle.
    let oracle = Oracle::connect(&referee.url(), "cluster-rw", "main")
        .await
        .unwrap();
    let url = data.url();
    let runs = keys.iter().flat_map(|key| {
        [&a, &b].map(|l| rw_cycles(l, &url, &oracle, key, 4, 10, Writers::WriteLock))
    });
    tokio::time::timeout(
        Duration::from_secs(120),
        futures_util::future::join_all(runs),
    )
    .await
    .expect("the run finished");
    let report = oracle.report().await.unwrap();
    lock_testkit::figure(&format!(
        "cluster read-write lock, 3 keys on 3 shards, 8 tasks each: {report}"
    ));
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        (report.cycles, report.overlaps),
        (3 * 2 * 4 * 10, 0),
        "{report}"
    );
    assert!(report.shared_overlaps > 0, "{report}");
    for key in &keys {
        let (half, writes, torn) = rw_data(&data, key);
        assert_eq!(
            (half, torn),
            (writes, 0),
            "{key}: lost updates or torn reads"
        );
        assert_eq!(writes, 2 * 10, "{key}");
    }
    common::assert_cluster_clean(&cluster, &[&a, &b, &c]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_readers_share_and_a_writer_excludes_them() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let (data, referee) = (server(), server());
    let build = || async {
        Locker::builder()
            .redlock(nodes.iter().map(RedisServer::url).collect::<Vec<_>>())
            .watchdog_lease(Duration::from_secs(2))
            .build()
            .await
            .unwrap()
    };
    let (a, b, c) = (build().await, build().await, build().await);
    share_then_exclude([&a, &b], &c, "doc").await;
    let oracle = Oracle::connect(&referee.url(), "redlock-rw", "main")
        .await
        .unwrap();
    let url = data.url();
    let runs = [&a, &b].map(|l| rw_cycles(l, &url, &oracle, "doc", 4, 10, Writers::WriteLock));
    tokio::time::timeout(
        Duration::from_secs(120),
        futures_util::future::join_all(runs),
    )
    .await
    .expect("the run finished");
    let report = oracle.report().await.unwrap();
    lock_testkit::figure(&format!(
        "redlock (3 nodes) read-write lock, 8 tasks: {report}"
    ));
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        (report.cycles, report.overlaps),
        (2 * 4 * 10, 0),
        "{report}"
    );
    let (half, writes, torn) = rw_data(&data, "doc");
    assert_eq!(
        (half, writes, torn),
        (20, 20, 0),
        "lost updates or torn reads"
    );
    for node in &nodes {
        common::assert_nothing_left(node, &[&a, &b, &c]).await;
    }
}

/// A writer of `w` takes `k` with a fixed 500 ms lease and never releases it (its process
/// stalled or died); `waiter` waits for `k` (reading or writing) meanwhile, and `end` may end
/// the writer's hold early. Returns how long after the writer's grant the waiter got in.
async fn wait_for_a_writer_that_never_releases(
    w: &Locker,
    waiter: &Locker,
    read: bool,
    end: Option<&Locker>,
) -> Duration {
    let stalled = w
        .write("k")
        .lease(Duration::from_millis(500))
        .await
        .unwrap();
    let started = Instant::now();
    let acquire = if read {
        waiter.read("k")
    } else {
        waiter.write("k")
    };
    let waiting = tokio::spawn(acquire.wait(Duration::from_secs(10)).into_future());
    if let Some(admin) = end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(admin.force_unlock("k").await.unwrap());
    }
    let guard = waiting.await.unwrap().unwrap();
    let took = started.elapsed();
    guard.release().await.unwrap();
    assert!(stalled.release().await.unwrap_err().is_lost());
    took
}

#[tokio::test]
async fn a_writer_waiting_for_a_writer_whose_lease_runs_out_gets_in_when_it_ends() {
    // The comparison for the next two tests: a waiting writer is not held back once the
    // stalled writer's lease has ended (or the lock was force-unlocked).
    let server = server();
    let (w, other, admin) = (
        locker(&server).await,
        locker(&server).await,
        locker(&server).await,
    );
    let expired = wait_for_a_writer_that_never_releases(&w, &other, false, None).await;
    let forced = wait_for_a_writer_that_never_releases(&w, &other, false, Some(&admin)).await;
    lock_testkit::figure(&format!(
        "writer waiting for a writer that never releases: in after {expired:?} (500 ms lease), {forced:?} (force_unlock at 100 ms)"
    ));
    assert!(expired < Duration::from_millis(1300), "{expired:?}");
    assert!(forced < Duration::from_millis(900), "{forced:?}");
    common::assert_nothing_left(&server, &[&w, &other, &admin]).await;
}

#[tokio::test]
async fn a_reader_waiting_for_a_writer_whose_lease_runs_out_gets_in_when_it_ends() {
    let server = server();
    let (w, r) = (locker(&server).await, locker(&server).await);
    let took = wait_for_a_writer_that_never_releases(&w, &r, true, None).await;
    lock_testkit::figure(&format!(
        "reader waiting for a writer whose 500 ms lease ran out: in after {took:?}"
    ));
    // Measured at 2562a54: 3.0 s (the flag's TTL, 3 x the 1 s fallback retry).
    assert!(
        took < Duration::from_millis(1300),
        "the reader got in {took:?} after the writer's 500 ms lease began"
    );
    common::assert_nothing_left(&server, &[&w, &r]).await;
}

#[tokio::test]
async fn a_reader_waiting_for_a_force_unlocked_writer_gets_in_at_once() {
    let server = server();
    let (w, r, admin) = (
        locker(&server).await,
        locker(&server).await,
        locker(&server).await,
    );
    let took = wait_for_a_writer_that_never_releases(&w, &r, true, Some(&admin)).await;
    lock_testkit::figure(&format!(
        "reader waiting for a writer force-unlocked at 100 ms: in after {took:?}"
    ));
    assert!(
        took < Duration::from_millis(900),
        "the reader got in {took:?} after the writer's grant, force_unlock at 100 ms"
    );
    common::assert_nothing_left(&server, &[&w, &r, &admin]).await;
}

/// A renewal tells why a read lock is gone: the reader's own lease ended (its entry is still
/// there), or the lock key now holds something else than the readers' marker.
#[tokio::test]
async fn a_lost_read_lock_says_why() {
    let server = server();
    let locker = common::locker_with_lease(&server, Duration::from_millis(300)).await;
    let reader = locker.read("cat").await.unwrap();
    let readers = server
        .keys("lock:*")
        .into_iter()
        .find(|k| k.contains(":readers:"))
        .unwrap();
    let tokens: Vec<String> = server.cmd(&["ZRANGE", &readers, "0", "-1"]);
    // The reader's lease ended as far as Redis knows (its score is in the past).
    let _: i64 = server.cmd(&["ZADD", &readers, "XX", "1", &tokens[0]]);
    tokio::time::timeout(Duration::from_secs(2), reader.lost())
        .await
        .expect("the renewal notices");
    let lost = reader.release().await.unwrap_err();
    assert_eq!(common::lost_reason(lost), lock_core::LostReason::Expired);

    let reader = locker.read("cat").await.unwrap();
    let lock = common::lock_key(&server, "cat");
    let _: () = server.cmd(&["SET", &lock, "a-writer", "PX", "60000"]);
    tokio::time::timeout(Duration::from_secs(2), reader.lost())
        .await
        .expect("the renewal notices");
    let lost = reader.release().await.unwrap_err();
    assert_eq!(common::lost_reason(lost), lock_core::LostReason::TakenOver);
    let _: () = server.cmd(&["DEL", &lock]);
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A read lock's readers set is another Redis key its scripts read with a type. Redis does not
/// say which key of a script had the wrong type, so the errors of the acquire and the release
/// name the lock key and the readers set, each in full.
#[tokio::test]
async fn a_readers_set_of_another_type_is_named_in_the_acquire_and_release_errors() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker.read("k").await.unwrap();
    let name = common::lock_key(&server, "k");
    let readers = name.replace(":lock:k", ":readers:k");
    // The release meets a hash where its readers set was.
    let _: () = server.cmd(&["DEL", &readers]);
    let _: () = server.cmd(&["HSET", &readers, "field", "1"]);
    let err = guard.release().await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LockError::WrongType { .. }), "{err:?}");
    assert!(text.contains(&format!("`{name}`")), "{text}");
    assert!(text.contains(&format!("`{readers}`")), "{text}");
    // So does the next acquire.
    let _: () = server.cmd(&["DEL", &name]);
    let err = locker.read("k").wait(Duration::ZERO).await.unwrap_err();
    match &err {
        LockError::WrongType {
            redis_key, others, ..
        } => {
            assert_eq!(redis_key.as_deref(), Some(name.as_str()));
            assert_eq!(others, std::slice::from_ref(&readers));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains(&format!("`{readers}`")), "{err}");
    let _: () = server.cmd(&["DEL", &readers]);
}

/// The same with a fixed lease (no renewal to notice it): a reader whose marker a writer's
/// token replaced must not hear `Ok` from its release, and its entry is gone afterwards.
#[tokio::test]
async fn a_lost_fixed_lease_read_lock_says_why() {
    let server = server();
    let locker = locker(&server).await;
    let lease = Duration::from_secs(10);
    let reader = locker.read("cat").lease(lease).await.unwrap();
    let readers = server
        .keys("lock:*")
        .into_iter()
        .find(|k| k.contains(":readers:"))
        .unwrap();
    let tokens: Vec<String> = server.cmd(&["ZRANGE", &readers, "0", "-1"]);
    let _: i64 = server.cmd(&["ZADD", &readers, "XX", "1", &tokens[0]]);
    let lost = reader.release().await.unwrap_err();
    assert_eq!(common::lost_reason(lost), lock_core::LostReason::Expired);

    // The marker replaced by a writer's token while the reader's own lease still runs (a
    // marker that expired early, a server clock step).
    let reader = locker.read("cat").lease(lease).await.unwrap();
    let lock = common::lock_key(&server, "cat");
    let _: () = server.cmd(&["SET", &lock, "a-writer", "PX", "60000"]);
    let lost = reader.release().await.unwrap_err();
    assert_eq!(common::lost_reason(lost), lock_core::LostReason::TakenOver);
    let entries: i64 = server.cmd(&["ZCARD", &readers]);
    assert_eq!(entries, 0, "the lost reader's entry was removed");
    let current: String = server.cmd(&["GET", &lock]);
    assert_eq!(current, "a-writer", "the writer's lock was left alone");
    let _: i64 = server.cmd(&["DEL", &lock]);

    // And the marker gone altogether: lost as deleted.
    let reader = locker.read("cat").lease(lease).await.unwrap();
    let _: () = server.cmd(&["DEL", &lock]);
    let lost = reader.release().await.unwrap_err();
    assert_eq!(common::lost_reason(lost), lock_core::LostReason::Deleted);
    let _: i64 = server.cmd(&["DEL", &lock, &readers]);
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A writer that stops waiting (its future dropped, or its wait ran out) stops holding
/// readers back at once: a new reader gets in with a zero wait, and a reader already waiting
/// behind it is told. A writer that wins leaves no waiting mark behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_stops_waiting_does_not_hold_readers_back() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let c = locker(&server).await;
    let held = a.read("cat").await.unwrap();
    let waiting_marks = || {
        keys(&server, "lock:")
            .into_iter()
            .filter(|k| k.contains(":waiters:"))
            .collect::<Vec<_>>()
    };

    // Cancelled: the writer's future is dropped mid-wait.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        b.write("cat").wait(Duration::from_secs(10)).into_future(),
    )
    .await;
    assert!(cancelled.is_err(), "the writer waited");
    let started = Instant::now();
    let reader = loop {
        match c.read("cat").wait(Duration::ZERO).await {
            Ok(reader) => break reader,
            Err(e) if started.elapsed() < Duration::from_secs(2) => {
                assert!(matches!(e, LockError::Busy { .. }), "{e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("a reader is still held back 2 s after the writer left: {e}"),
        }
    };
    let cancelled_after = started.elapsed();
    reader.release().await.unwrap();

    // Gave up: the writer's wait ran out; a reader waiting behind it meanwhile is let in.
    let writer = tokio::spawn({
        let b = b.clone();
        async move { b.write("cat").wait(Duration::from_millis(400)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let busy = c.read("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(
        matches!(busy, LockError::Busy { .. }),
        "the writer waits: {busy}"
    );
    let waiting_reader = tokio::spawn({
        let c = c.clone();
        async move {
            let reader = c.read("cat").wait(Duration::from_secs(10)).await.unwrap();
            (Instant::now(), reader)
        }
    });
    let gave_up = writer.await.unwrap().unwrap_err();
    let gave_up_at = Instant::now();
    assert!(matches!(gave_up, LockError::Busy { .. }), "{gave_up}");
    let (entered, reader) = waiting_reader.await.unwrap();
    let waiting_reader_after = entered.saturating_duration_since(gave_up_at);
    reader.release().await.unwrap();

    // Won: no waiting mark stays while it holds.
    let writer = tokio::spawn({
        let b = b.clone();
        async move { b.write("cat").wait(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiting_marks().is_empty(),
        "the writer flagged that it waits"
    );
    held.release().await.unwrap();
    let writer = writer.await.unwrap().unwrap();
    let left_while_held = waiting_marks();
    writer.release().await.unwrap();
    lock_testkit::figure(&format!(
        "K2b: reader in {cancelled_after:?} after a cancelled writer, a waiting reader \
         {waiting_reader_after:?} after a writer gave up (fallback retry 1 s)"
    ));
    assert!(
        cancelled_after < Duration::from_millis(300),
        "a new reader waited {cancelled_after:?} after the writer was cancelled"
    );
    assert!(
        waiting_reader_after < Duration::from_millis(300),
        "a waiting reader got in {waiting_reader_after:?} after the writer gave up"
    );
    assert!(
        left_while_held.is_empty(),
        "the winning writer left {left_while_held:?}"
    );
    common::assert_nothing_left(&server, &[&a, &b, &c]).await;
    only_fences_left(&server, Duration::from_millis(300)).await;
}

/// The readers' mark shares the waiting writers' set (so a mutex's release sends one name for
/// both) but is never taken for a writer. A writer's hold ends without its release (force
/// unlocked) while a reader of another locker waits, so the reader's mark stays in the set:
/// a new reader must still get in at once, and when the last writer waiting behind those
/// readers gives up, a reader waiting behind it must be told at once (it tries again only
/// after 10 s otherwise). Counting the mark as a writer fails both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readers_mark_left_by_a_writer_that_never_released_is_not_a_waiting_writer() {
    let server = server();
    let (a, b) = (locker(&server).await, locker(&server).await);
    let (c, d) = (
        common::locker_woken_by_messages(&server).await,
        common::locker_woken_by_messages(&server).await,
    );
    let writer = a.write("cat").await.unwrap();
    // A reader of another locker waits for the writer (its mark lives 5 s) and gives up.
    let marked = tokio::time::timeout(
        Duration::from_millis(200),
        c.read("cat").wait(Duration::from_secs(5)).into_future(),
    )
    .await;
    assert!(marked.is_err(), "the reader waited");
    let marks = keys(&server, "lock:")
        .into_iter()
        .filter(|k| k.contains(":waiters:"))
        .collect::<Vec<_>>();
    assert_eq!(marks.len(), 1, "{marks:?}");
    let score: Option<f64> = server.cmd(&["ZSCORE", &marks[0], "readers"]);
    assert_eq!(score, Some(-1.0), "the readers' mark in {}", marks[0]);
    assert!(a.force_unlock("cat").await.unwrap());
    assert!(writer.release().await.unwrap_err().is_lost());

    // The mark stays, and holds no reader back.
    let reader = b.read("cat").wait(Duration::ZERO).await.unwrap();
    // A writer waits behind the reader; a reader waiting behind that writer is told when the
    // writer gives up, although the mark is still in the set.
    let giving_up = tokio::spawn({
        let c = c.clone();
        async move { c.write("cat").wait(Duration::from_millis(400)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let behind = tokio::spawn({
        let d = d.clone();
        async move {
            let reader = d.read("cat").wait(Duration::from_secs(5)).await?;
            Ok::<_, LockError>((Instant::now(), reader))
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !behind.is_finished(),
        "readers let the waiting writer go first"
    );
    let gave_up = giving_up.await.unwrap().unwrap_err();
    let gave_up_at = Instant::now();
    assert!(matches!(gave_up, LockError::Busy { .. }), "{gave_up}");
    let (entered, behind) = behind.await.unwrap().unwrap();
    let after = entered.saturating_duration_since(gave_up_at);
    assert!(
        after < Duration::from_millis(1000),
        "the reader behind the writer got in {after:?} after the writer gave up"
    );
    behind.release().await.unwrap();
    reader.release().await.unwrap();
    // The readers' mark of the reader that gave up stays until it expires (5 s after it was
    // set), as this test shows it does; nothing else is left.
    common::assert_nothing_left_under(&server, "lock:", &[":waiters:cat"], &[&a, &b, &c, &d]).await;
}

/// K24 (smaller review item): a writer with a short wait does not shorten the life of the
/// waiting writers that another writer, waiting longer, joined. A reader holds `cat`; a writer
/// of another locker (fallback retry 10 s, so it does not try again meanwhile) waits 10 s; a
/// third writer waits 150 ms and gives up. 400 ms later readers must still let the first
/// writer go first (before: the short writer's `PEXPIRE` cut the set's life to its own 150 ms
/// wait, the set expired with the long writer's entry, and a new reader got in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_waiting_writer_does_not_cut_a_long_waiting_writers_place() {
    let server = server();
    let a = locker(&server).await;
    let b = common::locker_woken_by_messages(&server).await;
    let c = locker(&server).await;
    let held = a.read("cat").await.unwrap();
    let long = tokio::spawn({
        let b = b.clone();
        async move { b.write("cat").wait(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let short = c.write("cat").wait(Duration::from_millis(150)).await;
    assert!(matches!(short, Err(LockError::Busy { .. })), "{short:?}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let reader = c.read("cat").wait(Duration::ZERO).await;
    let waiters = common::lock_key(&server, "cat").replace(":lock:cat", ":waiters:cat");
    let ttl: i64 = server.cmd(&["PTTL", &waiters]);
    assert!(
        matches!(reader, Err(LockError::Busy { .. })),
        "a new reader got in while a writer waits (waiting writers' PTTL {ttl}): {:?}",
        reader.map(|r| r.is_held())
    );
    held.release().await.unwrap();
    long.await.unwrap().unwrap().release().await.unwrap();
    common::assert_nothing_left(&server, &[&a, &b, &c]).await;
}

/// K24, the readers' side: a reader with a short wait does not shorten the readers' mark
/// that another reader, waiting longer for a writer, set (the mark is what makes the writer's
/// release tell the readers). A writer holds `cat`; a reader of another locker
/// (fallback retry 10 s) waits 5 s; a third reader waits 150 ms and gives up; 400 ms later
/// the writer releases, and the first reader must get in at once (before: the short reader's
/// mark replaced the long one's with its own 150 ms life, the release found no mark and told
/// nobody, and the reader slept on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_waiting_reader_does_not_cut_a_long_waiting_readers_flag() {
    let server = server();
    let a = locker(&server).await;
    let b = common::locker_woken_by_messages(&server).await;
    let c = locker(&server).await;
    let held = a.write("cat").await.unwrap();
    let long = tokio::spawn({
        let b = b.clone();
        async move {
            let guard = b.read("cat").wait(Duration::from_secs(5)).await?;
            Ok::<_, LockError>((Instant::now(), guard))
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let short = c.read("cat").wait(Duration::from_millis(150)).await;
    assert!(matches!(short, Err(LockError::Busy { .. })), "{short:?}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (in_at, guard) = long.await.unwrap().unwrap_or_else(|e| {
        panic!(
            "the long-waiting reader: {e} ({:?} after the writer's release)",
            released.elapsed()
        )
    });
    let after = in_at - released;
    assert!(
        after < Duration::from_millis(500),
        "the reader got in {after:?} after the writer's release"
    );
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&a, &b, &c]).await;
}

/// A task holding the read lock takes it again (nested) while a writer of another locker
/// waits: writer preference must not make it wait for the writer that waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_read_while_a_writer_waits_is_granted_at_once() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let outer = a.read("cat").await.unwrap();
    let writer = tokio::spawn({
        let b = b.clone();
        async move { b.write("cat").wait(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let busy = b.read("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(
        matches!(busy, LockError::Busy { .. }),
        "a writer waits: {busy}"
    );
    let nested = a.read("cat").wait(Duration::ZERO).await.unwrap();
    assert!(nested.is_shared() && nested.is_held());
    nested.release().await.unwrap();
    assert!(
        !writer.is_finished(),
        "the outer read still holds the writer back"
    );
    outer.release().await.unwrap();
    writer.await.unwrap().unwrap().release().await.unwrap();
    common::assert_nothing_left(&server, &[&a, &b]).await;
}
