//! Shared set-up of the integration tests: a fresh redis-server and locker per test.
#![allow(dead_code, unreachable_pub)]

pub mod child;

use std::time::Duration;

use lock_core::{LockError, LockGuard, Locker, LostReason};
use lock_testkit::oracle::Oracle;
use lock_testkit::RedisServer;
use redis::AsyncCommands;

pub fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server (apt-get install redis-server)")
}

pub async fn locker(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .build()
        .await
        .expect("connect locker")
}

pub async fn locker_with_lease(server: &RedisServer, lease: Duration) -> Locker {
    Locker::builder()
        .url(server.url())
        .watchdog_lease(lease)
        .build()
        .await
        .expect("connect locker")
}

/// A locker whose waiters try again only when a release message tells them: its fallback
/// retry (10 s) is beyond any test's wait, so a waiter that gets in was told.
pub async fn locker_woken_by_messages(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .fallback_retry(Duration::from_secs(10))
        .build()
        .await
        .expect("connect locker")
}

/// What an application that uses TLS does once at start-up: install the process's default
/// rustls `CryptoProvider` (the kit never installs one). Later calls change nothing.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The reason of a [`LockError::Lost`]; panics on any other error.
pub fn lost_reason(error: LockError) -> LostReason {
    match error {
        LockError::Lost { reason, .. } => reason,
        other => panic!("expected a lost lock, got: {other}"),
    }
}

/// The documented minimal ACL (`lock-core/src/acl.md`, which the crate docs include): the user
/// name and its rules, exactly as written there.
pub fn documented_acl() -> (String, Vec<String>) {
    let doc = include_str!("../../src/acl.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("user "))
        .expect("a `user ..` line in acl.md");
    let mut words = line.split_whitespace().skip(1).map(str::to_owned);
    let name = words.next().expect("a user name");
    (name, words.collect())
}

/// Creates the documented ACL user on `server` (as its `default` user), with its rules less
/// those `keep` refuses.
pub fn create_documented_user(server: &RedisServer, keep: impl Fn(&str) -> bool) -> String {
    let (name, rules) = documented_acl();
    let mut args = vec!["ACL", "SETUSER", name.as_str()];
    args.extend(rules.iter().map(String::as_str).filter(|r| keep(r)));
    let _: () = server.cmd(&args);
    name
}

/// The documented user's URL for `server` (the password of the documented rules).
pub fn documented_user_url(port: u16) -> String {
    let (name, rules) = documented_acl();
    let password = rules
        .iter()
        .find_map(|r| r.strip_prefix('>'))
        .expect("a `>password` rule");
    format!("redis://{name}:{password}@127.0.0.1:{port}/")
}

/// Every Redis key under `prefix`.
pub fn keys(server: &RedisServer, prefix: &str) -> Vec<String> {
    server.cmd(&["KEYS", &format!("{prefix}*")])
}

/// The Redis name of `key`'s lock (`lock:{tag}:lock:<key>`) on `server`, if it exists.
pub fn lock_key_opt(server: &RedisServer, key: &str) -> Option<String> {
    keys(server, "lock:")
        .into_iter()
        .find(|k| k.ends_with(&format!(":lock:{key}")))
}

/// The PTTL of `key`'s lock on `server` in ms (-2: no such key).
pub fn lock_pttl(server: &RedisServer, key: &str) -> i64 {
    lock_key_opt(server, key).map_or(-2, |name| server.cmd(&["PTTL", &name]))
}

/// The Redis name of `key`'s lock on `server` and its PTTL in ms, if the lock exists.
pub fn lock_key_pttl(server: &RedisServer, key: &str) -> Option<(String, i64)> {
    let name = lock_key_opt(server, key)?;
    let pttl: i64 = server.cmd(&["PTTL", &name]);
    Some((name, pttl))
}

/// A holder whose connection goes through a proxy that can hold, delay or drop its calls,
/// with `lease` as its watchdog lease, a 2 s command timeout and its scripts loaded, and
/// another locker straight to the server: `(server, proxy, holder, other)`.
pub async fn holder_behind_a_proxy(
    lease: Duration,
) -> (RedisServer, lock_testkit::FaultProxy, Locker, Locker) {
    let server = server();
    let proxy = lock_testkit::FaultProxy::start(server.port())
        .await
        .unwrap();
    let holder = Locker::builder()
        .url(proxy.url())
        .watchdog_lease(lease)
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let other = locker(&server).await;
    load_scripts(&holder).await;
    (server, proxy, holder, other)
}

/// A primary and its replica, which replicates through a proxy (`link`) that can slow or cut
/// the replication link: `(primary, replica, link)`, the replica attached.
pub async fn replica_behind_a_proxy() -> (RedisServer, RedisServer, lock_testkit::FaultProxy) {
    let primary = server();
    let replica = server();
    let link = lock_testkit::FaultProxy::start(primary.port())
        .await
        .unwrap();
    attach_replica(&replica, link.port()).await;
    (primary, replica, link)
}

/// A locker on `front` (a proxy before a primary with a replica) with `min_replicas(1, 400
/// ms)`, a 1 s command timeout and `connect` as its connect timeout.
pub async fn replicated_locker_via(front: &lock_testkit::FaultProxy, connect: Duration) -> Locker {
    Locker::builder()
        .url(front.url())
        .min_replicas(1, Duration::from_millis(400))
        .command_timeout(Duration::from_secs(1))
        .connect_timeout(connect)
        .build()
        .await
        .unwrap()
}

/// `key` locked with `min_replicas` once the replica acknowledges (it may still be catching
/// up after its sync): tried every 100 ms for up to 5 s.
pub async fn replicated_lock(locker: &Locker, key: &str) -> LockGuard {
    replicated_lock_leased(locker, key, None).await
}

/// [`replicated_lock`], with a fixed `lease` when given (no watchdog).
pub async fn replicated_lock_leased(
    locker: &Locker,
    key: &str,
    lease: Option<Duration>,
) -> LockGuard {
    let mut last = None;
    for _ in 0..50 {
        let acquire = locker.lock(key).wait(Duration::ZERO);
        let acquire = match lease {
            Some(lease) => acquire.lease(lease),
            None => acquire,
        };
        match acquire.await {
            Ok(guard) => return guard,
            Err(error) => last = Some(error),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no replicated lock while the replica is up: {last:?}");
}

/// The Redis name of the lock of `key` (the only `:lock:` key for it).
pub fn lock_key(server: &RedisServer, key: &str) -> String {
    keys(server, "lock:")
        .into_iter()
        .find(|k| k.ends_with(&format!(":lock:{key}")))
        .expect("lock key exists")
}

/// Loads the scripts of an acquire, a renewal (an extension) and a release into the server's
/// cache through `locker`, so that a test's later calls are one round trip each.
pub async fn load_scripts(locker: &Locker) {
    let warm = locker.lock("warm").await.unwrap();
    warm.extend(Duration::from_secs(5)).await.unwrap();
    warm.release().await.unwrap();
}

/// What Sentinel does at once to the other replicas of a deployment with more than one: a
/// replica (`extra`) follows the promoted primary on `port`. Returns once its link is up.
pub async fn attach_replica(extra: &RedisServer, port: u16) {
    let _: () = extra.cmd(&["REPLICAOF", "127.0.0.1", &port.to_string()]);
    assert!(
        eventually(Duration::from_secs(10), || {
            extra
                .try_cmd::<String>(&["INFO", "replication"])
                .is_ok_and(|info| info.contains("master_link_status:up"))
        })
        .await,
        "the extra replica did not attach"
    );
}

/// Freezes the server at `url` for `seconds` (`DEBUG SLEEP`, sent on a connection of its own
/// from a blocking thread); the handle ends when the server answers it.
pub fn freeze(url: String, seconds: &str) -> tokio::task::JoinHandle<()> {
    let seconds = seconds.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(seconds)
            .query(&mut conn)
            .unwrap();
    })
}

/// Polls `cond` every 5 ms until it holds or `limit` passes; returns whether it held.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}

/// Read-modify-write increments of the Redis counter `counter-value` by `tasks` tasks, each
/// `per_task` times, under the lock `counter` (or without it, as the control). Between the
/// read and the write each task yields (`pause` zero) or sleeps `pause`, so unprotected updates
/// interleave. Every section also goes through the double-holder `oracle` (the control enters
/// with a made-up token and no lock). Returns the final counter.
pub async fn increments(
    locker: &Locker,
    url: &str,
    oracle: &Oracle,
    tasks: usize,
    per_task: usize,
    locked: bool,
    pause: Duration,
) -> i64 {
    let client = redis::Client::open(url).unwrap();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (locker, client, oracle) = (locker.clone(), client.clone(), oracle.clone());
        handles.push(tokio::spawn(async move {
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            for _ in 0..per_task {
                let guard = if locked {
                    Some(
                        locker
                            .lock("counter")
                            .wait(Duration::from_secs(30))
                            .await
                            .unwrap(),
                    )
                } else {
                    None
                };
                let increment = async {
                    let value: i64 = conn.get("counter-value").await.unwrap_or(0);
                    if pause.is_zero() {
                        tokio::task::yield_now().await;
                    } else {
                        tokio::time::sleep(pause).await;
                    }
                    let _: () = conn.set("counter-value", value + 1).await.unwrap();
                };
                let fence = match &guard {
                    Some(guard) => guard.fencing_token().await.unwrap(),
                    None => 1,
                };
                let held = || guard.as_ref().is_none_or(LockGuard::is_held);
                oracle
                    .section("counter", fence, held, increment)
                    .await
                    .unwrap();
                if let Some(guard) = guard {
                    guard.release().await.unwrap();
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    conn.get("counter-value").await.unwrap()
}

/// The end state every test must reach: the lockers hold, queue, renew and subscribe nothing,
/// and the server has no lock key, no key without an expiry and no subscribed channel under
/// `lock:`. Subscriptions linger 500 ms after their last use, hence the polling.
pub async fn assert_nothing_left(server: &RedisServer, lockers: &[&Locker]) {
    assert_nothing_left_under(server, "lock:", &[], lockers).await;
}

/// [`assert_nothing_left`] under another key prefix, not counting keys that end in one of
/// `allowed` (e.g. a RedLock node's `node-epoch`).
pub async fn assert_nothing_left_under(
    server: &RedisServer,
    prefix: &str,
    allowed: &[&str],
    lockers: &[&Locker],
) {
    lock_testkit::assert_nothing_left(server, prefix, allowed, || busy(lockers)).await;
}

/// `None` when every locker is idle (no watchdog entry, local key or subscription), else their
/// counters.
fn busy(lockers: &[&Locker]) -> Option<String> {
    let counters: Vec<_> = lockers
        .iter()
        .map(|l| {
            (
                l.stats().watchdog_locks,
                l.stats().local_keys,
                l.stats().subscriptions,
            )
        })
        .collect();
    counters
        .iter()
        .any(|c| *c != (0, 0, 0))
        .then(|| format!("per locker (watchdog locks, local keys, subscriptions): {counters:?}"))
}

/// [`assert_nothing_left`] on every live primary of `cluster` (pub/sub channels are per node).
pub async fn assert_cluster_clean(cluster: &lock_testkit::RedisCluster, lockers: &[&Locker]) {
    for primary in cluster.current_primaries().unwrap() {
        if primary.is_running() && !primary.is_paused() {
            assert_nothing_left(primary, lockers).await;
        }
    }
}

/// How a waiter in another locker learns of a release: `waiter` waits for `guard`'s key (give
/// its locker a long fallback retry, so that only the release message can wake it quickly).
/// Once `subscribed` says its subscription is on the server, and 200 ms later it is still
/// waiting, the guard is released. Returns the time from the release to the waiter's acquire,
/// and the waiter's fencing token.
pub async fn wake_up_after_release(
    guard: LockGuard,
    waiter: &Locker,
    subscribed: impl Fn() -> bool,
) -> (Duration, u64) {
    let key = guard.key().to_owned();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let g = waiter
                .lock(key)
                .wait(Duration::from_secs(20))
                .await
                .unwrap();
            let at = std::time::Instant::now();
            let token = g.fencing_token().await.unwrap();
            g.release().await.unwrap();
            (at, token)
        }
    });
    let started = std::time::Instant::now();
    while !subscribed() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the waiter never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "the waiter got a held lock");
    let released = std::time::Instant::now();
    guard.release().await.unwrap();
    let (acquired, token) = waiting.await.unwrap();
    (acquired - released, token)
}

/// The cluster slot of user key `key`'s lock and companions: the kit tags every Redis name of
/// a key with the first 16 hex digits of the key's SHA-1.
pub fn kit_slot(key: &str) -> u16 {
    let digest = sha1_smol::Sha1::from(key.as_bytes()).digest().to_string();
    lock_testkit::key_slot(format!("{{{}}}", &digest[..16]).as_bytes())
}

/// `per_shard` user keys `<stem><n>` for every primary of `cluster`, grouped by primary (in
/// the order of [`lock_testkit::RedisCluster::current_primaries`]).
pub fn keys_on_every_shard(
    cluster: &lock_testkit::RedisCluster,
    stem: &str,
    per_shard: usize,
) -> Vec<Vec<String>> {
    let primaries: Vec<u16> = cluster
        .current_primaries()
        .unwrap()
        .iter()
        .map(|p| p.port())
        .collect();
    let mut by_shard = vec![Vec::new(); primaries.len()];
    for n in 0..10_000 {
        if by_shard
            .iter()
            .all(|keys: &Vec<String>| keys.len() >= per_shard)
        {
            return by_shard;
        }
        let key = format!("{stem}{n}");
        let port = cluster.primary_for_slot(kit_slot(&key)).unwrap().port();
        let shard = primaries.iter().position(|p| *p == port).unwrap();
        if by_shard[shard].len() < per_shard {
            by_shard[shard].push(key);
        }
    }
    panic!("no {per_shard} keys per shard among 10,000");
}

/// Asserts that the lock key of every one of `keys` is on the primary [`kit_slot`] says
/// (they are held now): the keys really are spread as chosen.
pub fn assert_locks_on_their_shards(cluster: &lock_testkit::RedisCluster, keys: &[String]) {
    for key in keys {
        let primary = cluster.primary_for_slot(kit_slot(key)).unwrap();
        let found: Vec<String> = primary.cmd(&["KEYS", &format!("lock:*:lock:{key}")]);
        assert_eq!(
            found.len(),
            1,
            "the lock of {key} is not on port {}",
            primary.port()
        );
    }
}

/// A guard used in another task, where it stays (its lock is then not reentrant for the task
/// that took it): see [`lend`].
pub struct Lent {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// Moves `guard` into a task that uses it (`is_held()`, which must be true), then keeps it
/// until [`Lent::give_back`], or for `at_most` when given, and drops it there. Returns once
/// the guard was used.
pub async fn lend(guard: LockGuard, at_most: Option<Duration>) -> Lent {
    let (used, used_rx) = tokio::sync::oneshot::channel();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        assert!(guard.is_held());
        used.send(()).unwrap();
        match at_most {
            Some(at_most) => drop(tokio::time::timeout(at_most, stop_rx).await),
            None => drop(stop_rx.await),
        }
        drop(guard);
    });
    used_rx.await.unwrap();
    Lent { stop, task }
}

impl Lent {
    /// Has the task drop the guard now, and waits until it did.
    pub async fn give_back(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }

    /// Waits until the task dropped the guard (after its `at_most`).
    pub async fn dropped(self) {
        self.task.await.unwrap();
    }
}
