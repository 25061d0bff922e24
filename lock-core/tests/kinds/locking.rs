//! Single-instance locking against a real redis-server: exclusion, ownership, reentrancy,
//! waiting, and recovery from server trouble.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{eventually, increments, keys, lock_key, locker, lost_reason, server};
use lock_core::{InvalidKeyReason, LockError, Locker, LostReason, MAX_KEY_LEN};
use lock_testkit::oracle::Oracle;
use lock_testkit::{FaultProxy, ProxyMode};

/// The next local acquirer after a release that told another locker's waiter (so the lock is
/// most likely that waiter's now) subscribes before its first try and sends the acquire script
/// at once: one try that finds the lock taken is enough. Whoever of the two wins, the four
/// acquires and releases below take six scripts and one subscription. Before, the acquirer
/// sent a plain `SET NX` first, and after a busy try subscribed and tried again: seven scripts
/// when the other waiter won, five and no subscription when the plain `SET` did.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acquire_right_after_a_release_that_told_others_tries_once_subscribed() {
    let server = server();
    // No waiter wakes but by a release message: every try below is one the test expects.
    let quiet = || async {
        Locker::builder()
            .url(server.url())
            .fallback_retry(Duration::from_secs(20))
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (quiet().await, quiet().await);
    let hold = Duration::from_millis(100);
    // The release script loaded before counting (a first EVALSHA answers NOSCRIPT).
    a.lock("warm").await.unwrap().release().await.unwrap();
    // A fixed lease: its release goes through Redis although a local task waits.
    let first = a.lock("k").lease(Duration::from_secs(5)).await.unwrap();
    let take = |locker: &Locker| {
        let locker = locker.clone();
        tokio::spawn(async move {
            let guard = locker
                .lock("k")
                .wait(Duration::from_secs(10))
                .await
                .unwrap();
            tokio::time::sleep(hold).await;
            guard.release().await.unwrap();
        })
    };
    let other = take(&b);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let next = take(&a);
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.reset_stats();
    first.release().await.unwrap();
    other.await.unwrap();
    next.await.unwrap();
    let sent = ["evalsha", "subscribe"].map(|c| server.command_calls(c));
    assert_eq!(sent, [6, 1], "scripts and subscriptions");
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_tasks_never_lose_an_update() {
    let (server, referee) = (server(), server());
    let locker = locker(&server).await;
    let oracle = Oracle::connect(&referee.url(), "locked", "main")
        .await
        .unwrap();
    let total = increments(
        &locker,
        &server.url(),
        &oracle,
        32,
        25,
        true,
        Duration::ZERO,
    )
    .await;
    assert_eq!(total, 32 * 25);
    let report = oracle.report().await.unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!((report.cycles, report.overlaps), (32 * 25, 0), "{report}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_without_the_lock_loses_updates() {
    // Proves the checkers above can fail: the same workload without the lock loses updates,
    // and the oracle sees the double holders.
    let (server, referee) = (server(), server());
    let locker = locker(&server).await;
    let oracle = Oracle::connect(&referee.url(), "unlocked", "main")
        .await
        .unwrap();
    let total = increments(
        &locker,
        &server.url(),
        &oracle,
        32,
        25,
        false,
        Duration::ZERO,
    )
    .await;
    assert!(
        total < 32 * 25,
        "unlocked run should lose updates, got {total}"
    );
    let report = oracle.report().await.unwrap();
    assert!(report.unsignalled_overlaps > 0, "{report}");
    assert!(report.occupancy_violations > 0, "{report}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn a_second_owner_cannot_acquire_until_release() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let guard = a.lock("k").await.unwrap();
    let err = b.lock("k").wait(Duration::ZERO).await.unwrap_err();
    assert!(err.is_busy(), "{err}");
    assert!(
        err.retry_after().unwrap() > Duration::from_secs(25),
        "holder TTL reported: {err:?}"
    );
    assert!(a.is_locked("k").await.unwrap());
    guard.release().await.unwrap();
    assert!(!a.is_locked("k").await.unwrap());
    b.lock("k")
        .wait(Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

#[tokio::test]
async fn another_task_of_the_same_process_is_another_owner() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker.lock("k").await.unwrap();
    let other = locker.clone();
    let busy = tokio::spawn(async move { other.lock("k").wait(Duration::from_millis(100)).await })
        .await
        .unwrap();
    assert!(busy.unwrap_err().is_busy());
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn a_non_owner_cannot_release_or_renew() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker
        .lock("k")
        .lease(Duration::from_secs(5))
        .await
        .unwrap();
    let name = lock_key(&server, "k");
    let token: String = server.cmd(&["GET", &name]);
    // Another client's token takes over the key behind the holder's back.
    let _: () = server.cmd(&["SET", &name, "someone-else", "PX", "60000"]);
    let extended = guard.extend(Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(lost_reason(extended), LostReason::TakenOver);
    let err = guard.release().await.unwrap_err();
    assert!(err.is_lost(), "{err}");
    let value: String = server.cmd(&["GET", &name]);
    assert_eq!(value, "someone-else", "foreign lock untouched");
    assert_ne!(token, value);
    let ttl: i64 = server.cmd(&["PTTL", &name]);
    assert!(ttl > 50_000, "foreign lock not renewed or shortened: {ttl}");
    // The foreign lock is this test's own doing: remove it, then nothing of the kit may be left.
    let _: () = server.cmd(&["DEL", &name]);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn reentrant_acquire_costs_no_redis_command() {
    let server = server();
    let locker = locker(&server).await;
    let outer = locker.lock("k").await.unwrap();
    // Issued once for the acquisition; nested guards share it without a round trip.
    let token = outer.fencing_token().await.unwrap();
    server.reset_stats();
    let before = server.total_calls();
    let inner = locker.lock("k").wait(Duration::ZERO).await.unwrap();
    let inner2 = locker.lock("k").await.unwrap();
    assert_eq!(inner.fencing_token().await.unwrap(), token);
    inner2.release().await.unwrap();
    inner.release().await.unwrap();
    // CONFIG RESETSTAT and the INFO calls of total_calls are not lock traffic.
    let after = server.total_calls();
    assert_eq!(
        after - before,
        0,
        "nested acquire/release sent Redis commands"
    );
    assert!(
        locker.is_locked("k").await.unwrap(),
        "outer guard still holds the key"
    );
    // Another task still waits while the outer guard lives.
    let other = locker.clone();
    let busy = tokio::spawn(async move { other.lock("k").wait(Duration::ZERO).await })
        .await
        .unwrap();
    assert!(busy.unwrap_err().is_busy());
    outer.release().await.unwrap();
    assert!(!locker.is_locked("k").await.unwrap());
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn wait_timeout_returns_busy_after_about_the_wait() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let guard = a.lock("k").await.unwrap();
    let started = Instant::now();
    let err = b
        .lock("k")
        .wait(Duration::from_millis(400))
        .await
        .unwrap_err();
    let took = started.elapsed();
    match err {
        LockError::Busy {
            ref key, waited, ..
        } => {
            assert_eq!(key, "k");
            assert!(waited >= Duration::from_millis(400), "{waited:?}");
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    // The waiter's subscription is gone.
    assert!(eventually(Duration::from_secs(2), || b.stats().subscriptions == 0).await);
    let numsub: Vec<redis::Value> = server.cmd(&["PUBSUB", "NUMSUB", "x"]);
    assert_eq!(numsub.len(), 2);
    let channels: Vec<String> = server.cmd(&["PUBSUB", "CHANNELS"]);
    assert!(
        eventually(Duration::from_secs(2), || server
            .cmd::<Vec<String>>(&["PUBSUB", "CHANNELS"])
            .is_empty())
        .await,
        "channels left: {channels:?}"
    );
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

#[tokio::test]
async fn a_waiter_is_woken_by_release_not_by_the_ttl() {
    let server = server();
    let a = locker(&server).await;
    // The fallback retry is long, so only the release message can explain a fast wake-up.
    let b = Locker::builder()
        .url(server.url())
        .fallback_retry(Duration::from_secs(20))
        .build()
        .await
        .unwrap();
    let guard = a.lock("k").await.unwrap();
    let (gap, _) =
        common::wake_up_after_release(guard, &b, || !server.pubsub_channels().is_empty()).await;
    lock_testkit::figure(&format!(
        "wake-up of a waiter in another locker by the release message: {gap:?} (fallback retry 20 s)"
    ));
    assert!(
        gap < Duration::from_millis(500),
        "woken after {gap:?}; lease was 30 s"
    );
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

#[tokio::test]
async fn dropping_a_guard_releases_in_the_background() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker.lock("k").await.unwrap();
    drop(guard);
    assert!(
        eventually(Duration::from_secs(2), || keys(&server, "lock:")
            .iter()
            .all(|k| !k.contains(":lock:")))
        .await
    );
    assert!(eventually(Duration::from_secs(1), || locker.stats().local_keys == 0).await);
    assert_eq!(locker.stats().watchdog_locks, 0);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[test]
fn dropping_a_guard_after_the_runtime_is_gone_does_not_panic() {
    let server = server();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let guard = rt.block_on(async {
        let locker = locker(&server).await;
        locker
            .lock("k")
            .lease(Duration::from_millis(500))
            .await
            .unwrap()
    });
    drop(rt);
    drop(guard);
    // Nothing could release it without a runtime: the key expires with its 500 ms lease (the
    // check polls for 3 s). The locker is gone with the runtime.
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(common::assert_nothing_left(&server, &[]));
}

#[tokio::test]
async fn a_cancelled_acquire_leaves_nothing_behind() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let guard = a.lock("k").await.unwrap();
    // Many acquires abandoned mid-wait, on several keys.
    let mut handles = Vec::new();
    for i in 0..200 {
        let b = b.clone();
        handles.push(tokio::spawn(async move {
            let key = if i % 2 == 0 {
                "k".to_owned()
            } else {
                format!("k{}", i % 10)
            };
            let _ = tokio::time::timeout(
                Duration::from_millis(1 + i % 20),
                b.lock(key).wait(Duration::from_secs(10)),
            )
            .await;
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    guard.release().await.unwrap();
    // Guards from the acquires that did succeed were dropped at once and released in the
    // background; abandoned attempts are cleaned up by token.
    assert!(
        eventually(Duration::from_secs(3), || keys(&server, "lock:")
            .iter()
            .all(|k| !k.contains(":lock:")))
        .await,
        "left: {:?}",
        keys(&server, "lock:")
    );
    assert!(
        eventually(Duration::from_secs(2), || b.stats().subscriptions == 0
            && b.stats().local_keys == 0)
        .await
    );
    assert!(
        eventually(Duration::from_secs(2), || server
            .cmd::<Vec<String>>(&["PUBSUB", "CHANNELS"])
            .is_empty())
        .await
    );
    assert_eq!(b.stats().watchdog_locks, 0);
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_waiters_on_a_thousand_keys_use_one_subscriber_connection() {
    let server = server();
    let holder = locker(&server).await;
    let waiter = locker(&server).await;
    let mut guards = Vec::new();
    for i in 0..1000 {
        guards.push(
            holder
                .lock(format!("key-{i}"))
                .lease(Duration::from_secs(60))
                .await
                .unwrap(),
        );
    }
    let finished = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for i in 0..10_000 {
        let waiter = waiter.clone();
        let finished = finished.clone();
        handles.push(tokio::spawn(async move {
            let guard = waiter
                .lock(format!("key-{}", i % 1000))
                .wait(Duration::from_secs(60))
                .await
                .unwrap();
            guard.release().await.unwrap();
            finished.fetch_add(1, Ordering::Relaxed);
        }));
    }
    // Wait until the head waiter of every key has subscribed.
    assert!(
        eventually(Duration::from_secs(20), || waiter.stats().subscriptions
            == 1000)
        .await,
        "{}",
        waiter.stats().subscriptions
    );
    let clients: String = server.cmd(&["CLIENT", "LIST"]);
    // Two lockers: each one command connection and one pub/sub connection; plus our probe.
    let count = clients.lines().count();
    assert!(count <= 5, "{count} connections:\n{clients}");
    assert!(
        eventually(Duration::from_secs(20), || server
            .cmd::<Vec<String>>(&["PUBSUB", "CHANNELS"])
            .len()
            == 1000)
        .await,
        "server-side subscriptions"
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
    for h in handles {
        h.await.unwrap();
    }
    assert_eq!(finished.load(Ordering::Relaxed), 10_000);
    assert!(
        eventually(Duration::from_secs(5), || server
            .cmd::<Vec<String>>(&["PUBSUB", "CHANNELS"])
            .is_empty())
        .await
    );
    common::assert_nothing_left(&server, &[&holder, &waiter]).await;
}

#[tokio::test]
async fn invalid_keys_are_rejected_before_redis() {
    let server = server();
    let locker = locker(&server).await;
    server.reset_stats();
    let before = server.total_calls();
    match locker.lock("").await.unwrap_err() {
        LockError::InvalidKey { reason, .. } => assert_eq!(reason, InvalidKeyReason::Empty),
        other => panic!("{other:?}"),
    }
    let long = "k".repeat(MAX_KEY_LEN + 1);
    match locker.lock(long).await.unwrap_err() {
        LockError::InvalidKey { reason, key } => {
            assert_eq!(reason, InvalidKeyReason::TooLong);
            assert_eq!(key.len(), 64);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        locker.is_locked("").await,
        Err(LockError::InvalidKey { .. })
    ));
    let err = locker
        .lock("k")
        .lease(Duration::from_micros(500))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err}");
    assert_eq!(server.total_calls() - before, 0);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn braces_and_binary_in_keys_stay_under_the_prefix_in_one_slot() {
    let server = server();
    let locker = locker(&server).await;
    let key = "a}x{b\r\n\0é";
    let guard = locker.lock(key).await.unwrap();
    guard.fencing_token().await.unwrap();
    let names = keys(&server, "lock:");
    assert_eq!(names.len(), 2, "{names:?}"); // lock + fence
    for name in &names {
        assert!(name.starts_with("lock:{"), "{name}");
    }
    // The slots as Redis Cluster computes them (KEYSLOT needs a cluster-enabled node).
    let cluster_node =
        lock_testkit::RedisServer::start_with(&["--cluster-enabled", "yes"]).unwrap();
    let slot = |name: &str| cluster_node.cmd::<i64>(&["CLUSTER", "KEYSLOT", name]);
    let channel = names[0]
        .replace(":lock:", ":released:")
        .replace(":fence:", ":released:");
    assert_eq!(slot(&names[0]), slot(&names[1]));
    assert_eq!(slot(&names[0]), slot(&channel));
    // The user's braces do not pick the slot: a key that is its own hash tag lands elsewhere.
    let other = locker.lock("{b}").await.unwrap();
    other.fencing_token().await.unwrap();
    let other_names: Vec<String> = keys(&server, "lock:")
        .into_iter()
        .filter(|n| n.ends_with(":{b}"))
        .collect();
    assert_eq!(other_names.len(), 2);
    assert_ne!(
        slot(&other_names[0]),
        slot("{b}"),
        "user hash tag must not choose the slot"
    );
    other.release().await.unwrap();
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn wrong_type_on_the_lock_key_is_a_clear_error_and_the_key_survives() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker.lock("k").await.unwrap();
    let name = lock_key(&server, "k");
    guard.release().await.unwrap();
    let _: () = server.cmd(&["HSET", &name, "field", "1"]);
    let started = Instant::now();
    let err = locker
        .lock("k")
        .wait(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::WrongType { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "did not wait for the deadline"
    );
    // The message names the Redis key an operator must inspect.
    let text = err.to_string();
    assert!(text.contains("another type"), "{text}");
    assert!(text.contains(&format!("`{name}`")), "{text}");
    let kind: String = server.cmd(&["TYPE", &name]);
    assert_eq!(kind, "hash");
    // An operator's call knows it and names the exact key to inspect.
    let err = locker.force_unlock("k").await.unwrap_err();
    match &err {
        LockError::WrongType { redis_key, .. } => {
            assert_eq!(redis_key.as_deref(), Some(name.as_str()))
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string()
            .contains(&format!("redis key `{name}` of lock `k`")),
        "{err}"
    );
    // So do with_lock and #[distributed_lock], which have the locker at hand.
    let err = locker
        .with_lock("k", |_| async { Ok::<_, LockError>(()) })
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("redis key `{name}` of lock `k`")),
        "{text}"
    );
    // The hash is this test's own: remove it, then nothing of the kit may be left.
    let _: () = server.cmd(&["DEL", &name]);
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A held lock's key replaced by a value of another type (an operator's or another program's
/// write): the release answers the loss (`TakenOver`: a value the kit did not write), never
/// `Ok` and never a Redis error, and leaves the value alone.
#[tokio::test]
async fn a_release_that_finds_a_value_of_another_type_reports_the_loss_and_leaves_it() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker
        .lock("k")
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    let name = lock_key(&server, "k");
    let _: () = server.cmd(&["DEL", &name]);
    let _: () = server.cmd(&["HSET", &name, "field", "1"]);
    let err = guard.release().await.unwrap_err();
    assert_eq!(lost_reason(err), LostReason::TakenOver);
    let kind: String = server.cmd(&["TYPE", &name]);
    assert_eq!(kind, "hash");
    let _: () = server.cmd(&["DEL", &name]);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn script_flush_is_transparent() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker.lock("k").await.unwrap();
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    guard.release().await.unwrap();
    assert!(!locker.is_locked("k").await.unwrap());
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    let guard = locker.lock("k").await.unwrap();
    assert!(locker.is_locked("k").await.unwrap());
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn a_restarted_server_is_used_without_a_new_locker() {
    let mut server = server();
    let locker = locker(&server).await;
    locker.lock("k").await.unwrap().release().await.unwrap();
    server.restart().unwrap();
    let guard = locker.lock("k").wait(Duration::from_secs(5)).await.unwrap();
    assert!(locker.is_locked("k").await.unwrap());
    guard.release().await.unwrap();
    // Waiting still works after the restart: the pub/sub connection came back too.
    let holder = locker.lock("k").await.unwrap();
    let other = locker.clone();
    let waiter = tokio::spawn(async move {
        other
            .lock("k")
            .wait(Duration::from_secs(5))
            .await
            .map(|_| ())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn redis_down_is_a_backend_error_not_busy() {
    let mut server = server();
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    server.kill9();
    let started = Instant::now();
    let err = locker
        .lock("k")
        .wait(Duration::from_millis(800))
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(!err.is_busy());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let err = Locker::connect(&server.url()).await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    // No leak check: the server is dead for good (SIGKILL), there is nothing to ask.
}

#[tokio::test]
async fn bad_configuration_is_rejected() {
    assert!(matches!(
        Locker::connect("not a url").await,
        Err(LockError::Config(_))
    ));
    assert!(matches!(
        Locker::builder().build().await,
        Err(LockError::Config(_))
    ));
    let server = server();
    let err = Locker::builder()
        .url(server.url())
        .prefix("a{b}")
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("prefix"), "{err}");
    let err = Locker::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_millis(5))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err}");
    common::assert_nothing_left(&server, &[]).await;
}

#[tokio::test]
async fn force_unlock_frees_the_key_and_the_holder_learns_it() {
    let server = server();
    let holder = common::locker_with_lease(&server, Duration::from_millis(300)).await;
    let admin = locker(&server).await;
    let guard = holder.lock("k").await.unwrap();
    assert!(admin.force_unlock("k").await.unwrap());
    assert!(!admin.force_unlock("k").await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("holder notices");
    let lost = guard.release().await.unwrap_err();
    assert_eq!(lost_reason(lost), LostReason::Deleted);
    common::assert_nothing_left(&server, &[&holder, &admin]).await;
}

#[tokio::test]
async fn a_release_interrupted_mid_call_still_releases() {
    let server = server();
    let locker = locker(&server).await;
    for _ in 0..20 {
        let guard = locker
            .lock("k")
            .lease(Duration::from_secs(30))
            .await
            .unwrap();
        // Dropped after its first poll, with the release command in flight.
        let _ = tokio::time::timeout(Duration::from_micros(1), guard.release()).await;
        assert!(
            eventually(Duration::from_secs(2), || keys(&server, "lock:")
                .iter()
                .all(|k| !k.contains(":lock:")))
            .await,
            "key left locked after an interrupted release"
        );
    }
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// Local handoff: when tasks of one process queue for a key, a release hands the lock to the
/// next of them without giving it back to Redis (the key keeps its token). Exclusion holds
/// (an occupancy counter that any overlap would push above 1), the fencing tokens the holders
/// ask for increase in the order they held the lock, and most acquisitions cost no Redis
/// command (each acquisition through Redis costs two `SET`s: the acquire and the release's
/// latch; one in every few is made through Redis so that other lockers get their turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queued_local_acquirers_take_the_lock_over_without_redis() {
    let server = server();
    let locker = locker(&server).await;
    locker.lock("warm").await.unwrap().release().await.unwrap();
    server.reset_stats();
    let (tasks, rounds) = (8, 25);
    let inside = Arc::new(AtomicUsize::new(0));
    let worst = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (locker, inside, worst) = (locker.clone(), inside.clone(), worst.clone());
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let guard = locker.lock("hot").await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    worst.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    assert_eq!(worst.load(Ordering::SeqCst), 1, "two holders at once");
    let sets = server.command_calls("set");
    let acquisitions = (tasks * rounds) as u64;
    assert!(
        sets < acquisitions,
        "{sets} SETs for {acquisitions} acquisitions: the lock was not handed over locally"
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// The fencing tokens of locally handed-over holders increase in the order they held the
/// lock, and a holder taken over from another locker in between gets a larger one still.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencing_tokens_increase_across_local_handoffs_and_remote_takeovers() {
    let server = server();
    let (a, b) = (locker(&server).await, locker(&server).await);
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let locker = if i % 4 == 0 { b.clone() } else { a.clone() };
            let order = order.clone();
            tokio::spawn(async move {
                for _ in 0..15 {
                    let guard = locker.lock("hot").await.unwrap();
                    let token = guard.fencing_token().await.unwrap();
                    order.lock().unwrap().push(token);
                    tokio::time::sleep(Duration::from_micros(300)).await;
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), 120);
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "tokens out of holder order: {order:?}"
    );
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

/// A lock handed over to a queued acquirer that is cancelled before it runs is released in
/// Redis after a moment, not left to its lease (30 s here).
#[tokio::test]
async fn a_handed_over_lock_nobody_takes_is_released_in_redis() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker.lock("k").await.unwrap();
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("k").wait(Duration::from_secs(5)).await })
    };
    // Let the waiter queue for the local permit (this runtime has one thread: it runs only
    // when this task yields).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let name = lock_key(&server, "k");
    guard.release().await.unwrap();
    // Handed over, not released: the key is still there (checked before this task yields).
    assert_eq!(
        keys(&server, &name).len(),
        1,
        "the release did not hand the lock over"
    );
    waiter.abort(); // before it could run and take the lock over
    assert!(waiter.await.unwrap_err().is_cancelled());
    assert!(
        eventually(Duration::from_secs(2), || keys(&server, &name).is_empty()).await,
        "the handed-over lock stayed in Redis"
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A `Fence` handle that outlives its guard keeps the lock from being handed over locally: it
/// could still ask for a token under the Redis token the next holder would share. The release
/// goes to Redis, and the old handle gets no token once the next holder has the lock.
#[tokio::test]
async fn a_live_fence_handle_keeps_the_lock_from_being_handed_over() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker.lock("k").await.unwrap();
    let fence = guard.fence();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let guard = locker.lock("k").wait(Duration::from_secs(5)).await?;
            let token = guard.fencing_token().await?;
            let _ = rx.await;
            guard.release().await.map(|()| token)
        })
    };
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let name = lock_key(&server, "k");
    guard.release().await.unwrap();
    assert!(
        keys(&server, &name).is_empty(),
        "the lock was handed over while a Fence handle of it lived"
    );
    // The next holder took it in Redis; the old handle's token request is refused.
    assert!(
        eventually(Duration::from_secs(2), || keys(&server, &name).len() == 1).await,
        "the waiter did not take the lock"
    );
    let err = fence.token().await.unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err}");
    tx.send(()).unwrap();
    assert!(waiter.await.unwrap().unwrap() > 0);
    drop(fence);
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A release while the watchdog's renewal of the lock is still in flight hands the lock over
/// all the same: the renewal holds the lock's record until Redis answers, but cannot ask for a
/// fencing token. (Before the fix the handoff counted every reference to the record as a
/// possible `Fence`, so a release that met a renewal went to Redis; one CI run in a few failed
/// `a_handed_over_lock_nobody_takes_is_released_in_redis` that way.)
#[tokio::test]
async fn a_release_during_a_renewal_still_hands_over() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    // Renewals every 200 ms.
    let locker = Locker::builder()
        .url(proxy.url())
        .watchdog_lease(Duration::from_millis(600))
        .build()
        .await
        .unwrap();
    let guard = locker.lock("k").await.unwrap();
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let guard = locker.lock("k").wait(Duration::from_secs(5)).await?;
            guard.release().await
        })
    };
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let name = lock_key(&server, "k");
    // One renewal first, undelayed: it loads the renewal script, so the one below is a
    // single round trip.
    assert!(
        eventually(Duration::from_secs(2), || locker.stats().renewal_calls > 0).await,
        "no renewal was sent"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Each round trip now takes 200 ms: the next renewal is in flight for that long.
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(100)))
        .await;
    let calls = locker.stats().renewal_calls;
    assert!(
        eventually(Duration::from_secs(2), || locker.stats().renewal_calls
            > calls)
        .await,
        "no renewal was sent"
    );
    guard.release().await.unwrap();
    // Handed over, not released: the key is still there (the release waited for Redis to
    // confirm the token, then left the lock to the waiter; checked before this task yields).
    assert_eq!(
        keys(&server, &name).len(),
        1,
        "the release did not hand the lock over"
    );
    proxy.set_mode(ProxyMode::Pass).await;
    waiter.await.unwrap().unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A wait longer than the command timeout on a lock held throughout ends `Busy`, not as a
/// Redis timeout: the last sleep ends at the deadline, and a try started there has no time
/// left. (Before the fix, waits of at least the command timeout answered
/// `Backend(TimedOut("redis did not answer before the acquire's deadline"))`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_longer_than_the_command_timeout_on_a_held_lock_ends_busy() {
    let server = server();
    let holder = locker(&server).await;
    let waiter = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(200))
        .fallback_retry(Duration::from_millis(120))
        .build()
        .await
        .unwrap();
    let guard = holder.lock("k").await.unwrap();
    for wait in [300, 450, 700] {
        let wait = Duration::from_millis(wait);
        let err = waiter.lock("k").wait(wait).await.unwrap_err();
        assert!(err.is_busy(), "wait {wait:?}: {err}");
    }
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder, &waiter]).await;
}

/// fence.lua reads the lock key in a pcall: a WRONGTYPE can only come from the fence key, and
/// the error names that key in full.
#[tokio::test]
async fn a_fence_key_of_another_type_is_named_in_the_fencing_token_error() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker.lock("k").await.unwrap();
    let fence = lock_key(&server, "k").replace(":lock:k", ":fence:k");
    let _: () = server.cmd(&["HSET", &fence, "field", "1"]);
    let err = guard.fencing_token().await.unwrap_err();
    match &err {
        LockError::WrongType {
            key,
            redis_key,
            others,
            ..
        } => {
            assert_eq!(key, "k");
            assert_eq!(redis_key.as_deref(), Some(fence.as_str()));
            assert!(others.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string()
            .contains(&format!("redis key `{fence}` of lock `k`")),
        "{err}"
    );
    guard.release().await.unwrap();
    let _: () = server.cmd(&["DEL", &fence]);
}
