//! Fair locks against a real redis-server: arrival order across lockers, no overtaking by a
//! zero wait, a cancelled or dead waiter does not block the line.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{locker, server};
use lock_core::LockError;
use parking_lot::Mutex;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_of_every_locker_get_the_lock_in_arrival_order() {
    let server = server();
    let lockers = [
        locker(&server).await,
        locker(&server).await,
        locker(&server).await,
    ];
    let first = lockers[0].fair_lock("printer").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..9 {
        let (locker, order) = (lockers[i % 3].clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let turn = locker
                .fair_lock("printer")
                .wait(Duration::from_secs(20))
                .await
                .unwrap();
            order.lock().push(i);
            tokio::time::sleep(Duration::from_millis(2)).await;
            turn.release().await.unwrap();
        }));
        // Arrivals 30 ms apart: each joined the line before the next arrives.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // A zero wait does not jump the line.
    let err = lockers[1]
        .fair_lock("printer")
        .wait(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Busy { .. }), "{err}");
    first.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock(), (0..9).collect::<Vec<_>>());
    let left: Vec<String> = server.keys("lock:*");
    assert!(left.iter().all(|k| !k.contains(":line")), "{left:?}");
}

#[tokio::test]
async fn a_cancelled_waiter_leaves_the_line_at_once() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let held = a.fair_lock("k").await.unwrap();
    let gone = tokio::spawn({
        let b = b.clone();
        async move { b.fair_lock("k").wait(Duration::from_secs(30)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let line: Vec<String> = server.keys("lock:*:line:k");
    assert_eq!(
        line.len(),
        1,
        "the waiter lined up: {:?}",
        server.keys("lock:*")
    );
    let count = |server: &lock_testkit::RedisServer| -> i64 { server.cmd(&["ZCARD", &line[0]]) };
    assert_eq!(count(&server), 1);
    gone.abort();
    let _ = gone.await;
    assert!(
        common::eventually(Duration::from_secs(2), || count(&server) == 0).await,
        "the cancelled waiter still blocks the line"
    );
    // The next waiter is not held back by it.
    let next = tokio::spawn({
        let b = b.clone();
        async move { b.fair_lock("k").wait(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    held.release().await.unwrap();
    let started = std::time::Instant::now();
    next.await.unwrap().unwrap().release().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
}

/// Exclusion under contention, checked by the double-holder oracle (occupancy, intervals,
/// fenced writes) on its own referee server: 12 tasks in three lockers on two keys. Fair
/// order costs nothing in safety: every holder's fenced write is accepted, no overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_locks_exclude_under_contention_by_the_oracle() {
    let server = server();
    let referee = lock_testkit::RedisServer::start().unwrap();
    let oracle = lock_testkit::oracle::Oracle::connect(&referee.url(), "fair", "test")
        .await
        .unwrap();
    let lockers = [
        locker(&server).await,
        locker(&server).await,
        locker(&server).await,
    ];
    let mut tasks = Vec::new();
    for t in 0..12 {
        let (locker, oracle) = (lockers[t % 3].clone(), oracle.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..15 {
                let key = if (t + i) % 2 == 0 { "a" } else { "b" };
                let guard = locker
                    .fair_lock(key)
                    .wait(Duration::from_secs(30))
                    .await
                    .unwrap();
                let work = tokio::time::sleep(Duration::from_micros(300));
                let ((), accepted) = oracle
                    .section(
                        key,
                        guard.fencing_token().await.unwrap(),
                        || guard.is_held(),
                        work,
                    )
                    .await
                    .unwrap();
                assert!(accepted, "the holder's fenced write was rejected");
                guard.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = oracle.report().await.unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!((report.cycles, report.overlaps), (12 * 15, 0), "{report}");
    for locker in &lockers {
        common::assert_nothing_left(&server, &[locker]).await;
    }
}

/// Fair locks are refused on RedLock before anything is sent: every busy try there runs under
/// a fresh token, and each node's line would keep the waiter's earlier tokens ahead of its
/// current one, so it would wait behind itself. The refusal leaves no key on any node.
#[tokio::test]
async fn a_fair_lock_on_redlock_is_refused_and_leaves_nothing() {
    let nodes: Vec<_> = (0..3).map(|_| server()).collect();
    let redlock = lock_core::Locker::builder()
        .redlock(
            nodes
                .iter()
                .map(lock_testkit::RedisServer::url)
                .collect::<Vec<_>>(),
        )
        .build()
        .await
        .unwrap();
    for wait in [Duration::ZERO, Duration::from_millis(200)] {
        let err = redlock.fair_lock("printer").wait(wait).await.unwrap_err();
        assert!(
            matches!(
                err,
                LockError::Config(lock_core::ConfigError::FairLockWithRedLock)
            ),
            "{err}"
        );
    }
    for node in &nodes {
        assert_eq!(node.keys("lock:*"), Vec::<String>::new());
    }
    // The mutex of the same key still works there.
    redlock
        .lock("printer")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for node in &nodes {
        common::assert_nothing_left(node, &[&redlock]).await;
    }
}
