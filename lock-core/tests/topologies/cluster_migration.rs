//! Locks on a Redis Cluster slot while it migrates to another primary. Inside a script, Redis
//! checks each command's key on its own: a key the script did not declare, in a slot that is
//! migrating, fails that command after the script's earlier writes. Every key a script touches
//! is declared, so a migrating slot refuses the script before it runs (`ASK`, `TRYAGAIN`),
//! which the kit retries, instead of failing it halfway through.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{LockError, Locker};
use lock_testkit::RedisCluster;
use parking_lot::Mutex;

async fn cluster_locker(cluster: &RedisCluster) -> Locker {
    Locker::builder()
        .cluster(cluster.urls())
        .watchdog_lease(Duration::from_secs(3))
        .build()
        .await
        .unwrap()
}

/// The Redis name of the lock of user key `key` under the default prefix.
fn lock_name(key: &str) -> String {
    let digest = sha1_smol::Sha1::from(key.as_bytes()).digest().to_string();
    format!("lock:{{{}}}:lock:{key}", &digest[..16])
}

/// A primary other than the one on `port`.
fn other_primary(cluster: &RedisCluster, port: u16) -> u16 {
    cluster
        .current_primaries()
        .unwrap()
        .iter()
        .map(|p| p.port())
        .find(|p| *p != port)
        .unwrap()
}

/// A release and a wait for a held lock, each during a slot migration: the waiter starts while
/// the slot is migrating and no key has moved (the lock key on the source, its waiting writers
/// nowhere), the release once the lock key alone has moved to the target. Both must wait out the
/// migration: the release says `Ok` (it deleted the key), the waiter gets the lock.
///
/// With the waiting writers passed as an argument instead of a key, the waiter's script failed
/// on `ZADD` (an undeclared key of a migrating slot) and its acquire ended with a backend error
/// instead of waiting; the release's script deleted the lock key on the target, then failed on
/// the waiting writers: a backend error for a lock it did delete, with no latch and no message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_slot_refuses_scripts_before_they_run_not_halfway() {
    let cluster = RedisCluster::start(3, 0).unwrap();
    let holder = cluster_locker(&cluster).await;
    let other = cluster_locker(&cluster).await;
    let name = lock_name("k");
    let slot = common::kit_slot("k");
    assert_eq!(cluster.keyslot(&name), slot);
    let source = cluster.primary_for_slot(slot).unwrap().port();
    let target = other_primary(&cluster, source);

    let guard = holder.lock("k").await.unwrap();
    assert_eq!(cluster.begin_slot_migration(slot, target).unwrap(), source);

    // Nothing moved yet: a second locker waits for the held key.
    let waiter = tokio::spawn({
        let other = other.clone();
        async move {
            let acquired = other.lock("k").wait(Duration::from_secs(20)).await;
            match acquired {
                Ok(turn) => {
                    let held = turn.is_held();
                    (Ok(held), Some(turn.release().await))
                }
                Err(error) => (Err(error), None),
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let waiter_ended_while_migrating = waiter.is_finished();

    // Some keys moved: the lock key is on the target, the rest of the slot on the source.
    assert_eq!(cluster.move_keys(source, target, &[&name]).unwrap(), 1);
    let release = tokio::spawn(async move { guard.release().await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let release_ended_while_migrating = release.is_finished();
    let lock_keys_then = cluster.keys(&name).unwrap();

    cluster.finish_slot_migration(slot, source, target).unwrap();
    let released = release.await.unwrap();
    let (waited, waiter_released) = waiter.await.unwrap();
    let observed = format!(
        "holder's release: {released:?} (ended while migrating: \
         {release_ended_while_migrating}; lock keys on the nodes then: {lock_keys_then:?}); \
         waiter: {waited:?}, its release {waiter_released:?} (ended while migrating: \
         {waiter_ended_while_migrating})"
    );
    assert!(released.is_ok(), "{observed}");
    assert!(matches!(waited, Ok(true)), "{observed}");
    assert!(matches!(waiter_released, Some(Ok(()))), "{observed}");
    assert_eq!(cluster.primary_for_slot(slot).unwrap().port(), target);
    common::assert_cluster_clean(&cluster, &[&holder, &other]).await;
}

/// How a holder and a waiter take a key, for every kind of lock.
type Take = fn(&Locker, &str) -> lock_core::Acquire;

/// Every kind's scripts through a migration: for each pair (holder, waiter) of kinds that
/// exclude each other, on its own key, the holder takes the key, the slot starts migrating, the
/// waiter waits for the key, one key of the slot moves, the holder releases, and the migration
/// finishes. The release says `Ok`, the waiter gets the key, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_waits_and_releases_through_a_migration() {
    let cluster = RedisCluster::start(3, 0).unwrap();
    let holder = cluster_locker(&cluster).await;
    let other = cluster_locker(&cluster).await;
    let kinds: [(&str, Take, Take); 4] = [
        ("read, then write", |l, k| l.read(k), |l, k| l.write(k)),
        ("write, then read", |l, k| l.write(k), |l, k| l.read(k)),
        ("fair", |l, k| l.fair_lock(k), |l, k| l.fair_lock(k)),
        (
            "semaphore of 1",
            |l, k| l.semaphore(k, 1).acquire(),
            |l, k| l.semaphore(k, 1).acquire(),
        ),
    ];
    for (kind, take, wait_for) in kinds {
        let key = format!("kind:{kind}");
        let slot = common::kit_slot(&key);
        let source = cluster.primary_for_slot(slot).unwrap().port();
        let target = other_primary(&cluster, source);
        let guard = take(&holder, &key).await.unwrap();
        cluster.begin_slot_migration(slot, target).unwrap();
        let waiter = tokio::spawn({
            let (other, key) = (other.clone(), key.clone());
            async move {
                let turn = wait_for(&other, &key).wait(Duration::from_secs(20)).await?;
                let held = turn.is_held();
                turn.release().await.map(|()| held)
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Some keys moved: the first of the slot (the main key or a companion of it).
        let first = cluster.keys_in_slot(source, slot, 1).unwrap();
        let first: Vec<&str> = first.iter().map(String::as_str).collect();
        assert_eq!(
            cluster.move_keys(source, target, &first).unwrap(),
            1,
            "{kind}"
        );
        let release = tokio::spawn(async move { guard.release().await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        cluster.finish_slot_migration(slot, source, target).unwrap();
        let released = release.await.unwrap();
        let waited = waiter.await.unwrap();
        assert!(
            released.is_ok() && matches!(waited, Ok(true)),
            "{kind}: holder's release {released:?}, waiter {waited:?}"
        );
        assert_eq!(cluster.primary_for_slot(slot).unwrap().port(), target);
    }
    common::assert_cluster_clean(&cluster, &[&holder, &other]).await;
}

/// User keys `<stem><n>`, `count` of them, whose locks share one cluster slot.
fn keys_of_one_slot(stem: &str, count: usize) -> Vec<String> {
    let first = format!("{stem}0");
    let slot = common::kit_slot(&first);
    let mut keys = vec![first];
    for n in 1..2_000_000 {
        if keys.len() == count {
            return keys;
        }
        let key = format!("{stem}{n}");
        if common::kit_slot(&key) == slot {
            keys.push(key);
        }
    }
    panic!("no {count} keys of one slot");
}

/// What the contending tasks saw.
#[derive(Default)]
struct Tally {
    /// The most tasks inside one key's section at once.
    most_inside: AtomicUsize,
    sections: AtomicUsize,
    /// When each acquire and each release in Redis was sent and answered.
    acquires: Mutex<Vec<(Instant, Instant)>>,
    releases: Mutex<Vec<(Instant, Instant)>>,
    acquire_errors: Mutex<Vec<String>>,
    release_errors: Mutex<Vec<String>>,
}

/// Tasks of every locker (`per_locker` each) enter the sections of `keys` in turn, under the
/// lock when `locked` (the control runs the same sections unlocked), until `stop` is set and
/// each did at least `min_rounds` sections. A section counts the tasks inside its key (it must
/// be alone) and increments the key's counter by a read, a pause and a write, so an overlap
/// also loses an update. Returns the tally and whether every counter matches its sections.
async fn contend(
    lockers: &[Locker],
    per_locker: usize,
    keys: &[String],
    locked: bool,
    stop: Arc<AtomicBool>,
    min_rounds: usize,
) -> (Arc<Tally>, bool) {
    let tally = Arc::new(Tally::default());
    let inside: Arc<HashMap<String, AtomicUsize>> = Arc::new(
        keys.iter()
            .map(|k| (k.clone(), AtomicUsize::new(0)))
            .collect(),
    );
    let counters: Arc<HashMap<String, (AtomicUsize, AtomicUsize)>> = Arc::new(
        keys.iter()
            .map(|k| (k.clone(), Default::default()))
            .collect(),
    );
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (l, locker) in lockers.iter().enumerate() {
        for t in 0..per_locker {
            let (locker, keys) = (locker.clone(), keys.to_vec());
            let stop = stop.clone();
            let (tally, inside, counters) = (tally.clone(), inside.clone(), counters.clone());
            tasks.push(tokio::spawn(async move {
                let mut round = 0;
                while round < min_rounds || !stop.load(Ordering::SeqCst) {
                    assert!(started.elapsed() < Duration::from_secs(90), "no end");
                    let key = &keys[(l * per_locker + t + round) % keys.len()];
                    round += 1;
                    let guard = if locked {
                        let sent = Instant::now();
                        let acquired = locker
                            .lock(key.as_str())
                            .wait(Duration::from_secs(20))
                            .await;
                        tally.acquires.lock().push((sent, Instant::now()));
                        match acquired {
                            Ok(guard) => Some(guard),
                            Err(error) => {
                                tally.acquire_errors.lock().push(format!("{key}: {error}"));
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                continue;
                            }
                        }
                    } else {
                        None
                    };
                    let now = inside[key].fetch_add(1, Ordering::SeqCst) + 1;
                    tally.most_inside.fetch_max(now, Ordering::SeqCst);
                    let (value, sections) = &counters[key];
                    let read = value.load(Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    value.store(read + 1, Ordering::SeqCst);
                    sections.fetch_add(1, Ordering::SeqCst);
                    tally.sections.fetch_add(1, Ordering::SeqCst);
                    inside[key].fetch_sub(1, Ordering::SeqCst);
                    if let Some(guard) = guard {
                        let sent = Instant::now();
                        let released = guard.release().await;
                        tally.releases.lock().push((sent, Instant::now()));
                        if let Err(error) = released {
                            tally.release_errors.lock().push(format!("{key}: {error}"));
                        }
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let counted = counters
        .values()
        .all(|(value, sections)| value.load(Ordering::SeqCst) == sections.load(Ordering::SeqCst));
    (tally, counted)
}

/// Two lockers, three tasks each, contend for three keys of one slot while the slot migrates
/// key by key (each step leaves it with some keys moved) and then finishes. Exclusion holds
/// (one task inside a key at a time, no lost update), every acquire ends with the lock, every
/// release says `Ok`, and nothing is left behind. The control runs the same sections without the
/// lock and shows the checks catch an overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_on_a_migrating_slot_keeps_exclusion_and_true_releases() {
    let keys = keys_of_one_slot("stock:", 3);
    let slot = common::kit_slot(&keys[0]);

    let cluster = Arc::new(RedisCluster::start(3, 0).unwrap());
    let lockers = [
        cluster_locker(&cluster).await,
        cluster_locker(&cluster).await,
    ];

    // Control: the same sections without the lock overlap, and the checks see it.
    let done = Arc::new(AtomicBool::new(true));
    let (control, counted) = contend(&lockers, 3, &keys, false, done, 20).await;
    assert!(
        control.most_inside.load(Ordering::SeqCst) > 1 && !counted,
        "the unlocked control shows no overlap: the checks would miss one"
    );

    let source = cluster.primary_for_slot(slot).unwrap().port();
    let target = other_primary(&cluster, source);
    let stop = Arc::new(AtomicBool::new(false));
    let migration = tokio::task::spawn_blocking({
        let (cluster, stop) = (cluster.clone(), stop.clone());
        move || {
            std::thread::sleep(Duration::from_millis(300));
            cluster.begin_slot_migration(slot, target).unwrap();
            let begun = Instant::now();
            let mut moves = 0;
            for _ in 0..8 {
                std::thread::sleep(Duration::from_millis(150));
                let Some(next) = cluster.keys_in_slot(source, slot, 1).unwrap().pop() else {
                    std::thread::sleep(Duration::from_millis(150));
                    continue;
                };
                moves += cluster.move_keys(source, target, &[&next]).unwrap();
            }
            cluster.finish_slot_migration(slot, source, target).unwrap();
            let ended = Instant::now();
            // Contention goes on for a while on the slot's new primary.
            std::thread::sleep(Duration::from_millis(500));
            stop.store(true, Ordering::SeqCst);
            (moves, begun, ended)
        }
    });
    let (tally, counted) = contend(&lockers, 3, &keys, true, stop, 10).await;
    let (moves, begun, ended) = migration.await.unwrap();
    // Calls in flight at some time between the start and the end of the migration.
    let during = |calls: &Mutex<Vec<(Instant, Instant)>>| {
        let calls = calls.lock();
        calls
            .iter()
            .filter(|(sent, answered)| *sent <= ended && *answered >= begun)
            .count()
    };

    let acquire_errors = tally.acquire_errors.lock().clone();
    let release_errors = tally.release_errors.lock().clone();
    let most = tally.most_inside.load(Ordering::SeqCst);
    let sections = tally.sections.load(Ordering::SeqCst);
    let (acquires, releases) = (during(&tally.acquires), during(&tally.releases));
    let observed = format!(
        "{sections} sections, at most {most} inside one key, counters match: {counted}, \
         {moves} keys moved one by one, {acquires} acquires and {releases} releases in flight \
         while the slot migrated; acquire errors: {acquire_errors:?}; release errors: \
         {release_errors:?}"
    );
    assert!(acquires > 0 && releases > 0, "{observed}");
    assert_eq!(most, 1, "{observed}");
    assert!(counted, "{observed}");
    assert!(
        acquire_errors.is_empty() && release_errors.is_empty(),
        "{observed}"
    );
    assert_eq!(cluster.primary_for_slot(slot).unwrap().port(), target);
    lock_testkit::figure(&format!("cluster migration under contention: {observed}"));
    let lockers: Vec<&Locker> = lockers.iter().collect();
    common::assert_cluster_clean(&cluster, &lockers).await;
    // Every release said `Ok` and no lock key is left: each one deleted its key.
    for key in &keys {
        let free = lockers[0].lock(key.as_str()).wait(Duration::ZERO).await;
        let free = free.unwrap_or_else(|e: LockError| panic!("{key}: {e}"));
        free.release().await.unwrap();
    }
}
