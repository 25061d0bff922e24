//! Several OS processes contending for one lock: the test binary re-executes itself as the
//! workers (`child_worker`, selected by environment variables), so kills hit real processes.

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::child::{spawn_child, wait_for_line, MODE, REFEREE, URL};
use common::{locker, server};
use lock_core::Locker;
use lock_testkit::oracle::{Oracle, Report};

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
            other => panic!("unknown mode {other}"),
        }
    });
}

/// The keys a `lock_all` holder child holds.
const ALL_KEYS: [&str; 3] = ["all-a", "all-b", "all-c"];

/// Three child processes run the increments; returns the counter and the oracle's report.
fn run_increments(mode: &str) -> (i64, Report) {
    let (server, referee) = (server(), server());
    let children: Vec<Child> = (0..3)
        .map(|_| spawn_child(mode, &server.url(), &referee.url()))
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
    (server.cmd(&["GET", "counter-value"]), report)
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
    let mut child = spawn_child(mode, &server.url(), "");
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
    let mut child = spawn_child("hold-all-watchdog", &server.url(), "");
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
