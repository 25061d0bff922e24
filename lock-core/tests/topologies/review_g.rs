//! A read of 880c068 (with 2243402): `extend` with `min_replicas` on a pooled connection
//! again, the hold ordering a pooled extension by its answer (`held.rs`, `Extended`,
//! `ExtensionPath`). Each test shows one finding and fails on 2243402; its doc comment says
//! what 52f9ecd (extensions on the shared connection) does. Availability, not wrong answers:
//! in each the lock is given up locally while Redis keeps its key under the holder's token,
//! the conservative side. Both fixed (RELIABILITY, "A seventeenth read"): an extension
//! answered without enough replicas ran before its answer and caps nothing
//! (`Undecided::Unreplicated`, `Hold::extension_ran`), and rounds sent while one is unanswered
//! count up to the least it leaves the key.

use crate::common;

use std::time::{Duration, Instant};

use lock_core::{LockGuard, Locker};
use lock_testkit::{FaultProxy, ProxyMode, RedisServer};

/// A locker on `primary` with `min_replicas(1, 500 ms)` (its pool of connections of their
/// own), a 2 s command timeout and a 3 s watchdog lease (a round each second).
async fn replicated_locker(primary: &RedisServer) -> Locker {
    Locker::builder()
        .url(primary.url())
        .min_replicas(1, Duration::from_millis(500))
        .command_timeout(Duration::from_secs(2))
        .watchdog_lease(Duration::from_secs(3))
        .build()
        .await
        .unwrap()
}

/// `guard.extend(by)` with the replication link a blackhole: the renewal script runs on the
/// primary (its PTTL shows `by`) and the `WAIT` counts no replica, so `extend` fails ("no
/// decisive answer"). The link passes again afterwards. Returns the error shown and the
/// PTTL read just after.
async fn extend_unreplicated(
    guard: &LockGuard,
    by: Duration,
    link: &FaultProxy,
    primary: &RedisServer,
    name: &str,
) -> (String, i64) {
    link.set_mode(ProxyMode::Hole).await;
    let answer = match guard.extend(by).await {
        Ok(()) => "Ok".to_owned(),
        Err(e) => format!("{e}"),
    };
    let pttl: i64 = primary.cmd(&["PTTL", name]);
    link.set_mode(ProxyMode::Pass).await;
    (answer, pttl)
}

/// Finding G1: one `extend` answered without its replica caps the lock's validity for good,
/// though its own answer shows it ran in Redis (and cannot run again later), and later
/// extensions, answered `Ok` with the replica, leave the key far beyond the cap: the lock
/// is lost locally at the failed extension's end, its key kept in Redis for the holder's
/// token for many seconds more (and nobody else can take it meanwhile).
///
/// `expect_extension` records the pooled extension as `unanswered`; its `Unknown` answer
/// (the script answered `Renewed`, the `WAIT` counted 0: `Renewal::unreplicated`) leaves it
/// so, and the next `expect_extension` folds it into `cap` (`lasting_cap`), which every later
/// `confirm_extension` and `confirm` keep to. An `Unknown` from an unreplicated `WAIT` is
/// not "never answered": the write ran on the primary before its reply (a later `WAIT`
/// that counts the replica covers it too), so it cannot cut a later lease there.
///
/// Interleaving: a fixed 3 s lease; the link a blackhole, `extend(3 s)` runs on the primary
/// and fails for want of a replica; the link passes; `extend(20 s)` answers `Ok` (the
/// replica acknowledged it, and with it the first). 3.5 s after the first extension.
///
/// Expected: `is_held()` true, `remaining()` about 16 s (the last extension, `Ok` and
/// replicated, left 20 s; the key's PTTL ~16 s, its value the holder's token). On 52f9ecd
/// (extensions on the shared connection, no cap) it is. Observed on 2243402: see the test's
/// `figure` line ("is_held() = false, remaining() = 0ns" while the PTTL is ~17500; 2 of 2 runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn g1_an_unreplicated_extension_does_not_cap_later_replicated_extensions_for_good() {
    let (primary, _replica, link) = common::replica_behind_a_proxy().await;
    let locker = replicated_locker(&primary).await;
    let guard = common::replicated_lock_leased(&locker, "g1", Some(Duration::from_secs(3))).await;
    let name = common::lock_key(&primary, "g1");
    let token: Option<String> = primary.cmd(&["GET", &name]);

    let first_sent = Instant::now();
    let (first, first_pttl) =
        extend_unreplicated(&guard, Duration::from_secs(3), &link, &primary, &name).await;
    // The replica catches up; the next extension is answered with it.
    let mut second = String::new();
    for _ in 0..20 {
        match guard.extend(Duration::from_secs(20)).await {
            Ok(()) => {
                second = "Ok".to_owned();
                break;
            }
            Err(e) => second = format!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let remaining_after_second = guard.remaining();
    tokio::time::sleep_until((first_sent + Duration::from_millis(3500)).into()).await;
    let (is_held, remaining) = (guard.is_held(), guard.remaining());
    let pttl: i64 = primary.cmd(&["PTTL", &name]);
    let value: Option<String> = primary.cmd(&["GET", &name]);
    let observed = format!(
        "extend(3 s) without the replica: {first:?} (PTTL then {first_pttl}); extend(20 s): \
         {second:?}, remaining() just after it {remaining_after_second:?}; 3.5 s after the \
         first: is_held() = {is_held}, remaining() = {remaining:?}; the key's PTTL {pttl}, \
         still the holder's token: {}",
        value.is_some() && value == token
    );
    lock_testkit::figure(&format!("G1: {observed}"));
    assert!(
        first_pttl > 2_000,
        "the first extension did not run: {observed}"
    );
    assert_eq!(second, "Ok", "{observed}");
    assert!(pttl > 10_000 && value == token, "{observed}");
    assert!(
        is_held && remaining > Duration::from_secs(10),
        "the lock is lost locally while Redis keeps it for the holder: {observed}"
    );
}

/// Finding G2: a watchdog lock whose *lengthening* pooled `extend` failed (its `WAIT`
/// counted no replica) is lost locally within one watchdog lease, not "at that extension's
/// end" as RELIABILITY.md's row "E1, E2, S4" says the cost is: every later watchdog round is
/// ignored for good (`renewal_unordered` is true while `unanswered` is set, and nothing ever
/// clears it), not just held to the cap (the least the extension leaves the key: counting a
/// round up to it would be safe whether or not the extension ever ran). The key stays in
/// Redis under the holder's token (the extension ran: ~20 s), and the holder is told its
/// lock is gone after ~3 s.
///
/// Interleaving: a watchdog lock (lease 3 s, a round each second); the link a blackhole,
/// `extend(20 s)` runs on the primary and fails for want of a replica; the link passes. The
/// watchdog's rounds go on (on the shared connection, answered with the replica). 4.5 s
/// later.
///
/// Expected: `is_held()` true (the key has ~15 s left under the holder's token; the rounds
/// renew it). On 52f9ecd (the extension on the shared connection: the rounds sent after it
/// count) it is. Observed on 2243402: see the test's `figure` line ("is_held() = false, remaining() = 0ns" with the PTTL ~15000; 2 of 2 runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn g2_a_watchdog_lock_with_a_failed_lengthening_extension_is_kept_by_its_rounds() {
    let (primary, _replica, link) = common::replica_behind_a_proxy().await;
    let locker = replicated_locker(&primary).await;
    let guard = common::replicated_lock(&locker, "g2").await;
    let name = common::lock_key(&primary, "g2");
    let token: Option<String> = primary.cmd(&["GET", &name]);

    let (answer, pttl_then) =
        extend_unreplicated(&guard, Duration::from_secs(20), &link, &primary, &name).await;
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let (is_held, remaining) = (guard.is_held(), guard.remaining());
    let pttl: i64 = primary.cmd(&["PTTL", &name]);
    let value: Option<String> = primary.cmd(&["GET", &name]);
    let observed = format!(
        "extend(20 s) without the replica: {answer:?} (PTTL then {pttl_then}); 4.5 s later: \
         is_held() = {is_held}, remaining() = {remaining:?}; the key's PTTL {pttl}, still the \
         holder's token: {}",
        value.is_some() && value == token
    );
    lock_testkit::figure(&format!("G2: {observed}"));
    assert!(pttl_then > 15_000, "the extension did not run: {observed}");
    assert!(pttl > 5_000 && value == token, "{observed}");
    assert!(
        is_held,
        "the lock is lost locally while Redis keeps it for the holder: {observed}"
    );
}
