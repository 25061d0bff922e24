//! Fair locks against a real redis-server: arrival order across lockers, no overtaking by a
//! zero wait, a cancelled or dead waiter does not block the line.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{locker, server};
use lock_core::{LockError, Locker, LostReason};
use lock_testkit::{FaultProxy, ProxyMode};
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
        // Each waiter has joined the line before the next arrives (a late task on a busy
        // machine would otherwise be overtaken by the next).
        let in_line = common::eventually(Duration::from_secs(5), || {
            server
                .keys("lock:*:line:printer")
                .first()
                .map_or(0, |line| server.cmd::<usize>(&["ZCARD", line]))
                == i + 1
        })
        .await;
        assert!(in_line, "waiter {i} did not join the line");
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
    let [a, b, c] = &lockers;
    common::assert_nothing_left(&server, &[a, b, c]).await;
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
    common::assert_nothing_left(&server, &[&a, &b]).await;
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
    let redlock = Locker::builder()
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

/// A waiter first in line whose process is cut off from Redis (a proxy hole) holds the free
/// lock back only until its place in line stops counting as alive: three fallback retries
/// after its last try (300 ms with a 100 ms fallback retry), not its whole 10 s wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_waiter_first_in_line_stops_blocking_after_its_liveness() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let (holder, other) = (locker(&server).await, locker(&server).await);
    let cut_off = Locker::builder()
        .url(proxy.url())
        .fallback_retry(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let held = holder.fair_lock("k").await.unwrap();
    let waiter = {
        let cut_off = cut_off.clone();
        tokio::spawn(async move { cut_off.fair_lock("k").wait(Duration::from_secs(10)).await })
    };
    let line = line_key(&server, "k").await;
    proxy.set_mode(ProxyMode::Hole).await;
    held.release().await.unwrap();
    // Free, but the cut-off waiter is first in line: an acquire that asks at once is refused.
    let refused = other.fair_lock("k").wait(Duration::ZERO).await.unwrap_err();
    assert!(refused.is_busy(), "{refused}");
    let started = std::time::Instant::now();
    let got = other
        .fair_lock("k")
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    let waited = started.elapsed();
    // Generous: the bound only says it was the waiter's liveness (300 ms after its last try,
    // then the next fallback retry of `other`), not its wait.
    assert!(
        waited < Duration::from_secs(2),
        "waited {waited:?} behind a waiter cut off from Redis"
    );
    let alive: usize = server.cmd(&["ZCARD", &line]);
    assert_eq!(alive, 0, "the cut-off waiter is still in line");
    got.release().await.unwrap();
    waiter.abort();
    let _ = waiter.await;
    proxy.set_mode(ProxyMode::Reset).await;
    drop(cut_off);
    common::assert_nothing_left(&server, &[&holder, &other]).await;
}

/// A fair lock deleted while held (`force_unlock`) is lost like a mutex: the watchdog's next
/// renewal finds it gone, `lost()` resolves within about a third of the lease, and the release
/// says `Lost` (deleted). Another waiter gets it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_lost_while_held_fires_lost_and_release_says_lost() {
    let server = server();
    let lease = Duration::from_millis(600);
    let (holder, other) = (
        common::locker_with_lease(&server, lease).await,
        locker(&server).await,
    );
    let guard = holder.fair_lock("k").await.unwrap();
    assert!(other.force_unlock("k").await.unwrap());
    let started = std::time::Instant::now();
    tokio::time::timeout(lease, guard.lost())
        .await
        .expect("lost() did not fire within the lease");
    let noticed = started.elapsed();
    assert!(!guard.is_held());
    assert!(
        noticed <= lease / 3 + Duration::from_millis(100),
        "{noticed:?}"
    );
    let next = other.fair_lock("k").wait(Duration::ZERO).await.unwrap();
    let reason = common::lost_reason(guard.release().await.unwrap_err());
    assert_eq!(reason, LostReason::Deleted);
    // The old holder's release left the new holder's lock alone.
    assert!(next.is_held());
    assert!(other.is_locked("k").await.unwrap());
    next.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder, &other]).await;
}

/// An acquire dropped after Redis granted it but while it waits for the local place (held
/// here by a guard of the same process whose key was deleted behind it, and whose loss the
/// watchdog has not seen yet) gives the lock back in the background: nothing is left, and
/// another process gets the lock at once rather than after the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_acquire_dropped_between_the_grant_and_the_local_place_leaves_nothing() {
    let server = server();
    let (locker_a, other) = (locker(&server).await, locker(&server).await);
    let first = locker_a.fair_lock("k").await.unwrap();
    let key = common::lock_key(&server, "k");
    let first_token: String = server.cmd(&["GET", &key]);
    let _: i64 = server.cmd(&["DEL", &key]);
    let second = {
        let locker_a = locker_a.clone();
        tokio::spawn(async move { locker_a.fair_lock("k").wait(Duration::from_secs(10)).await })
    };
    // Redis granted the second acquire (the key holds another token), which now waits for
    // the local place the first guard holds.
    let granted = common::eventually(Duration::from_secs(3), || {
        let token: Option<String> = server.cmd(&["GET", &key]);
        token.is_some_and(|t| t != first_token)
    })
    .await;
    assert!(granted, "the second acquire was never granted in Redis");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !second.is_finished(),
        "the second acquire took a taken local place"
    );
    second.abort();
    assert!(second.await.unwrap_err().is_cancelled());
    assert!(
        common::eventually(Duration::from_secs(2), || {
            let exists: i64 = server.cmd(&["EXISTS", &key]);
            exists == 0
        })
        .await,
        "the lock granted to the dropped acquire stayed in Redis"
    );
    let got = other
        .fair_lock("k")
        .wait(Duration::ZERO)
        .await
        .expect("the lock is free for another process");
    got.release().await.unwrap();
    assert!(first.release().await.unwrap_err().is_lost());
    common::assert_nothing_left(&server, &[&locker_a, &other]).await;
}

/// K21 (review item K5): a mutex and a fair lock of one key in one process do not deadlock.
/// Another locker holds the fair lock; a task of `a` waits for the mutex (it has `a`'s local
/// place for the key and waits in Redis), then a task of `a` lines up for the fair lock. The
/// release names the fair waiter, which gets the lock in Redis: it must get in at once, and the
/// mutex after it (before: the fair acquire waited for the local place the mutex waiter held,
/// while the mutex waiter waited in Redis for the fair grant, until the fair acquire's wait ran
/// out). Then the other way round: a task holding either kind of the key nests the other, and
/// a read inside a fair lock shares it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_and_a_fair_lock_of_one_key_in_one_process_do_not_deadlock() {
    let server = server();
    let (a, other) = (locker(&server).await, locker(&server).await);
    let held = other.fair_lock("k").await.unwrap();
    let enter = |acquire: lock_core::Acquire| {
        tokio::spawn(async move {
            let guard = acquire.wait(Duration::from_secs(2)).await?;
            let at = std::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await?;
            Ok::<_, LockError>(at)
        })
    };
    let mutex = enter(a.lock("k"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fair = enter(a.fair_lock("k"));
    let _ = line_key(&server, "k").await;
    let released = std::time::Instant::now();
    held.release().await.unwrap();
    let fair_in = fair.await.unwrap();
    let mutex_in = mutex.await.unwrap();
    let fair_in = fair_in.unwrap_or_else(|e| {
        panic!(
            "fair lock: {e} ({:?} after the release)",
            released.elapsed()
        )
    });
    let mutex_in = mutex_in.unwrap_or_else(|e| panic!("mutex: {e}"));
    assert!(
        fair_in - released < Duration::from_secs(1),
        "the fair waiter got in {:?} after the release",
        fair_in - released
    );
    assert!(
        mutex_in > fair_in,
        "the mutex got in before the fair lock's release"
    );

    // One task, both kinds: whichever it holds, the other nests (no Redis wait for itself).
    let outer = a.lock("k").await.unwrap();
    let inner = a.fair_lock("k").wait(Duration::ZERO).await.unwrap();
    assert_eq!(
        inner.fencing_token().await.unwrap(),
        outer.fencing_token().await.unwrap()
    );
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    let outer = a.fair_lock("k").await.unwrap();
    let inner = a.lock("k").wait(Duration::ZERO).await.unwrap();
    let read = a.read("k").wait(Duration::ZERO).await.unwrap();
    assert!(inner.is_held() && read.is_held());
    read.release().await.unwrap();
    inner.release().await.unwrap();
    // Another task of the process is refused while the fair lock is held.
    let busy = tokio::spawn({
        let a = a.clone();
        async move { a.lock("k").wait(Duration::from_millis(100)).await }
    })
    .await
    .unwrap()
    .unwrap_err();
    assert!(busy.is_busy(), "{busy}");
    outer.release().await.unwrap();
    common::assert_nothing_left(&server, &[&a, &other]).await;
}

/// 8 tasks in two lockers on one key, each cycle taking the key as a mutex or as a fair lock
/// in turn (so every process has both kinds waiting and holding at once), 15 cycles each,
/// every section through the double-holder oracle. `locked: false` is the control: the fair
/// cycles take no lock. Returns the oracle's report; the whole run must end within 60 s (no
/// deadlock).
async fn mixed_kinds_run(locked: bool) -> lock_testkit::oracle::Report {
    let server = server();
    let referee = lock_testkit::RedisServer::start().unwrap();
    let oracle = lock_testkit::oracle::Oracle::connect(&referee.url(), "mixed", "test")
        .await
        .unwrap();
    let lockers = [locker(&server).await, locker(&server).await];
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (locker, oracle) = (lockers[t % 2].clone(), oracle.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..15 {
                let fair = (t + i) % 2 == 0;
                let guard = match (fair, locked) {
                    (true, false) => None,
                    (true, true) => Some(locker.fair_lock("m")),
                    (false, _) => Some(locker.lock("m")),
                };
                let guard = match guard {
                    Some(acquire) => Some(acquire.wait(Duration::from_secs(30)).await.unwrap()),
                    None => None,
                };
                let fence = match &guard {
                    Some(guard) => guard.fencing_token().await.unwrap(),
                    None => 1,
                };
                let held = || guard.as_ref().is_none_or(lock_core::LockGuard::is_held);
                let work = tokio::time::sleep(Duration::from_micros(300));
                oracle.section("m", fence, held, work).await.unwrap();
                if let Some(guard) = guard {
                    guard.release().await.unwrap();
                }
            }
        }));
    }
    tokio::time::timeout(
        Duration::from_secs(60),
        futures_util::future::try_join_all(tasks),
    )
    .await
    .expect("the run ended (no deadlock)")
    .unwrap();
    let report = oracle.report().await.unwrap();
    if locked {
        common::assert_nothing_left(&server, &[&lockers[0], &lockers[1]]).await;
    }
    report
}

/// K21: the mutex and the fair lock of one key, mixed in each of two processes, exclude each
/// other (one Redis lock, though their local places are apart now) and never wait for each
/// other: a clean oracle report with every section. The control (the fair cycles without a
/// lock) shows the oracle catching the overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutexes_and_fair_locks_of_one_key_mixed_in_each_process_exclude_each_other() {
    let report = mixed_kinds_run(true).await;
    lock_testkit::figure(&format!(
        "K21 mutex and fair lock mixed on one key, 8 tasks of 2 lockers: {report}"
    ));
    assert!(report.is_clean(), "{report}");
    assert_eq!((report.cycles, report.overlaps), (8 * 15, 0), "{report}");
    let control = mixed_kinds_run(false).await;
    lock_testkit::figure(&format!("K21 control (fair cycles unlocked): {control}"));
    assert!(control.overlaps > 0, "the oracle saw no overlap: {control}");
}

/// K22 (smaller review item): a fair waiter that gives up wakes the readers that let it go
/// first. A reader holds the lock; a fair waiter of another locker lines up (it joins the
/// waiting writers, so new readers wait for it); a reader of a third locker (fallback retry
/// 10 s) waits behind it. When the fair waiter is cancelled, the waiting reader must get in
/// at once (before: nothing told it, and it slept until the waiting writers' TTL, the fair
/// waiter's whole wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_that_gives_up_wakes_the_readers_behind_it() {
    let server = server();
    let (a, b) = (locker(&server).await, locker(&server).await);
    let c = common::locker_woken_by_messages(&server).await;
    let held = a.read("k").await.unwrap();
    let fair = tokio::spawn({
        let b = b.clone();
        async move { b.fair_lock("k").wait(Duration::from_secs(5)).await }
    });
    let _ = line_key(&server, "k").await;
    let busy = c.read("k").wait(Duration::ZERO).await.unwrap_err();
    assert!(
        busy.is_busy(),
        "readers let the fair waiter go first: {busy}"
    );
    let reader = tokio::spawn({
        let c = c.clone();
        async move {
            let guard = c.read("k").wait(Duration::from_secs(8)).await?;
            Ok::<_, LockError>((std::time::Instant::now(), guard))
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !reader.is_finished(),
        "the reader did not wait for the fair waiter"
    );
    fair.abort();
    let gave_up = std::time::Instant::now();
    assert!(fair.await.unwrap_err().is_cancelled());
    let (entered, guard) = reader.await.unwrap().unwrap();
    let after = entered.saturating_duration_since(gave_up);
    lock_testkit::figure(&format!(
        "K22: a waiting reader in {after:?} after the fair waiter ahead of it was cancelled (fallback retry 10 s)"
    ));
    assert!(
        after < Duration::from_millis(500),
        "the reader got in {after:?} after the fair waiter gave up"
    );
    guard.release().await.unwrap();
    held.release().await.unwrap();
    common::assert_nothing_left(&server, &[&a, &b, &c]).await;
}

/// The line of the fair lock of `key` once a waiter is in it.
async fn line_key(server: &lock_testkit::RedisServer, key: &str) -> String {
    let mut found = None;
    let seen = common::eventually(Duration::from_secs(5), || {
        found = server
            .keys("lock:*")
            .into_iter()
            .find(|k| k.ends_with(&format!(":line:{key}")))
            .filter(|k| server.cmd::<usize>(&["ZCARD", k]) > 0);
        found.is_some()
    })
    .await;
    assert!(seen, "nobody lined up: {:?}", server.keys("lock:*"));
    found.unwrap_or_default()
}
