//! Did the first try reach Redis or not, and does the holder hear the truth? RELIABILITY.md
//! rows T18–T22: each test failed before its fix; the assertion message says what the kit
//! claimed and what Redis really had.

use crate::common;

use std::time::Duration;

use common::{lock_key, locker, locker_with_lease, server};
use lock_core::{LockError, Locker, LostReason};
use lock_testkit::{FaultProxy, ProxyMode, RedisServer};

/// The `calls=` of `cmdstat_<command>` in `INFO commandstats` (0 before its first call).
fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// A reader holds `cat`; the lock key alone is deleted behind it (a `DEL` by an operator, an
/// eviction of that key; the readers' set stays), a writer of another locker takes `cat` and
/// releases it, and a reader of a third locker takes `cat`. That reader's `read_acquire.lua`
/// finds no marker and writes a new one over the old readers' set, which still holds the first
/// reader's entry: the first reader is alive again in Redis. It was overlapped by the writer,
/// yet its release answers `Ok`, with a fixed lease and with the watchdog alike, and the
/// watchdog's renewals go on succeeding (`is_held()` stays true for good). K13 made a release say `Lost` when
/// the marker is gone or a writer's; not when a later reader brought the marker back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_overlapped_by_a_writer_after_its_marker_was_deleted_is_not_released_ok() {
    let mut wrong = Vec::new();
    for watchdog in [false, true] {
        let server = server();
        // Watchdog lease 1 s: the reader is renewed every 333 ms, several times below.
        let a = locker_with_lease(&server, Duration::from_secs(1)).await;
        let b = locker(&server).await;
        let c = locker(&server).await;
        let first = if watchdog {
            a.read("cat").await.unwrap()
        } else {
            a.read("cat").lease(Duration::from_secs(30)).await.unwrap()
        };
        let marker = lock_key(&server, "cat");
        let deleted: i64 = server.cmd(&["DEL", &marker]);
        assert_eq!(deleted, 1);
        // The lock is free in Redis: a writer gets it at once.
        let writer = b
            .write("cat")
            .wait(Duration::ZERO)
            .await
            .expect("a writer takes the lock whose marker was deleted");
        let first_held_beside_writer = first.is_held();
        writer.release().await.unwrap();
        let later = c.read("cat").wait(Duration::ZERO).await.unwrap();
        // Three renewal rounds of the first reader (watchdog case), each of which found its
        // entry under the marker the later reader wrote.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let first_held_after = first.is_held();
        let released = first.release().await;
        later.release().await.unwrap();
        // A fixed lease has no renewal to notice the loss: only its release must tell.
        if !matches!(released, Err(LockError::Lost { .. })) || (watchdog && first_held_after) {
            wrong.push(format!(
                "watchdog {watchdog}: the first reader's release answered {released:?} although \
                 a writer held `cat` exclusively in between (the first reader's is_held() beside \
                 the writer: {first_held_beside_writer}, 1.1 s after the later reader came: \
                 {first_held_after})"
            ));
        }
        common::assert_nothing_left(&server, &[&a, &b, &c]).await;
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `lock_all([a, b])` with `b` held by another locker: its first try takes `a` and finds `b`
/// busy, so it gives `a` back before going the ordered way. That give-back meets a short
/// outage (the proxy refuses connections for 1.5 s from the moment the release of `a` is on
/// its way): `LockGuard::release` answers `Backend`, `release_all` drops the answer, and
/// nothing tries again. `a` stays locked in Redis under a token nobody holds, for the whole
/// watchdog lease (30 s): the ordered way then waits for `a` behind its own leftover, and
/// after `lock_all` answered, `a` is still locked by nobody. (The module docs: "a failure on
/// any key gives back the keys already taken before the error is returned, so no key stays
/// behind"; T3 moved the other give-backs of unused grants to the background releaser, which
/// tries again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_all_whose_give_back_meets_a_short_outage_leaves_no_key_held_by_nobody() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let holder = Locker::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let other = locker(&server).await;
    let b = other.lock("b").await.unwrap();
    // Warm up: the acquire and release scripts loaded through the proxy (a busy `b` runs the
    // acquire script, the give-back of `a` the release script).
    let warm = holder.lock_all(["a", "b"]).wait(Duration::ZERO).await;
    assert!(matches!(warm, Err(LockError::Busy { .. })), "{warm:?}");
    assert!(
        common::keys(&server, "lock:")
            .iter()
            .all(|k| !k.ends_with(":lock:a")),
        "the warm-up gave `a` back"
    );
    let delay = Duration::from_millis(300);
    proxy.set_mode(ProxyMode::Delay(delay)).await;
    let evalsha_before = command_calls(&server, "evalsha");
    let all = tokio::spawn({
        let holder = holder.clone();
        async move {
            holder
                .lock_all(["a", "b"])
                .wait(Duration::from_secs(8))
                .await
        }
    });
    // The first try: `SET NX` of both keys, then the acquire script for the busy `b` (runs one
    // delay later); its answer reaches the holder one delay after it ran, and the give-back of
    // `a` follows at once and reaches the proxy then. Cut it on its way.
    assert!(
        common::eventually(Duration::from_secs(5), || {
            command_calls(&server, "evalsha") > evalsha_before
        })
        .await,
        "the first try's acquire script for `b` ran"
    );
    assert!(
        common::lock_key_opt(&server, "a").is_some(),
        "the first try took `a`"
    );
    tokio::time::sleep(delay + delay / 2).await;
    proxy.set_mode(ProxyMode::Refuse).await;
    tokio::time::sleep(OUTAGE).await;
    proxy.set_mode(ProxyMode::Pass).await;
    let answer = all.await.unwrap();
    let leftover = common::lock_key_opt(&server, "a").map(|name| {
        let pttl: i64 = server.cmd(&["PTTL", &name]);
        pttl
    });
    let held = answer.as_ref().map(|g| g.is_held()).unwrap_or(false);
    if let Ok(guard) = answer.as_ref() {
        assert!(guard.is_held());
    }
    assert!(
        answer.is_ok() || leftover.is_none(),
        "lock_all answered {answer:?} (held: {held}), and left `a` locked in Redis by no guard \
         (PTTL {leftover:?} ms, holder's watchdog locks: {}): the give-back of its first try's \
         grant of `a` failed in a {OUTAGE:?} outage and was never tried again",
        holder.stats().watchdog_locks
    );
    if let Ok(guard) = answer {
        guard.release().await.unwrap();
    }
    b.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder, &other]).await;
}

/// How long Redis is out of reach for the give-back of `a` (the connection manager's own
/// reconnection attempts, which a command waits for, span a few hundred milliseconds).
const OUTAGE: Duration = Duration::from_millis(1500);

/// A release future dropped after its release ran on the server (its reply on its way) is
/// finished by the background releaser, which runs the release again from the start: as a
/// new call, it trusts what it finds (with the default zero retry window there is no latch to
/// find): no key, and the lock is marked lost as `Deleted`; another locker's token (it took the
/// key after our release), and it is marked lost as `TakenOver`. The lock's `LockWatch` then
/// reports that reason, a "lock lost" warning is logged and `lock_lost_total` counts it, though
/// the holder's own release deleted the key: an accusation of a deletion behind the holder,
/// or of a double holder, that did not happen. R1/R3: a retried release that finds the key gone
/// or taken without a latch "cannot tell its own delete from a loss and answers `Lost` with
/// `LostReason::Unknown`", never an accusation it cannot prove; the in-call retries do so, the
/// background's rerun does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cancelled_after_it_ran_is_not_reported_as_a_deletion_behind_the_holder() {
    let mut wrong = Vec::new();
    for taken in [false, true] {
        let server = server();
        let proxy = FaultProxy::start(server.port()).await.unwrap();
        let holder = Locker::connect(&proxy.url()).await.unwrap();
        let other = locker(&server).await;
        // Scripts loaded first, so the release is one EVALSHA.
        holder.lock("warm").await.unwrap().release().await.unwrap();
        let guard = holder
            .lock("r")
            .lease(Duration::from_secs(5))
            .await
            .unwrap();
        let watch = guard.watch();
        let delay = Duration::from_millis(500);
        proxy.set_mode(ProxyMode::Delay(delay)).await;
        let release = tokio::spawn(async move { guard.release().await });
        // The release ran on the server after one delay; its reply is half a delay away.
        tokio::time::sleep(delay + delay / 2).await;
        assert!(
            common::lock_key_opt(&server, "r").is_none(),
            "the release ran"
        );
        let next = if taken {
            Some(other.lock("r").wait(Duration::ZERO).await.unwrap())
        } else {
            None
        };
        release.abort();
        assert!(release.await.unwrap_err().is_cancelled());
        // The background releaser's run: one more round trip through the delaying proxy.
        tokio::time::sleep(delay * 4).await;
        proxy.set_mode(ProxyMode::Pass).await;
        let reason = watch.lost_reason();
        drop(watch);
        if !matches!(reason, None | Some(LostReason::Unknown)) {
            wrong.push(format!(
                "another locker took the key after the release: {taken}: a lock its own \
                 (cancelled) release deleted is reported lost as {reason:?}"
            ));
        }
        if let Some(next) = next {
            assert!(next.is_held(), "the other locker's lock was left alone");
            next.release().await.unwrap();
        }
        common::assert_nothing_left(&server, &[&holder, &other]).await;
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `with_lock` (the closure form of `#[distributed_lock]`): while the body runs, the lock is
/// deleted behind it (`force_unlock`) and another locker takes and releases the key; the body
/// returns `Ok` before any renewal could notice (a fixed lease has none; a watchdog lease of
/// 30 s renews after 10 s). The release then answers `Lost` (the lock was not ours up to the
/// release), but `with_lock` only logs a failed release and returns the body's `Ok`: the
/// caller, and every user of the macro, hears that its section ran under the lock although
/// another holder was inside meanwhile. The docs: "Errors: .. `LockError::Lost` when the lock
/// was lost meanwhile"; "a failed release is logged, the body's result stands: the key expires
/// with its lease" is about a release Redis did not answer, not one that proved the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_does_not_answer_ok_for_a_section_another_holder_entered() {
    let mut wrong = Vec::new();
    for fixed in [true, false] {
        let server = server();
        let a = locker(&server).await;
        let b = locker(&server).await;
        let mut acquire = a.lock("k");
        if fixed {
            acquire = acquire.lease(Duration::from_secs(30));
        }
        let answer: Result<&str, LockError> = acquire
            .with_lock(|_fence| {
                let b = b.clone();
                async move {
                    assert!(b.force_unlock("k").await.unwrap());
                    let other = b.lock("k").wait(Duration::ZERO).await.unwrap();
                    other.release().await.unwrap();
                    Ok("written")
                }
            })
            .await;
        if !matches!(answer, Err(LockError::Lost { .. })) {
            wrong.push(format!(
                "fixed lease {fixed}: with_lock answered {answer:?} for a section during which \
                 another locker held the key"
            ));
        }
        common::assert_nothing_left(&server, &[&a, &b]).await;
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A local handoff whose confirmation (the renewal script, the lock having used more than an
/// eighth of its lease) is slow: it reaches Redis while the key is still ours and renews it for
/// a whole lease, but its answer comes back after the validity the holder counted from its
/// send. `LocalLocks::confirm` then reads the clock's loss as "lost before the handoff"
/// (`Renewed` but `is_lost()`: "an older renewal's answer: believe the loss") and `finish`
/// returns `Lost` without releasing: the key Redis just renewed under the holder's token stays
/// there, held by nobody, for the rest of that fresh lease, and the queued task waits for it.
/// Released through Redis instead (no queued task), the same slow round trip deletes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_handoff_confirmation_that_renewed_the_lock_does_not_leave_it_held_by_nobody() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let lease = Duration::from_secs(3);
    let built = tokio::time::Instant::now();
    let holder = Locker::builder()
        .url(proxy.url())
        .watchdog_lease(lease)
        .command_timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    // Scripts loaded first.
    holder.lock("warm").await.unwrap().release().await.unwrap();
    let guard = holder.lock("k").await.unwrap();
    let queued = tokio::spawn({
        let holder = holder.clone();
        async move { holder.lock("k").wait(Duration::from_secs(20)).await }
    });
    // The watchdog's ticks come every lease / 3 from the build: the one at 1 s renews `k`
    // (2.97 s of validity from then). Half a tick later more than an eighth of the lease is
    // used, so the handoff confirms with the renewal script.
    tokio::time::sleep_until(built + Duration::from_millis(1400)).await;
    let delay = Duration::from_millis(1750);
    proxy.set_mode(ProxyMode::Delay(delay)).await;
    tokio::time::sleep_until(built + Duration::from_millis(1500)).await;
    let released = guard.release().await;
    let pttl: i64 =
        common::lock_key_opt(&server, "k").map_or(-2, |name| server.cmd(&["PTTL", &name]));
    let watchdog_locks = holder.stats().watchdog_locks;
    proxy.set_mode(ProxyMode::Pass).await;
    let next = queued.await.unwrap();
    let left_by_nobody = released.is_err() && pttl > 0;
    assert!(
        !left_by_nobody,
        "the release answered {released:?} and left `k` in Redis, renewed by that very \
         confirmation, held by nobody (PTTL {pttl} ms, watchdog locks {watchdog_locks}); the \
         queued task then got {:?}",
        next.as_ref().map(|g| g.is_held())
    );
    if let Ok(next) = next {
        next.release().await.unwrap();
    }
    common::assert_nothing_left(&server, &[&holder]).await;
}
