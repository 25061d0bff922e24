//! Redis Cluster and Sentinel: one test binary, each test with its own deployment of real
//! redis-server processes.

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use lock_core::{LockError, Locker};
use lock_testkit::oracle::Oracle;
use lock_testkit::{RedisCluster, RedisSentinel};

async fn cluster_locker(cluster: &RedisCluster, lease: Duration) -> Locker {
    Locker::builder()
        .cluster(cluster.urls())
        .watchdog_lease(lease)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mutual_exclusion_across_slots_waking_and_renewal() {
    let cluster = RedisCluster::start(3, 0).unwrap();
    let a = cluster_locker(&cluster, Duration::from_millis(600)).await;
    let b = Locker::builder()
        .cluster(cluster.urls())
        .watchdog_lease(Duration::from_millis(600))
        .fallback_retry(Duration::from_secs(30))
        .build()
        .await
        .unwrap();

    // Exclusion on 24 keys spread over the slots, 16 tasks in two lockers, checked by the
    // double-holder oracle on its own referee server.
    let referee = lock_testkit::RedisServer::start().unwrap();
    let oracle = Oracle::connect(&referee.url(), "cluster", "test")
        .await
        .unwrap();
    let keys: Vec<String> = (0..24).map(|i| format!("sku:{i}")).collect();
    let mut tasks = Vec::new();
    for t in 0..16 {
        let locker = if t % 2 == 0 { a.clone() } else { b.clone() };
        let (keys, oracle) = (keys.clone(), oracle.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..30 {
                let key = &keys[(t * 7 + i) % keys.len()];
                let guard = locker
                    .lock(key.as_str())
                    .wait(Duration::from_secs(20))
                    .await
                    .unwrap();
                let work = tokio::time::sleep(Duration::from_micros(300));
                let ((), accepted) = oracle
                    .section(
                        key,
                        guard.fencing_token().await.unwrap(),
                        || guard.is_held(),
                        work,
                    )
                    .await
                    .unwrap();
                assert!(accepted, "the holder's fenced write was rejected");
                guard.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let report = oracle.report().await.unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!((report.cycles, report.overlaps), (16 * 30, 0), "{report}");

    // The locks really were spread over every primary.
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(a.lock(key.as_str()).await.unwrap());
    }
    let mut nodes = HashSet::new();
    for name in cluster.keys("lock:*:lock:*").unwrap() {
        nodes.insert(cluster.primary_for_key(&name).unwrap().port());
    }
    assert_eq!(nodes.len(), 3, "locks on every primary");

    // Watchdog: three leases later every lock is still held and the keys still exist.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(guards.iter().all(|g| g.is_held()));
    assert_eq!(cluster.keys("lock:*:lock:*").unwrap().len(), keys.len());

    // Waking: b waits on a key a holds; the release message reaches it through the cluster.
    let held = guards.pop().unwrap();
    let subscribed = || {
        let primaries = cluster.current_primaries().unwrap();
        primaries.iter().any(|p| !p.pubsub_channels().is_empty())
    };
    let (woken, _) = common::wake_up_after_release(held, &b, subscribed).await;
    assert!(
        woken < Duration::from_secs(2),
        "woken after {woken:?} (fallback is 30 s)"
    );
    for g in guards {
        g.release().await.unwrap();
    }
    common::assert_cluster_clean(&cluster, &[&a, &b]).await;
}

#[tokio::test]
async fn cluster_min_replicas_acknowledged_and_refused() {
    let cluster = RedisCluster::start(3, 1).unwrap();
    // A replica acknowledges within milliseconds; 3 s leaves room for a loaded machine (500 ms
    // once timed out with the link up).
    let (logs, capture) = lock_testkit::LogBuffer::capture(tracing::Level::DEBUG);
    let locker = Locker::builder()
        .cluster(cluster.urls())
        .min_replicas(1, Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    drop(capture);
    // `build` read the version of every primary (`INFO` goes to each; the refusal of one too
    // old is unit-tested in `server_version.rs`: a proxy cannot stand in for a cluster node,
    // whose redirections name the real ports).
    let versions: Vec<String> = logs
        .text()
        .lines()
        .filter(|line| line.contains("server version") && line.contains("cluster node 127.0.0.1:"))
        .map(str::to_owned)
        .collect();
    assert_eq!(versions.len(), 3, "{versions:#?}");
    let guard = locker.lock("order:1").await.unwrap();
    guard.release().await.unwrap();
    let two = Locker::builder()
        .cluster(cluster.urls())
        .min_replicas(2, Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    match two.lock("order:1").wait(Duration::ZERO).await {
        // The key's primary has one replica: two acknowledgements can never come.
        Err(LockError::NotReplicated { acked, wanted, .. }) => {
            assert!(acked <= 1 && wanted == 2, "acked {acked} of {wanted}");
        }
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    assert!(
        cluster.keys("lock:*:lock:*").unwrap().is_empty(),
        "refused lock released again"
    );
    common::assert_cluster_clean(&cluster, &[&locker, &two]).await;
}

async fn sentinel_locker(sentinel: &RedisSentinel, min_replicas: bool) -> Locker {
    let mut builder = Locker::builder()
        .sentinel(sentinel.master_name(), sentinel.sentinel_urls())
        .watchdog_lease(Duration::from_millis(900))
        .command_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(500));
    if min_replicas {
        builder = builder.min_replicas(1, Duration::from_millis(300));
    }
    builder.build().await.unwrap()
}

#[tokio::test]
async fn sentinel_replicated_lock_survives_a_failover() {
    let mut sentinel = RedisSentinel::start("locks").unwrap();
    let holder = sentinel_locker(&sentinel, true).await;
    let guard = holder
        .lock("k")
        .lease(Duration::from_secs(30))
        .await
        .unwrap();
    let old = sentinel.kill_primary();
    let new = sentinel.wait_for_failover(Duration::from_secs(15)).unwrap();
    assert_ne!(old, new);
    // The replicated key is on the new primary: nobody else gets the lock.
    let other = sentinel_locker(&sentinel, false).await;
    let err = other.lock("k").wait(Duration::ZERO).await.unwrap_err();
    assert!(err.is_busy(), "{err:?}");
    // The holder follows the failover: its release reaches the new primary.
    let started = Instant::now();
    loop {
        match holder.is_locked("k").await {
            Ok(true) => break,
            _ if started.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => panic!("holder did not follow the failover: {other:?}"),
        }
    }
    guard.release().await.unwrap();
    assert!(!other.is_locked("k").await.unwrap());
    common::assert_nothing_left(sentinel.master(), &[&holder, &other]).await;
}

#[tokio::test]
async fn sentinel_failover_loss_window_and_min_replicas_refusal() {
    let mut sentinel = RedisSentinel::start("locks").unwrap();
    let careful = sentinel_locker(&sentinel, true).await;
    let plain = sentinel_locker(&sentinel, false).await;
    sentinel.break_replication().unwrap();

    // With min_replicas the unreplicated acquire is refused and undone.
    match careful.lock("k").wait(Duration::ZERO).await {
        Err(LockError::NotReplicated {
            acked: 0,
            wanted: 1,
            ..
        }) => {}
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    assert!(!plain.is_locked("k").await.unwrap());

    // A plain acquire succeeds but never reaches the replica ...
    let first = plain.lock("k").await.unwrap();
    let first_token = first.fencing_token().await.unwrap();
    sentinel.kill_primary();
    sentinel.wait_for_failover(Duration::from_secs(15)).unwrap();
    // ... so after the failover a second client gets the same lock: two holders. This is the
    // documented window; the fencing token tells them apart, and the first holder's watchdog
    // learns the loss.
    let second = sentinel_locker(&sentinel, false).await;
    let started = Instant::now();
    let taken = loop {
        match second.lock("k").wait(Duration::from_secs(1)).await {
            Ok(g) => break g,
            Err(e) if started.elapsed() < Duration::from_secs(10) => {
                assert!(!e.is_busy(), "the new primary never saw the lock: {e}");
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(
        taken.fencing_token().await.unwrap() > first_token,
        "fencing tokens still increase"
    );
    tokio::time::timeout(Duration::from_secs(5), first.lost())
        .await
        .expect("the first holder learns it lost the lock");
    assert!(first.release().await.unwrap_err().is_lost());
    taken.release().await.unwrap();
    common::assert_nothing_left(sentinel.master(), &[&careful, &plain, &second]).await;
}

/// F17: a cluster primary is SIGKILLed while locks are held on every shard. Locks on the other
/// shards survive the `CLUSTERDOWN` second; the replicated lock on the failed shard survives the
/// failover (acquired with `min_replicas(1, ..)`); new acquires work again within their wait.
/// Two replicas a shard: with `min_replicas` the renewals count only where a replica
/// acknowledges them (N8), and the promoted replica keeps the other one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_primary_failover_keeps_replicated_locks() {
    let mut cluster = RedisCluster::start(3, 2).unwrap();
    let holder = Locker::builder()
        .cluster(cluster.urls())
        .watchdog_lease(Duration::from_secs(6))
        .min_replicas(1, Duration::from_millis(500))
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("shard-{i}")).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(holder.lock(key.as_str()).await.unwrap());
    }
    // The primary that holds the first key's lock.
    let victim_key = cluster.keys("lock:*:lock:shard-0").unwrap().pop().unwrap();
    let port = cluster.primary_for_key(&victim_key).unwrap().port();
    let index = cluster.index_of_port(port).unwrap();
    cluster.node_mut(index).kill9();
    let killed = Instant::now();
    cluster
        .wait_for_failover(port, Duration::from_secs(20))
        .unwrap();
    let failover = killed.elapsed();
    // Another client cannot take any of the held keys, on the failed shard included.
    let other = Locker::builder()
        .cluster(
            cluster
                .urls()
                .into_iter()
                .filter(|u| !u.contains(&port.to_string())),
        )
        .build()
        .await
        .unwrap();
    for key in &keys {
        let err = other
            .lock(key.as_str())
            .wait(Duration::ZERO)
            .await
            .unwrap_err();
        assert!(err.is_busy(), "{key}: {err:?}");
    }
    // The watchdog kept every lock through the failover (lease 6 s, renewal every 2 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    for g in &guards {
        assert!(
            g.is_held(),
            "{} lost after a {failover:?} failover",
            g.key()
        );
    }
    lock_testkit::figure(&format!(
        "F17: cluster failover {failover:?}; {} of {} replicated locks still held 3 s later",
        guards.iter().filter(|g| g.is_held()).count(),
        guards.len()
    ));
    // And a new lock can be taken on the failed shard's slots again.
    let fresh = other
        .lock("after-failover")
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    fresh.release().await.unwrap();
    for g in guards {
        g.release().await.unwrap();
    }
    common::assert_cluster_clean(&cluster, &[&holder, &other]).await;
}

/// The Redis name of user key `key`'s lock, learned by taking and releasing it once.
async fn cluster_lock_name(cluster: &RedisCluster, locker: &Locker, key: &str) -> String {
    let guard = locker.lock(key).await.unwrap();
    let name = cluster
        .keys(&format!("lock:*:lock:{key}"))
        .unwrap()
        .pop()
        .expect("the lock key");
    guard.release().await.unwrap();
    name
}

/// F18a: cluster lock loss by the masterauth recipe. The shard's replica no longer replicates:
/// `min_replicas(1)` refuses the lock (and removes the key); a plain lock is granted, its
/// primary is killed and the replica that never saw the key is promoted. The holder's `lost()`
/// fires, another client acquires (the documented window) with a larger fencing token, and the
/// first holder's release answers `Lost`.
#[tokio::test]
async fn cluster_failover_with_a_broken_replica_link_loses_the_lock_and_says_so() {
    let mut cluster = RedisCluster::start(3, 1).unwrap();
    let builder = || {
        Locker::builder()
            .cluster(cluster.urls())
            .watchdog_lease(Duration::from_millis(1500))
            .command_timeout(Duration::from_millis(500))
    };
    let holder = builder().build().await.unwrap();
    let strict = builder()
        .min_replicas(1, Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let name = cluster_lock_name(&cluster, &holder, "k").await;
    let primary = cluster.primary_for_key(&name).unwrap().port();
    cluster.break_replication(primary).unwrap();

    let err = strict
        .lock("k")
        .wait(Duration::ZERO)
        .await
        .expect_err("an unreplicated lock must be refused");
    assert!(
        matches!(err, LockError::NotReplicated { acked: 0, .. }),
        "{err:?}"
    );
    assert!(cluster.keys(&name).unwrap().is_empty(), "refused lock left");

    let first = holder.lock("k").await.unwrap();
    let first_token = first.fencing_token().await.unwrap();
    let index = cluster.index_of_port(primary).unwrap();
    cluster.node_mut(index).kill9();
    let killed = Instant::now();
    tokio::time::timeout(Duration::from_secs(20), first.lost())
        .await
        .expect("the holder learns that the promoted replica lost its lock");
    let detected = killed.elapsed();
    cluster
        .wait_for_failover(primary, Duration::from_secs(20))
        .unwrap();
    let other = Locker::builder()
        .cluster(
            cluster
                .urls()
                .into_iter()
                .filter(|u| !u.contains(&primary.to_string())),
        )
        .build()
        .await
        .unwrap();
    let second = other
        .lock("k")
        .wait(Duration::from_secs(10))
        .await
        .expect("the lost lock is free on the promoted replica");
    assert!(
        second.fencing_token().await.unwrap() > first_token,
        "tokens keep increasing after the fence counter was lost too"
    );
    lock_testkit::figure(&format!(
        "F18a: cluster holder's lost() {detected:?} after its primary was SIGKILLed (lease 1.5 s)"
    ));
    let err = first.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    second.release().await.unwrap();
    common::assert_cluster_clean(&cluster, &[&holder, &strict, &other]).await;
}

/// F18b: a held lock's slot migrates to another primary while the watchdog renews it. With the
/// keys moved but the slot not yet reassigned, the source answers `ASK`; after
/// `SETSLOT .. NODE`, `MOVED`. Renewal follows both (the key, lease 1 s, is still there after
/// 2 s in each phase), another client is refused meanwhile, the TTL moved with the key, and
/// the release deletes it on the new primary. While the slot migrates, the other client's
/// acquire script names the lock key (moved) and its waiting writers (on no node): the target
/// refuses it with `TRYAGAIN` before it runs, so the other client gets a backend error (a
/// transient one, retried until its bound), not `Busy`; after `MOVED`, `Busy`.
#[tokio::test]
async fn cluster_slot_migration_of_a_held_lock_is_followed() {
    let cluster = RedisCluster::start(3, 0).unwrap();
    let lease = Duration::from_secs(1);
    let holder = Locker::builder()
        .cluster(cluster.urls())
        .watchdog_lease(lease)
        .build()
        .await
        .unwrap();
    let other = Locker::builder()
        .cluster(cluster.urls())
        .build()
        .await
        .unwrap();
    let name = cluster_lock_name(&cluster, &holder, "k").await;
    let slot = cluster.keyslot(&name);
    let guard = holder.lock("k").await.unwrap();
    // Issued now, so that the fence key migrates with the lock.
    guard.fencing_token().await.unwrap();
    let source = cluster.primary_for_slot(slot).unwrap().port();
    let target = cluster
        .current_primaries()
        .unwrap()
        .iter()
        .map(|p| p.port())
        .find(|p| *p != source)
        .unwrap();
    // A direct connection to the target; `ASKING` lets it answer for an importing slot.
    let direct = redis::Client::open(format!("redis://127.0.0.1:{target}/")).unwrap();
    let mut target_conn = direct.get_multiplexed_async_connection().await.unwrap();

    let from = cluster.begin_slot_migration(slot, target).unwrap();
    assert_eq!(from, source);
    // The lock and its fence (`cluster_lock_name`'s release left no latch: the default).
    assert_eq!(cluster.migrate_keys(slot, source, target).unwrap(), 2);
    // `ASKING` first lets the target answer for a slot it is still importing.
    let ttl_on_target = |mut conn: redis::aio::MultiplexedConnection, name: String| async move {
        let (_, ttl): ((), i64) = redis::pipe()
            .cmd("ASKING")
            .cmd("PTTL")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .unwrap();
        ttl
    };
    let ttl_after_move = ttl_on_target(target_conn.clone(), name.clone()).await;
    assert!(ttl_after_move > 0, "MIGRATE kept the TTL: {ttl_after_move}");

    // Phase 1, ASK: two leases on the target with renewals redirected there. Phase 2, MOVED:
    // the slot now belongs to the target.
    for phase in ["ASK", "MOVED"] {
        if phase == "MOVED" {
            cluster.finish_slot_migration(slot, source, target).unwrap();
        }
        tokio::time::sleep(lease * 2).await;
        let ttl = ttl_on_target(target_conn.clone(), name.clone()).await;
        assert!(
            ttl > 0,
            "the lock expired on the target ({phase} not followed)"
        );
        assert!(guard.is_held());
        let err = other.lock("k").wait(Duration::ZERO).await.unwrap_err();
        if phase == "ASK" {
            assert!(err.is_backend(), "{phase}: {err:?}");
        } else {
            assert!(err.is_busy(), "{phase}: {err:?}");
        }
    }
    assert_eq!(cluster.primary_for_slot(slot).unwrap().port(), target);

    guard.release().await.unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&name)
        .query_async(&mut target_conn)
        .await
        .unwrap();
    assert_eq!(exists, 0, "the release reached the new primary");
    other
        .lock("k")
        .wait(Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    common::assert_cluster_clean(&cluster, &[&holder, &other]).await;
}

/// The Redis name of the lock of `k` on a RedLock node that granted it (the grant may land
/// just after the majority decided).
async fn redlock_lock_name(server: &lock_testkit::RedisServer) -> String {
    let lock = || server.keys("lock:*:lock:k");
    assert!(common::eventually(Duration::from_secs(2), || !lock().is_empty()).await);
    lock()[0].clone()
}

/// F20, documented caveat: a RedLock node restarted without persistence forgets the locks it
/// granted, and a second client can then assemble a majority: two holders. Run RedLock nodes
/// with AOF (or keep a restarted node out for one lease); fencing tokens still increase.
#[tokio::test]
async fn redlock_node_restarted_without_persistence_allows_a_second_holder() {
    let mut servers: Vec<lock_testkit::RedisServer> = (0..5)
        .map(|_| lock_testkit::RedisServer::start().unwrap())
        .collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    let a = Locker::builder()
        .redlock(urls.clone())
        .build()
        .await
        .unwrap();
    let b = Locker::builder().redlock(urls).build().await.unwrap();
    // Learn the lock's Redis name, then pre-hold it on nodes 3 and 4 so A's majority is 0,1,2.
    let held = a.lock("k").await.unwrap();
    let name = redlock_lock_name(&servers[0]).await;
    held.release().await.unwrap();
    for s in &servers[3..] {
        let _: () = s.cmd(&["SET", &name, "someone", "PX", "60000"]);
    }
    let first = a.lock("k").lease(Duration::from_secs(30)).await.unwrap();
    let first_token = first.fencing_token().await.unwrap();
    // Node 2 restarts without persistence; the foreign holds on 3 and 4 end.
    servers[2].restart().unwrap();
    for s in &servers[3..] {
        let _: () = s.cmd(&["DEL", &name]);
    }
    // (b's connection to the restarted node reconnects on the first try, hence the short wait.)
    let second = b
        .lock("k")
        .wait(Duration::from_secs(3))
        .await
        .expect("the documented double holder");
    assert!(first.is_held() && second.is_held(), "two holders at once");
    assert!(
        second.fencing_token().await.unwrap() > first_token,
        "the fence still orders them"
    );
    second.release().await.unwrap();
    drop(first);
    for server in servers.iter() {
        common::assert_nothing_left(server, &[&a, &b]).await;
    }
}

/// F20 with the delayed-restart guard: the restarted node grants nothing until the guard has
/// passed, so the second client cannot assemble a majority with it; it gets the lock only once
/// the first holder's lease has ended everywhere. (Brand-new nodes wait out the guard too.)
#[tokio::test]
async fn redlock_restart_guard_prevents_the_second_holder() {
    let mut servers: Vec<lock_testkit::RedisServer> = (0..5)
        .map(|_| lock_testkit::RedisServer::start().unwrap())
        .collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
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

    // New nodes: the first acquire writes each node's epoch, then waits out the guard.
    let started = Instant::now();
    let warm_up = a.lock("k").wait(Duration::from_secs(10)).await.unwrap();
    assert!(
        started.elapsed() + Duration::from_millis(20) >= guard,
        "fresh nodes granted a lock after {:?}",
        started.elapsed()
    );
    let name = redlock_lock_name(&servers[0]).await;
    warm_up.release().await.unwrap();

    // The F20 set-up: A's majority is nodes 0, 1, 2.
    for s in &servers[3..] {
        let _: () = s.cmd(&["SET", &name, "someone", "PX", "60000"]);
    }
    let first = a.lock("k").lease(lease).await.unwrap();
    let first_token = first.fencing_token().await.unwrap();
    servers[2].restart().unwrap();
    for s in &servers[3..] {
        let _: () = s.cmd(&["DEL", &name]);
    }
    let asked = Instant::now();
    let second = b.lock("k").wait(Duration::from_secs(10)).await.unwrap();
    assert!(
        !first.is_held(),
        "two holders at once: B acquired {:?} after asking while A's lease still ran",
        asked.elapsed()
    );
    assert!(second.fencing_token().await.unwrap() > first_token);
    second.release().await.unwrap();
    drop(first);
    for server in servers.iter() {
        common::assert_nothing_left_under(server, "lock:", &["node-epoch"], &[&a, &b]).await;
    }
}

/// F16: a manual `SENTINEL FAILOVER`. The old primary keeps answering for seconds after the
/// switch, so a client that only reacted to errors would keep renewing there while the key on
/// the new primary runs out. The locker asks Sentinel every second, moves to the new primary,
/// and the lock stays exclusive there for longer than its lease. With `min_replicas` the
/// renewals count only where a replica acknowledges them (N8): the new primary gets the
/// deployment's second replica (`extra`), as Sentinel reconfigures it at once.
#[tokio::test]
async fn sentinel_manual_failover_is_followed_before_the_lease_runs_out() {
    let mut sentinel = RedisSentinel::start("locks").unwrap();
    let lease = Duration::from_secs(3);
    let holder = Locker::builder()
        .sentinel(sentinel.master_name(), sentinel.sentinel_urls())
        .watchdog_lease(lease)
        .min_replicas(1, Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let guard = holder.lock("k").await.unwrap();
    let old = sentinel.current_master_port().unwrap();
    let _: () = sentinel.sentinels()[0].cmd(&["SENTINEL", "FAILOVER", "locks"]);
    let new = sentinel.wait_for_failover(Duration::from_secs(15)).unwrap();
    assert_ne!(old, new);
    let extra = lock_testkit::RedisServer::start().unwrap();
    common::attach_replica(&extra, new).await;
    // Two leases on the new primary: without renewals there, its copy of the key would expire.
    let direct = redis::Client::open(format!("redis://127.0.0.1:{new}/")).unwrap();
    let mut conn = direct.get_multiplexed_async_connection().await.unwrap();
    let started = Instant::now();
    while started.elapsed() < lease * 2 {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("lock:*:lock:k")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            keys.len(),
            1,
            "the lock key expired on the new primary after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(guard.is_held());
    guard.release().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("lock:*:lock:k")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "release reached the new primary");
    common::assert_nothing_left(sentinel.master(), &[&holder]).await;
}

/// Timeouts on a primary that did not move do not rebuild the connection: the locker's
/// connections to the primary (commands and pub/sub) are the same ones after the stalls, so
/// no channel was resubscribed and no waiter woken for nothing. Five stalls of the primary
/// (`DEBUG SLEEP`, shorter than Sentinel's down-after), each met by a burst of commands that
/// time out; a waiter subscribed all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_timeouts_on_an_unmoved_primary_do_not_rebuild_the_connection() {
    let sentinel = RedisSentinel::start("locks").unwrap();
    let locker = Locker::builder()
        .sentinel(sentinel.master_name(), sentinel.sentinel_urls())
        .command_timeout(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let holder = locker.lock("held").await.unwrap();
    // A waiter of another task, subscribed to the key's channel all along.
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("held").wait(Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The primary's long-lived client connections that are not the sentinels' or this
    // query's own: the locker's (the replica's link has the `S` flag).
    let lockers_connections = || -> HashSet<String> {
        let list: String = sentinel.master().cmd(&["CLIENT", "LIST"]);
        list.lines()
            .filter(|l| l.contains(" name= ") && !l.contains("cmd=client|list"))
            .filter(|l| !l.contains(" flags=S "))
            .filter_map(|l| l.split(' ').find(|f| f.starts_with("id=")))
            .map(str::to_owned)
            .collect()
    };
    let before = lockers_connections();
    assert!(
        before.len() >= 2,
        "the locker's command and pub/sub connections: {before:?}"
    );
    let mut timeouts = 0;
    for _ in 0..5 {
        let stall = common::freeze(sentinel.master().url(), "0.4");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let tries = (0..20).map(|i| {
            let locker = locker.clone();
            async move { locker.is_locked(&format!("other-{i}")).await }
        });
        for result in futures_util::future::join_all(tries).await {
            timeouts += usize::from(result.is_err());
        }
        stall.await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let after = lockers_connections();
    let new: Vec<_> = after.difference(&before).collect();
    lock_testkit::figure(&format!(
        "sentinel, 5 stalls of an unmoved primary, {timeouts} command timeouts: {} new locker connections, {} of {} kept",
        new.len(),
        before.intersection(&after).count(),
        before.len()
    ));
    assert!(
        timeouts >= 50,
        "the stalls timed out only {timeouts} commands"
    );
    assert!(
        new.is_empty() && after == before,
        "the locker rebuilt its connections to a primary that did not move: before {before:?}, after {after:?}"
    );
    assert!(holder.is_held());
    holder.release().await.unwrap();
    let woken = waiter.await.unwrap().unwrap();
    woken.release().await.unwrap();
    common::assert_nothing_left(sentinel.master(), &[&locker]).await;
}
