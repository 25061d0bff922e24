//! Answers that come late, or not at all, around the fixes T16–T22: RELIABILITY.md rows
//! T23–T26. Each test states the interleaving it drives; each failed before its fix.

use crate::common;

use std::time::Duration;

use common::{locker, server};
use lock_core::{LockError, Locker};
use lock_testkit::{FaultProxy, ProxyMode, RedisServer};
use tokio::time::Instant;

/// T19's hole, the case an outage makes most often: a lock whose local validity ran out
/// while Redis still has it under the holder's token (an extension, or a watchdog renewal,
/// that ran on the server but whose reply did not come back in time), released while the
/// outage goes on. `release_in_redis` answers `Lost` for a lock lost before the release
/// (`Ok(_) | Err(_) if was_lost`), so the backend error is swallowed and `LocalLocks::finish`
/// (which hands only a `Backend` error to the background releaser) never tries again: the key
/// stays in Redis for the rest of the lease that late command gave it, held by nobody, and
/// every other locker waits it out. T19's own claim: "any release that failed the same way
/// left its key for the lease too ... a release that fails with a transient backend error is
/// also handed to the background releaser".
///
/// Two shapes. `extend`: a fixed lease of 1.5 s is extended by 20 s through a proxy that
/// delays each way by 500 ms with a command timeout of 800 ms (the extension runs on the server
/// at +500 ms, its reply would come at +1 s: the call fails, the validity stays 1.5 s).
/// `watchdog`: a watchdog lease of 6 s, ticks every 2 s, the proxy delays each way by 2.4 s
/// with a command timeout of 2 s: the renewals at 2 s and 4 s land at 4.4 s and 6.4 s (the key
/// lives until 12.4 s) and time out; the validity ends at 5.94 s. Then the proxy refuses
/// connections, the holder releases (`Lost`), and the proxy passes again 400 ms later: 2.5 s
/// after that (the background releaser's tries at 0, 100, 500 and 2,000 ms would have
/// deleted the key by then) another locker asks with a zero wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_by_its_clock_whose_release_meets_an_outage_leaves_no_key_held_by_nobody() {
    let mut wrong = Vec::new();
    for watchdog in [false, true] {
        let server = server();
        let proxy = FaultProxy::start(server.port()).await.unwrap();
        let (lease, delay, timeout) = if watchdog {
            (
                Duration::from_secs(6),
                Duration::from_millis(2400),
                Duration::from_secs(2),
            )
        } else {
            (
                Duration::from_secs(30),
                Duration::from_millis(500),
                Duration::from_millis(800),
            )
        };
        let built = Instant::now();
        let holder = Locker::builder()
            .url(proxy.url())
            .watchdog_lease(lease)
            .command_timeout(timeout)
            .build()
            .await
            .unwrap();
        let other = locker(&server).await;
        common::load_scripts(&holder).await;
        let guard = if watchdog {
            holder.lock("k").await.unwrap()
        } else {
            holder
                .lock("k")
                .lease(Duration::from_millis(1500))
                .await
                .unwrap()
        };
        let extended = if watchdog {
            tokio::time::sleep_until(built + Duration::from_millis(1000)).await;
            proxy.set_mode(ProxyMode::Delay(delay)).await;
            None
        } else {
            proxy.set_mode(ProxyMode::Delay(delay)).await;
            Some(guard.extend(Duration::from_secs(20)).await)
        };
        // The local validity runs out; Redis keeps the key under the holder's token.
        tokio::time::timeout(Duration::from_secs(10), guard.lost())
            .await
            .expect("the lock is lost by its clock");
        let lost_at = built.elapsed();
        if watchdog {
            // The renewal sent at 4 s lands at 6.4 s.
            tokio::time::sleep_until(built + Duration::from_millis(6700)).await;
        } else {
            tokio::time::sleep(delay).await;
        }
        let pttl_before = common::lock_pttl(&server, "k");
        proxy.set_mode(ProxyMode::Refuse).await;
        let released = guard.release().await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        proxy.set_mode(ProxyMode::Pass).await;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let pttl_after = common::lock_pttl(&server, "k");
        let taken = other.lock("k").wait(Duration::ZERO).await;
        let taken_desc = format!("{:?}", taken.as_ref().map(|_| "taken"));
        if let Ok(g) = taken {
            g.release().await.unwrap();
        } else {
            wrong.push(format!(
                "{}: the holder's lock was lost by its clock {lost_at:?} after the build while \
                 Redis kept it (PTTL {pttl_before} ms{}); its release during a 400 ms outage \
                 answered {released:?}, and 2.5 s after the outage the key is still there \
                 (PTTL {pttl_after} ms), held by nobody: another locker's zero-wait acquire \
                 got {taken_desc}",
                if watchdog {
                    "watchdog renewals landed late"
                } else {
                    "fixed lease extended"
                },
                extended
                    .as_ref()
                    .map(|e| format!(", the extension answered {e:?}"))
                    .unwrap_or_default(),
            ));
            // Wait the leftover out for the clean-up check.
            let left = u64::try_from(pttl_after.max(0)).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(left + 100)).await;
        }
        assert!(
            matches!(
                released,
                Err(LockError::Lost { .. } | LockError::Backend { .. })
            ),
            "{released:?}"
        );
        common::assert_nothing_left(&server, &[&holder, &other]).await;
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// T21 × T22: `with_lock` answers `Lost`, dropping the body's `Ok`, for a section whose lock
/// the release's own compare-and-delete found still ours in Redis. The body returns `Ok` at
/// 2 s (valid until about 9.95 s). The release hands over to a queued task of the same process:
/// its confirmation (the renewal script: more than an eighth of the 10 s lease is used) goes
/// through a proxy that delays each way by 4.975 s: it renews the key at about 6.98 s (until
/// 16.98 s) and answers at about 11.95 s, after the validity counted from its send (11.9 s):
/// T22 makes that `Undecided`, and the Redis release that follows lands at about 16.93 s, while
/// the key still holds the holder's token: it deletes it (no expiry of the key is counted). Yet
/// `release_in_redis` answers `Lost(Expired)` (the local clock ran out before it was sent), and
/// T21 turns that into the call's answer: "another holder may have been inside beside it",
/// although Redis just proved the token never left the key. A caller told `Lost` runs a
/// non-idempotent body again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_does_not_answer_lost_when_the_release_found_the_lock_still_ours() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let lease = Duration::from_secs(10);
    let built = Instant::now();
    let holder = Locker::builder()
        .url(proxy.url())
        .watchdog_lease(lease)
        .command_timeout(Duration::from_secs(20))
        .build()
        .await
        .unwrap();
    // Scripts loaded first (acquire, renew, release): one round trip each below.
    common::load_scripts(&holder).await;
    let (entered, entered_rx) = tokio::sync::oneshot::channel::<()>();
    let section = tokio::spawn({
        let holder = holder.clone();
        async move {
            holder
                .lock("k")
                .with_lock(|fence| {
                    // No `Fence` alive at the release: it would stop the local handoff.
                    drop(fence);
                    async move {
                        entered.send(()).unwrap();
                        tokio::time::sleep_until(built + Duration::from_millis(2000)).await;
                        Ok::<_, LockError>("written")
                    }
                })
                .await
        }
    });
    entered_rx.await.unwrap();
    let queued = tokio::spawn({
        let holder = holder.clone();
        async move { holder.lock("k").wait(Duration::from_secs(60)).await }
    });
    tokio::time::sleep_until(built + Duration::from_millis(1900)).await;
    let expired_before = expired_keys(&server);
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(4975)))
        .await;
    let answer = section.await.unwrap();
    let answered_at = built.elapsed();
    let expired_after = expired_keys(&server);
    let left = common::lock_key_opt(&server, "k");
    eprintln!(
        "FIGURE with_lock answer {answer:?} at {answered_at:?}; expired_keys {expired_before} -> \
         {expired_after}; key left {left:?}"
    );
    proxy.set_mode(ProxyMode::Pass).await;
    let next = queued.await.unwrap();
    if let Ok(next) = next {
        next.release().await.unwrap();
    }
    assert!(
        answer.is_ok() || expired_after != expired_before || left.is_some(),
        "with_lock answered {answer:?} ({answered_at:?} after the build) for a body that \
         returned Ok 2 s after the build, although its release deleted the key holding its \
         token (the key is gone: {}, and Redis counted no expiry: expired_keys \
         {expired_before} -> {expired_after})",
        left.is_none()
    );
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// `expired_keys` of `INFO stats`.
fn expired_keys(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "stats"]);
    info.lines()
        .find_map(|line| line.strip_prefix("expired_keys:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// A lock deleted behind its holder (an operator's `DEL`) is reported lost as
/// `ServerRestarted` when the link is slow, though the server never restarted. A renewal that
/// finds the key absent asks the server's uptime (`INFO server`, one more round trip:
/// `NodeStore::dated`), and `Hold::reason_for` calls it a restart when `uptime + 1 s` is
/// shorter than `held_for()`: but `held_for()` is read when the INFO's reply has arrived, up
/// to a one-way delay after the server read its uptime. With a 2.5 s delay each way the
/// extension (the renewal script) finds the key gone, the INFO runs about 7.6 s after the
/// grant and answers 5 s later: `held_for` 10 s against an uptime of about 8 s. The lease is
/// the default 30 s, so the lock is still valid by its clock: the honest reason is `Deleted`.
/// The same misdating reaches the watchdog's renewals and a handoff's confirmation (the first
/// version of the T21 × T22 test above, whose renew script was not loaded yet, answered
/// `Lost(ServerRestarted)` for a key that had merely expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_deleted_behind_its_holder_over_a_slow_link_is_not_reported_as_a_server_restart() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let holder = Locker::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_secs(20))
        .build()
        .await
        .unwrap();
    common::load_scripts(&holder).await;
    let guard = holder.lock("k").await.unwrap();
    let granted = Instant::now();
    let name = common::lock_key(&server, "k");
    let deleted: i64 = server.cmd(&["DEL", &name]);
    assert_eq!(deleted, 1);
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(2500)))
        .await;
    let extended = guard.extend(Duration::from_secs(30)).await;
    let answered_after = granted.elapsed();
    proxy.set_mode(ProxyMode::Pass).await;
    let reason = guard.lost_reason();
    let released = guard.release().await;
    assert!(
        matches!(reason, Some(lock_core::LostReason::Deleted)),
        "a lock deleted behind its holder (the server up all along) is reported lost as \
         {reason:?} (the extension answered {extended:?} {answered_after:?} after the grant; \
         the release {released:?})"
    );
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// T17's wake-up waits behind a renewal round trip. The watchdog's loop serves the ends of
/// held locks (`HoldEnds`) and its renewal rounds in one `select!`, and a round's arm awaits
/// the renewal calls inside it: while Redis is slow, no lock that ends by design is marked
/// lost, and the owner waiting for its escaped nested guard (T15, whose wait only the mark
/// wakes) keeps waiting, a whole renewal round trip (up to the command timeout, and the next
/// round may come first again) after its lock ended in Redis.
///
/// Driven: watchdog lease 6 s (rounds at 2 s, 4 s, ... after the build), another lock `w`
/// held by the same locker so that the round at 2 s has something to renew; the owner holds
/// `k` with a fixed lease of 2.5 s, its nested guard kept by a helper task, and asks for `k`
/// again at 1.95 s. At 1.9 s the proxy starts delaying 1.5 s each way: the round at 2 s
/// waits for its renewal's reply until 5 s. `k` ends 2.5 s after its grant (about 2.55 s);
/// with the wake-up T17 promises, the owner acquires `k` anew one round trip (3 s) later,
/// 5.5 s after the grant. Without it, only after the round came back and one round trip more:
/// 8 s after the build. The bound, 6.6 s, is counted from `k`'s grant, so a slow set-up (a
/// busy machine) moves both it and the answer: it stays 1.1 s above the answer with the
/// wake-up, and 0.6 s or more below the answer without it while the set-up takes less than
/// 0.8 s (which is checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_that_ends_by_design_is_marked_lost_also_while_a_renewal_round_waits_for_redis() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let built = Instant::now();
    let holder = Locker::builder()
        .url(proxy.url())
        .watchdog_lease(Duration::from_secs(6))
        .command_timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    common::load_scripts(&holder).await;
    let w = holder.lock("w").await.unwrap();
    let k = holder
        .lock("k")
        .lease(Duration::from_millis(2500))
        .await
        .unwrap();
    let granted = built.elapsed();
    let nested = holder.lock("k").wait(Duration::ZERO).await.unwrap();
    let helper = common::lend(nested, None).await;
    let set_up = built.elapsed();
    assert!(
        set_up < Duration::from_millis(800),
        "the set-up took {set_up:?} (k granted {granted:?} after the build): the scenario \
         needs k to end while the watchdog's round at 2 s waits for Redis"
    );
    tokio::time::sleep_until(built + Duration::from_millis(1900)).await;
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(1500)))
        .await;
    tokio::time::sleep_until(built + Duration::from_millis(1950)).await;
    let again = holder.lock("k").wait(Duration::from_secs(20)).await;
    let answered = built.elapsed();
    proxy.set_mode(ProxyMode::Pass).await;
    let desc = format!("{:?}", again.as_ref().map(|g| g.is_held()));
    eprintln!(
        "FIGURE owner's lock() answered {desc} {answered:?} after the build, {:?} after k's \
         grant ({granted:?} after the build)",
        answered - granted
    );
    if let Ok(g) = again {
        g.release().await.unwrap();
    }
    helper.give_back().await;
    drop(k);
    w.release().await.unwrap();
    assert!(
        answered - granted < Duration::from_millis(6600),
        "the owner waiting for its escaped guard got {desc} {answered:?} after the build, \
         {:?} after k's grant, though k's fixed lease (2.5 s) ended 2.5 s after the grant and \
         one round trip takes 3 s: the watchdog marked it lost only after the renewal round \
         sent at 2 s came back",
        answered - granted
    );
    common::assert_nothing_left(&server, &[&holder]).await;
}
