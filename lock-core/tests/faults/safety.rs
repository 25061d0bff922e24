//! Regression tests for the findings of an independent read of lock-core (RELIABILITY.md rows
//! S1-S11): interleavings in which a holder could be told "released", "replicated" or "held"
//! when it was not. Each test failed before its fix.

use crate::common;

use std::time::{Duration, Instant};

use common::{eventually, keys, locker, server};
use lock_core::{LockError, Locker};
use lock_testkit::{FaultProxy, ProxyMode, RedisCluster, RedisSentinel, RedisServer};

/// S1 set-up: a holder with a fixed 10 s lease (no renewal traffic on its connection), then a
/// restart of Redis without persistence: the key is gone and the holder's connection is dead,
/// so its release's first call fails without reaching Redis and is sent again.
async fn holder_across_a_restart(server: &mut RedisServer) -> (Locker, lock_core::LockGuard) {
    let holder = locker(server).await;
    let guard = holder
        .lock("k")
        .lease(Duration::from_secs(10))
        .await
        .unwrap();
    server.restart().unwrap();
    (holder, guard)
}

/// S1 (a): another locker acquired the forgotten lock. The retried release finds its token;
/// the holder must hear `Lost`, not `Ok` (before the latch it heard `Ok`: an unsignalled
/// double holder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_retried_after_a_restart_reports_lost_when_another_holds_it() {
    let mut server = server();
    let (holder, guard) = holder_across_a_restart(&mut server).await;
    let other = locker(&server).await;
    let taken = other.lock("k").wait(Duration::ZERO).await.unwrap();
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "release of a lock forgotten by a restart and taken by another: {released:?}"
    );
    assert!(taken.is_held());
    assert!(
        other.is_locked("k").await.unwrap(),
        "the new holder's key is untouched"
    );
    taken.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder, &other]).await;
}

/// S1 (b): nobody took it. The retry finds no key and no latch: `Lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_retried_after_a_restart_reports_lost_when_nobody_holds_it() {
    let mut server = server();
    let (holder, guard) = holder_across_a_restart(&mut server).await;
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "release of a lock forgotten by a restart: {released:?}"
    );
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// A primary and one replica whose link is up.
async fn primary_with_replica() -> (RedisServer, RedisServer) {
    let primary = server();
    let replica = server();
    let _: () = replica.cmd(&["REPLICAOF", "127.0.0.1", &primary.port().to_string()]);
    let linked = || {
        let info: String = replica.cmd(&["INFO", "replication"]);
        info.contains("master_link_status:up")
    };
    assert!(eventually(Duration::from_secs(10), linked).await);
    (primary, replica)
}

/// One acquire+release that a healthy replica acknowledged (it also loads the scripts). A
/// loaded machine may keep the replica from acknowledging within the `min_replicas` timeout
/// now and then; the tests are about what comes after, so the warm-up tries for up to 10 s.
async fn warm_up_replicated(locker: &Locker) {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match locker.lock("warm").await {
            Ok(guard) => return guard.release().await.unwrap(),
            Err(LockError::NotReplicated { .. }) if std::time::Instant::now() < until => {}
            Err(error) => panic!("warm-up with a healthy replica: {error:?}"),
        }
    }
}

/// S2: `WAIT` counts the writes of its own connection. The acquire's connection is reset
/// while `WAIT` waits for a stalled replica; the retry on the new connection finds the key
/// already ours. Before the fix it wrote nothing there, `WAIT` counted the stalled replica at
/// once and the acquire returned `Ok` without replication.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_is_not_bypassed_by_a_retry_on_a_new_connection() {
    let (primary, replica) = primary_with_replica().await;
    let proxy = FaultProxy::start(primary.port()).await.unwrap();
    let locker = Locker::builder()
        .url(proxy.url())
        .min_replicas(1, Duration::from_secs(1))
        .command_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    // Healthy replica: acknowledged (this also loads the scripts).
    warm_up_replicated(&locker).await;

    replica.pause();
    let acquire = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("k").wait(Duration::from_secs(5)).await })
    };
    // The script ran (the key is there) and WAIT is waiting for the stalled replica.
    assert!(
        eventually(Duration::from_secs(2), || !keys(&primary, "lock:")
            .iter()
            .all(|k| !k.ends_with(":lock:k")))
        .await
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set_mode(ProxyMode::Reset).await;
    let result = acquire.await.unwrap();
    replica.resume();
    assert!(
        matches!(result, Err(LockError::NotReplicated { acked: 0, .. })),
        "an acquire no replica acknowledged: {result:?}"
    );
    common::assert_nothing_left(&primary, &[&locker]).await;
}

/// S2, the other half: the first pipeline never reaches Redis (the connection was reset just
/// before; the first command on it fails as dropped). The retry on the new connection runs the
/// script and WAIT afresh; with a healthy replica the lock is granted, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_acquire_retried_after_an_unsent_first_try_is_granted() {
    let (primary, _replica) = primary_with_replica().await;
    let proxy = FaultProxy::start(primary.port()).await.unwrap();
    let locker = Locker::builder()
        .url(proxy.url())
        .min_replicas(1, Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    warm_up_replicated(&locker).await;
    proxy.set_mode(ProxyMode::Reset).await;
    let guard = locker.lock("k").wait(Duration::ZERO).await.unwrap();
    assert_eq!(
        keys(&primary, "lock:")
            .iter()
            .filter(|k| k.contains(":lock:"))
            .count(),
        1
    );
    guard.release().await.unwrap();
    common::assert_nothing_left(&primary, &[&locker]).await;
}

/// S3: a RedLock node that restarts from an older RDB snapshot (Redis's default persistence:
/// any crash) keeps its epoch key but loses the locks granted since the snapshot. Before the
/// fix the guard never started for it, and a second client assembled a majority with it while
/// the first still held the lock. The server's `run_id` changes at every start: the guard
/// starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_restart_guard_sees_a_node_restarted_from_an_old_snapshot() {
    let mut servers: Vec<RedisServer> = (0..3).map(|_| server()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let guard = Duration::from_millis(2000);
    let lease = Duration::from_millis(1500);
    let locker = || {
        Locker::builder()
            .redlock(urls.clone())
            .restart_guard(guard)
            .fallback_retry(Duration::from_secs(30))
            .build()
    };
    let a = locker().await.unwrap();
    let b = locker().await.unwrap();
    // New nodes: the first acquire writes their epochs and waits out the guard.
    let held = a.lock("k").wait(Duration::from_secs(10)).await.unwrap();
    // The acquire answers once a majority granted: read the name off a node that has it.
    let name = servers
        .iter()
        .find_map(|s| s.keys("lock:*:lock:k").pop())
        .expect("a majority holds the lock");
    held.release().await.unwrap();
    // The release answers once a majority released; node 1's may still be on its way.
    assert!(eventually(Duration::from_secs(2), || servers[1].keys(&name).is_empty()).await);
    // Node 1's snapshot holds its epoch key and no lock.
    let _: () = servers[1].cmd(&["SAVE"]);
    // A's majority is nodes 0 and 1 (node 2 is held by someone else for now).
    let _: () = servers[2].cmd(&["SET", &name, "someone", "PX", "60000"]);
    let first = a.lock("k").lease(lease).await.unwrap();
    let first_token = first.fencing_token().await.unwrap();
    servers[1].restart().unwrap();
    assert!(
        servers[1].keys("lock:*node-epoch").len() == 1 && servers[1].keys(&name).is_empty(),
        "node 1 came back from the snapshot: epoch key, no lock"
    );
    let _: () = servers[2].cmd(&["DEL", &name]);
    let asked = Instant::now();
    let second = b.lock("k").wait(Duration::from_secs(10)).await.unwrap();
    assert!(
        !first.is_held(),
        "two holders at once: B acquired {:?} after asking, while A's lease still ran",
        asked.elapsed()
    );
    assert!(second.fencing_token().await.unwrap() > first_token);
    second.release().await.unwrap();
    drop(first);
    for server in &servers {
        common::assert_nothing_left_under(server, "lock:", &["node-epoch"], &[&a, &b]).await;
    }
}

/// S3 for one server: without the guard a restart without persistence hands the lock to a
/// second client at once while the first still believes it holds it (the control); with the
/// guard the second client gets it only after the first holder's lease ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_server_restart_guard_keeps_a_forgotten_lock_from_a_second_holder() {
    let lease = Duration::from_millis(1200);
    for guarded in [false, true] {
        let mut server = server();
        let build = || {
            let builder = Locker::builder().url(server.url());
            if guarded {
                builder.restart_guard(Duration::from_millis(1500))
            } else {
                builder
            }
            .build()
        };
        let a = build().await.unwrap();
        let b = build().await.unwrap();
        let first = a
            .lock("k")
            .lease(lease)
            .wait(Duration::from_secs(5))
            .await
            .unwrap();
        server.restart().unwrap();
        let second = b.lock("k").wait(Duration::from_secs(5)).await.unwrap();
        let both = first.is_held();
        assert_eq!(
            both, !guarded,
            "guarded: {guarded}; the first holder still held the lock when the second got it: {both}"
        );
        assert!(first.release().await.unwrap_err().is_lost());
        second.release().await.unwrap();
        common::assert_nothing_left_under(&server, "lock:", &["node-epoch"], &[&a, &b]).await;
    }
}

/// S4: reentrancy belongs to the task that acquired, as long as the guard stays in it. A guard
/// used in another task (moved there by `tokio::spawn`) ends reentrancy: the acquiring task's
/// next `lock()` waits for that guard like any other task instead of entering at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_moved_to_another_task_ends_reentrancy() {
    let server = server();
    let locker = locker(&server).await;
    let guard = locker.lock("k").await.unwrap();
    let outer_token = guard.fencing_token().await.unwrap();
    let (used, used_rx) = tokio::sync::oneshot::channel();
    let inside = tokio::spawn(async move {
        assert!(guard.is_held());
        used.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let dropped_at = Instant::now();
        guard.release().await.unwrap();
        dropped_at
    });
    used_rx.await.unwrap();
    let next = locker.lock("k").wait(Duration::from_secs(5)).await.unwrap();
    let acquired_at = Instant::now();
    let dropped_at = inside.await.unwrap();
    assert!(
        acquired_at >= dropped_at,
        "the acquiring task entered again while the moved guard was still held in the other task"
    );
    assert!(
        next.fencing_token().await.unwrap() > outer_token,
        "a new acquisition"
    );
    next.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A nested guard used in another task keeps its owner from nesting only while it lives:
/// once it is dropped there, the owner, whose outer guard never left it, nests again. Before,
/// the lock stayed not reentrant for good, and the owner's next `lock()` waited for its own
/// outer guard ("the task holding the lock could not lock it again: Err(Busy { .. })").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_guard_dropped_in_another_task_lets_its_owner_nest_again() {
    let server = server();
    let locker = locker(&server).await;
    let outer = locker.lock("k").await.unwrap();
    let nested = locker.lock("k").wait(Duration::ZERO).await.unwrap();
    let helper = common::lend(nested, None).await;
    // While the helper task has it, the owner waits like any task.
    let meanwhile = locker.lock("k").wait(Duration::from_millis(200)).await;
    assert!(
        matches!(meanwhile, Err(LockError::Busy { .. })),
        "the owner nested while another task used a guard of the lock: {meanwhile:?}"
    );
    helper.give_back().await;
    // Only the outer guard is left, in this task: it nests at once.
    let again = locker.lock("k").wait(Duration::ZERO).await;
    assert!(
        again.is_ok(),
        "the task holding the lock could not lock it again: {again:?}"
    );
    again.unwrap().release().await.unwrap();
    assert!(outer.is_held());
    outer.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// S5a: a nested guard of a lost lock reports the loss on release, like the outer guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_release_of_a_lost_lock_reports_lost() {
    let server = server();
    let holder = common::locker_with_lease(&server, Duration::from_millis(300)).await;
    let outer = holder.lock("k").await.unwrap();
    let nested = holder.lock("k").await.unwrap();
    let operator = locker(&server).await;
    assert!(operator.force_unlock("k").await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), outer.lost())
        .await
        .expect("the watchdog notices");
    let released = nested.release().await;
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "nested release of a lost lock: {released:?}"
    );
    assert!(outer.release().await.unwrap_err().is_lost());
    common::assert_nothing_left(&server, &[&holder, &operator]).await;
}

/// S5e: `max_hold` ends a hung holder's lock in Redis, and now also its local place: another
/// task of the same process gets the lock while the hung guard still lives (before, it stayed
/// `Busy` behind the local queue until the guard was dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_frees_the_local_place_of_a_hung_holder() {
    let server = server();
    let locker = common::locker_with_lease(&server, Duration::from_millis(300)).await;
    let hung = locker
        .lock("k")
        .max_hold(Duration::from_millis(300))
        .await
        .unwrap();
    let hung_token = hung.fencing_token().await.unwrap();
    let other = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("k").wait(Duration::from_secs(3)).await })
    };
    let next = other.await.unwrap();
    assert!(next.is_ok(), "another task behind a hung holder: {next:?}");
    assert!(!hung.is_held());
    assert!(next.as_ref().unwrap().fencing_token().await.unwrap() > hung_token);
    next.unwrap().release().await.unwrap();
    assert!(hung.release().await.unwrap_err().is_lost());
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// S5f: a frozen server does not stretch the wait. Before the fix a try that started just
/// before the deadline ran its full command timeout (and a first failure was retried once
/// past the deadline): up to about two command timeouts late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_does_not_stretch_the_wait() {
    let server = server();
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    locker.lock("warm").await.unwrap().release().await.unwrap();
    server.pause();
    let wait = Duration::from_millis(1500);
    let started = Instant::now();
    let result = locker.lock("k").wait(wait).await;
    let took = started.elapsed();
    server.resume();
    assert!(
        matches!(result, Err(LockError::Backend { .. })),
        "{result:?}"
    );
    assert!(
        took < wait + Duration::from_millis(300),
        "an acquire with a {wait:?} wait returned after {took:?}"
    );
    // With a wait shorter than the command timeout, one full command is still tried (once
    // the resumed server answers again: on a loaded machine that takes a moment).
    assert!(
        eventually(Duration::from_secs(5), || server.cmd::<String>(&["PING"])
            == "PONG")
        .await
    );
    locker
        .lock("k")
        .wait(Duration::ZERO)
        .await
        .unwrap_or_else(|e| panic!("a zero-wait acquire after the freeze: {e:?}"))
        .release()
        .await
        .unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// S5c: in a Cluster, PUBLISH counts only the subscribers of the node it runs on, so a holder
/// never learned that a locker subscribed elsewhere was waiting, and its own tasks won every
/// handoff. The waiting flag is kept with the key: the remote waiter gets its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_waiter_subscribed_on_another_node_is_not_starved() {
    let cluster = RedisCluster::start(3, 0).unwrap();
    let hot = cluster_locker(&cluster.urls()).await;
    let held = hot.lock("k").await.unwrap();
    let name = cluster.keys("lock:*:lock:k").unwrap()[0].clone();
    held.release().await.unwrap();
    let owner = cluster.primary_for_key(&name).unwrap().port();
    // The waiter's subscriber connects to its first seed: one that does not serve the key.
    let mut seeds = cluster.urls();
    seeds.sort_by_key(|url| url.contains(&format!(":{owner}")));
    let waiter = cluster_locker(&seeds).await;

    // Four tasks of one process pass the lock among themselves without pause.
    let stop = tokio_util::sync::CancellationToken::new();
    let sections = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut hammer = Vec::new();
    for _ in 0..4 {
        let (hot, stop, sections) = (hot.clone(), stop.clone(), sections.clone());
        hammer.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                let guard = hot.lock("k").wait(Duration::from_secs(10)).await.unwrap();
                sections.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                guard.release().await.unwrap();
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // How many sections the local tasks ran while the remote waiter waited for its turn.
    let mut passed_over = Vec::new();
    let mut waits = Vec::new();
    for _ in 0..5 {
        let before = sections.load(std::sync::atomic::Ordering::SeqCst);
        let started = Instant::now();
        let turn = waiter.lock("k").wait(Duration::from_secs(5)).await;
        waits.push(started.elapsed());
        passed_over.push(sections.load(std::sync::atomic::Ordering::SeqCst) - before);
        turn.unwrap_or_else(|e| panic!("the remote waiter starved: {e} (waits {waits:?})"))
            .release()
            .await
            .unwrap();
    }
    stop.cancel();
    for task in hammer {
        task.await.unwrap();
    }
    lock_testkit::figure(&format!(
        "cluster remote waiter behind 4 local tasks: passed over {passed_over:?} times, waits {waits:?}"
    ));
    // Up to 6 local handoffs, then a release through Redis that tells the waiter; on a loaded
    // machine it may lose a few races to the local tasks' retries after their 1 ms pause (30
    // seen with a load average of 6). Without the flag it was passed over for its whole 5 s
    // wait: about 2,000 sections of 2 ms.
    assert!(
        passed_over.iter().all(|n| *n <= 60),
        "the local tasks kept the lock from the remote waiter: passed over {passed_over:?} times"
    );
    common::assert_cluster_clean(&cluster, &[&hot, &waiter]).await;
}

async fn cluster_locker(seeds: &[String]) -> Locker {
    Locker::builder()
        .cluster(seeds.to_vec())
        .fallback_retry(Duration::from_secs(30))
        .build()
        .await
        .unwrap()
}

/// S5d: after a manual `SENTINEL FAILOVER` the old primary keeps its connections, so a
/// subscriber that only reconnected on errors stayed there; it now follows the command side
/// to the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscriber_follows_a_manual_sentinel_failover() {
    let mut sentinel = RedisSentinel::start("locks").unwrap();
    let build = || {
        Locker::builder()
            .sentinel(sentinel.master_name(), sentinel.sentinel_urls())
            .fallback_retry(Duration::from_secs(30))
            .build()
    };
    let holder = build().await.unwrap();
    let waiter = build().await.unwrap();
    let guard = holder.lock("k").await.unwrap();
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.lock("k").wait(Duration::from_secs(30)).await })
    };
    let old = sentinel.current_master_port().unwrap();
    let subscribers = |port: u16| {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
        let mut conn = client.get_connection().unwrap();
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg("lock:*")
            .query(&mut conn)
            .unwrap();
        channels.len()
    };
    assert!(eventually(Duration::from_secs(5), || subscribers(old) == 1).await);
    let _: () = sentinel.sentinels()[0].cmd(&["SENTINEL", "FAILOVER", "locks"]);
    let new = sentinel.wait_for_failover(Duration::from_secs(15)).unwrap();
    assert_ne!(old, new);
    assert!(
        eventually(Duration::from_secs(5), || subscribers(new) == 1).await,
        "the waiter's subscription did not move to the new primary"
    );
    guard.release().await.unwrap();
    let turn = waiting.await.unwrap().unwrap();
    turn.release().await.unwrap();
    common::assert_nothing_left(sentinel.master(), &[&holder, &waiter]).await;
}

/// S2: the pipelined acquire (and the renewals) survive an empty script cache (`SCRIPT FLUSH`, or a
/// replica promoted by a failover, which never loaded the scripts): the script is loaded and
/// the pipeline sent again, and renewals keep the lock alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_acquire_and_renewal_survive_a_script_flush() {
    let (primary, _replica) = primary_with_replica().await;
    // Long enough that a loaded machine (CI runs many tests at once) still renews in time.
    let lease = Duration::from_secs(3);
    let locker = Locker::builder()
        .url(primary.url())
        .watchdog_lease(lease)
        .min_replicas(1, Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let _: () = primary.cmd(&["SCRIPT", "FLUSH"]);
    let guard = locker.lock("k").await.unwrap();
    let _: () = primary.cmd(&["SCRIPT", "FLUSH"]);
    tokio::time::sleep(lease * 2).await;
    assert!(guard.is_held(), "renewals went on after the flush");
    assert!(locker.is_locked("k").await.unwrap());
    guard.release().await.unwrap();
    common::assert_nothing_left(&primary, &[&locker]).await;
}

/// S3, the start of a restarted server: Redis reports `uptime_in_seconds` as whole seconds of
/// the wall clock (`time(NULL) - starttime`), so a server started late in a second reports an
/// uptime of 1 s a moment later. The guard dated the data set by that and ended up to a second
/// early (found by the chaos soak after a restart from a snapshot). The server here starts
/// 0.85 s into a wall-clock second and finds an epoch key of another run (as after a restart
/// from a snapshot): the guard must still have at least `guard - real uptime` to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restart_guard_runs_from_the_real_start_of_the_server() {
    use std::time::{SystemTime, UNIX_EPOCH};
    let guard = Duration::from_millis(1500);
    // Start late in a wall-clock second.
    let subsec = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_millis();
    let until = (1850 - u64::from(subsec)) % 1000;
    std::thread::sleep(Duration::from_millis(until));
    let spawned = Instant::now();
    let server = server();
    // The epoch of an earlier run of another process, written as a snapshot would bring it back.
    let (now_s, _): (String, String) = server.cmd(&["TIME"]);
    let old_epoch = (now_s.parse::<u64>().unwrap() - 100) * 1_000_000;
    let _: () = server.cmd(&["SET", "lock:node-epoch", &format!("00ff:{old_epoch}")]);
    // Past the next second boundary, where `uptime_in_seconds` turns 1.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let locker = Locker::builder()
        .url(server.url())
        .restart_guard(guard)
        .build()
        .await
        .unwrap();
    let asked = Instant::now();
    let err = locker.lock("k").wait(Duration::ZERO).await.unwrap_err();
    let real_uptime = asked.duration_since(spawned);
    let LockError::Busy {
        holder_ttl: Some(left),
        ..
    } = err
    else {
        panic!("expected the guard to refuse: {err:?}");
    };
    assert!(
        left + real_uptime + Duration::from_millis(50) >= guard,
        "the guard had {left:?} left {real_uptime:?} after the server started (guard {guard:?})"
    );
    common::assert_nothing_left_under(&server, "lock:", &["node-epoch"], &[&locker]).await;
}

/// The uncontended acquire is a plain `SET NX PX`. Its first try reaches Redis (the key is
/// there) but the reply is lost with the connection; the retry must not read the taken key as
/// busy (it would wait for itself): the script recognises the key as ours. One lock, granted
/// once, under the first try's token, released cleanly. (Fails when a refused `SET NX` is
/// taken for "busy" without asking the script.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_acquire_whose_reply_was_lost_is_recognised_as_ours() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let locker = Locker::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    locker.lock("warm").await.unwrap().release().await.unwrap();
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(300)))
        .await;
    let acquire = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("k").wait(Duration::from_secs(5)).await })
    };
    let lock_key = || {
        keys(&server, "lock:")
            .into_iter()
            .find(|k| k.ends_with(":lock:k"))
    };
    assert!(eventually(Duration::from_secs(2), || lock_key().is_some()).await);
    let name = lock_key().unwrap();
    let token: String = server.cmd(&["GET", &name]);
    // The SET ran; its reply is still in the proxy: cut the connection under it.
    proxy.set_mode(ProxyMode::Reset).await;
    let guard = tokio::time::timeout(Duration::from_secs(10), acquire)
        .await
        .expect("the retry must not wait for its own lock")
        .unwrap()
        .expect("the retry recognises the lock as ours");
    let value: String = server.cmd(&["GET", &name]);
    assert_eq!(
        value, token,
        "granted under the first try's token, not taken anew"
    );
    assert!(guard.is_held());
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// The other half: the first `SET NX` never reaches Redis (the connection was reset just
/// before). The retry runs the script, which takes the free lock: granted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_acquire_whose_first_try_never_arrived_is_granted_by_the_retry() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let locker = Locker::builder().url(proxy.url()).build().await.unwrap();
    locker.lock("warm").await.unwrap().release().await.unwrap();
    proxy.set_mode(ProxyMode::Reset).await;
    let guard = locker.lock("k").wait(Duration::ZERO).await.unwrap();
    let held: Vec<String> = keys(&server, "lock:")
        .into_iter()
        .filter(|k| k.contains(":lock:"))
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// Fencing on demand: an acquire whose token is never asked for writes no fence key; a holder
/// that lost its lock gets no token; the next holder's token is larger than one issued before.
#[tokio::test]
async fn fencing_tokens_are_issued_only_to_a_holder_and_only_when_asked() {
    let server = server();
    let locker = locker(&server).await;
    let fences = || {
        keys(&server, "lock:")
            .into_iter()
            .filter(|k| k.contains(":fence:"))
            .count()
    };
    let first = locker.lock("k").await.unwrap();
    assert_eq!(fences(), 0, "no token asked for, no fence written");
    let token = first.fencing_token().await.unwrap();
    assert_eq!(fences(), 1);
    assert_eq!(first.fencing_token().await.unwrap(), token, "issued once");
    first.release().await.unwrap();

    let lapsed = locker
        .lock("k")
        .lease(Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    let other = Locker::connect(&server.url()).await.unwrap();
    let next = other.lock("k").wait(Duration::ZERO).await.unwrap();
    let err = lapsed.fencing_token().await.unwrap_err();
    assert!(
        err.is_lost(),
        "a holder whose lease ran out gets no token: {err}"
    );
    assert!(next.fencing_token().await.unwrap() > token);
    next.release().await.unwrap();
    drop(lapsed);
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}

/// T15 (T6, timing variant): an owner's `lock()` that starts while its nested guard is used in
/// another task waits for that guard ("for as long as that guard lives", crate docs,
/// "Reentrancy"), and nests once it left. It waited in the local queue for the place its own
/// outer guard holds, and nothing looked again when the guard left: the owner waited for
/// itself ("Err(Busy { .. waited: 2.000713778s .. })", and forever without a wait). For each
/// way a task nests (a mutex, a fair lock, a read inside its write lock), with a wait and
/// without one; the helper drops its guard 200 ms in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_waiting_while_its_nested_guard_is_elsewhere_nests_once_that_guard_is_dropped() {
    let server = server();
    let locker = locker(&server).await;
    let mut wrong = Vec::new();
    for (way, fair, read) in [
        ("mutex", false, false),
        ("fair", true, false),
        ("read inside the write lock", false, true),
    ] {
        for wait in [Some(Duration::from_secs(5)), None] {
            let key = format!("k-{way}-{}", wait.is_some());
            let take = |locker: &Locker| {
                if fair {
                    locker.fair_lock(key.clone())
                } else {
                    locker.lock(key.clone())
                }
            };
            let outer = take(&locker).await.unwrap();
            let nested = take(&locker).wait(Duration::ZERO).await.unwrap();
            // Taken before the helper's 200 ms start: a nest that waits for the helper's drop
            // waits at least that long from here, however late this task runs.
            let started = Instant::now();
            let helper = common::lend(nested, Some(Duration::from_millis(200))).await;
            // Called while the helper still has its guard: waits for it, then nests.
            let again = if read {
                locker.read(key.clone())
            } else {
                take(&locker)
            };
            let again = match wait {
                Some(wait) => again.wait(wait),
                None => again.wait(Duration::MAX),
            };
            let again = tokio::time::timeout(Duration::from_secs(10), again).await;
            let waited = started.elapsed();
            helper.dropped().await;
            match again {
                Ok(Ok(guard)) => {
                    if waited < Duration::from_millis(150) {
                        wrong.push(format!(
                            "{way}, wait {wait:?}: nested after {waited:?}, while the helper \
                             still used its guard"
                        ));
                    }
                    guard.release().await.unwrap();
                }
                other => wrong.push(format!(
                    "{way}, wait {wait:?}: the owner's acquire, called while its nested guard \
                     was in another task, still waited after that guard was dropped (200 ms \
                     in): {other:?} after {waited:?}"
                )),
            }
            assert!(outer.is_held(), "{way}");
            outer.release().await.unwrap();
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    common::assert_nothing_left(&server, &[&locker]).await;
}
