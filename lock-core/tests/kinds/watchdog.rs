//! Watchdog renewal, loss detection and fencing tokens against a real redis-server.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{eventually, lock_key, locker, locker_with_lease, lost_reason, server};
use lock_core::{Locker, LostReason};
use redis::AsyncCommands;

const LEASE: Duration = Duration::from_millis(300);

#[tokio::test]
async fn work_three_times_the_lease_stays_exclusive_and_frees_at_release() {
    let server = server();
    let holder = locker_with_lease(&server, LEASE).await;
    let other = locker(&server).await;
    let guard = holder.lock("k").await.unwrap();
    let name = lock_key(&server, "k");
    let started = Instant::now();
    let mut tries = 0;
    while started.elapsed() < LEASE * 3 {
        let err = other.lock("k").wait(Duration::ZERO).await.unwrap_err();
        assert!(err.is_busy(), "{err}");
        let pttl: i64 = server.cmd(&["PTTL", &name]);
        assert!(
            pttl > 0,
            "the key never runs out while the guard lives: {pttl}"
        );
        tries += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(tries > 20);
    assert!(guard.is_held());
    guard.release().await.unwrap();
    other
        .lock("k")
        .wait(Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    common::assert_nothing_left(&server, &[&holder, &other]).await;
}

#[tokio::test]
async fn a_fixed_lease_is_never_renewed() {
    let server = server();
    let holder = locker_with_lease(&server, LEASE).await;
    let guard = holder
        .lock("k")
        .lease(Duration::from_millis(400))
        .await
        .unwrap();
    assert_eq!(holder.stats().watchdog_locks, 0);
    tokio::time::timeout(Duration::from_millis(800), guard.lost())
        .await
        .expect("lost when the lease ends");
    assert!(!guard.is_held());
    // `lost` fires a safety margin before Redis expires the key, never after.
    assert!(holder.is_locked("k").await.unwrap() || guard.remaining().is_zero());
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(!holder.is_locked("k").await.unwrap());
    assert!(guard.release().await.unwrap_err().is_lost());
    common::assert_nothing_left(&server, &[&holder]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_locks_are_renewed_in_batches_not_one_call_each() {
    let server = server();
    let holder = locker_with_lease(&server, Duration::from_millis(600)).await;
    let mut guards = Vec::new();
    for i in 0..1000 {
        guards.push(holder.lock(format!("k{i}")).await.unwrap());
    }
    let calls_before = holder.stats().renewal_calls;
    server.reset_stats();
    // Three lease periods: without renewal every key would have expired.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let keys: Vec<String> = server.cmd(&["KEYS", "lock:*:lock:*"]);
    assert_eq!(keys.len(), 1000, "all kept alive");
    assert!(guards.iter().all(|g| g.is_held()));
    let calls = holder.stats().renewal_calls - calls_before;
    let evalsha = server.command_calls("evalsha");
    // 1800 ms / (600 ms / 3) = 9 ticks, 2 batches of 500 each.
    assert!(
        calls <= 2 * 10,
        "{calls} renewal calls for 1000 locks over 9 ticks"
    );
    assert!(evalsha <= 2 * 10 + 4, "{evalsha} EVALSHA on the server");
    assert!(calls >= 2 * 7, "renewals happened: {calls}");
    for g in guards {
        g.release().await.unwrap();
    }
    common::assert_nothing_left(&server, &[&holder]).await;
}

#[tokio::test]
async fn deleting_the_key_is_noticed_within_one_renewal_interval() {
    let server = server();
    let holder = locker_with_lease(&server, LEASE).await;
    let guard = holder.lock("k").await.unwrap();
    let name = lock_key(&server, "k");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _: () = server.cmd(&["DEL", &name]);
    let deleted = Instant::now();
    tokio::time::timeout(LEASE, guard.lost())
        .await
        .expect("lost within the lease");
    let took = deleted.elapsed();
    lock_testkit::figure(&format!(
        "loss detection, key deleted behind the holder: {took:?} (lease {LEASE:?}, renewal every lease/3)"
    ));
    assert!(
        took <= LEASE / 3 + Duration::from_millis(60),
        "noticed after {took:?}"
    );
    assert!(!guard.is_held());
    assert_eq!(guard.lost_reason(), Some(LostReason::Deleted));
    let lost = guard.release().await.unwrap_err();
    assert_eq!(lost_reason(lost), LostReason::Deleted);
    common::assert_nothing_left(&server, &[&holder]).await;
}

#[tokio::test]
async fn a_foreign_token_is_noticed_and_left_alone() {
    let server = server();
    let holder = locker_with_lease(&server, LEASE).await;
    let guard = holder.lock("k").await.unwrap();
    let name = lock_key(&server, "k");
    let _: () = server.cmd(&["SET", &name, "intruder", "PX", "60000"]);
    tokio::time::timeout(LEASE, guard.lost())
        .await
        .expect("lost");
    let lost = guard.release().await.unwrap_err();
    assert_eq!(lost_reason(lost), LostReason::TakenOver);
    let value: String = server.cmd(&["GET", &name]);
    assert_eq!(value, "intruder");
    // The intruder's key is this test's own: remove it, then nothing of the kit may be left.
    let _: () = server.cmd(&["DEL", &name]);
    common::assert_nothing_left(&server, &[&holder]).await;
}

#[tokio::test]
async fn a_stopped_server_makes_the_lock_lost_by_the_end_of_the_lease() {
    let server = server();
    let holder = Locker::builder()
        .url(server.url())
        .watchdog_lease(LEASE)
        .command_timeout(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let guard = holder.lock("k").await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    server.pause(); // SIGSTOP: no replies at all
    let paused = Instant::now();
    tokio::time::timeout(LEASE * 2, guard.lost())
        .await
        .expect("lost without any reply");
    let took = paused.elapsed();
    server.resume();
    lock_testkit::figure(&format!(
        "loss detection, server SIGSTOPped (no replies): {took:?} (lease {LEASE:?})"
    ));
    assert!(
        took <= LEASE,
        "reported lost {took:?} after the server stopped; lease {LEASE:?}"
    );
    assert!(!guard.is_held());
    let lost = guard.release().await.unwrap_err();
    assert_eq!(lost_reason(lost), LostReason::Expired);
    common::assert_nothing_left(&server, &[&holder]).await;
}

#[tokio::test]
async fn max_hold_stops_renewal_and_reports_lost() {
    let server = server();
    let holder = locker_with_lease(&server, LEASE).await;
    let guard = holder
        .lock("k")
        .max_hold(Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(guard.lost_reason(), None);
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost after max_hold");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took <= Duration::from_millis(500) + LEASE,
        "{took:?}"
    );
    assert!(
        eventually(Duration::from_secs(1), || !server
            .cmd::<Vec<String>>(&["KEYS", "lock:*:lock:*"])
            .iter()
            .any(|_| true))
        .await
    );
    let lost = guard.release().await.unwrap_err();
    assert_eq!(
        lost.to_string(),
        "lock `k` was lost: it was held past its max_hold"
    );
    assert_eq!(lost_reason(lost), LostReason::MaxHold);
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// A stuck holder keeps a key no longer than its `max_hold`: the key ends in Redis then, not a
/// lease later (the watchdog cuts its last renewals to what is left of the hold, and a hold
/// shorter than the lease is the first lease). Both a hold shorter than the locker's lease and
/// one several leases long.
#[tokio::test]
async fn the_key_ends_in_redis_when_the_max_hold_does() {
    let server = server();
    for (lease, max_hold) in [
        (Duration::from_secs(30), Duration::from_millis(400)),
        (LEASE, Duration::from_millis(1_000)),
    ] {
        let holder = locker_with_lease(&server, lease).await;
        let other = locker(&server).await;
        let acquired = Instant::now();
        let guard = holder.lock("k").max_hold(max_hold).await.unwrap();
        let pttl: i64 = server.cmd(&["PTTL", &lock_key(&server, "k")]);
        assert!(
            pttl > 0 && pttl as u128 <= max_hold.as_millis(),
            "the first lease ends within the hold: PTTL {pttl} ms, max_hold {max_hold:?}"
        );
        // Another locker gets the key once the hold is over (plus the wait's polling), never
        // a lease later.
        let taken = other.lock("k").wait(Duration::from_secs(10)).await.unwrap();
        let waited = acquired.elapsed();
        assert!(
            waited >= max_hold - Duration::from_millis(50)
                && waited < max_hold + Duration::from_millis(450),
            "taken by another {waited:?} after the grant; max_hold {max_hold:?}, lease {lease:?}"
        );
        assert!(!guard.is_held());
        assert_eq!(guard.lost_reason(), Some(LostReason::MaxHold));
        assert!(guard.release().await.unwrap_err().is_lost());
        taken.release().await.unwrap();
        common::assert_nothing_left(&server, &[&holder, &other]).await;
    }
}

#[tokio::test]
async fn extend_and_remaining() {
    let server = server();
    let holder = locker(&server).await;
    let guard = holder
        .lock("k")
        .lease(Duration::from_millis(500))
        .await
        .unwrap();
    assert!(guard.remaining() <= Duration::from_millis(500));
    guard.extend(Duration::from_secs(5)).await.unwrap();
    assert!(guard.remaining() > Duration::from_secs(4));
    let pttl: i64 = server.cmd(&["PTTL", &lock_key(&server, "k")]);
    assert!(pttl > 4000, "{pttl}");
    assert!(
        guard.extend(Duration::ZERO).await.is_err(),
        "never PEXPIRE 0"
    );
    assert!(
        holder.is_locked("k").await.unwrap(),
        "a zero extension did not delete the key"
    );
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder]).await;
}

#[tokio::test]
async fn no_renewal_traffic_after_every_guard_is_gone() {
    let server = server();
    // Renewed every 100 ms: a busy machine's stall of a few hundred ms does not lose `a`.
    let holder = locker_with_lease(&server, Duration::from_millis(300)).await;
    let a = holder.lock("a").await.unwrap();
    let b = holder.lock("b").await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(holder.stats().renewal_calls > 0);
    a.release().await.unwrap();
    drop(b);
    assert!(
        eventually(Duration::from_secs(1), || holder.stats().watchdog_locks
            == 0)
        .await
    );
    // A round sent before the records went is answered by then.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let calls = holder.stats().renewal_calls;
    server.reset_stats();
    // Four renewal periods.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(holder.stats().renewal_calls, calls);
    assert_eq!(server.command_calls("evalsha"), 0);
    assert_eq!(server.command_calls("eval"), 0);
    common::assert_nothing_left(&server, &[&holder]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencing_tokens_strictly_increase_across_ten_thousand_acquisitions() {
    let server = server();
    let lockers = [locker(&server).await, locker(&server).await];
    let log = Arc::new(std::sync::Mutex::new(Vec::with_capacity(10_000)));
    let mut handles = Vec::new();
    for t in 0..16 {
        let locker = lockers[t % 2].clone();
        let log = log.clone();
        handles.push(tokio::spawn(async move {
            for _ in 0..625 {
                let guard = locker
                    .lock("fenced")
                    .wait(Duration::from_secs(60))
                    .await
                    .unwrap();
                // Recorded while holding: the log order is the acquisition order.
                let token = guard.fencing_token().await.unwrap();
                log.lock().unwrap().push(token);
                guard.release().await.unwrap();
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    {
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 10_000);
        assert!(
            log.windows(2).all(|w| w[0] < w[1]),
            "tokens not strictly increasing"
        );
    }
    common::assert_nothing_left(&server, &[&lockers[0], &lockers[1]]).await;
}

#[tokio::test]
async fn fencing_tokens_keep_increasing_after_expiry_and_idle_periods() {
    let server = server();
    let holder = Locker::builder()
        .url(server.url())
        .fence_retention(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let mut last = 0;
    for _ in 0..5 {
        // Long enough that the token's two round trips stay inside it on a busy machine (a
        // token asked after the lease answers `Lost`).
        let guard = holder
            .lock("k")
            .lease(Duration::from_millis(100))
            .await
            .unwrap();
        assert!(guard.fencing_token().await.unwrap() > last);
        last = guard.fencing_token().await.unwrap();
        drop(guard);
        // Let both the lock and the fence counter expire (retention is at least twice the lease).
        tokio::time::sleep(Duration::from_millis(350)).await;
        let fence_keys: Vec<String> = server.cmd(&["KEYS", "lock:*:fence:*"]);
        assert!(
            fence_keys.is_empty(),
            "idle keys leave no counter behind: {fence_keys:?}"
        );
    }
    common::assert_nothing_left(&server, &[&holder]).await;
}

#[tokio::test]
async fn a_stale_holder_is_rejected_by_a_fenced_write() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    // A fenced resource: accepts a write only with a token above the highest one seen.
    let fenced = redis::Script::new(
        "local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
         if tonumber(ARGV[1]) <= seen then return 0 end
         redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
         return 1",
    );
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // A pauses past its fixed lease; B takes over and writes.
    let stale = a.lock("k").lease(Duration::from_millis(100)).await.unwrap();
    let stale_token = stale.fencing_token().await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let fresh = b.lock("k").wait(Duration::ZERO).await.unwrap();
    assert!(fresh.fencing_token().await.unwrap() > stale_token);
    let ok: i64 = fenced
        .key("resource")
        .arg(fresh.fencing_token().await.unwrap())
        .arg("b")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(ok, 1);
    // A wakes up and tries to write with its old token: rejected.
    let ok: i64 = fenced
        .key("resource")
        .arg(stale_token)
        .arg("a")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(ok, 0);
    let value: String = conn.hget("resource", "value").await.unwrap();
    assert_eq!(value, "b");
    let _: HashMap<String, String> = conn.hgetall("resource").await.unwrap();
    assert!(stale.release().await.unwrap_err().is_lost());
    fresh.release().await.unwrap();
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

/// `LockGuard::remaining` is "how long the lock is certainly ours without a further renewal".
/// Once the guard knows the lock is lost (a renewal found the key gone), it is not ours for
/// any time at all: `remaining()` is zero, as `is_held()` is false (before: "remaining() says
/// the lock is certainly ours for 1.967222182s more").
#[tokio::test]
async fn remaining_is_zero_once_the_lock_is_known_lost() {
    let server = server();
    let lease = Duration::from_secs(3);
    let holder = locker_with_lease(&server, lease).await;
    let guard = holder.lock("k").await.unwrap();
    let name = lock_key(&server, "k");
    let _: () = server.cmd(&["DEL", &name]);
    tokio::time::timeout(lease, guard.lost())
        .await
        .expect("the loss is noticed at the next renewal");
    assert!(!guard.is_held());
    assert_eq!(guard.lost_reason(), Some(LostReason::Deleted));
    let remaining = guard.remaining();
    assert_eq!(
        remaining,
        Duration::ZERO,
        "is_held() is false and the key is gone from Redis, yet remaining() says the lock is \
         certainly ours for {remaining:?} more"
    );
    drop(guard.release().await);
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// The same after `Locker::shutdown` gave the lock back (the key is deleted in Redis; before:
/// "certainly ours for 29.696833854s more").
#[tokio::test]
async fn remaining_is_zero_after_the_shutdown_gave_the_lock_back() {
    let server = server();
    let holder = locker(&server).await;
    let guard = holder.lock("k").await.unwrap();
    holder.shutdown(Duration::from_secs(5)).await.unwrap();
    assert!(!guard.is_held());
    assert!(
        server.keys("lock:*").is_empty(),
        "the shutdown released the key"
    );
    let remaining = guard.remaining();
    assert_eq!(
        remaining,
        Duration::ZERO,
        "the shutdown deleted the key, yet remaining() says the lock is certainly ours for \
         {remaining:?} more"
    );
    drop(guard.release().await);
}

/// `LockerStats::renewal_calls` counts "renewal script calls the watchdog has sent" (and the
/// `lock_renewal_calls_total` metric gets the same numbers). Each kind of lock has its own
/// renewal script, so a tick that renews a mutex, a read lock and a semaphore permit sends
/// three script calls; the counter says so, neither more nor less (but for the ticks at the
/// edges of the window). Before: "the server ran 30 renewal script calls; the locker counted
/// 9".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_calls_count_every_script_call_of_a_tick_with_several_kinds() {
    let server = server();
    let holder = locker_with_lease(&server, Duration::from_millis(600)).await;
    let mutex = holder.lock("m").await.unwrap();
    let reader = holder.read("r").await.unwrap();
    let permit = holder.semaphore("s", 3).acquire().await.unwrap();
    // Each side's window is read around the other's, so that a tick between two reads (a
    // loaded machine can take a while over one) cannot tell them apart.
    let counted_before_reset = holder.stats().renewal_calls;
    server.reset_stats();
    let counted_after_reset = holder.stats().renewal_calls;
    // Nine ticks (every 200 ms).
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let counted_before_read = holder.stats().renewal_calls;
    let sent = server.command_calls("evalsha") + server.command_calls("eval");
    let counted_after_read = holder.stats().renewal_calls;
    let (fewest, most) = (
        counted_before_read - counted_after_reset,
        counted_after_read - counted_before_reset,
    );
    assert!(mutex.is_held() && reader.is_held() && permit.is_held());
    assert!(sent >= 3 * 7, "renewals happened: {sent} script calls");
    assert!(
        fewest <= sent + 3 && sent <= most + 3,
        "the server ran {sent} renewal script calls; the locker counted {fewest} to {most}"
    );
    mutex.release().await.unwrap();
    reader.release().await.unwrap();
    permit.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// The other way round: a local handoff's confirmation (one `GET` while the lease is fresh) is
/// not a renewal script call of the watchdog, which sent nothing (its first tick is 10 s away);
/// before, it was counted ("renewal_calls grew by 1").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_confirmation_is_not_counted_as_a_watchdog_renewal_call() {
    let server = server();
    let holder = locker(&server).await;
    let guard = holder.lock("h").await.unwrap();
    let waiter = {
        let holder = holder.clone();
        tokio::spawn(async move { holder.lock("h").wait(Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = holder.stats().renewal_calls;
    server.reset_stats();
    guard.release().await.unwrap();
    let next = waiter.await.unwrap().expect("handed over");
    let counted = holder.stats().renewal_calls - before;
    let scripts = server.command_calls("evalsha") + server.command_calls("eval");
    assert_eq!(scripts, 0, "a fresh handoff runs no script");
    assert_eq!(
        counted, 0,
        "no watchdog tick ran and no script was sent, yet renewal_calls grew by {counted}"
    );
    next.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder]).await;
}
