//! Review of the fixes since 339ada3 (N1-N9) on multi-node topologies. Each test names its
//! finding and fails on the code it was written against (c08356c).

use crate::common;

use std::time::{Duration, Instant};

use lock_core::{ConfigError, LockError, Locker};
use lock_testkit::ProxyMode;

/// Finding O2 (N7's fix, incomplete): with `min_replicas` on a cluster, every renewal goes
/// through `with_wait` (the script and `WAIT`, pipelined to the key's shard), and a NOSCRIPT
/// there still loads the script with `LoadOn::Everywhere`: `SCRIPT LOAD` to every primary,
/// which waits for a paused one. So N7's shape is back as soon as `min_replicas` is set: one
/// primary slow for clients loses the locks of every other shard (their first renewal meets
/// NOSCRIPT, and its load waits on the paused primary until the command timeout).
///
/// Expected: as without `min_replicas`, the script is loaded on the key's shard first
/// (`LoadOn::KeysServer`), and a slow shard only affects its own locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o2_with_min_replicas_a_slow_cluster_shard_does_not_lose_the_other_shards_locks() {
    let cluster = lock_testkit::RedisCluster::start(3, 1).unwrap();
    let locker = Locker::builder()
        .cluster(cluster.urls())
        .watchdog_lease(Duration::from_secs(3))
        .command_timeout(Duration::from_secs(2))
        .min_replicas(1, Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let shards = common::keys_on_every_shard(&cluster, "s", 1);
    let mut guards = Vec::new();
    for keys in &shards {
        guards.push(locker.lock(&keys[0]).await.unwrap());
    }
    // The renewal script is not in any cache yet (the acquires used their own scripts); a
    // flush makes sure of it.
    for keys in &shards {
        let primary = cluster
            .primary_for_slot(common::kit_slot(&keys[0]))
            .unwrap();
        let _: () = primary.cmd(&["SCRIPT", "FLUSH"]);
    }
    let slow = cluster
        .primary_for_slot(common::kit_slot(&shards[0][0]))
        .unwrap();
    let _: () = slow.cmd(&["CLIENT", "PAUSE", "4500", "ALL"]);
    let started = Instant::now();
    let mut first_false: Vec<Option<Duration>> = vec![None; guards.len()];
    while started.elapsed() < Duration::from_millis(4400) {
        for (i, guard) in guards.iter().enumerate() {
            if first_false[i].is_none() && !guard.is_held() {
                first_false[i] = Some(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _: () = slow.cmd(&["CLIENT", "UNPAUSE"]);
    drop(guards);
    assert!(
        first_false[1..].iter().all(Option::is_none),
        "min_replicas(1, 500 ms), one primary paused for clients 4.5 s (watchdog lease 3 s, \
         command timeout 2 s); when each guard first said not held, by shard (the paused one \
         first): {first_false:?}"
    );
}

/// Finding O3 (T29's fix against N7's): `extend_again` runs inside the watchdog's round
/// (`tick` awaits it after `renew_each`), so an extension sent again to a slow shard holds the
/// whole round up for another command timeout. A lock on a paused primary whose holder
/// shortened it with `extend` while the round's renewal waited (the renewal times out:
/// `Unknown`, sent before the extension, so `renewal_undoes_extension`) makes the round last
/// two command timeouts (2 s + 2 s); the healthy shards' locks, renewed at its start for a 3 s
/// lease, run out before the next round and are reported lost, although their primaries
/// answer at once. N7's claim: a slow shard only affects its own locks.
///
/// Expected: the extension sent again does not hold the round up (spawned, or cut at the
/// time the hold has left), and the healthy shards' locks stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o3_an_extension_sent_again_to_a_slow_shard_does_not_lose_the_other_shards_locks() {
    let cluster = lock_testkit::RedisCluster::start(3, 0).unwrap();
    let locker = Locker::builder()
        .cluster(cluster.urls())
        .watchdog_lease(Duration::from_secs(3))
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let shards = common::keys_on_every_shard(&cluster, "s", 1);
    let mut guards = Vec::new();
    for keys in &shards {
        guards.push(locker.lock(&keys[0]).await.unwrap());
    }
    // Every shard's renewal script loaded (a round passes).
    let calls = locker.stats().renewal_calls;
    assert!(
        common::eventually(Duration::from_secs(3), || locker.stats().renewal_calls
            > calls)
        .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let slow = cluster
        .primary_for_slot(common::kit_slot(&shards[0][0]))
        .unwrap();
    let _: () = slow.cmd(&["CLIENT", "PAUSE", "7000", "ALL"]);
    // The next round sends its renewals (the slow shard's waits).
    let calls = locker.stats().renewal_calls;
    let limit = Instant::now() + Duration::from_secs(3);
    while locker.stats().renewal_calls == calls && Instant::now() < limit {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    // The slow shard's holder shortens its lock meanwhile (2.5 s: less than the renewal's 3 s).
    let slow_guard = guards.remove(0);
    let extending = tokio::spawn(async move {
        let extended = slow_guard.extend(Duration::from_millis(2500)).await;
        (slow_guard, extended)
    });
    let mut first_false: Vec<Option<Duration>> = vec![None; guards.len()];
    while started.elapsed() < Duration::from_millis(6000) {
        for (i, guard) in guards.iter().enumerate() {
            if first_false[i].is_none() && !guard.is_held() {
                first_false[i] = Some(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _: () = slow.cmd(&["CLIENT", "UNPAUSE"]);
    let (slow_guard, extended) = extending.await.unwrap();
    drop(slow_guard);
    drop(guards);
    assert!(
        first_false.iter().all(Option::is_none),
        "one primary paused for clients (watchdog lease 3 s, command timeout 2 s); its holder's \
         extend(2.5 s) sent while the round's renewal waited: {extended:?}; when each healthy \
         shard's guard first said not held, counted from the round: {first_false:?}"
    );
}

/// Finding O4 (N2's fix, incomplete; low): the `run_id` comparison ran only in `build()`,
/// for the nodes up at start-up; `build_lazy()` (and a node down at `build()`) compared
/// addresses only, so one server under two names (here a proxy; `localhost` and `127.0.0.1`
/// in a deployment) cast two votes. The third node is unreachable here, so a grant needs
/// both names of `a`: before the fix the acquire answered `Ok` ("Ok(guard) from a and a
/// through a proxy, b down").
///
/// Expected: each node's `run_id` is read before its first call, before its answer
/// counts, and one server named twice fails the acquire as `build()` fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o4_a_redlock_node_named_twice_is_refused_by_build_lazy_too() {
    let a = lock_testkit::RedisServer::start().unwrap();
    let b = lock_testkit::RedisServer::start().unwrap();
    let proxy = lock_testkit::FaultProxy::start(a.port()).await.unwrap();
    let to_b = lock_testkit::FaultProxy::start(b.port()).await.unwrap();
    let urls = vec![a.url(), proxy.url(), to_b.url()];
    let built = Locker::builder().redlock(urls.clone()).build();
    assert!(
        matches!(built.await, Err(LockError::Config(_))),
        "build() refuses it (N2)"
    );
    let lazy = Locker::builder()
        .redlock(urls)
        .build_lazy()
        .expect("build_lazy() cannot read run_ids; it accepts the addresses");
    to_b.set_mode(ProxyMode::Refuse).await;
    for attempt in 0..3 {
        let answer = lazy.lock("k").wait(Duration::ZERO).await;
        assert!(
            matches!(
                &answer,
                Err(LockError::Config(ConfigError::RedLockNodeTwice { first, second }))
                    if *first == a.url() && *second == proxy.url()
            ),
            "attempt {attempt}, redlock([a, a through a proxy, b]) with b down: {answer:?}"
        );
    }
    assert!(
        common::eventually(Duration::from_secs(2), || common::lock_key_opt(&a, "k")
            .is_none())
        .await,
        "the refused tries' grants on `a` are undone"
    );
}

/// O4's other shape: a node down when `build()` reads the `run_id`s, which turns out to be
/// another node's server once it is reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o4_a_redlock_node_down_at_build_and_named_twice_is_refused_once_reachable() {
    let a = lock_testkit::RedisServer::start().unwrap();
    let b = lock_testkit::RedisServer::start().unwrap();
    let proxy = lock_testkit::FaultProxy::start(a.port()).await.unwrap();
    let to_b = lock_testkit::FaultProxy::start(b.port()).await.unwrap();
    proxy.set_mode(ProxyMode::Refuse).await;
    let locker = Locker::builder()
        .redlock(vec![a.url(), proxy.url(), to_b.url()])
        .build()
        .await
        .expect("a majority (a, b) is up and distinct");
    let guard = locker.lock("before").wait(Duration::ZERO).await;
    assert!(guard.is_ok(), "a and b grant it: {guard:?}");
    proxy.set_mode(ProxyMode::Pass).await;
    to_b.set_mode(ProxyMode::Refuse).await;
    let answer = locker.lock("k").wait(Duration::ZERO).await;
    assert!(
        matches!(
            &answer,
            Err(LockError::Config(ConfigError::RedLockNodeTwice { .. }))
        ),
        "redlock([a, a through a proxy down at build(), b]), then the proxy up and b down: \
         {answer:?}"
    );
}
