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
