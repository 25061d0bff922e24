//! The holder always knows: a release says `Ok` only for a lock that was ours up to its
//! deletion (also when it hands the lock to the next local task), a successor never enters a
//! lock Redis no longer holds for it, an extension is never cut back by a renewal, the closure
//! API stops at a loss before the body's next step, a shortening extension wakes `lost()`
//! waiters in time, and an acquire keeps to its wait also when it gives back a lock handed to
//! it.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_nothing_left, lock_key, locker, locker_with_lease, lost_reason, server};
use lock_core::{LockError, LockGuard, Locker, LostReason, OnLost};
use lock_testkit::RedisServer;

/// How the lock key disappears behind its holder.
#[derive(Debug, Clone, Copy)]
enum Behind {
    /// `Locker::force_unlock` by an operator.
    ForceUnlock,
    /// A raw `DEL` (eviction looks the same).
    Del,
    /// `FLUSHALL`, as an empty restart leaves the server.
    Flushall,
}

async fn delete_behind(how: Behind, server: &RedisServer, admin: &Locker, key: &str) {
    match how {
        Behind::ForceUnlock => assert!(admin.force_unlock(key).await.unwrap()),
        Behind::Del => {
            let name = lock_key(server, key);
            let deleted: i64 = server.cmd(&["DEL", &name]);
            assert_eq!(deleted, 1);
        }
        Behind::Flushall => server.cmd::<()>(&["FLUSHALL"]),
    }
}

/// Hole 1: task A holds `k`, task T2 of the same process queues for it; the key is deleted
/// behind A and another locker takes `k`; A releases before its next renewal. A's release must
/// say `Lost` (the lock was not ours up to the release), and T2 must not enter while the other
/// locker holds `k`. (Before the fix: A's release said `Ok(())` and T2 entered at once, beside
/// the other holder, with `is_held() == true`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_of_a_lock_redis_lost_is_not_ok_and_lets_nobody_in_beside_the_new_holder() {
    for how in [Behind::ForceUnlock, Behind::Del, Behind::Flushall] {
        let server = server();
        // A long lease: no renewal comes between the deletion and the release.
        let (a, b) = (
            locker_with_lease(&server, Duration::from_secs(3)).await,
            locker(&server).await,
        );
        let guard = a.lock("k").await.unwrap();
        let other_inside = Arc::new(AtomicBool::new(false));
        let successor = {
            let (a, other_inside) = (a.clone(), other_inside.clone());
            tokio::spawn(async move {
                let guard = a.lock("k").wait(Duration::from_secs(10)).await.unwrap();
                let beside = other_inside.load(Ordering::SeqCst) && guard.is_held();
                guard.release().await.unwrap();
                beside
            })
        };
        // Let the successor queue behind A.
        tokio::time::sleep(Duration::from_millis(50)).await;
        delete_behind(how, &server, &b, "k").await;
        let other = b.lock("k").wait(Duration::ZERO).await.unwrap();
        other_inside.store(true, Ordering::SeqCst);
        let released = guard.release().await;
        assert!(
            matches!(released, Err(LockError::Lost { .. })),
            "{how:?}: A's release answered {released:?} for a lock Redis had lost"
        );
        // The other holder stays inside a while: the successor must not enter meanwhile.
        tokio::time::sleep(Duration::from_millis(300)).await;
        other_inside.store(false, Ordering::SeqCst);
        other.release().await.unwrap();
        let beside = successor.await.unwrap();
        assert!(
            !beside,
            "{how:?}: the successor entered beside the other holder without being told"
        );
        assert_nothing_left(&server, &[&a, &b]).await;
    }
}

/// Hole 1, the drop path: a guard dropped (not released) with a local successor queued hands
/// over by the same rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_does_not_hand_over_a_lock_redis_lost() {
    let server = server();
    let (a, b) = (
        locker_with_lease(&server, Duration::from_secs(3)).await,
        locker(&server).await,
    );
    let guard = a.lock("k").await.unwrap();
    let other_inside = Arc::new(AtomicBool::new(false));
    let successor = {
        let (a, other_inside) = (a.clone(), other_inside.clone());
        tokio::spawn(async move {
            let guard = a.lock("k").wait(Duration::from_secs(10)).await.unwrap();
            let beside = other_inside.load(Ordering::SeqCst) && guard.is_held();
            guard.release().await.unwrap();
            beside
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    delete_behind(Behind::Del, &server, &b, "k").await;
    let other = b.lock("k").wait(Duration::ZERO).await.unwrap();
    other_inside.store(true, Ordering::SeqCst);
    drop(guard);
    tokio::time::sleep(Duration::from_millis(300)).await;
    other_inside.store(false, Ordering::SeqCst);
    other.release().await.unwrap();
    assert!(
        !successor.await.unwrap(),
        "the successor entered beside the other holder without being told"
    );
    assert_nothing_left(&server, &[&a, &b]).await;
}

/// A handoff of a lock Redis still holds goes on as before: `Ok`, the key keeps its token,
/// and the successor holds it with a full lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_of_a_lock_redis_holds_is_ok_and_refreshes_the_lease() {
    let server = server();
    let lease = Duration::from_secs(3);
    let a = locker_with_lease(&server, lease).await;
    let guard = a.lock("k").await.unwrap();
    let successor = {
        let a = a.clone();
        tokio::spawn(async move {
            let guard = a.lock("k").wait(Duration::from_secs(10)).await.unwrap();
            let remaining = guard.remaining();
            guard.release().await.unwrap();
            remaining
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let name = lock_key(&server, "k");
    let token: String = server.cmd(&["GET", &name]);
    // Much of the lease gone by: the successor starts with at least seven eighths of it
    // (what the last renewal left, or the confirmation renews it).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    guard.release().await.unwrap();
    let remaining = successor.await.unwrap();
    assert!(
        remaining > Duration::from_millis(2500),
        "the successor got {remaining:?} of a {lease:?} lease"
    );
    // Handed over (same token), and released by the successor.
    assert!(server.keys(&name).is_empty());
    // The stored value: the 32-hex-digit token, then the holder name.
    let (token, holder) = token.split_once('|').unwrap();
    assert_eq!((token.len(), holder.is_empty()), (32, false));
    assert_nothing_left(&server, &[&a]).await;
}

/// A handoff while most of the lease Redis confirmed is left writes nothing: one `GET`
/// compares the token, and the successor inherits the holder's validity (not more). Before,
/// every handoff ran `renew.lua` (a script and four commands in it) and renewed the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_handoff_is_confirmed_by_one_read_and_passes_the_confirmed_lease_on() {
    let server = server();
    let lease = Duration::from_secs(30);
    let a = locker_with_lease(&server, lease).await;
    let guard = a.lock("k").await.unwrap();
    let successor = {
        let a = a.clone();
        tokio::spawn(async move {
            let guard = a.lock("k").wait(Duration::from_secs(10)).await.unwrap();
            let remaining = guard.remaining();
            (guard, remaining)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.reset_stats();
    let before = guard.remaining();
    guard.release().await.unwrap();
    let (next, remaining) = successor.await.unwrap();
    let sent = ["get", "evalsha", "pexpire", "pttl", "set"].map(|c| server.command_calls(c));
    assert_eq!(
        sent,
        [1, 0, 0, 0, 0],
        "the handoff's GET, EVALSHA, PEXPIRE, PTTL, SET"
    );
    assert!(
        remaining <= before,
        "the successor got {remaining:?}, more than the {before:?} Redis confirmed"
    );
    assert!(remaining > lease * 7 / 8, "{remaining:?}");
    next.release().await.unwrap();
    assert_nothing_left(&server, &[&a]).await;
}

/// A handoff with less than seven eighths of the lease left renews it in its confirmation:
/// the successor starts with a whole lease (here the holder shortened it to 2 s of 3 s).
/// Comparing alone would pass on less than 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_of_a_lock_with_little_lease_left_renews_it() {
    let server = server();
    let lease = Duration::from_secs(3);
    let a = locker_with_lease(&server, lease).await;
    let guard = a.lock("k").await.unwrap();
    let successor = {
        let a = a.clone();
        tokio::spawn(async move {
            let guard = a.lock("k").wait(Duration::from_secs(10)).await.unwrap();
            let remaining = guard.remaining();
            guard.release().await.unwrap();
            remaining
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    guard.extend(Duration::from_secs(2)).await.unwrap();
    guard.release().await.unwrap();
    let remaining = successor.await.unwrap();
    assert!(
        remaining > Duration::from_millis(2500),
        "the successor got {remaining:?} of a {lease:?} lease"
    );
    assert_nothing_left(&server, &[&a]).await;
}

/// How a test takes one kind of lock.
type AcquireOf = fn(&Locker, &str) -> lock_core::Acquire;

/// Hole 2: an extension past the watchdog lease is not cut back by the next renewal. With a
/// 1 s lease, `max_hold(2s)` and `extend(60s)`, no other client may acquire at 3 s while the
/// guard says it holds the lock. (Before the fix another client acquired at about 2.7 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_past_the_lease_is_not_cut_back_by_renewals() {
    let server = server();
    let lease = Duration::from_secs(1);
    let (a, b) = (
        locker_with_lease(&server, lease).await,
        locker(&server).await,
    );
    let kinds: [(&str, AcquireOf); 3] = [
        ("mutex", |l, k| l.lock(k)),
        ("read", |l, k| l.read(k)),
        ("write", |l, k| l.write(k)),
    ];
    for (kind, acquire) in kinds {
        let key = format!("extended-{kind}");
        let guard = acquire(&a, &key)
            .max_hold(Duration::from_secs(2))
            .await
            .unwrap();
        guard.extend(Duration::from_secs(60)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(guard.is_held(), "{kind}: the guard says it lost the lock");
        assert!(guard.remaining() > Duration::from_secs(50), "{kind}");
        let intruder = b.lock(&key).wait(Duration::ZERO).await;
        assert!(
            matches!(intruder, Err(LockError::Busy { .. })),
            "{kind}: another client acquired a lock whose holder extended it to 60 s: {intruder:?}"
        );
        guard.release().await.unwrap();
    }
    assert_nothing_left(&server, &[&a, &b]).await;
}

/// Hole 2 for semaphore permits: an extended permit is not pruned after the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_permit_outlives_the_lease() {
    let server = server();
    let lease = Duration::from_secs(1);
    let (a, b) = (
        locker_with_lease(&server, lease).await,
        locker(&server).await,
    );
    let permit = a
        .semaphore("pool", 1)
        .acquire()
        .max_hold(Duration::from_secs(2))
        .await
        .unwrap();
    permit.extend(Duration::from_secs(60)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(permit.is_held());
    let intruder = b.semaphore("pool", 1).acquire().wait(Duration::ZERO).await;
    assert!(
        matches!(intruder, Err(LockError::Busy { .. })),
        "a second permit of one was granted while the first was extended: {intruder:?}"
    );
    permit.release().await.unwrap();
    assert_nothing_left(&server, &[&a, &b]).await;
}

/// Hole 5: `with_lock` checks the loss before the body's next step. The body blocks its thread
/// past the lock's fixed lease, then yields: when it is polled again, both the loss and the
/// body's next step are ready, and the step must not run. (Before the fix the body was polled
/// first and its next step ran without the lock.)
#[tokio::test(flavor = "current_thread")]
async fn with_lock_stops_at_a_loss_before_the_body_steps_again() {
    let server = server();
    let locker = locker(&server).await;
    let stepped = Arc::new(AtomicBool::new(false));
    let result = locker
        .lock("short")
        .lease(Duration::from_millis(100))
        .on_lost(OnLost::Abort)
        .with_lock(|_fence| {
            let stepped = stepped.clone();
            async move {
                // Let the loss's timer be registered first.
                tokio::time::sleep(Duration::from_millis(5)).await;
                std::thread::sleep(Duration::from_millis(300));
                tokio::task::yield_now().await;
                stepped.store(true, Ordering::SeqCst);
                Ok::<_, LockError>(())
            }
        })
        .await;
    assert!(
        !stepped.load(Ordering::SeqCst),
        "the body ran a step after the lock was lost (result {result:?})"
    );
    assert_eq!(lost_reason(result.unwrap_err()), LostReason::Expired);
    assert_nothing_left(&server, &[&locker]).await;
}

/// Hole 6: a fair acquire granted in Redis while the local place is still taken (here by a
/// holder whose key was deleted behind it and that does not know yet) keeps to its wait: it
/// ends `Busy` about when the wait ends, and gives the grant back. (Before the fix it waited
/// for the local place without a deadline, 3 s here, with its grant not renewed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_acquire_keeps_to_its_wait_after_the_grant() {
    let server = server();
    let a = locker_with_lease(&server, Duration::from_secs(30)).await;
    // A fixed lease: no renewal can tell the holder of the deletion (the watchdog's first tick
    // could, on a loaded machine, and free the place early).
    let holder = a
        .fair_lock("f")
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(a.force_unlock("f").await.unwrap());
    let started = Instant::now();
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.fair_lock("f").wait(Duration::from_millis(500)).await })
    };
    let release_at = Instant::now() + Duration::from_secs(3);
    let answer = waiter.await.unwrap();
    let took = started.elapsed();
    assert!(
        matches!(answer, Err(LockError::Busy { .. })),
        "the fair acquire answered {answer:?} after {took:?}"
    );
    assert!(
        took < Duration::from_millis(1500),
        "the fair acquire overshot its 500 ms wait: {took:?}"
    );
    // The grant it could not use was given back: nobody holds the key.
    assert!(
        !a.is_locked("f").await.unwrap(),
        "the unused grant was kept"
    );
    tokio::time::sleep_until(release_at.into()).await;
    let released = holder.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "{released:?}"
    );
    assert_nothing_left(&server, &[&a]).await;
}

/// An extension that shortens the lease, dropped (or failing) after it was sent but before
/// its answer: Redis applied it, so the key ends early. The guard must not go on saying
/// "held" until its old lease ends while another locker holds the key. Both a cancelled call
/// and one whose reply is lost (the connection cut, its retries refused) are tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shortening_extension_without_its_answer_still_counts() {
    use lock_testkit::{FaultProxy, ProxyMode};

    for cancelled in [true, false] {
        let server = server();
        let proxy = FaultProxy::start(server.port()).await.unwrap();
        let holder = Locker::builder()
            .url(proxy.url())
            .command_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        let other = locker(&server).await;
        let guard = holder
            .lock("k")
            .lease(Duration::from_secs(30))
            .await
            .unwrap();
        // Loads the extension's script, so that the extension below is one call.
        guard.extend(Duration::from_secs(30)).await.unwrap();
        proxy
            .set_mode(ProxyMode::Delay(Duration::from_millis(200)))
            .await;
        let by = Duration::from_millis(300);
        if cancelled {
            // Dropped 100 ms in: the command is on its way and runs 100 ms later.
            let extend = tokio::time::timeout(Duration::from_millis(100), guard.extend(by)).await;
            assert!(extend.is_err(), "the extension was cut off: {extend:?}");
        } else {
            let reset = async {
                // After the extension ran (200 ms in), before its reply (400 ms): the
                // connection dies and the retries find no server.
                tokio::time::sleep(Duration::from_millis(300)).await;
                proxy.set_mode(ProxyMode::Refuse).await;
            };
            let (extended, ()) = tokio::join!(guard.extend(by), reset);
            assert!(extended.is_err(), "no answer: {extended:?}");
        }
        proxy.set_mode(ProxyMode::Pass).await;
        // Another locker takes the key as soon as the shortened lease ends in Redis.
        let taken = other.lock("k").wait(Duration::from_secs(5)).await.unwrap();
        assert!(
            !guard.is_held(),
            "cancelled={cancelled}: the guard says held while another locker holds the key"
        );
        assert!(guard.release().await.unwrap_err().is_lost());
        taken.release().await.unwrap();
        assert_nothing_left(&server, &[&holder, &other]).await;
    }
}

/// A `LockWatch` handed to another task sees what the guard sees: the key deleted behind the
/// holder is a loss (with its reason); a release ends the hold without a loss.
#[tokio::test]
async fn a_watch_outside_the_guard_sees_the_loss_and_the_release() {
    let server = server();
    let holder = locker_with_lease(&server, Duration::from_millis(600)).await;
    let admin = locker(&server).await;
    let guard = holder.lock("watched").await.unwrap();
    let watch = guard.watch();
    assert!(watch.is_held() && watch.lost_reason().is_none());
    let watcher = {
        let watch = watch.clone();
        tokio::spawn(async move {
            watch.lost().await;
            (watch.is_held(), watch.lost_reason())
        })
    };
    delete_behind(Behind::ForceUnlock, &server, &admin, "watched").await;
    let seen = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the watch saw the loss")
        .unwrap();
    assert_eq!(seen, (false, Some(LostReason::Deleted)));
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    // A watch keeps the lock's local record (not the lock) while it lives.
    drop(watch);

    let guard = holder.lock("watched").await.unwrap();
    let watch = guard.watch();
    let watcher = tokio::spawn(async move {
        watch.lost().await;
        (watch.is_held(), watch.lost_reason())
    });
    guard.release().await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the watch saw the release")
        .unwrap();
    assert_eq!(seen, (false, None));
    assert_nothing_left(&server, &[&holder, &admin]).await;
}

/// A watch, unlike a fence, does not keep a lock from being handed to the next task of the
/// process (the handoff keeps the Redis token; a release in Redis and a new acquire do not),
/// and it then says the old hold is over, without a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_does_not_keep_the_lock_from_being_handed_over() {
    let server = server();
    let a = locker_with_lease(&server, Duration::from_secs(3)).await;
    for keep_a_fence in [false, true] {
        let guard = a.lock("k").await.unwrap();
        let name = lock_key(&server, "k");
        let watch = guard.watch();
        let fence = keep_a_fence.then(|| guard.fence());
        let before: String = server.cmd(&["GET", &name]);
        let (acquired, got_it) = tokio::sync::oneshot::channel();
        let (done, release) = tokio::sync::oneshot::channel::<()>();
        let successor = {
            let a = a.clone();
            tokio::spawn(async move {
                let guard = a.lock("k").wait(Duration::from_secs(10)).await.unwrap();
                acquired.send(()).unwrap();
                release.await.unwrap();
                guard.release().await.unwrap();
            })
        };
        // The successor queues locally.
        tokio::time::sleep(Duration::from_millis(50)).await;
        guard.release().await.unwrap();
        got_it.await.unwrap();
        let after: String = server.cmd(&["GET", &name]);
        assert_eq!(
            before == after,
            !keep_a_fence,
            "handed over (same token) unless a fence was alive"
        );
        assert!(!watch.is_held());
        assert_eq!(watch.lost_reason(), None);
        done.send(()).unwrap();
        successor.await.unwrap();
        drop((watch, fence));
    }
    assert_nothing_left(&server, &[&a]).await;
}

/// The kinds whose guards `extend`: each is taken with a zero wait.
#[derive(Debug, Clone, Copy)]
enum KindTaken {
    Mutex,
    Fair,
    Read,
    Permit,
}

const KINDS_TAKEN: [KindTaken; 4] = [
    KindTaken::Mutex,
    KindTaken::Fair,
    KindTaken::Read,
    KindTaken::Permit,
];

async fn take_kind(
    locker: &Locker,
    kind: KindTaken,
    key: &str,
    lease: Option<Duration>,
) -> LockGuard {
    let acquire = match kind {
        KindTaken::Mutex => locker.lock(key),
        KindTaken::Fair => locker.fair_lock(key),
        KindTaken::Read => locker.read(key),
        KindTaken::Permit => locker.semaphore(key, 1).acquire(),
    };
    let acquire = match lease {
        Some(lease) => acquire.lease(lease),
        None => acquire,
    };
    acquire.wait(Duration::ZERO).await.unwrap()
}

/// The other side of each kind: a writer for a read lock, another permit for a semaphore of 1.
async fn take_other(locker: &Locker, kind: KindTaken, key: &str) -> Result<LockGuard, LockError> {
    let acquire = match kind {
        KindTaken::Mutex | KindTaken::Read => locker.lock(key),
        KindTaken::Fair => locker.fair_lock(key),
        KindTaken::Permit => locker.semaphore(key, 1).acquire(),
    };
    acquire.wait(Duration::ZERO).await
}

/// A fair acquire granted in Redis that waits for its local place keeps to its wait also
/// when the server stops answering at the deadline: `wait(d)` bounds the whole acquire
/// (DESIGN.md "Waiting"; ARCHITECTURE.md: "every Redis call of an acquire ends by its wait's
/// deadline"). The local place is held by a holder whose key was force-unlocked (as in
/// `a_fair_acquire_keeps_to_its_wait_after_the_grant`); the server is frozen (SIGSTOP) 500 ms
/// into a 1.5 s wait. At the deadline the acquire gives its grant back (before: it awaited
/// that release for a whole command timeout, 1 s here and 3 s by default, before answering
/// `Busy`: "a fair acquire with a 1.5s wait answered after 2.502336719s").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_acquire_waiting_for_its_local_place_keeps_to_its_wait_on_a_frozen_server() {
    let server = server();
    let locker = locker_with_command_timeout(&server.url()).await;
    let wait = Duration::from_millis(1500);
    let (holder, started, waiter) =
        fair_waiter_behind_a_deleted_holder(&server, &locker, &locker, wait).await;
    tokio::time::sleep(Duration::from_millis(500).saturating_sub(started.elapsed())).await;
    server.pause();
    let answer = waiter.await.unwrap();
    let took = started.elapsed();
    server.resume();
    assert!(
        matches!(answer, Err(LockError::Busy { .. })),
        "the fair acquire answered {answer:?} after {took:?}"
    );
    assert!(
        took < wait + Duration::from_millis(300),
        "a fair acquire with a {wait:?} wait answered after {took:?}"
    );
    assert!(
        common::eventually(Duration::from_secs(5), || server.cmd::<String>(&["PING"])
            == "PONG")
        .await
    );
    let released = holder.release().await;
    assert!(released.is_err(), "{released:?}");
    assert_nothing_left(&server, &[&locker]).await;
}

/// The same give-back after a short outage: the server is unreachable for 600 ms around the
/// fair acquire's deadline. The acquire answers `Busy` in time, and its unused grant's
/// release, failed there, is tried again in the background (as an abandoned try's, F5).
/// Before, it was tried once: the key stayed locked in Redis by nobody for the grant's whole
/// lease, keeping every other locker out ("still locked in Redis 4.007257104s after the
/// acquire gave up (PTTL 23409 ms)").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unused_fair_grant_is_not_left_locked_after_a_short_outage() {
    use lock_testkit::{FaultProxy, ProxyMode};
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let locker = locker_with_command_timeout(&proxy.url()).await;
    let other = common::locker(&server).await;
    let wait = Duration::from_millis(1500);
    let (holder, started, waiter) =
        fair_waiter_behind_a_deleted_holder(&server, &locker, &other, wait).await;
    tokio::time::sleep(Duration::from_millis(1200).saturating_sub(started.elapsed())).await;
    proxy.set_mode(ProxyMode::Refuse).await;
    let answer = waiter.await.unwrap();
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(1800).saturating_sub(started.elapsed())).await;
    proxy.set_mode(ProxyMode::Pass).await;
    assert!(
        matches!(answer, Err(LockError::Busy { .. })),
        "the fair acquire answered {answer:?} after {took:?}"
    );
    // The server answers again from 1.8 s on; give the clean-up the F5 schedule and more.
    let gone = common::eventually(Duration::from_secs(4), || {
        fair_lock_keys(&server).is_empty()
    })
    .await;
    let pttl: i64 = fair_lock_keys(&server)
        .first()
        .map_or(-2, |name| server.cmd(&["PTTL", name.as_str()]));
    assert!(
        gone,
        "the unused fair grant is still locked in Redis {:?} after the acquire gave up \
         (PTTL {pttl} ms); another locker gets: {:?}",
        started.elapsed().saturating_sub(took),
        other.fair_lock("f").wait(Duration::ZERO).await.map(|_| ())
    );
    let _ = holder.release().await;
    assert_nothing_left(&server, &[&locker, &other]).await;
}

/// A locker on `url` whose commands time out after 1 s (3 s by default): the tests of an
/// acquire's deadline use it.
async fn locker_with_command_timeout(url: &str) -> Locker {
    Locker::builder()
        .url(url)
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap()
}

/// The Redis names of fair lock `f`'s lock key on `server` (one while someone holds it).
fn fair_lock_keys(server: &RedisServer) -> Vec<String> {
    common::keys(server, "lock:")
        .into_iter()
        .filter(|k| k.ends_with(":lock:f"))
        .collect()
}

/// A holder of fair lock `f` (fixed 30 s lease) whose key `admin` deleted behind it, and a
/// waiter of the same locker (wait `wait`, started at the returned instant), granted in Redis
/// at once and waiting for the local place the holder keeps.
async fn fair_waiter_behind_a_deleted_holder(
    server: &RedisServer,
    locker: &Locker,
    admin: &Locker,
    wait: Duration,
) -> (
    LockGuard,
    Instant,
    tokio::task::JoinHandle<Result<LockGuard, LockError>>,
) {
    let holder = locker
        .fair_lock("f")
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(admin.force_unlock("f").await.unwrap());
    let started = Instant::now();
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.fair_lock("f").wait(wait).await })
    };
    assert!(
        common::eventually(Duration::from_millis(400), || fair_lock_keys(server).len()
            == 1)
        .await,
        "the fair waiter was not granted in Redis"
    );
    (holder, started, waiter)
}

/// `guard.lost()` is the holder's signal to stop (the documented `select!` pattern, the
/// closure API, `LockWatch`). An `extend` that shortens the lease is documented to make the
/// guard "report the lock lost when that shorter lease ends". A `lost()` that is already
/// waiting when the extension is sent keeps sleeping until the validity it read before the
/// extension (the fixed lease's old end): meanwhile `is_held()` is `false`, Redis has let the
/// key go, and another locker holds the lock, while the holder's `select!` on `lost()` lets its
/// critical section run on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_future_waiting_before_a_shortening_extend_fires_when_the_shorter_lease_ends() {
    let mut late = Vec::new();
    for kind in KINDS_TAKEN {
        let server = server();
        let (holder, other) = (locker(&server).await, locker(&server).await);
        // A fixed lease of 20 s: nothing renews it, nothing else marks it lost.
        let guard = Arc::new(take_kind(&holder, kind, "k", Some(Duration::from_secs(20))).await);
        // The documented pattern: someone waits on `lost()` while the section runs.
        let watcher = {
            let guard = guard.clone();
            tokio::spawn(async move {
                guard.lost().await;
                Instant::now()
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The section decides it needs the lock only 200 ms more.
        let shortened_at = Instant::now();
        guard.extend(Duration::from_millis(200)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        // Redis let it go: another locker takes it, and the holder's clock agrees.
        let taken = take_other(&other, kind, "k").await;
        assert!(
            taken.is_ok(),
            "{kind:?}: the lock should be free in Redis 400 ms after a 200 ms extension: {taken:?}"
        );
        let taken = taken.unwrap();
        assert!(
            !guard.is_held(),
            "{kind:?}: is_held() after the shorter lease ended"
        );
        // ... but is the watcher awake?
        let abort = watcher.abort_handle();
        match tokio::time::timeout(Duration::from_secs(2), watcher).await {
            Ok(at) => {
                let after = at.unwrap().duration_since(shortened_at);
                if after >= Duration::from_millis(700) {
                    late.push(format!(
                        "{kind:?}: lost() fired {after:?} after a 200 ms extension"
                    ));
                }
            }
            Err(_) => {
                abort.abort();
                late.push(format!(
                    "{kind:?}: lost() had not fired {:?} after the lease was shortened to 200 ms \
                     (is_held() = {}, another locker has held the lock for {:?})",
                    shortened_at.elapsed(),
                    guard.is_held(),
                    shortened_at.elapsed() - Duration::from_millis(400),
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        taken.release().await.unwrap();
        let guard = Arc::into_inner(guard).expect("the watcher is gone");
        assert!(guard.release().await.unwrap_err().is_lost());
        assert_nothing_left(&server, &[&holder, &other]).await;
    }
    assert!(late.is_empty(), "{}", late.join("\n"));
}

/// `wait(d)` bounds the whole acquire (DESIGN.md), and "every Redis call of an acquire ends by
/// its wait's deadline (or one command when the wait is shorter)" (ARCHITECTURE.md). A
/// fixed-lease acquire queued in its process behind a watchdog holder is handed that holder's
/// lock when it releases, cannot use it (a fixed lease takes no handed-over lock), and gives it
/// back to Redis with a release that is not cut at its deadline. Through a slow link (450 ms
/// each way, inside the 1 s command timeout: no call fails) the acquire with a 1.5 s wait
/// answers long after its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_acquire_handed_a_watchdog_lock_keeps_to_its_wait() {
    use lock_testkit::{FaultProxy, ProxyMode};
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let locker = locker_with_command_timeout(&proxy.url()).await;
    // Warm the scripts and the connection.
    locker.lock("warm").await.unwrap().release().await.unwrap();
    let holder = locker.lock("k").await.unwrap();
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(450)))
        .await;
    let wait = Duration::from_millis(1500);
    let started = Instant::now();
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move {
            let got = locker
                .lock("k")
                .lease(Duration::from_secs(5))
                .wait(wait)
                .await;
            (got, Instant::now())
        }
    });
    // The waiter queues behind the holder in this process; the holder leaves 450 ms later, so
    // that its handoff (one round trip to confirm it, 900 ms) comes before the waiter's
    // deadline.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let release = tokio::spawn(async move { holder.release().await });
    let (got, answered) = waiter.await.unwrap();
    let took = answered.duration_since(started);
    release.await.unwrap().unwrap();
    proxy.set_mode(ProxyMode::Pass).await;
    let shown = got.as_ref().map(|_| "granted").map_err(ToString::to_string);
    if let Ok(guard) = got {
        guard.release().await.unwrap();
    }
    assert!(
        took < wait + Duration::from_millis(150),
        "an acquire with a {wait:?} wait answered after {took:?}: {shown:?}"
    );
    assert_nothing_left(&server, &[&locker]).await;
}
