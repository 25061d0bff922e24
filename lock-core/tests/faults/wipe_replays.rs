//! The chaos soak's two wipe shapes, replayed deterministically against real servers: a holder
//! whose lock Redis granted before a `force_unlock` but which entered the oracle after it. The
//! kit does what it documents in both (the holder notices at its next renewal, its release
//! answers `Lost`); the oracle must excuse the overlap by the holder's grant stamp
//! ([`Oracle::enter_granted`]), which the soak's sections take as their acquire returns.
//! Without the stamp the oracle blamed these holders: the soak's only failures under a machine
//! overloaded 6 to 15 times (`unsignalled=1 untold_after_wipe=1`, `occupancy_violations=1`).

use std::time::Duration;

use lock_core::{LockError, LockGuard, Locker};
use lock_testkit::oracle::{monotonic_ns, Entry, Kind, Oracle, Outcome, Release, Report, Wipe};
use lock_testkit::RedisServer;

const LEASE: Duration = Duration::from_secs(1);
const PREFIX: &str = "soak:";
/// The soak's: one renewal interval of its lease, plus a margin.
const WIPE_NOTICE: Duration = Duration::from_millis(1000 / 3 + 250);

async fn locker(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .prefix(PREFIX)
        .watchdog_lease(LEASE)
        .command_timeout(LEASE)
        .fence_retention(LEASE * 2)
        .restart_guard(LEASE)
        .build()
        .await
        .unwrap()
}

fn answer(result: &Result<(), LockError>) -> Release {
    match result {
        Ok(()) => Release::Ok,
        Err(e) if e.is_lost() => Release::Lost,
        Err(_) => Release::Failed,
    }
}

/// Enters with the grant stamp `granted_at` when `stamped`, else as a holder that records
/// none (the soak's sections before the stamp existed).
async fn enter(
    oracle: &Oracle,
    key: &str,
    fence: u64,
    granted_at: u64,
    stamped: bool,
    guard: &LockGuard,
) -> Entry {
    let held = || guard.is_held();
    if stamped {
        oracle
            .enter_granted(key, Kind::Exclusive, fence, granted_at, held)
            .await
    } else {
        oracle.enter(key, fence, held).await
    }
    .unwrap()
}

/// Works inside until the lock's loss is observed (checking every 5 ms, as the soak's queue
/// sections do), then leaves and releases; returns the release's answer.
async fn work_until_lost(
    oracle: &Oracle,
    mut entry: Entry,
    guard: LockGuard,
    beside: Option<(&mut Entry, &LockGuard)>,
) -> Result<(), LockError> {
    let mut beside = beside;
    let started = std::time::Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the holder never learned of the loss"
        );
        let lost = tokio::select! {
            biased;
            () = guard.lost() => true,
            () = tokio::time::sleep(Duration::from_millis(5)) => false,
        };
        if lost {
            entry.mark_lost();
        }
        if let Some((other, other_guard)) = beside.as_mut() {
            other.observe(|| other_guard.is_held());
        }
        if !entry.observe(|| guard.is_held()) {
            break;
        }
    }
    oracle.leave(&mut entry).await.unwrap();
    let released = guard.release().await;
    entry.record_release(answer(&released));
    oracle.finish(entry, Outcome::Lost).await.unwrap();
    released
}

/// Leaves and releases the section of a holder that kept its lock (`who` names it).
async fn finish_held(oracle: &Oracle, mut entry: Entry, guard: LockGuard, who: &str) {
    entry.observe(|| guard.is_held());
    oracle.leave(&mut entry).await.unwrap();
    let released = guard.release().await;
    assert!(released.is_ok(), "{who}'s release: {released:?}");
    entry.record_release(answer(&released));
    oracle.finish(entry, Outcome::Completed).await.unwrap();
}

async fn force_unlock(admin: &Locker, parent: &Oracle, key: &str) {
    let begin = monotonic_ns();
    assert!(admin.force_unlock(key).await.unwrap(), "nothing to unlock");
    let end = monotonic_ns();
    parent
        .wipe(&Wipe {
            key: Some(key.to_owned()),
            kind: "force-unlock".to_owned(),
            begin,
            end,
            notice: WIPE_NOTICE.as_nanos() as u64,
        })
        .await
        .unwrap();
}

struct Servers {
    lock: RedisServer,
    referee: RedisServer,
}

impl Servers {
    fn start() -> Self {
        Self {
            lock: RedisServer::start().unwrap(),
            referee: RedisServer::start().unwrap(),
        }
    }

    async fn oracle(&self, worker: &str) -> Oracle {
        Oracle::connect(&self.referee.url(), "replay", worker)
            .await
            .unwrap()
    }

    async fn admin(&self) -> Locker {
        Locker::builder()
            .url(self.lock.url())
            .prefix(PREFIX)
            .command_timeout(LEASE)
            .build()
            .await
            .unwrap()
    }
}

/// A holds q1; B (another task of A's process) queues and gets it by A's local handoff,
/// confirmed by Redis, then its fencing token; the wipe lands; B enters; C, of another
/// process, takes the freed key and enters beside B; B learns of the loss at its renewal.
async fn handoff_then_wipe_then_enter(stamped: bool) -> Report {
    let servers = Servers::start();
    let (w1, w3, admin) = (
        locker(&servers.lock).await,
        locker(&servers.lock).await,
        servers.admin().await,
    );
    let (o1, o3, parent) = (
        servers.oracle("w1").await,
        servers.oracle("w3").await,
        servers.oracle("parent").await,
    );

    let a = w1.lock("q1").wait(Duration::from_secs(5)).await.unwrap();
    let fa = a.fencing_token().await.unwrap();
    let mut ea = enter(&o1, "q1", fa, monotonic_ns(), stamped, &a).await;

    let (fenced_tx, fenced_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (in_tx, in_rx) = tokio::sync::oneshot::channel::<()>();
    let (w1b, o1b) = (w1.clone(), o1.clone());
    let b = tokio::spawn(async move {
        let guard = w1b.lock("q1").wait(Duration::from_secs(5)).await.unwrap();
        let granted_at = monotonic_ns();
        // Redis issues a token only to the lock's holder: the lock is B's now.
        let fence = guard.fencing_token().await.unwrap();
        fenced_tx.send(()).unwrap();
        go_rx.await.unwrap();
        let entry = enter(&o1b, "q1", fence, granted_at, stamped, &guard).await;
        in_tx.send(()).unwrap();
        work_until_lost(&o1b, entry, guard, None).await
    });
    // B waits for A (as a local waiter), then A leaves and hands over.
    tokio::time::sleep(Duration::from_millis(200)).await;
    o1.leave(&mut ea).await.unwrap();
    let released = a.release().await;
    assert!(released.is_ok(), "A's handoff: {released:?}");
    ea.record_release(answer(&released));
    o1.finish(ea, Outcome::Completed).await.unwrap();
    fenced_rx.await.unwrap();

    force_unlock(&admin, &parent, "q1").await;
    go_tx.send(()).unwrap();
    in_rx.await.unwrap();

    let c = w3.lock("q1").wait(Duration::from_secs(5)).await.unwrap();
    let granted_at = monotonic_ns();
    let fc = c.fencing_token().await.unwrap();
    let ec = enter(&o3, "q1", fc, granted_at, stamped, &c).await;
    let b_released = b.await.unwrap();
    assert!(
        b_released.as_ref().is_err_and(LockError::is_lost),
        "B: {b_released:?}"
    );
    finish_held(&o3, ec, c, "C").await;
    parent.report().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_granted_before_a_wipe_and_entering_after_it_is_excused_by_its_grant() {
    let report = handoff_then_wipe_then_enter(true).await;
    assert!(report.is_clean(), "{report}\n{:#?}", report.violations);
    assert_eq!(
        (
            report.overlaps,
            report.wiped_overlaps,
            report.false_ok_releases
        ),
        (1, 1, 0),
        "{report}"
    );
    // The control: without the grant stamp the same run is the soak's failure.
    let report = handoff_then_wipe_then_enter(false).await;
    assert_eq!(
        (report.unsignalled_overlaps, report.untold_after_wipe),
        (1, 1),
        "{report}"
    );
}

/// W2's task takes q1 and its token; the wipe deletes that lock; W1's task takes the free key
/// (a new token) and enters without asking for a token, the key's real holder; W2's task
/// enters after it and learns of the loss at its renewal.
async fn granted_then_wipe_then_untokened_holder(stamped: bool) -> Report {
    let servers = Servers::start();
    let (w1, w2, admin) = (
        locker(&servers.lock).await,
        locker(&servers.lock).await,
        servers.admin().await,
    );
    let (o1, o2, parent) = (
        servers.oracle("w1").await,
        servers.oracle("w2").await,
        servers.oracle("parent").await,
    );

    let c = w2.lock("q1").wait(Duration::from_secs(5)).await.unwrap();
    let c_granted = monotonic_ns();
    let fc = c.fencing_token().await.unwrap();
    force_unlock(&admin, &parent, "q1").await;

    let u = w1.lock("q1").wait(Duration::from_secs(5)).await.unwrap();
    let mut eu = enter(&o1, "q1", 0, monotonic_ns(), stamped, &u).await;
    let ec = enter(&o2, "q1", fc, c_granted, stamped, &c).await;
    let released = work_until_lost(&o2, ec, c, Some((&mut eu, &u))).await;
    assert!(
        released.as_ref().is_err_and(LockError::is_lost),
        "{released:?}"
    );
    finish_held(&o1, eu, u, "the real holder").await;
    parent.report().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_granted_before_a_wipe_is_older_than_the_untokened_holder_after_it() {
    let report = granted_then_wipe_then_untokened_holder(true).await;
    assert!(report.is_clean(), "{report}\n{:#?}", report.violations);
    assert_eq!((report.overlaps, report.wiped_overlaps), (1, 1), "{report}");
    // The control: by enter times the real holder is blamed.
    let report = granted_then_wipe_then_untokened_holder(false).await;
    assert_eq!(
        (report.unsignalled_overlaps, report.occupancy_violations),
        (1, 1),
        "{report}"
    );
}
