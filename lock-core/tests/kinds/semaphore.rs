//! Semaphores with expiring permits against a real redis-server.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{locker, server};
use lock_core::{ConfigError, LockError, Locker};
use lock_testkit::{FaultProxy, ProxyMode};

#[tokio::test]
async fn at_most_the_permits_are_held_and_a_release_lets_the_next_in() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let sem_a = a.semaphore("exports", 3);
    let sem_b = b.semaphore("exports", 3);
    let p1 = sem_a.acquire().wait(Duration::ZERO).await.unwrap();
    let p2 = sem_b.acquire_many(2).wait(Duration::ZERO).await.unwrap();
    assert!(p1.is_shared());
    let busy = sem_b.acquire().wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    assert!(matches!(
        p1.fencing_token().await,
        Err(LockError::NotExclusive { .. })
    ));
    let waiter = tokio::spawn(async move { sem_b.acquire().wait(Duration::from_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    p1.release().await.unwrap();
    let p3 = waiter.await.unwrap().unwrap();
    p3.release().await.unwrap();
    p2.release().await.unwrap();
    assert_eq!(semaphore_keys(&server), Vec::<String>::new());
    let err = sem_a.acquire_many(4).await.unwrap_err();
    assert!(
        matches!(
            err,
            LockError::Config(ConfigError::Permits {
                permits: 3,
                wanted: 4
            })
        ),
        "{err}"
    );
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_tasks_on_three_permits_never_exceed_three() {
    let server = server();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let locker = locker(&server).await;
        let (inside, most) = (inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let sem = locker.semaphore("s", 3);
            for _ in 0..20 {
                let permit = sem.acquire().wait(Duration::from_secs(20)).await.unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1 + i % 3)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} holders at once");
    assert_eq!(most, 3, "the permits were never all used");
    // (Each task's locker went with it.)
    common::assert_nothing_left(&server, &[]).await;
}

/// The checker of the test above, run without the semaphore: it sees more than three inside,
/// so a semaphore that let a fourth in would be caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_without_the_semaphore_the_checker_sees_more_than_three() {
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (inside, most) = (inside.clone(), most.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert!(most.load(Ordering::SeqCst) > 3);
}

#[tokio::test]
async fn a_dead_holders_permits_come_back_with_its_lease_and_the_others_stay() {
    let server = server();
    let survivor = locker(&server).await;
    let kept = survivor.semaphore("jobs", 2).acquire().await.unwrap();
    let leased;
    {
        // A holder whose process is gone: its locker is dropped without releasing (the
        // background tasks stop with it), its fixed lease is all that ends the permit.
        let doomed = common::locker(&server).await;
        // The lease runs in Redis from the acquire's run, after this.
        leased = std::time::Instant::now();
        let permit = doomed
            .semaphore("jobs", 2)
            .acquire()
            .lease(Duration::from_millis(300))
            .await
            .unwrap();
        std::mem::forget(permit);
        drop(doomed);
    }
    let other = locker(&server).await;
    let sem = other.semaphore("jobs", 2);
    let busy = sem.acquire().wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    let started = std::time::Instant::now();
    let permit = sem.acquire().wait(Duration::from_secs(5)).await.unwrap();
    let (waited, since_lease) = (started.elapsed(), leased.elapsed());
    assert!(
        since_lease >= Duration::from_millis(290) && waited < Duration::from_secs(3),
        "the permit came {since_lease:?} after the dead holder's 300 ms lease was asked for, \
         {waited:?} after the wait began"
    );
    // The surviving holder's permit was renewed meanwhile and is still held.
    assert!(kept.is_held());
    assert!(matches!(
        sem.acquire().wait(Duration::ZERO).await,
        Err(LockError::Busy { .. })
    ));
    permit.release().await.unwrap();
    kept.release().await.unwrap();
    common::assert_nothing_left(&server, &[&survivor, &other]).await;
}

#[tokio::test]
async fn a_lost_permit_is_reported_and_a_cancelled_acquire_leaves_nothing() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let permit = a.semaphore("s", 1).acquire().await.unwrap();
    let set = server
        .keys("lock:*")
        .into_iter()
        .find(|k| k.contains(":semaphore:"))
        .unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            b.semaphore("s", 1)
                .acquire()
                .wait(Duration::from_secs(30))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiter.abort();
    let _ = waiter.await;
    // Someone deletes the set: the holder learns it at its next renewal or release.
    let _: i64 = server.cmd(&["DEL", &set]);
    let err = permit.release().await.unwrap_err();
    assert!(
        matches!(
            err,
            LockError::Lost {
                reason: lock_core::LostReason::Deleted,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        common::eventually(Duration::from_secs(3), || {
            a.stats().local_keys == 0 && b.stats().local_keys == 0 && b.stats().subscriptions == 0
        })
        .await,
        "{:?} {:?}",
        a.stats(),
        b.stats()
    );
    assert_eq!(semaphore_keys(&server), Vec::<String>::new());
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

/// Local handoff of permits: tasks of one process queued for a semaphore take over the permits
/// a releasing task leaves, with one confirmation in Redis instead of a release and an
/// acquire, mixed with acquisitions through Redis by other lockers and by every few releases
/// (so those get their turn). At most three inside at any time (a counter that a fourth holder
/// would push above three); most of this process's acquisitions cost one script call, not two.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queued_local_tasks_take_released_permits_over_without_redis() {
    let server = server();
    let (a, b) = (locker(&server).await, locker(&server).await);
    a.semaphore("warm", 3)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.reset_stats();
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let round = |locker: lock_core::Locker, tasks: usize, rounds: usize| {
        (0..tasks)
            .map(|i| {
                let (sem, inside, most) = (locker.semaphore("s", 3), inside.clone(), most.clone());
                tokio::spawn(async move {
                    for _ in 0..rounds {
                        let permit = sem.acquire().wait(Duration::from_secs(20)).await.unwrap();
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(1 + i as u64 % 2)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        permit.release().await.unwrap();
                    }
                })
            })
            .collect::<Vec<_>>()
    };
    // Alone first: every release finds a local task queued.
    for t in round(a.clone(), 12, 20) {
        t.await.unwrap();
    }
    // Through Redis an acquisition costs two script calls (the acquire and the release); a
    // handoff one (the confirmation that Redis still holds the permit).
    let alone = server.command_calls("evalsha") + server.command_calls("eval");
    assert!(
        alone < 2 * 240 * 9 / 10,
        "{alone} script calls for 240 acquisitions of one process: no permit was handed over"
    );
    // Then with another locker contending in Redis.
    let mut tasks = round(a.clone(), 8, 15);
    tasks.extend(round(b.clone(), 4, 15));
    for t in tasks {
        t.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} holders at once");
    assert_eq!(most, 3, "the permits were never all used");
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

/// A handed-over permit only fits an acquire of the same count: a queued `acquire_many(2)`
/// behind a releasing single permit gets its permits through Redis, and the single permit
/// goes back to Redis rather than staying held by nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_permit_of_another_count_goes_back_to_redis() {
    let server = server();
    let (locker, other) = (locker(&server).await, common::locker(&server).await);
    let sem = locker.semaphore("s", 3);
    let one = sem.acquire().await.unwrap();
    let others = sem.acquire_many(2).await.unwrap();
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_many(2).wait(Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    one.release().await.unwrap();
    others.release().await.unwrap();
    let two = waiter.await.unwrap().unwrap();
    // Redis holds the waiter's two permits and nothing else: another process gets one more,
    // and no second.
    let elsewhere = other.semaphore("s", 3);
    let third = elsewhere.acquire().wait(Duration::ZERO).await.unwrap();
    let full = elsewhere.acquire().wait(Duration::ZERO).await.unwrap_err();
    assert!(full.is_busy(), "{full}");
    third.release().await.unwrap();
    two.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}

/// The line across processes: a waiter that found too few permits is in line, and permits
/// freed while it is first are kept for it, even from an acquire that asks at once; once it
/// took its permit it leaves the line and the others may take the rest. The waiter here is
/// slow (every round trip of its locker is delayed 200 ms), so the other acquire comes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_freed_while_a_waiter_is_first_in_line_are_kept_for_it() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let holder = locker(&server).await;
    let other = locker(&server).await;
    let slow = Locker::builder().url(proxy.url()).build().await.unwrap();
    let held = holder.semaphore("s", 3);
    let (p1, p2, p3) = (
        held.acquire().await.unwrap(),
        held.acquire().await.unwrap(),
        held.acquire().await.unwrap(),
    );
    let waiter = {
        let sem = slow.semaphore("s", 3);
        tokio::spawn(async move { sem.acquire().wait(Duration::from_secs(10)).await })
    };
    let line = line_key(&server, 1).await;
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(100)))
        .await;
    p1.release().await.unwrap();
    p2.release().await.unwrap();
    // Two permits are free, but the slow waiter is first in line: an acquire that asks at
    // once is refused while the waiter's round trip is under way.
    let sem = other.semaphore("s", 3);
    let refused = sem.acquire().wait(Duration::ZERO).await.unwrap_err();
    assert!(refused.is_busy(), "{refused}");
    let taken = waiter.await.unwrap().unwrap();
    assert_eq!(line_len(&server, &line), 0, "the waiter stayed in line");
    // A permit is left: the other gets it.
    let got = sem.acquire().wait(Duration::from_secs(2)).await.unwrap();
    proxy.set_mode(ProxyMode::Pass).await;
    for permit in [got, p3, taken] {
        permit.release().await.unwrap();
    }
    common::assert_nothing_left(&server, &[&holder, &other, &slow]).await;
}

/// Waiters of three processes get a one-permit semaphore in the order they arrived, whatever
/// order their release messages reach them in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_several_processes_get_permits_in_arrival_order() {
    let server = server();
    let holder = locker(&server).await;
    let lockers = [
        locker(&server).await,
        locker(&server).await,
        locker(&server).await,
    ];
    let mut permit = Some(holder.semaphore("s", 1).acquire().await.unwrap());
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (i, locker) in lockers.iter().enumerate() {
        let (sem, order) = (locker.semaphore("s", 1), order.clone());
        waiters.push(tokio::spawn(async move {
            let permit = sem.acquire().wait(Duration::from_secs(10)).await?;
            order.lock().push(i);
            tokio::time::sleep(Duration::from_millis(5)).await;
            permit.release().await
        }));
        // The next one arrives once this one is in line.
        let _ = line_key(&server, i + 1).await;
    }
    if let Some(permit) = permit.take() {
        permit.release().await.unwrap();
    }
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    assert_eq!(*order.lock(), vec![0, 1, 2]);
    let refs: Vec<&Locker> = std::iter::once(&holder).chain(lockers.iter()).collect();
    common::assert_nothing_left(&server, &refs).await;
}

/// A waiter first in line that is dropped leaves the line at once (its background release),
/// so the freed permit goes to the others; one whose process is cut off holds it back until it
/// stops counting as alive (its waiting flag's life: 300 ms with a 100 ms fallback retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_holds_nothing_back() {
    for cut_off in [false, true] {
        waiter_gone(cut_off).await;
    }
}

async fn waiter_gone(cut_off: bool) {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let holder = locker(&server).await;
    let other = locker(&server).await;
    let quitter = Locker::builder()
        .url(proxy.url())
        .fallback_retry(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let permit = holder.semaphore("s", 1).acquire().await.unwrap();
    let waiter = {
        let sem = quitter.semaphore("s", 1);
        tokio::spawn(async move { sem.acquire().wait(Duration::from_secs(10)).await })
    };
    let line = line_key(&server, 1).await;
    if cut_off {
        proxy.set_mode(ProxyMode::Hole).await;
    }
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    if !cut_off {
        assert!(
            common::eventually(Duration::from_secs(2), || line_len(&server, &line) == 0).await,
            "the dropped waiter stayed in line"
        );
    }
    permit.release().await.unwrap();
    let started = std::time::Instant::now();
    let got = other
        .semaphore("s", 1)
        .acquire()
        .wait(Duration::from_secs(5))
        .await
        .unwrap();
    // Generous: a cut-off waiter stops counting 300 ms after its last try; the bound only
    // says it was not the 5 s wait.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "waited {:?} behind a waiter that was gone (cut off: {cut_off})",
        started.elapsed()
    );
    got.release().await.unwrap();
    proxy.set_mode(ProxyMode::Reset).await;
    common::assert_nothing_left(&server, &[&holder, &other]).await;
    drop(quitter);
}

/// First come, first served whatever the size: a 2-permit request waiting for a semaphore of
/// 3 with one permit free holds back the 1-permit requests that came after it, though they
/// would fit: another process's (in the line in Redis) waits its whole 300 ms and gets
/// nothing, and one of the waiter's own process (in the local queue) gets in only after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smaller_requests_wait_behind_a_larger_one_that_came_first() {
    let server = server();
    let (holder, waiting, other) = (
        locker(&server).await,
        locker(&server).await,
        locker(&server).await,
    );
    let held = holder.semaphore("s", 3);
    let (p1, p2) = (held.acquire().await.unwrap(), held.acquire().await.unwrap());
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let sem = waiting.semaphore("s", 3);
    let enter = |permits: u32, name: &'static str| {
        let (sem, order) = (sem.clone(), order.clone());
        tokio::spawn(async move {
            let permit = sem
                .acquire_many(permits)
                .wait(Duration::from_secs(10))
                .await?;
            order.lock().push(name);
            Ok::<_, LockError>(permit)
        })
    };
    let large = enter(2, "large");
    let _ = line_key(&server, 1).await;
    let small = enter(1, "small");
    // One permit is free, but the large request is first in line.
    let refused = other
        .semaphore("s", 3)
        .acquire()
        .wait(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(refused.is_busy(), "{refused}");
    assert!(order.lock().is_empty(), "{:?}", order.lock());
    p1.release().await.unwrap();
    let large = large.await.unwrap().unwrap();
    p2.release().await.unwrap();
    let small = small.await.unwrap().unwrap();
    assert_eq!(*order.lock(), vec!["large", "small"]);
    small.release().await.unwrap();
    large.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder, &waiting, &other]).await;
}

/// The count travels with each acquire: with 3 permits held under a count of 3, a caller
/// counting 5 is granted a fourth at once, and a caller counting 2 is refused and waits until
/// only one is held (two held plus its own would be 3 > 2), revoking nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_count_admits_by_each_callers_own_count() {
    let server = server();
    let (three, five, two) = (
        locker(&server).await,
        locker(&server).await,
        locker(&server).await,
    );
    let sem = three.semaphore("s", 3);
    let (p1, p2, p3) = (
        sem.acquire().await.unwrap(),
        sem.acquire().await.unwrap(),
        sem.acquire().await.unwrap(),
    );
    let full = sem.acquire().wait(Duration::ZERO).await.unwrap_err();
    assert!(full.is_busy(), "{full}");
    // Raised to 5: granted while the 3 are held.
    let fourth = five
        .semaphore("s", 5)
        .acquire()
        .wait(Duration::ZERO)
        .await
        .unwrap();
    assert!(p1.is_held() && p2.is_held() && p3.is_held());
    fourth.release().await.unwrap();
    // Lowered to 2: refused while 3 are held, and still while 2 are.
    let lowered = two.semaphore("s", 2);
    let refused = lowered.acquire().wait(Duration::ZERO).await.unwrap_err();
    assert!(refused.is_busy(), "{refused}");
    let waiter = {
        let lowered = lowered.clone();
        tokio::spawn(async move { lowered.acquire().wait(Duration::from_secs(5)).await })
    };
    let _ = line_key(&server, 1).await;
    p1.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "granted with 2 held under a count of 2"
    );
    assert!(p2.is_held() && p3.is_held());
    p2.release().await.unwrap();
    let got = waiter.await.unwrap().unwrap();
    assert!(p3.is_held());
    got.release().await.unwrap();
    p3.release().await.unwrap();
    common::assert_nothing_left(&server, &[&three, &five, &two]).await;
}

/// Every key of a semaphore in `server`: its set (`:semaphore:`), its line and the line's
/// liveness (`:semaphore-line:`, `:semaphore-line-alive:`), any other `:semaphore-` name.
fn semaphore_keys(server: &lock_testkit::RedisServer) -> Vec<String> {
    server
        .keys("lock:*")
        .into_iter()
        .filter(|k| k.contains(":semaphore:") || k.contains(":semaphore-"))
        .collect()
}

/// A semaphore deleted while a watchdog permit is held: the watchdog's next renewal finds the
/// permit gone and `lost()` resolves within about a third of the lease (the renewal interval);
/// the release then says `Lost` (deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_deleted_while_held_fires_lost_within_a_renewal() {
    let server = server();
    let lease = Duration::from_millis(600);
    let holder = common::locker_with_lease(&server, lease).await;
    let permit = holder.semaphore("s", 2).acquire().await.unwrap();
    let set = semaphore_keys(&server)
        .into_iter()
        .find(|k| k.contains(":semaphore:"))
        .expect("the semaphore's set exists");
    let _: i64 = server.cmd(&["DEL", &set]);
    let started = std::time::Instant::now();
    tokio::time::timeout(lease, permit.lost())
        .await
        .expect("lost() did not fire within the lease");
    let noticed = started.elapsed();
    assert!(
        noticed <= lease / 3 + Duration::from_millis(100),
        "lost() after {noticed:?}, renewals every {:?}",
        lease / 3
    );
    assert!(!permit.is_held());
    let reason = common::lost_reason(permit.release().await.unwrap_err());
    assert_eq!(reason, lock_core::LostReason::Deleted);
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// The line of the only semaphore in `server`, once `waiters` waiters are in it.
async fn line_key(server: &lock_testkit::RedisServer, waiters: usize) -> String {
    let mut found = None;
    let seen = common::eventually(Duration::from_secs(5), || {
        found = server
            .keys("lock:*")
            .into_iter()
            .find(|k| k.contains(":semaphore-line:") && line_len(server, k) == waiters);
        found.is_some()
    })
    .await;
    assert!(
        seen,
        "{waiters} waiters never were in line: {:?}",
        server.keys("lock:*")
    );
    found.unwrap_or_default()
}

fn line_len(server: &lock_testkit::RedisServer, line: &str) -> usize {
    server.cmd(&["ZCARD", line])
}

/// Under the restart guard a semaphore's acquire script takes the guard's argument after its
/// own (`scripts/permit_acquire.lua`): a node the kit has not seen grants no permit until the
/// guard has passed (a zero wait is refused), then two holders get theirs, a third is
/// refused, and the releases leave nothing but the node's epoch.
#[tokio::test]
async fn semaphore_permits_wait_out_the_restart_guard() {
    let server = server();
    let locker = Locker::builder()
        .url(server.url())
        .restart_guard(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let sem = locker.semaphore("guarded", 2);
    let guarded = sem.acquire().wait(Duration::ZERO).await.unwrap_err();
    assert!(guarded.is_busy(), "{guarded}");
    let first = sem.acquire().wait(Duration::from_secs(10)).await.unwrap();
    let second = sem.acquire().wait(Duration::from_secs(10)).await.unwrap();
    let third = sem.acquire().wait(Duration::ZERO).await.unwrap_err();
    assert!(third.is_busy(), "{third}");
    first.release().await.unwrap();
    second.release().await.unwrap();
    common::assert_nothing_left_under(&server, "lock:", &["node-epoch"], &[&locker]).await;
}

/// One round of `tasks` zero-wait acquires of `sem`, started together (a barrier): each that
/// is admitted enters (an occupancy counter) and stays until every task has tried, so all the
/// admitted ones are inside at once. Returns (admitted, most inside at once, refusals).
async fn zero_wait_round(sems: &[lock_core::Semaphore]) -> (usize, usize, Vec<String>) {
    let start = Arc::new(tokio::sync::Barrier::new(sems.len()));
    let tried = Arc::new(tokio::sync::Barrier::new(sems.len()));
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let tasks: Vec<_> = sems
        .iter()
        .map(|sem| {
            let (sem, start, tried) = (sem.clone(), start.clone(), tried.clone());
            let (inside, most) = (inside.clone(), most.clone());
            tokio::spawn(async move {
                start.wait().await;
                let permit = sem.acquire().wait(Duration::ZERO).await;
                if permit.is_ok() {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                }
                tried.wait().await;
                match permit {
                    Ok(permit) => {
                        inside.fetch_sub(1, Ordering::SeqCst);
                        permit.release().await.unwrap();
                        Ok(())
                    }
                    Err(refused) => Err(refused.to_string()),
                }
            })
        })
        .collect();
    let mut refusals = Vec::new();
    for task in tasks {
        if let Err(refused) = task.await.unwrap() {
            refusals.push(refused);
        }
    }
    (
        sems.len() - refusals.len(),
        most.load(Ordering::SeqCst),
        refusals,
    )
}

/// K18 (review item K3): a zero-wait acquire tries Redis once whatever the other tasks of its
/// process do. Four zero-wait acquires of one locker started together under a semaphore of
/// four, every permit free, are all admitted, in every one of 40 rounds (before: one task's
/// try held the process's one-place turn to ask Redis, and the others were refused without
/// Redis being asked). The occupancy counter sees all four inside at once and never a fifth:
/// with a fifth task in another locker the same round admits exactly four; the control, five
/// tasks on a semaphore of five, shows the counter sees five when five are let in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_zero_wait_acquires_with_permits_free_are_all_admitted() {
    let server = server();
    let (a, b) = (locker(&server).await, locker(&server).await);
    let four: Vec<_> = (0..4).map(|_| a.semaphore("s", 4)).collect();
    for round in 0..40 {
        let (admitted, most, refusals) = zero_wait_round(&four).await;
        assert_eq!(
            (admitted, most),
            (4, 4),
            "round {round}: {admitted} of 4 zero-wait acquires admitted with every permit free: {refusals:?}"
        );
    }
    let mut five = four.clone();
    five.push(b.semaphore("s", 4));
    for round in 0..10 {
        let (admitted, most, refusals) = zero_wait_round(&five).await;
        assert_eq!(
            (admitted, most),
            (4, 4),
            "round {round}: 5 zero-wait acquires on 4 permits: {refusals:?}"
        );
    }
    let control: Vec<_> = (0..5).map(|_| a.semaphore("c", 5)).collect();
    let (_, most, _) = zero_wait_round(&control).await;
    assert_eq!(
        most, 5,
        "the counter did not see five inside a semaphore of five"
    );
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

/// K19 (review item K7): first come, first served within the process. A semaphore of 2, one
/// permit held by another locker and one by a task of this one; three tasks of this locker
/// then arrive 50 ms apart and wait. The first has a
/// local place and waits in Redis; the other two wait for a place. Released permits must go
/// to them in arrival order (before: the first release handed the permit to the task that got
/// the freed local place, the second to arrive, passing the first, which waited in Redis).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_permits_go_to_the_local_waiters_in_arrival_order() {
    let server = server();
    let (a, b) = (locker(&server).await, locker(&server).await);
    let elsewhere = b.semaphore("s", 2).acquire().await.unwrap();
    let sem = a.semaphore("s", 2);
    let first = sem.acquire().await.unwrap();
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let (sem, order) = (sem.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let permit = sem.acquire().wait(Duration::from_secs(10)).await?;
            order.lock().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            permit.release().await
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = line_key(&server, 1).await;
    first.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    elsewhere.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    assert_eq!(
        *order.lock(),
        vec![0, 1, 2],
        "grant order of tasks arriving 0, 1, 2"
    );
    common::assert_nothing_left(&server, &[&a, &b]).await;
}

/// A waiter that leaves the line behind another, or leaves no permit free for the next, tells
/// nobody: only the first in line had permits kept for it. Here a released permit is handed
/// over in its process to the local waiter (first come, first served), which leaves its place
/// in the Redis line behind another process's waiter: before, that withdrawal published a
/// message to the waiter ahead, which tried in vain (a message and a failed try for every
/// permit handed over in a process while others wait). And it leaves with one call: its last
/// try was answered, so nothing of it can land later (before, the call was repeated 100 and
/// 500 ms later, as for an acquire dropped mid-try).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_leaving_the_line_that_frees_nothing_tells_nobody() {
    let server = server();
    // `b` retries only when told (its fallback retry is beyond the test).
    let b = common::locker_woken_by_messages(&server).await;
    let (a, c) = (locker(&server).await, locker(&server).await);
    // Two permits, both held: one here, one by `a`, whose second task has a local place
    // (two per process) and so waits in the Redis line, behind `b`'s waiter.
    let kept = c.semaphore("s", 2).acquire().await.unwrap();
    let held = a.semaphore("s", 2).acquire().await.unwrap();
    let elsewhere = {
        let sem = b.semaphore("s", 2);
        tokio::spawn(async move { sem.acquire().wait(Duration::from_secs(10)).await })
    };
    let line = line_key(&server, 1).await;
    let local = {
        let sem = a.semaphore("s", 2);
        tokio::spawn(async move { sem.acquire().wait(Duration::from_secs(10)).await })
    };
    let _ = line_key(&server, 2).await;
    // The local waiter's try after it subscribed, too, is done by then.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.reset_stats();
    held.release().await.unwrap();
    let handed = local.await.unwrap().unwrap();
    assert!(
        common::eventually(Duration::from_secs(2), || line_len(&server, &line) == 1).await,
        "the local waiter stayed in line"
    );
    // Whatever a message would set off has happened by then (the other process's try is one
    // round trip on loopback), and a repeated withdrawal too.
    let withdrawn = server.command_calls("evalsha");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        server.command_calls("publish"),
        0,
        "the withdrawal told the waiter ahead of it"
    );
    // permit_acquire.lua is the only script that runs ZREMRANGEBYSCORE.
    assert_eq!(
        server.command_calls("zremrangebyscore"),
        0,
        "the other process's waiter tried with no permit free"
    );
    assert_eq!(
        server.command_calls("evalsha"),
        withdrawn,
        "the withdrawal was sent again after the line had let it go"
    );
    assert!(!elsewhere.is_finished(), "{:?}", elsewhere.await);
    // A permit given back is still announced to the first in line.
    let started = std::time::Instant::now();
    handed.release().await.unwrap();
    let got = elsewhere.await.unwrap().unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(700),
        "the waiter first in line was not told of the free permit: {:?}",
        started.elapsed()
    );
    for permit in [got, kept] {
        permit.release().await.unwrap();
    }
    common::assert_nothing_left(&server, &[&a, &b, &c]).await;
}

/// The first in line leaving with permits free for the next tells the next at once: a
/// 2-permit request first in line holds the one free permit back from a 1-permit request of
/// another process; when it gives up, that one is told and gets in before its fallback retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_in_line_leaving_with_permits_free_tells_the_next() {
    let server = server();
    let holder = locker(&server).await;
    let quitter = locker(&server).await;
    let patient = common::locker_woken_by_messages(&server).await;
    let held = holder.semaphore("s", 2).acquire().await.unwrap();
    let big = {
        let sem = quitter.semaphore("s", 2);
        tokio::spawn(async move { sem.acquire_many(2).wait(Duration::from_secs(10)).await })
    };
    let _ = line_key(&server, 1).await;
    let small = {
        let sem = patient.semaphore("s", 2);
        tokio::spawn(async move { sem.acquire().wait(Duration::from_secs(10)).await })
    };
    let line = line_key(&server, 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !small.is_finished(),
        "the 1-permit request passed the 2-permit one"
    );
    let started = std::time::Instant::now();
    big.abort();
    assert!(big.await.unwrap_err().is_cancelled());
    let got = small.await.unwrap().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the next in line waited {:?} for its fallback retry",
        started.elapsed()
    );
    assert_eq!(line_len(&server, &line), 0);
    for permit in [got, held] {
        permit.release().await.unwrap();
    }
    common::assert_nothing_left(&server, &[&holder, &quitter, &patient]).await;
}

/// The largest semaphore: `u32::MAX` permits taken at once (no overflow in the count, the
/// local queue or the scripts), counted by `inspect`, and one more is busy for another locker
/// and for this one.
#[tokio::test]
async fn a_semaphore_of_u32_max_permits_gives_them_all_at_once_and_no_more() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let all = a
        .semaphore("s", u32::MAX)
        .acquire_many(u32::MAX)
        .wait(Duration::from_secs(1))
        .await
        .unwrap();
    let info = a.inspect("s").await.unwrap().unwrap();
    assert_eq!(info.kind(), lock_core::LockKind::Semaphore);
    assert_eq!(info.permits_in_use(), u32::MAX);
    let busy = b
        .semaphore("s", u32::MAX)
        .acquire()
        .wait(Duration::from_millis(300))
        .await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    let local_busy = a
        .semaphore("s", u32::MAX)
        .acquire()
        .wait(Duration::ZERO)
        .await;
    assert!(
        matches!(local_busy, Err(LockError::Busy { .. })),
        "{local_busy:?}"
    );
    all.release().await.unwrap();
    let one = b
        .semaphore("s", u32::MAX)
        .acquire()
        .wait(Duration::ZERO)
        .await
        .unwrap();
    one.release().await.unwrap();
    common::assert_nothing_left(&server, &[&a, &b]).await;
}
