//! A sixteenth read, of 02be023 (the pool of connections of their own for writes and their `WAIT`s,
//! `store/wait.rs`): wrong answers, not availability. Each test shows one finding and fails
//! on 02be023; its doc comment says what 4effc48 does.
//!
//! Fixed after this read (RELIABILITY, "A sixteenth read"): explicit extensions went on the
//! shared connection again, as on 4effc48, so a round sent after one ran after it; S4 was open
//! again. Then fixed for good: extensions use the pool again, and a hold orders a pooled
//! extension by its answer, not by its sending (`held.rs`, `Extended`): a round sent before
//! the answer does not count, and an extension that never answers caps the validity for good
//! and keeps the lock from being handed over locally. The last two tests here check those
//! two consequences.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::Locker;
use lock_testkit::ProxyMode;

/// Polls `cond` every 2 ms for up to `limit`; whether it held.
async fn until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    false
}

/// Finding E1: a watchdog renewal that ran in Redis *before* a shortening extension is
/// counted as if it ran after it, and the guard says "held" for a key Redis no longer has.
///
/// `extend()` records the extension as sent (`expect_extension`, `extended_at`) before it
/// borrows a connection from the pool; with all 8 lent, it waits there, and nothing of it
/// has reached Redis. A watchdog round sent meanwhile on the shared connection counts as
/// "sent after the extension" (`Hold::confirm`: not `before_extension`, and
/// `renewal_undoes_extension` is false), so its confirmed lease (3 s from its sending)
/// raises the guard's validity. But in Redis it ran first: the extension, sent when a
/// connection frees up, then cuts the key to 300 ms (`renew.lua`, exact). Cancelled before
/// its answer (or failing after it ran), nothing corrects the guard. On 4effc48 the
/// extension went out on the shared connection at once, before the round, so the round ran
/// after it in Redis (and grew the key back to the watchdog lease).
///
/// Interleaving: a primary and its replica behind a proxy (`link`); a locker with
/// `min_replicas(1, 800 ms)`, command timeout 2 s, watchdog lease 3 s (a round each second),
/// holding the watchdog lock `h` and 8 fixed-lease fillers. Just before a round: the link
/// becomes a blackhole, the 8 fillers' `extend(30 s)` take the pool's 8 connections (their
/// WAITs block), then `extend(h, 300 ms)` is called and waits for a connection. The round
/// renews `h` (its PTTL jumps to ~3000); the link then passes with a 150 ms delay: the
/// replica acknowledges the round and the fillers, the extension gets a connection and runs
/// (PTTL ~300), and it is cancelled before its answer. Then the key expires in Redis.
///
/// Expected: once the key is gone from Redis, `h.is_held()` is false, and another locker
/// taking `h` does not find the first still "held" (no second holder).
/// Observed on 02be023 (4 of 4 runs): "the round ran first: true; the extension ran: true;
/// its answer: \"cancelled\"; key gone: true; then is_held() = true, remaining() =
/// 5.282109748s; another locker's lock(\"h\"): granted; is_held() after it: true". On 4effc48
/// it passes: the round is not seen before the extension (both queue on the shared
/// connection behind the fillers' WAITs), the key stays, `is_held()` false, the other
/// locker refused (the lock lost locally but still in Redis: conservative).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e1_a_renewal_run_before_a_queued_shortening_extension_does_not_keep_h_held() {
    renewal_before_queued_extension("E1", Ending::Cancelled).await;
}

/// Finding E2: E1 without cancellation. The extension is left to answer; the link
/// becomes a blackhole again just after it ran in Redis, so its `WAIT` counts no replica
/// and `extend()` fails ("no decisive answer"), which its documentation covers: a
/// shortening extension "counts from when it was sent ... unless a later renewal or
/// extension confirms more". The renewal that "confirms more" ran in Redis before it.
///
/// Interleaving: E1's, except that instead of the cancellation, the replication link
/// becomes a blackhole as soon as the extension's PTTL shows in Redis.
///
/// Expected: once the key is gone from Redis, `h.is_held()` is false; no second holder.
/// On 4effc48 the extension went out on the shared connection before the round and ran
/// first in Redis. Observed on 02be023 (4 of 4 runs): "the round ran first: true; the
/// extension ran: true; its answer: \"redis error on lock `h`: the extension got no decisive
/// answer from redis\"; key gone: true; then is_held() = true, remaining() = 5.02777877s;
/// another locker's lock(\"h\"): granted; is_held() after it: true". On 4effc48 it passes
/// (extend answered Ok, the key stays, `is_held()` false, the other locker refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2_a_renewal_run_before_a_failed_shortening_extension_does_not_keep_h_held() {
    renewal_before_queued_extension("E2", Ending::Failed).await;
}

/// E1 with the extension answered `Ok`: the round sent while it waited for a connection ran
/// first in Redis, and the extension's answer came after the round's.
///
/// Expected: the extension answers `Ok`, the key ends, `h.is_held()` is false then, and
/// another locker taking `h` finds no second holder. This order of answers does not tell
/// the two orderings apart (the extension's answer sets the validity after the round's, and
/// the test passes with the hold ordering a pooled extension by its sending, run on purpose);
/// a round answered after the extension although it ran before it is
/// `held::tests::a_pooled_extension_orders_only_renewals_sent_after_its_answer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_run_before_a_queued_extension_answered_ok_does_not_keep_h_held() {
    renewal_before_queued_extension("E1, answered", Ending::Answered).await;
}

/// How the extension of [`renewal_before_queued_extension`] ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Cancelled once it ran in Redis.
    Cancelled,
    /// Left to answer, with the replication link cut once it ran so that its `WAIT` counts no
    /// replica.
    Failed,
    /// Left to answer, replicated.
    Answered,
}

/// E1's scenario, the extension ending as `ending` says.
async fn renewal_before_queued_extension(label: &str, ending: Ending) {
    let (primary, _replica, link) = common::replica_behind_a_proxy().await;
    let locker = Locker::builder()
        .url(primary.url())
        .min_replicas(1, Duration::from_millis(800))
        .command_timeout(Duration::from_secs(2))
        .watchdog_lease(Duration::from_secs(6))
        .build()
        .await
        .unwrap();
    let other = common::locker(&primary).await;
    let held = Arc::new(common::replicated_lock(&locker, "h").await);
    let mut fillers = Vec::new();
    for i in 0..8 {
        let guard = locker
            .lock(format!("f{i}"))
            .lease(Duration::from_secs(30))
            .wait(Duration::from_secs(5))
            .await
            .unwrap();
        fillers.push(Arc::new(guard));
    }
    // The pool warm: 8 connections, the renewal script loaded.
    let warm =
        futures_util::future::join_all(fillers.iter().map(|g| g.extend(Duration::from_secs(30))))
            .await;
    assert!(warm.iter().all(Result::is_ok), "{warm:?}");
    let name = common::lock_key(&primary, "h");
    let pttl = |p: &lock_testkit::RedisServer| -> i64 { p.cmd(&["PTTL", &name]) };

    // A watchdog round: the PTTL of `h` back at ~3000 after it fell below 2900.
    assert!(until(Duration::from_secs(3), || pttl(&primary) < 5900).await);
    assert!(
        until(Duration::from_secs(3), || pttl(&primary) >= 5950).await,
        "no round"
    );
    let round = Instant::now();
    tokio::time::sleep_until((round + Duration::from_millis(1850)).into()).await;

    link.set_mode(ProxyMode::Hole).await;
    let mut filling = Vec::new();
    for guard in &fillers {
        let guard = guard.clone();
        filling.push(tokio::spawn(async move {
            guard.extend(Duration::from_secs(30)).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let h = held.clone();
    let extension = tokio::spawn(async move { h.extend(Duration::from_millis(600)).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pttl_after_extend_called = pttl(&primary);

    // The next round renews `h` (its extension has not run yet on 02be023).
    let round_ran_first = until(Duration::from_millis(1500), || pttl(&primary) >= 5950).await;
    link.set_mode(ProxyMode::Delay(Duration::from_millis(50)))
        .await;
    // The extension runs in Redis; cancelled before its answer.
    let extension_ran = until(Duration::from_secs(3), || {
        let t = pttl(&primary);
        (0..=600).contains(&t)
    })
    .await;
    let answer = if ending == Ending::Cancelled {
        extension.abort();
        let _ = extension.await;
        "cancelled".to_owned()
    } else {
        if ending == Ending::Failed {
            link.set_mode(ProxyMode::Hole).await;
        }
        match extension.await.unwrap() {
            Ok(()) => "Ok".to_owned(),
            Err(e) => format!("{e}"),
        }
    };
    let gone = until(Duration::from_secs(2), || pttl(&primary) == -2).await;
    let is_held = held.is_held();
    let remaining = held.remaining();
    let second = other.lock("h").wait(Duration::ZERO).await;
    let still_held = held.is_held();
    let observed = format!(
        "PTTL after extend(600 ms) called: {pttl_after_extend_called}; the round ran first: \
         {round_ran_first}; the extension ran: {extension_ran}; its answer: {answer:?}; key gone: {gone}; then \
         is_held() = {is_held}, remaining() = {remaining:?}; another locker's lock(\"h\"): {}; \
         is_held() after it: {still_held}",
        if second.is_ok() { "granted" } else { "refused" }
    );
    lock_testkit::figure(&format!("{label}: {observed}"));
    link.set_mode(ProxyMode::Pass).await;
    for f in filling {
        let _ = f.await;
    }
    assert!(!(gone && is_held), "{observed}");
    assert!(!(second.is_ok() && still_held), "{observed}");
    if ending == Ending::Answered {
        // The scenario ran as meant: the round first, the extension after it, answered, and
        // the key ended by it.
        assert!(round_ran_first && extension_ran && gone, "{observed}");
        assert_eq!(answer, "Ok", "{observed}");
    }
}

/// An extension on a connection of its own that never answered may run in Redis at any time
/// after, under the lock's token: a local handoff keeps that token, and the late extension
/// would cut the next holder's lease under it. Such a lock is released in Redis instead, and
/// the next local acquirer takes it there under a token of its own.
///
/// Setup: a replica behind a proxy, `min_replicas(1, 2 s)`; `h` held, and a second task of
/// the same locker waiting for it. The link becomes a blackhole, `extend(h, 20 s)` runs in
/// Redis (its `PTTL` shows it) and waits for the replica; it is cancelled there. The link
/// passes again, and the holder releases.
///
/// Expected: the waiter gets `h` with a value of its own in Redis (a new token), not the
/// holder's. With the handoff allowed (the check removed on purpose), the waiter's value is
/// the holder's: handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_with_an_unanswered_pooled_extension_is_released_not_handed_over() {
    let (primary, _replica, link) = common::replica_behind_a_proxy().await;
    let locker = Locker::builder()
        .url(primary.url())
        .min_replicas(1, Duration::from_secs(2))
        .command_timeout(Duration::from_secs(3))
        .watchdog_lease(Duration::from_secs(6))
        .build()
        .await
        .unwrap();
    let held = common::replicated_lock(&locker, "h").await;
    let name = common::lock_key(&primary, "h");
    let value = |p: &lock_testkit::RedisServer| -> Option<String> { p.cmd(&["GET", &name]) };
    let holders_value = value(&primary);
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("h").wait(Duration::from_secs(20)).await })
    };
    // The waiter queued locally (it asks Redis once, finds `h` taken, then waits).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());

    link.set_mode(ProxyMode::Hole).await;
    let held = Arc::new(held);
    let h = held.clone();
    let extension = tokio::spawn(async move { h.extend(Duration::from_secs(20)).await });
    let ran = until(Duration::from_secs(2), || {
        let t: i64 = primary.cmd(&["PTTL", &name]);
        t > 15_000
    })
    .await;
    extension.abort();
    let cancelled = extension.await.is_err();
    link.set_mode(ProxyMode::Pass).await;
    let held = Arc::try_unwrap(held).unwrap_or_else(|_| panic!("the extension's task ended"));
    let released = held.release().await;
    let taken = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter got an answer")
        .unwrap();
    let waiters_value = value(&primary);
    let observed = format!(
        "the extension ran: {ran}, cancelled: {cancelled}; release: {released:?}; the waiter:          {}; the holder's value {holders_value:?}, the waiter's {waiters_value:?}",
        match &taken {
            Ok(_) => "granted".to_owned(),
            Err(e) => format!("{e}"),
        }
    );
    lock_testkit::figure(&format!("unanswered pooled extension: {observed}"));
    assert!(ran && cancelled, "{observed}");
    assert!(taken.is_ok(), "{observed}");
    assert!(waiters_value.is_some(), "{observed}");
    assert_ne!(waiters_value, holders_value, "handed over: {observed}");
}
