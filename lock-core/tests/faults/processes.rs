//! Several OS processes contending for one lock: the test binary re-executes itself as the
//! workers (`child_worker`, selected by environment variables), so kills hit real processes.

use crate::common;

use std::future::IntoFuture;
use std::process::Child;
use std::time::{Duration, Instant};

use common::child::{spawn_child, wait_for_line, MODE, REFEREE, URL};
use common::{locker, server};
use lock_core::{Acquire, Locker};
use lock_testkit::oracle::{Kind, Oracle, Outcome, Report};

/// Sections per task of the semaphore runs.
const PERMIT_CYCLES: usize = 20;

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
            "increment-locked" | "increment-unlocked" => {
                let locker = Locker::connect(&url).await.unwrap();
                let locked = mode == "increment-locked";
                let referee = std::env::var(REFEREE).unwrap();
                let worker = std::process::id().to_string();
                let oracle = Oracle::connect(&referee, "processes", &worker)
                    .await
                    .unwrap();
                let pause = Duration::from_micros(200);
                common::increments(&locker, &url, &oracle, 4, 40, locked, pause).await;
            }
            "permits-3" | "permits-4" => {
                // The semaphore's count comes from the mode; the oracle always checks 3.
                let permits = if mode == "permits-3" { 3 } else { 4 };
                let referee = std::env::var(REFEREE).unwrap();
                permit_sections(&url, &referee, permits).await;
            }
            "hold-fixed" => {
                let locker = Locker::connect(&url).await.unwrap();
                let _guard = locker
                    .lock("held")
                    .lease(Duration::from_secs(1))
                    .await
                    .unwrap();
                println!("HELD");
                std::future::pending::<()>().await;
            }
            "hold-watchdog" => {
                let locker = Locker::builder()
                    .url(url)
                    .watchdog_lease(Duration::from_secs(1))
                    .build()
                    .await
                    .unwrap();
                let _guard = locker.lock("held").await.unwrap();
                println!("HELD");
                std::future::pending::<()>().await;
            }
            "hold-all-watchdog" => {
                let locker = Locker::builder()
                    .url(url)
                    .watchdog_lease(Duration::from_secs(1))
                    .build()
                    .await
                    .unwrap();
                let _guard = locker.lock_all(ALL_KEYS).await.unwrap();
                println!("HELD");
                std::future::pending::<()>().await;
            }
            "hold-permit-watchdog" | "hold-fair-watchdog" => {
                let locker = Locker::builder()
                    .url(url)
                    .watchdog_lease(Duration::from_secs(1))
                    .build()
                    .await
                    .unwrap();
                let _guard = if mode == "hold-permit-watchdog" {
                    locker.semaphore("held", 1).acquire().await.unwrap()
                } else {
                    locker.fair_lock("held").await.unwrap()
                };
                println!("HELD");
                std::future::pending::<()>().await;
            }
            other => panic!("unknown mode {other}"),
        }
    });
}

/// The keys a `lock_all` holder child holds.
const ALL_KEYS: [&str; 3] = ["all-a", "all-b", "all-c"];

/// A child's four tasks, each entering `PERMIT_CYCLES` sections under a permit of the
/// semaphore `s` of `permits`, every section checked by the oracle as one of at most 3
/// holders.
async fn permit_sections(url: &str, referee: &str, permits: u32) {
    let locker = Locker::connect(url).await.unwrap();
    let worker = std::process::id().to_string();
    let oracle = Oracle::connect(referee, "processes", &worker)
        .await
        .unwrap();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (sem, oracle) = (locker.semaphore("s", permits), oracle.clone());
            tokio::spawn(async move {
                for _ in 0..PERMIT_CYCLES {
                    let permit = sem.acquire().wait(Duration::from_secs(30)).await.unwrap();
                    let held = || permit.is_held();
                    let mut entry = oracle
                        .enter_as("s", Kind::Permits(3), 0, held)
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    entry.observe(held);
                    oracle.leave(&mut entry).await.unwrap();
                    oracle.finish(entry, Outcome::Completed).await.unwrap();
                    permit.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // A service's way out: a permit handed to a local waiter that took one in Redis instead is
    // released by the pickup 5 ms later, which an exit right after the last release would cut
    // (the permit would then stay until its lease ends).
    locker.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// Three child processes run `mode` against a fresh server; returns the server (checked clean
/// of locks) and the oracle's report.
fn run_children(mode: &str) -> (lock_testkit::RedisServer, Report) {
    let (server, referee) = (server(), server());
    let children: Vec<Child> = (0..3)
        .map(|_| spawn_child(module_path!(), mode, &server.url(), &referee.url()))
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The children's lockers are gone with them; their locks must be too.
    rt.block_on(common::assert_nothing_left(&server, &[]));
    let report = rt.block_on(async {
        let oracle = Oracle::connect(&referee.url(), "processes", "parent")
            .await
            .unwrap();
        oracle.report().await.unwrap()
    });
    (server, report)
}

/// Three child processes run the increments; returns the counter and the oracle's report.
fn run_increments(mode: &str) -> (i64, Report) {
    let (server, report) = run_children(mode);
    (server.cmd(&["GET", "counter-value"]), report)
}

/// "At most 3 holders" across real processes: 3 processes x 4 tasks on a semaphore of 3,
/// every section checked by the oracle as `Kind::Permits(3)`. Clean, every section counted, and
/// the permits were shared (up to 3 inside at once, never more).
#[test]
fn three_processes_on_three_permits_never_have_four_inside() {
    let (_server, report) = run_children("permits-3");
    assert!(report.is_clean(), "{report}");
    let sections = 3 * 4 * PERMIT_CYCLES as u64;
    assert_eq!(
        (
            report.cycles,
            report.completed,
            report.overlaps,
            report.over_limit
        ),
        (sections, sections, 0, 0),
        "{report}"
    );
    assert!(report.shared_overlaps > 0, "{report}");
    assert_eq!(report.max_inside, 3, "{report}");
}

/// The control: a semaphore of 4 checked as at most 3. The oracle must see a fourth holder.
#[test]
fn control_four_permits_checked_as_three_is_a_violation() {
    let (_server, report) = run_children("permits-4");
    assert!(!report.is_clean(), "{report}");
    assert!(report.over_limit > 0, "{report}");
    assert_eq!(report.max_inside, 4, "{report}");
}

#[test]
fn three_processes_never_lose_an_update() {
    let (total, report) = run_increments("increment-locked");
    assert_eq!(total, 3 * 4 * 40);
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        (report.cycles, report.overlaps),
        (3 * 4 * 40, 0),
        "{report}"
    );
}

#[test]
fn control_three_processes_without_the_lock_lose_updates() {
    let (total, report) = run_increments("increment-unlocked");
    assert!(
        total < 3 * 4 * 40,
        "the checker must see lost updates without the lock, got {total}"
    );
    assert!(report.unsignalled_overlaps > 0, "{report}");
}

async fn killed_holder_frees_within_lease(mode: &str, hold_before_kill: Duration) -> Duration {
    let server = server();
    let mut child = spawn_child(module_path!(), mode, &server.url(), "");
    wait_for_line(&mut child, "HELD");
    let locker = locker(&server).await;
    tokio::time::sleep(hold_before_kill).await;
    assert!(
        locker.is_locked("held").await.unwrap(),
        "still held after {hold_before_kill:?}"
    );
    let busy = locker.lock("held").wait(Duration::ZERO).await.unwrap_err();
    assert!(busy.is_busy());
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed = Instant::now();
    let guard = locker
        .lock("held")
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    let took = killed.elapsed();
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
    took
}

#[tokio::test]
async fn a_sigkilled_fixed_lease_holder_frees_the_key_within_the_lease() {
    let took = killed_holder_frees_within_lease("hold-fixed", Duration::from_millis(100)).await;
    lock_testkit::figure(&format!(
        "takeover after SIGKILL of a fixed-lease holder: {took:?} (lease 1 s)"
    ));
    assert!(
        took <= Duration::from_millis(1100),
        "freed after {took:?}, lease 1 s"
    );
}

#[tokio::test]
async fn a_sigkilled_watchdog_holder_frees_the_key_within_one_lease() {
    // Held for 2.5 leases first: only the child's watchdog can have kept it alive.
    let took = killed_holder_frees_within_lease("hold-watchdog", Duration::from_millis(2500)).await;
    lock_testkit::figure(&format!(
        "takeover after SIGKILL of a watchdog holder: {took:?} (lease 1 s)"
    ));
    assert!(
        took <= Duration::from_millis(1100),
        "freed after {took:?}, lease 1 s"
    );
}

/// A `lock_all` holder (watchdog lease 1 s) SIGKILLed after 2.5 leases: every key is free
/// within one lease of the kill.
#[tokio::test]
async fn a_sigkilled_lock_all_holder_frees_every_key_within_one_lease() {
    let server = server();
    let mut child = spawn_child(module_path!(), "hold-all-watchdog", &server.url(), "");
    wait_for_line(&mut child, "HELD");
    let locker = locker(&server).await;
    // Held for 2.5 leases first: only the child's watchdog can have kept the keys.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for key in ALL_KEYS {
        assert!(locker.is_locked(key).await.unwrap(), "{key} still held");
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed = Instant::now();
    let mut freed = Vec::new();
    for key in ALL_KEYS {
        let guard = locker.lock(key).wait(Duration::from_secs(5)).await.unwrap();
        freed.push(killed.elapsed());
        guard.release().await.unwrap();
    }
    let took = freed.iter().max().copied().unwrap_or_default();
    common::assert_nothing_left(&server, &[&locker]).await;
    lock_testkit::figure(&format!(
        "takeover of every key after SIGKILL of a lock_all watchdog holder: {freed:?} (lease 1 s)"
    ));
    assert!(
        took <= Duration::from_millis(1100),
        "all keys freed after {took:?}, lease 1 s"
    );
}

/// A child holding `take`'s lock with a 1 s watchdog lease is SIGKILLed after 1.5 leases
/// (only its watchdog kept it); a waiter of this process, already waiting (in line for a
/// fair lock or a semaphore), gets it. Returns the time from the kill to that acquire.
async fn killed_holder_hands_over_to_a_waiter(
    mode: &str,
    take: impl Fn(&Locker) -> Acquire,
) -> Duration {
    let server = server();
    let mut child = spawn_child(module_path!(), mode, &server.url(), "");
    wait_for_line(&mut child, "HELD");
    let locker = locker(&server).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let busy = take(&locker).wait(Duration::ZERO).await.unwrap_err();
    assert!(busy.is_busy(), "{busy}");
    let waiter = tokio::spawn(take(&locker).wait(Duration::from_secs(5)).into_future());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed = Instant::now();
    let guard = waiter.await.unwrap().unwrap();
    let took = killed.elapsed();
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_permit_holders_permit_comes_back_within_one_lease() {
    let took = killed_holder_hands_over_to_a_waiter("hold-permit-watchdog", |l| {
        l.semaphore("held", 1).acquire()
    })
    .await;
    lock_testkit::figure(&format!(
        "permit back after SIGKILL of a watchdog holder: {took:?} (lease 1 s)"
    ));
    assert!(
        took <= Duration::from_millis(1200),
        "the permit came back after {took:?}, lease 1 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_fair_lock_holder_is_followed_by_the_waiter_in_line_within_one_lease() {
    let took =
        killed_holder_hands_over_to_a_waiter("hold-fair-watchdog", |l| l.fair_lock("held")).await;
    lock_testkit::figure(&format!(
        "fair lock taken over after SIGKILL of a watchdog holder: {took:?} (lease 1 s)"
    ));
    assert!(
        took <= Duration::from_millis(1200),
        "the waiter in line got it after {took:?}, lease 1 s"
    );
}
