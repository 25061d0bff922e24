//! A review of N4's third fix (968703a): the writes followed by `WAIT` of acquires,
//! extensions, handoff renewals and Sentinel releases go on connections of their own, from a
//! pool of eight per locker (`store/wait.rs`). Each test shows one finding and fails on
//! 968703a (and passes on its parent 4effc48: each is a regression); its doc comment says
//! what it shows. X1 (dead idle connections) has three tests: an extension, a zero-wait
//! acquire after a restart, a Sentinel release. X2 was a suspicion that did not hold
//! (Redis 7 moves a client's `WAIT` offset to the server's on every command, so a `WAIT`
//! on a connection that wrote nothing still waits for other connections' earlier writes)
//! and has no test.
//!
//! Fixed after this read (RELIABILITY, "A thirteenth read"): a connection found dropped
//! closes the idle ones with it (X1); a cluster sends its writes and `WAIT`s on its shared
//! connection again, one connection to each primary, and has no pool (X3); a pool connection
//! is opened with one try within the connect timeout (X4).
//!
//! Since E1 and E2 (`review_e.rs`) explicit extensions go on the shared connection again:
//! the tests here that extend now meet it, not the pool (`y2_acquires_..` keeps Y2's check
//! on the pool through acquires; X1's restart and Sentinel release tests keep X1's).

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lock_core::{LockError, Locker};
use lock_testkit::ProxyMode;

/// A burst of `n` acquires of distinct keys at once while the replica's link is slow, so
/// that each one's [write, `WAIT`] is under way at the same time and the pool opens a
/// connection for each (up to its eight); all released again. Returns the answers counted.
async fn burst(
    locker: &Locker,
    link: &lock_testkit::FaultProxy,
    n: usize,
) -> BTreeMap<String, usize> {
    link.set_mode(ProxyMode::Delay(Duration::from_millis(50)))
        .await;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let locker = locker.clone();
            tokio::spawn(async move {
                match locker
                    .lock(format!("burst{i}"))
                    .wait(Duration::from_secs(5))
                    .await
                {
                    Ok(guard) => {
                        let _ = guard.release().await;
                        "Ok".to_owned()
                    }
                    Err(e) => e.to_string(),
                }
            })
        })
        .collect();
    let mut answers = BTreeMap::<String, usize>::new();
    for task in tasks {
        *answers.entry(task.await.unwrap()).or_default() += 1;
    }
    link.set_mode(ProxyMode::Pass).await;
    answers
}

/// The error text with the lock's name cut out.
fn shown<T>(answer: &Result<T, LockError>) -> String {
    match answer {
        Ok(_) => "Ok".to_owned(),
        Err(e) => e.to_string(),
    }
}

/// Finding X1: the pool keeps idle connections for good and lends them without a look, so
/// a connection the server closed while it sat idle (the server's `timeout` setting, a
/// restart, `CLIENT KILL`, a load balancer's idle cut) is lent as if alive. Its call fails
/// as a dropped connection; the connection is then closed and the retry lends the next idle
/// one, dead too. An extension tries three times (`retry_dropped`: the first try and two
/// retries 5 ms and 50 ms later), so with three or more dead idle connections in the pool
/// every `extend()` fails, on a server that is up and answers at once. The shared
/// connection of 4effc48 (which carried extensions) was closed the same way, but a
/// connection manager's dead connection costs one failed try, the retry finds the
/// reconnected one: the extension succeeded.
///
/// Interleaving: eight acquires at once (replica link 50 ms each way, so their `WAIT`s
/// overlap and the pool opens eight connections) fill the pool; the link is fast again; the
/// server closes clients idle for a second (`CONFIG SET timeout 1`; the shared connection,
/// idle too, is closed alike); 3 s later, `timeout 0` again, the holder of a lock taken before
/// extends it.
///
/// Expected: `extend(10 s)` is `Ok` (the server is up, the replica in sync). Fixed: the
/// first try's dropped connection closes the idle ones, and the retry opens a live one
/// ("extend(10 s): \"Ok\" after 7.990752ms").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_an_extension_after_the_server_closed_idle_connections_succeeds() {
    let (primary, _replica, link) = common::replica_behind_a_proxy().await;
    let locker = Locker::builder()
        .url(primary.url())
        .min_replicas(1, Duration::from_millis(400))
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let held = common::replicated_lock(&locker, "h").await;
    let burst = burst(&locker, &link, 8).await;
    let clients_after_burst = primary.client_count();
    let _: () = primary.cmd(&["CONFIG", "SET", "timeout", "1"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _: () = primary.cmd(&["CONFIG", "SET", "timeout", "0"]);
    let clients_after_idle_cut = primary.client_count();
    let asked = Instant::now();
    let extended = held.extend(Duration::from_secs(10)).await;
    let took = asked.elapsed();
    let h_in_redis = common::lock_key_pttl(&primary, "h");
    let observed = format!(
        "burst of 8 acquires: {burst:?}; clients of the primary then {clients_after_burst}, \
         after the server closed those idle 1 s {clients_after_idle_cut}; extend(10 s): {:?} \
         after {took:?}; h on the primary {h_in_redis:?}",
        shown(&extended)
    );
    lock_testkit::figure(&format!("X1: {observed}"));
    assert!(extended.is_ok(), "{observed}");
}

/// Finding X1, with a restart: the same dead idle connections after the server restarted.
/// Every idle pool connection is dead; an acquire meets them one after the other, each try a
/// dropped connection (transient: the acquire sends again after 20, 40, 80.. ms), so a
/// zero-wait acquire (one command timeout plus the `WAIT`'s for its tries) runs out of time
/// before it reaches a live connection. On 4effc48 the shared connection's first try failed
/// the same way and the retry 20 ms later went on the reconnected connection.
///
/// Interleaving: eight acquires at once fill the pool (as in X1); the primary restarts (no
/// persistence; the replica re-syncs); once the replica is linked again, one acquire with a
/// zero wait (command timeout 500 ms, `min_replicas(1, 200 ms)`).
///
/// Expected: `Ok` (the server and its replica are up). Fixed as the extension above
/// ("zero-wait acquire of k: \"Ok\" after 22.140207ms").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_a_zero_wait_acquire_after_a_server_restart_succeeds() {
    let (mut primary, replica, link) = common::replica_behind_a_proxy().await;
    let locker = Locker::builder()
        .url(primary.url())
        .min_replicas(1, Duration::from_millis(400))
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    common::replicated_lock(&locker, "warm")
        .await
        .release()
        .await
        .unwrap();
    let burst = burst(&locker, &link, 8).await;
    let clients_before_restart = primary.client_count();
    primary.restart().unwrap();
    // Linked, and acknowledging: the replica's last acknowledged offset is the primary's (a
    // replica just through its full sync can take a moment more on a loaded machine, and an
    // acquire then is rightly `NotReplicated`).
    let linked = common::eventually(Duration::from_secs(10), || {
        replica
            .try_cmd::<String>(&["INFO", "replication"])
            .is_ok_and(|info| info.contains("master_link_status:up"))
            && primary
                .try_cmd::<String>(&["INFO", "replication"])
                .is_ok_and(|info| replica_caught_up(&info))
    })
    .await;
    let asked = Instant::now();
    let answer = locker.lock("k").wait(Duration::ZERO).await;
    let took = asked.elapsed();
    let shown = shown(&answer);
    drop(answer);
    // Control: the same acquire again, now that the dead connections are used up.
    let again = locker.lock("k2").wait(Duration::ZERO).await;
    let observed = format!(
        "burst of 8 acquires: {burst:?}; clients of the primary then {clients_before_restart}; primary restarted, replica linked again: {linked}; \
         zero-wait acquire of k: {shown:?} after {took:?}; the next one (k2): {:?}",
        self::shown(&again)
    );
    lock_testkit::figure(&format!("X1 (restart): {observed}"));
    assert_eq!(shown, "Ok", "{observed}");
}

/// Finding X3: on a cluster, the pool's eight connections are shared by every shard, so one
/// shard that stops answering starves the others. Each pool connection is a whole cluster
/// connection, and each call holds one of the eight permits until it answers: acquires of
/// keys on a frozen primary hold them for a command timeout each (then the connection is
/// closed and their acquire loop sends again, queueing for a permit again), and every acquire
/// or extension of a key on a healthy shard queues behind them for a permit, and then may
/// have to open a new cluster connection (which connects to every node, the frozen one too).
/// On 4effc48 every call went on the shared cluster connection, whose per-node connections are
/// independent: a healthy shard answered in milliseconds (N7 made sure a slow shard "only
/// affects its own locks").
///
/// Interleaving: a cluster of three primaries with a replica each, `min_replicas(1, 200 ms)`,
/// command timeout 1 s. One primary is paused for clients (`CLIENT PAUSE 6000 ALL`); twelve
/// tasks acquire keys of that shard (each allowed to wait 5 s). 300 ms later, five acquires
/// of keys on a healthy shard, one after the other, each with a zero wait (one try).
///
/// Expected: the healthy shard's acquires are `Ok` within milliseconds, as on 4effc48.
/// Fixed: a cluster has no pool; its writes and `WAIT`s go on the shared connection, one
/// connection to each primary, as on 4effc48 ("Ok after 860.21µs", then four more `Ok`
/// under 400 µs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x3_a_frozen_cluster_shard_does_not_starve_the_acquires_of_healthy_shards() {
    let cluster = lock_testkit::RedisCluster::start(3, 1).unwrap();
    let locker = Locker::builder()
        .cluster(cluster.urls())
        .min_replicas(1, Duration::from_millis(200))
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let shards = common::keys_on_every_shard(&cluster, "v", 12);
    for keys in &shards {
        common::replicated_lock(&locker, &keys[0])
            .await
            .release()
            .await
            .unwrap();
    }
    let frozen = cluster
        .primary_for_slot(common::kit_slot(&shards[0][0]))
        .unwrap();
    let _: () = frozen.cmd(&["CLIENT", "PAUSE", "6000", "ALL"]);
    let stuck: Vec<_> = shards[0]
        .iter()
        .map(|key| {
            let (locker, key) = (locker.clone(), key.clone());
            tokio::spawn(async move {
                let _ = locker.lock(key.as_str()).wait(Duration::from_secs(5)).await;
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut healthy = Vec::new();
    let mut all_quick_and_ok = true;
    for key in &shards[1][1..6] {
        let asked = Instant::now();
        let answer = locker.lock(key.as_str()).wait(Duration::ZERO).await;
        let took = asked.elapsed();
        let shown = match answer {
            Ok(guard) => {
                let _ = guard.release().await;
                "Ok".to_owned()
            }
            Err(e) => e.to_string().replace(&format!("`{key}`"), "`v..`"),
        };
        all_quick_and_ok &= shown == "Ok" && took < Duration::from_millis(500);
        healthy.push(format!("{shown} after {took:?}"));
    }
    let _: () = frozen.cmd(&["CLIENT", "UNPAUSE"]);
    for task in stuck {
        let _ = task.await;
    }
    let observed = format!(
        "one primary of three paused for clients, 12 acquires of its keys under way; 5 \
         zero-wait acquires of keys on a healthy shard, one after the other: {healthy:?}"
    );
    lock_testkit::figure(&format!("X3: {observed}"));
    assert!(all_quick_and_ok, "{observed}");
}

/// Finding X1 on Sentinel: releases go to the pool there, so a release meets the dead idle
/// connections too. `release_sent` tries three times (the first try and two retries after a
/// dropped connection), each on the next dead idle connection, and the release answers an
/// error for a lock that is free in Redis a moment later (the background releaser sends it
/// again). On 4effc48 the release went on the shared connection: one dropped try, the retry on
/// the reconnected connection, `Ok`.
///
/// Interleaving: Sentinel deployment (a primary, a replica), `min_replicas(1, 400 ms)`; `h`
/// taken, then eight acquires at once fill the pool; the primary closes clients idle for a
/// second (`CONFIG SET timeout 1`, 3 s); the holder releases `h`.
///
/// Expected: `release()` is `Ok`. Fixed as the extension above ("h's release: \"Ok\" after
/// 7.322046ms; h on the primary right after None").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_a_sentinel_release_after_the_server_closed_idle_connections_is_ok() {
    let sentinel = lock_testkit::RedisSentinel::start("locks").unwrap();
    let locker = Locker::builder()
        .sentinel(sentinel.master_name(), sentinel.sentinel_urls())
        .min_replicas(1, Duration::from_millis(400))
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let held = common::replicated_lock(&locker, "h").await;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let locker = locker.clone();
            tokio::spawn(async move {
                match locker
                    .lock(format!("b{i}"))
                    .wait(Duration::from_secs(5))
                    .await
                {
                    Ok(guard) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        shown(&guard.release().await)
                    }
                    Err(e) => e.to_string(),
                }
            })
        })
        .collect();
    let mut burst = BTreeMap::<String, usize>::new();
    for task in tasks {
        *burst.entry(task.await.unwrap()).or_default() += 1;
    }
    let primary = sentinel.master();
    let clients_after_burst = primary.client_count();
    let _: () = primary.cmd(&["CONFIG", "SET", "timeout", "1"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _: () = primary.cmd(&["CONFIG", "SET", "timeout", "0"]);
    let asked = Instant::now();
    let released = held.release().await;
    let took = asked.elapsed();
    let h_right_after = common::lock_key_pttl(primary, "h");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let h_later = common::lock_key_pttl(primary, "h");
    let observed = format!(
        "8 acquires and releases at once: {burst:?}; clients of the primary then \
         {clients_after_burst}; the server closed those idle 1 s; h's release: {:?} after \
         {took:?}; h on the primary right after {h_right_after:?}, 2 s later {h_later:?}",
        shown(&released)
    );
    lock_testkit::figure(&format!("X1 (sentinel release): {observed}"));
    assert!(released.is_ok(), "{observed}");
}

/// Finding X4: a pool call that must open a connection is bounded by the connection manager's
/// connect retries, not by the command timeout: while the server is unreachable (a network
/// partition that drops packets) every extension (and handoff confirmation, and release on
/// Sentinel) hangs for about three connect timeouts (`ConnectionManager::new_with_config`
/// with `set_number_of_retries(2)`: three attempts of `connect_timeout` each, with backoff
/// between them) instead of failing after the command timeout. The first call through the
/// partition times out on its idle pool connection and closes it; from then on the pool has
/// no idle connection, and each call opens one first. Nothing bounds `extend()` from outside.
/// On 4effc48 an extension went on the shared connection and failed after the command timeout.
///
/// Interleaving: the locker reaches the primary through a proxy (command timeout 1 s, connect
/// timeout 2 s, `min_replicas(1, 400 ms)`); `h` taken with a 30 s lease; the proxy becomes a
/// blackhole; `extend(30 s)` three times in a row.
///
/// Expected: each extension answers (an error) within about the command timeout plus the
/// `WAIT`'s, as on 4effc48 (about 1 s each). Fixed: a pool connection is opened with one
/// try, within the connect timeout, so a call that must open one answers within it (here
/// 2 s: "after 1.001633566s", "after 2.001795799s", "after 2.001498211s"); the threshold
/// below allows that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x4_an_extension_through_a_partition_fails_within_the_command_timeout() {
    let (primary, _replica, _link) = common::replica_behind_a_proxy().await;
    let front = lock_testkit::FaultProxy::start(primary.port())
        .await
        .unwrap();
    let locker = common::replicated_locker_via(&front, Duration::from_secs(2)).await;
    let held = common::replicated_lock_leased(&locker, "h", Some(Duration::from_secs(30))).await;
    front.set_mode(ProxyMode::Hole).await;
    let mut answers = Vec::new();
    let mut slowest = Duration::ZERO;
    for _ in 0..3 {
        let asked = Instant::now();
        let answer = held.extend(Duration::from_secs(30)).await;
        let took = asked.elapsed();
        slowest = slowest.max(took);
        answers.push(format!("{:?} after {took:?}", shown(&answer)));
    }
    front.set_mode(ProxyMode::Pass).await;
    let observed = format!(
        "the locker's link to the primary a blackhole (command timeout 1 s, connect timeout \
         2 s, min_replicas 400 ms); three extend(30 s) in a row: {answers:?}"
    );
    lock_testkit::figure(&format!("X4: {observed}"));
    drop(held);
    assert!(slowest < Duration::from_millis(2500), "{observed}");
}

/// Whether `INFO replication` of a primary shows one replica online whose acknowledged
/// offset is the primary's own.
fn replica_caught_up(info: &str) -> bool {
    let field = |line: &str, name: &str| {
        line.split([',', ':'])
            .find_map(|part| part.strip_prefix(name))
            .map(|value| value.trim().to_owned())
    };
    let own = info
        .lines()
        .find_map(|line| line.strip_prefix("master_repl_offset:"))
        .map(|value| value.trim().to_owned());
    let acked = info
        .lines()
        .find(|line| line.starts_with("slave0:") && line.contains("state=online"))
        .and_then(|line| field(line, "offset="));
    own.is_some() && own == acked
}
