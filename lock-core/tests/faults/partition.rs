//! Network partitions and process pauses against the double-holder oracle (RELIABILITY.md C.2
//! rows F2, F8 and F12): a holder talks to Redis through a `FaultProxy` (or is a child process
//! that gets SIGSTOPped), another client talks to Redis directly, and a separate referee
//! `redis-server` runs the oracle (occupancy counter, interval log, fenced resource).
//!
//! Each test prints one line with its measurements (`F12:`, `F2:`, `F8:`), visible with
//! `--nocapture`.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{keys, locker, server};
use lock_core::Locker;
use lock_testkit::oracle::{Oracle, Outcome};
use lock_testkit::{FaultProxy, ProxyMode};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// The watchdog lease of the holders under test.
const LEASE: Duration = Duration::from_secs(1);

/// Allowed lateness of a local timer on a loaded 2-core machine.
const TIMER_SLACK: Duration = Duration::from_millis(100);

const CHILD_MODE: &str = "LOCK_PARTITION_CHILD";
const CHILD_URL: &str = "LOCK_PARTITION_URL";
const CHILD_REFEREE: &str = "LOCK_PARTITION_REFEREE";
const CHILD_RUN: &str = "LOCK_PARTITION_RUN";

/// The lock's Redis key (`lock:{tag}:lock:<key>`), found on the server.
fn lock_key(server: &lock_testkit::RedisServer, key: &str) -> Option<String> {
    keys(server, "lock:")
        .into_iter()
        .find(|k| k.ends_with(&format!(":lock:{key}")))
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// F12: a partition between the holder and Redis (proxy `Hole`) for 3× the lease.
///
/// - the holder's `lost()` resolves by its local lease expiry although no reply arrives;
/// - a client that talks to Redis directly acquires once the TTL ran out, with a higher
///   fencing token;
/// - after healing, the old holder's delayed renewals and release (held in the proxy) reach
///   Redis but do not touch the new holder's key, and `release()` reports `Lost`;
/// - the old holder's write through the fenced resource is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f12_partition_longer_than_the_lease() {
    let referee = server();
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    // Default command timeout (3 s): during the hole the holder gets no reply at all.
    let holder = Locker::builder()
        .url(proxy.url())
        .watchdog_lease(LEASE)
        .build()
        .await
        .unwrap();
    let other = locker(&server).await;
    let oracle_h = Oracle::connect(&referee.url(), "f12", "holder")
        .await
        .unwrap();
    let oracle_o = Oracle::connect(&referee.url(), "f12", "other")
        .await
        .unwrap();

    let guard = holder.lock("p").await.unwrap();
    let old_fence = guard.fencing_token().await.unwrap();
    let mut entry_h = oracle_h
        .enter("p", old_fence, || guard.is_held())
        .await
        .unwrap();
    // A few renewals through the proxy first.
    tokio::time::sleep(LEASE).await;
    assert!(entry_h.observe(|| guard.is_held()));
    let renewals_before = holder.stats().renewal_calls;
    assert!(renewals_before >= 2, "renewals: {renewals_before}");

    proxy.set_mode(ProxyMode::Hole).await;
    let cut = Instant::now();
    // The direct client starts waiting at once; it gets the lock when the holder's TTL runs
    // out on the server. Both in this task, the loss polled first: a late wake-up of the task
    // (a busy machine) stamps both late, in the order they happened, and the holder's
    // entry is marked lost before the other's is made.
    let contender = async {
        let taken = other.lock("p").wait(LEASE * 3).await.unwrap();
        let takeover = cut.elapsed();
        let entry = oracle_o
            .enter("p", taken.fencing_token().await.unwrap(), || {
                taken.is_held()
            })
            .await
            .unwrap();
        (taken, entry, takeover)
    };
    let loss = async {
        tokio::time::timeout(LEASE * 2, guard.lost())
            .await
            .expect("the holder reports the loss without any reply from redis");
        entry_h.mark_lost();
        cut.elapsed()
    };
    // `future::join` polls its first future first every time (`tokio::join!` rotates).
    let (detected, (taken, mut entry_o, takeover)) =
        futures_util::future::join(loss, contender).await;
    assert!(!guard.is_held());
    assert!(
        detected <= LEASE + TIMER_SLACK,
        "lost() resolved {detected:?} after the partition began; the local lease is {LEASE:?}"
    );

    let new_fence = taken.fencing_token().await.unwrap();
    assert!(new_fence > old_fence, "fence {new_fence} after {old_fence}");
    assert!(
        takeover >= detected,
        "the other client entered {takeover:?} after the cut, before the holder's loss signal at {detected:?}"
    );
    assert_eq!(entry_o.occupancy(), 2, "the lost holder has not left yet");
    assert!(oracle_o.write(&entry_o).await.unwrap());

    // The old holder leaves and releases while still cut off: its release waits in the hole.
    assert!(!entry_h.observe(|| guard.is_held()));
    oracle_h.leave(&mut entry_h).await.unwrap();
    let release = tokio::spawn(async move {
        let sent = Instant::now();
        (guard.release().await, sent.elapsed())
    });
    tokio::time::sleep_until((cut + LEASE * 3).into()).await;
    proxy.set_mode(ProxyMode::Pass).await;
    let healed = Instant::now();
    let (released, release_took) = release.await.unwrap();
    let answered_after_heal = healed.elapsed();
    let err = released.expect_err("the old holder's release cannot succeed");
    assert!(err.is_lost(), "{err:?}");
    assert!(
        release_took > LEASE,
        "the release was answered after {release_took:?}: it did not wait in the partition"
    );

    // The delayed renewals and the delayed release ran before the release's reply came back
    // (one connection, in order): the new holder's key is untouched.
    let name = lock_key(&server, "p").expect("the new holder's key survived");
    let pttl: i64 = server.cmd(&["PTTL", &name]);
    assert!(pttl > 0, "pttl {pttl}");
    assert!(taken.is_held());
    assert!(other.is_locked("p").await.unwrap());
    // The stale holder's write through the fence is rejected.
    assert!(!oracle_h.write(&entry_h).await.unwrap());
    oracle_h.finish(entry_h, Outcome::Lost).await.unwrap();

    assert!(entry_o.observe(|| taken.is_held()));
    oracle_o.leave(&mut entry_o).await.unwrap();
    taken
        .release()
        .await
        .expect("the new holder's key still held its token");
    oracle_o.finish(entry_o, Outcome::Completed).await.unwrap();
    assert!(lock_key(&server, "p").is_none());

    let report = oracle_o.report().await.unwrap();
    assert!(report.is_clean(), "{report}\n{:#?}", report.violations);
    assert_eq!(report.cycles, 2);
    assert_eq!(report.unfinished, 0);
    assert_eq!(
        (
            report.overlaps,
            report.signalled_overlaps,
            report.unsignalled_overlaps
        ),
        (1, 1, 0),
        "{report}"
    );
    assert_eq!(
        (report.occupancy_collisions, report.occupancy_violations),
        (1, 0)
    );
    assert_eq!(
        (
            report.stale_attempted,
            report.stale_rejected,
            report.stale_accepted
        ),
        (1, 1, 0)
    );
    lock_testkit::figure(&format!(
        "F12: lease={}ms lost_after_cut={}ms takeover_after_cut={}ms release_answered={}ms_after_heal (sent into the hole {}ms before) renewals_before_cut={} fence {} -> {} oracle: {report}",
        ms(LEASE),
        ms(detected),
        ms(takeover),
        ms(answered_after_heal),
        ms(release_took.saturating_sub(answered_after_heal)),
        renewals_before,
        old_fence,
        new_fence,
    ));
    common::assert_nothing_left(&server, &[&holder, &other]).await;
}

/// F8: resetting the holder's connections (command and pub/sub, through the proxy) once per
/// lease for three leases loses nothing: no false loss, renewals go on, and a waiter behind
/// the same proxy is woken promptly by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f8_connection_resets_do_not_lose_the_lock() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let lease = Duration::from_millis(600);
    let holder = proxied_locker(&proxy, lease).await;
    let waiter_locker = proxied_locker(&proxy, lease).await;
    let waiting = waiter_locker.clone();
    let guard = holder.lock("r").await.unwrap();
    let waiter = tokio::spawn(async move {
        let guard = waiter_locker
            .lock("r")
            .wait(Duration::from_secs(10))
            .await
            .unwrap();
        let acquired = Instant::now();
        guard.release().await.unwrap();
        // An unused subscription may linger briefly; it must go.
        let mut subscriptions = waiter_locker.stats().subscriptions;
        for _ in 0..200 {
            if subscriptions == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            subscriptions = waiter_locker.stats().subscriptions;
        }
        (acquired, subscriptions)
    });
    let renewals_before = holder.stats().renewal_calls;
    let resets = 3;
    for _ in 0..resets {
        proxy.set_mode(ProxyMode::Reset).await;
        // One lease: the renewal after the reset fails (and reconnects), the next succeeds.
        tokio::time::sleep(lease).await;
    }
    let renewals = holder.stats().renewal_calls - renewals_before;
    assert!(guard.is_held(), "false loss after connection resets");
    assert!(
        tokio::time::timeout(Duration::ZERO, guard.lost())
            .await
            .is_err(),
        "lost() resolved"
    );
    let pttl: i64 = server.cmd(&["PTTL", &lock_key(&server, "r").unwrap()]);
    assert!(pttl > 0, "pttl {pttl}");
    // Three leases at one renewal per third of a lease: about 9 calls, 3 failed by a reset.
    assert!(renewals >= 6, "only {renewals} renewal calls");
    assert!(!waiter.is_finished(), "the waiter got a lock that was held");
    let released = Instant::now();
    guard.release().await.unwrap();
    let (acquired, subscriptions) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter acquires")
        .unwrap();
    let wake = acquired.saturating_duration_since(released);
    // Woken by the release message on a resubscribed connection, not the 1 s fallback retry.
    assert!(
        wake < Duration::from_millis(500),
        "waiter acquired {wake:?} after the release"
    );
    assert_eq!(subscriptions, 0);
    lock_testkit::figure(&format!(
        "F8: lease={}ms resets={resets} renewal_calls={renewals} proxy_connections={} waiter_woken_after={}ms",
        ms(lease),
        proxy.connections(),
        ms(wake)
    ));
    common::assert_nothing_left(&server, &[&holder, &waiting]).await;
}

/// A locker behind `proxy`. Its releases' retry window is 10 s, well past the delays these
/// tests put in: a retried release then always finds its first try's latch.
async fn proxied_locker(proxy: &FaultProxy, lease: Duration) -> Locker {
    Locker::builder()
        .url(proxy.url())
        .watchdog_lease(lease)
        .release_retry_window(Duration::from_secs(10))
        .build()
        .await
        .unwrap()
}

/// F8, release right after a connection reset (Redis healthy and reachable): the release
/// succeeds and the next holder gets the key at once.
///
/// Regression test: the first command on a dropped connection fails with "broken pipe"
/// (redis-rs's `ConnectionManager` with RESP2 reconnects only after a command failed, and
/// passes that error on). `LockGuard::release` used to return it as `LockError::Backend`,
/// leaving the key for the whole lease (30 s by default); since 68320ba the idempotent
/// compare-and-delete is sent again on the new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f8_release_right_after_a_connection_reset_succeeds() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let lease = Duration::from_secs(3);
    let holder = proxied_locker(&proxy, lease).await;
    let direct = locker(&server).await;
    let guard = holder.lock("r").await.unwrap();
    proxy.set_mode(ProxyMode::Reset).await;
    let released = guard.release().await;
    let started = Instant::now();
    let next = direct.lock("r").wait(lease * 2).await.unwrap();
    let waited = started.elapsed();
    next.release().await.unwrap();
    assert!(
        released.is_ok(),
        "release after a connection reset: {released:?}; the next holder waited {waited:?} (lease {lease:?})"
    );
    assert!(waited < Duration::from_millis(500), "waited {waited:?}");
    common::assert_nothing_left(&server, &[&holder, &direct]).await;
}

/// F8, the connection drops while the release's reply is on its way: the release ran on the
/// server, so `release()` must report success, not a loss.
///
/// A release that fails on a dropped connection is sent again; when the first call had
/// already run, the retry finds no key, and that must count as our own release, not a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_is_lost_is_not_a_false_loss() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let (holder, release) = release_with_reply_in_flight(&server, &proxy).await;
    // The reply is still in the proxy: cut the connection.
    proxy.set_mode(ProxyMode::Reset).await;
    let released = release.await.unwrap();
    assert!(
        released.is_ok(),
        "release() of a lock it did release: {released:?}"
    );
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// The same with contention: the release ran and told the waiters, another client took the
/// lock, then the reply was lost. The retry finds the other client's token; the holder's lease
/// was confirmed when it sent the release, so the key it finds taken was taken after its own
/// delete: `release()` reports success, not a loss (the soak's "unexplained" losses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_is_lost_after_a_takeover_is_not_a_false_loss() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let other = Locker::connect(&server.url()).await.unwrap();
    let (holder, release) = release_with_reply_in_flight(&server, &proxy).await;
    // Another client takes the lock before the holder hears back.
    let taken = other.lock("r").wait(Duration::ZERO).await.unwrap();
    proxy.set_mode(ProxyMode::Reset).await;
    let released = release.await.unwrap();
    assert!(
        released.is_ok(),
        "release() of a lock it did release, then taken by another: {released:?}"
    );
    assert!(taken.is_held(), "the other client's lock was left alone");
    assert!(lock_key(&server, "r").is_some());
    taken.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder, &other]).await;
}

/// A holder behind `proxy` releases `r` (fixed 5 s lease: no renewal traffic on the
/// connection) while the proxy delays everything by 500 ms each way (a busy machine's stall
/// of 200 ms stays inside each step); returns once the release has run on the server and its
/// reply is still in the proxy. Returns the holder and the
/// release in flight.
async fn release_with_reply_in_flight(
    server: &lock_testkit::RedisServer,
    proxy: &FaultProxy,
) -> (
    Locker,
    tokio::task::JoinHandle<Result<(), lock_core::LockError>>,
) {
    let holder = proxied_locker(proxy, Duration::from_secs(5)).await;
    let release = release_in_flight(&holder, server, proxy, Duration::from_millis(500)).await;
    (holder, release)
}

/// [`release_with_reply_in_flight`] for a given holder behind `proxy`, which delays
/// everything by `delay` each way: returns `delay / 2` after the release ran on the server,
/// with its reply `delay / 2` from arriving.
async fn release_in_flight(
    holder: &Locker,
    server: &lock_testkit::RedisServer,
    proxy: &FaultProxy,
    delay: Duration,
) -> tokio::task::JoinHandle<Result<(), lock_core::LockError>> {
    // Load the scripts first, so that the release is one EVALSHA.
    holder.lock("warm").await.unwrap().release().await.unwrap();
    let guard = holder
        .lock("r")
        .lease(Duration::from_secs(5))
        .await
        .unwrap();
    proxy.set_mode(ProxyMode::Delay(delay)).await;
    let release = tokio::spawn(async move { guard.release().await });
    tokio::time::sleep(delay + delay / 2).await;
    assert!(
        lock_key(server, "r").is_none(),
        "the release ran on the server"
    );
    release
}

/// A release whose reply is lost after it ran, retried only once the release retry window
/// passed: its first try's latch is gone, so the retry cannot tell its own delete from a loss.
/// It reports the lock lost for an unknown reason, never `Ok` on a proof it no longer has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_retried_past_its_window_reports_an_unknown_loss_not_ok() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let holder = Locker::builder()
        .url(proxy.url())
        .release_retry_window(Duration::from_millis(20))
        .build()
        .await
        .unwrap();
    // The first try runs 1 s after it was sent; its reply would come 1 s later still.
    let release = release_in_flight(&holder, &server, &proxy, Duration::from_secs(1)).await;
    // Its reply is lost half a second after the first try ran: the retry runs long after the
    // first try's 20 ms latch is gone.
    proxy.set_mode(ProxyMode::Reset).await;
    let released = release.await.unwrap();
    match released {
        Err(lock_core::LockError::Lost { reason, .. }) => {
            assert_eq!(reason, lock_core::LostReason::Unknown);
        }
        other => panic!("a release retried past its window: {other:?}"),
    }
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// A locker whose releases leave no latch (a zero release retry window).
async fn unlatched(url: String) -> Locker {
    Locker::builder()
        .url(url)
        .release_retry_window(Duration::ZERO)
        .build()
        .await
        .unwrap()
}

/// With a zero retry window (no latch), a release whose reply is lost after it ran cannot
/// prove on its retry that it deleted the key: it reports the lock lost for an unknown
/// reason. The first try that never reached Redis is the next test: there the retry finds
/// its token and releases for sure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_latch_a_release_whose_reply_is_lost_reports_an_unknown_loss() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let holder = unlatched(proxy.url()).await;
    let release = release_in_flight(&holder, &server, &proxy, Duration::from_millis(500)).await;
    proxy.set_mode(ProxyMode::Reset).await;
    match release.await.unwrap() {
        Err(lock_core::LockError::Lost { reason, .. }) => {
            assert_eq!(reason, lock_core::LostReason::Unknown);
        }
        other => panic!("a release without a latch, its reply lost: {other:?}"),
    }
    assert!(
        server.keys("lock:*").is_empty(),
        "no latch, no lock key: {:?}",
        server.keys("lock:*")
    );
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// With a zero retry window, a release whose first try never reached Redis (the connection
/// reset under it) is sent again, finds its token, and releases: `Ok`, and the next holder
/// gets the key at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_latch_a_release_that_never_reached_redis_is_retried_and_ok() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let holder = unlatched(proxy.url()).await;
    let direct = unlatched(server.url()).await;
    let guard = holder
        .lock("r")
        .lease(Duration::from_secs(5))
        .await
        .unwrap();
    proxy.set_mode(ProxyMode::Reset).await;
    let released = guard.release().await;
    assert!(
        released.is_ok(),
        "a release whose first try never ran: {released:?}"
    );
    assert!(lock_key(&server, "r").is_none(), "the key was deleted");
    let next = direct.lock("r").wait(Duration::ZERO).await;
    assert!(next.is_ok(), "the next holder: {next:?}");
    next.unwrap().release().await.unwrap();
    assert!(
        server.keys("lock:*").is_empty(),
        "{:?}",
        server.keys("lock:*")
    );
    common::assert_nothing_left(&server, &[&holder, &direct]).await;
}

/// A reader's release whose reply is lost after it ran, then a writer takes the lock before
/// the retry: the retry finds the writer's token where the marker was, and must still count
/// the release as ours through the latch its first try left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_release_whose_reply_is_lost_is_recognised_by_its_latch() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let writer = Locker::connect(&server.url()).await.unwrap();
    let holder = proxied_locker(&proxy, Duration::from_secs(5)).await;
    // Load the scripts first, so that the release is one EVALSHA.
    holder.read("warm").await.unwrap().release().await.unwrap();
    let reader = holder
        .read("r")
        .lease(Duration::from_secs(5))
        .await
        .unwrap();
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(500)))
        .await;
    let release = tokio::spawn(async move { reader.release().await });
    // Run on the server 500 ms in; its reply arrives 1 s in.
    tokio::time::sleep(Duration::from_millis(750)).await;
    assert!(
        lock_key(&server, "r").is_none(),
        "the release ran on the server"
    );
    let taken = writer.write("r").wait(Duration::ZERO).await.unwrap();
    proxy.set_mode(ProxyMode::Reset).await;
    let released = release.await.unwrap();
    assert!(
        released.is_ok(),
        "release() of a read lock it did release, then taken by a writer: {released:?}"
    );
    assert!(taken.is_held(), "the writer's lock was left alone");
    taken.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder, &writer]).await;
}

/// A reader's release whose first try never reached Redis (the connection was reset before
/// it), after a writer's token replaced the marker: the retry finds the reader's entry but
/// not the marker, and reports the lock lost, not released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_read_release_of_a_lost_read_lock_reports_it_lost() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let holder = proxied_locker(&proxy, Duration::from_secs(5)).await;
    let reader = holder
        .read("r")
        .lease(Duration::from_secs(5))
        .await
        .unwrap();
    let lock = lock_key(&server, "r").unwrap();
    let _: () = server.cmd(&["SET", &lock, "a-writer", "PX", "60000"]);
    let before = proxy.connections();
    proxy.set_mode(ProxyMode::Reset).await;
    let released = reader.release().await;
    let reason = match released {
        Err(lock_core::LockError::Lost { reason, .. }) => reason,
        other => panic!("release of a read lock a writer took over: {other:?}"),
    };
    assert_eq!(reason, lock_core::LostReason::TakenOver);
    assert!(
        proxy.connections() > before,
        "the release was sent again on a new connection"
    );
    let _: i64 = server.cmd(&["DEL", &lock]);
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// A read acquire whose reply is lost after it ran on the server (the reader's entry is
/// there), while a writer of another locker starts waiting: the retry, with the same token, is
/// recognised as ours (not deferred to the writer, no second entry), and the reader holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_acquire_whose_reply_is_lost_is_recognised_by_its_retry() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let writer = Locker::connect(&server.url()).await.unwrap();
    let holder = proxied_locker(&proxy, Duration::from_secs(5)).await;
    // Load the scripts first, so that the acquire is one EVALSHA.
    holder.read("warm").await.unwrap().release().await.unwrap();
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(500)))
        .await;
    let acquire = tokio::spawn({
        let holder = holder.clone();
        async move {
            holder
                .read("r")
                .lease(Duration::from_secs(5))
                .wait(Duration::from_secs(5))
                .await
        }
    });
    // Run on the server 500 ms in; its reply arrives 1 s in.
    tokio::time::sleep(Duration::from_millis(750)).await;
    let readers = keys(&server, "lock:")
        .into_iter()
        .find(|k| k.contains(":readers:r"))
        .expect("the read acquire ran on the server");
    let waiting = tokio::spawn({
        let writer = writer.clone();
        async move { writer.write("r").wait(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = proxy.connections();
    proxy.set_mode(ProxyMode::Reset).await;
    let reader = acquire
        .await
        .unwrap()
        .expect("the retry is granted as ours");
    assert!(
        proxy.connections() > before,
        "the retry went on a new connection"
    );
    let entries: i64 = server.cmd(&["ZCARD", &readers]);
    assert_eq!(entries, 1, "one entry, the first try's");
    assert!(reader.is_held());
    assert!(!waiting.is_finished(), "the writer waits for the reader");
    proxy.set_mode(ProxyMode::Pass).await;
    reader.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder, &writer]).await;
}

/// F8 with a flapping connection (a reset every half lease, each reconnect immediate, Redis
/// reachable throughout): no false loss.
///
/// Regression test: a renewal that failed on a dropped connection ("broken pipe", never sent)
/// used to wait for the next watchdog tick, a third of the lease later, so two drops within
/// two thirds of a lease failed two ticks in a row and the lease ran out (`lost()` after the
/// 4th reset here). Since 68320ba the renewal is sent again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f8_a_flapping_connection_does_not_lose_the_lock() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let lease = Duration::from_millis(600);
    let holder = proxied_locker(&proxy, lease).await;
    let guard = holder.lock("r").await.unwrap();
    for i in 0..6 {
        tokio::time::sleep(lease / 2).await;
        proxy.set_mode(ProxyMode::Reset).await;
        assert!(
            guard.is_held(),
            "lost after {} resets, one every {:?} (lease {lease:?})",
            i + 1,
            lease / 2
        );
    }
    tokio::time::sleep(lease / 2).await;
    assert!(guard.is_held());
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// Starts this test binary again as a child holder process (see `partition_child`).
fn spawn_child(mode: &str, url: &str, referee: &str, run: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(crate::common::child::only_test_args(
            module_path!(),
            "partition_child",
        ))
        .env(CHILD_MODE, mode)
        .env(CHILD_URL, url)
        .env(CHILD_REFEREE, referee)
        .env(CHILD_RUN, run)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The text after `marker` on the first stdout line containing it.
async fn read_marked(out: &mut BufReader<ChildStdout>, marker: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let n = tokio::time::timeout(Duration::from_secs(20), out.read_line(&mut line))
            .await
            .unwrap_or_else(|_| panic!("no {marker} line from the child within 20 s"))
            .unwrap();
        assert!(n > 0, "the child exited before printing {marker}");
        if let Some(at) = line.find(marker) {
            return line[at + marker.len()..].trim().to_owned();
        }
    }
}

/// `kill -s <sig> <pid>` (the workspace forbids the unsafe `libc::kill`).
fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args(["-s", sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -s {sig} {pid}");
}

fn field<'a>(result: &'a str, name: &str) -> &'a str {
    result
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {name} in {result:?}"))
}

/// F2 (Kleppmann): the holder process is SIGSTOPped for 2× the lease. Another client takes the
/// lock with a higher fencing token and writes; the resumed holder's write (sent before it
/// looks at its lock) is rejected by the fenced resource, its lost signal fires, its release
/// reports `Lost`, and the new holder's key is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f2_a_paused_holder_process_is_fenced_off() {
    let referee = server();
    let server = server();
    let mut child = spawn_child("f2", &server.url(), &referee.url(), "f2");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let child_fence: u64 = read_marked(&mut out, "HELD ").await.parse().unwrap();
    let pid = child.id().unwrap();

    signal(pid, "STOP");
    let stopped = Instant::now();
    tokio::time::sleep(LEASE * 2).await;
    let other = locker(&server).await;
    let oracle = Oracle::connect(&referee.url(), "f2", "parent")
        .await
        .unwrap();
    // The paused holder could not renew: its key is gone.
    let guard = other.lock("f2").wait(LEASE).await.unwrap();
    let new_fence = guard.fencing_token().await.unwrap();
    assert!(
        new_fence > child_fence,
        "fence {new_fence} after {child_fence}"
    );
    let mut entry = oracle
        .enter("f2", new_fence, || guard.is_held())
        .await
        .unwrap();
    assert!(oracle.write(&entry).await.unwrap());

    signal(pid, "CONT");
    let paused = stopped.elapsed();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"GO\n").await.unwrap();
    stdin.flush().await.unwrap();
    let result = read_marked(&mut out, "RESULT ").await;
    assert!(child.wait().await.unwrap().success());
    assert_eq!(field(&result, "write_accepted"), "false", "{result}");
    assert_eq!(field(&result, "lost"), "true", "{result}");
    assert_eq!(field(&result, "held_after"), "false", "{result}");
    assert_eq!(field(&result, "release"), "lost", "{result}");
    let lost_after: u64 = field(&result, "lost_after_ms").parse().unwrap();
    assert!(
        lost_after <= 500,
        "lost signalled {lost_after} ms after resuming"
    );

    // The resumed holder's renewal and release did not touch the new holder's key.
    assert!(entry.observe(|| guard.is_held()));
    oracle.leave(&mut entry).await.unwrap();
    guard
        .release()
        .await
        .expect("the new holder's key held its token");
    oracle.finish(entry, Outcome::Completed).await.unwrap();

    let report = oracle.report().await.unwrap();
    assert!(report.is_clean(), "{report}\n{:#?}", report.violations);
    assert_eq!(report.cycles, 2);
    assert_eq!(report.unfinished, 0);
    // The paused holder was inside when the new one entered: one raw collision, explained by
    // its (late) loss signal, and one late-signalled overlap - the window fencing closes.
    assert_eq!(
        (report.occupancy_collisions, report.occupancy_violations),
        (1, 0)
    );
    assert_eq!(
        (report.overlaps, report.late_signalled_overlaps),
        (1, 1),
        "{report}"
    );
    assert_eq!(
        (
            report.stale_attempted,
            report.stale_rejected,
            report.stale_accepted
        ),
        (1, 1, 0)
    );
    lock_testkit::figure(&format!(
        "F2: lease={}ms paused={}ms fence {child_fence} -> {new_fence} child: {result} oracle: {report}",
        ms(LEASE),
        ms(paused),
    ));
    common::assert_nothing_left(&server, &[&other]).await;
}

/// The child side of the process tests. Does nothing unless started by a test of this file.
#[test]
#[ignore = "run as a child process by the tests of this file"]
fn partition_child() {
    let (Ok(mode), Ok(url), Ok(referee), Ok(run)) = (
        std::env::var(CHILD_MODE),
        std::env::var(CHILD_URL),
        std::env::var(CHILD_REFEREE),
        std::env::var(CHILD_RUN),
    ) else {
        return;
    };
    assert_eq!(mode, "f2", "unknown child mode");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let locker = Locker::builder()
            .url(url)
            .watchdog_lease(LEASE)
            .build()
            .await
            .unwrap();
        let oracle = Oracle::connect(&referee, &run, "child").await.unwrap();
        let guard = locker.lock("f2").await.unwrap();
        let mut entry = oracle
            .enter("f2", guard.fencing_token().await.unwrap(), || guard.is_held())
            .await
            .unwrap();
        assert!(entry.lost_at().is_none());
        println!("HELD {}", guard.fencing_token().await.unwrap());
        // The parent SIGSTOPs this process here, then sends GO after SIGCONT.
        let mut line = String::new();
        BufReader::new(tokio::io::stdin())
            .read_line(&mut line)
            .await
            .unwrap();
        let resumed = Instant::now();
        // Paused just before a write: it goes out before the lock is looked at again.
        let accepted = oracle.write(&entry).await.unwrap();
        let lost = tokio::time::timeout(Duration::from_secs(2), guard.lost())
            .await
            .is_ok();
        let lost_after = resumed.elapsed();
        if lost {
            entry.mark_lost();
        }
        let held_after = entry.observe(|| guard.is_held());
        oracle.leave(&mut entry).await.unwrap();
        let outcome = match guard.release().await {
            Ok(()) => Outcome::Completed,
            Err(e) if e.is_lost() => Outcome::Lost,
            Err(_) => Outcome::ReleaseFailed,
        };
        oracle.finish(entry, outcome).await.unwrap();
        let release = match outcome {
            Outcome::Completed => "ok",
            Outcome::Lost => "lost",
            _ => "error",
        };
        println!(
            "RESULT write_accepted={accepted} lost={lost} lost_after_ms={} held_after={held_after} release={release} renewal_calls={}",
            lost_after.as_millis(),
            locker.stats().renewal_calls
        );
    });
}
