//! Operating a locker in a service: built before Redis is up (lazy connect), shut down with
//! everything it holds given back at once (graceful shutdown, rolling restarts), and refused
//! on a Redis too old for it (the machine has one Redis version: a `VersionProxy` makes it
//! report another).

use crate::common;

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use common::{assert_nothing_left, locker, server};
use lock_core::{ConfigError, LockError, LockGuard, Locker, LostReason};
use lock_testkit::{free_port, FaultProxy, ProxyMode, RedisServer, VersionProxy};

/// Tries `acquire` until it succeeds or `limit` passes; the last error otherwise.
async fn first_ok<T, F, Fut>(limit: Duration, mut acquire: F) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, LockError>>,
{
    let start = Instant::now();
    loop {
        match acquire().await {
            Ok(value) => return Ok(value),
            Err(error) if start.elapsed() >= limit => return Err(error),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// A locker built while nothing listens on its port exists, fails its acquires fast with a
/// backend error, and works once a Redis server comes up there, without being rebuilt: locks,
/// releases, excludes another locker, and its waiters are woken over pub/sub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_locker_works_once_redis_comes_up() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let lazy = Locker::builder()
        .url(&url)
        .connect_timeout(Duration::from_millis(200))
        .command_timeout(Duration::from_millis(300))
        .build_lazy()
        .expect("a lazy locker needs no server");

    let mut slowest = Duration::ZERO;
    for _ in 0..3 {
        let started = Instant::now();
        let error = lazy
            .lock("lazy:k")
            .wait(Duration::ZERO)
            .await
            .expect_err("no server yet");
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert!(error.is_backend(), "expected a backend error, got {error}");
        assert!(
            took < Duration::from_secs(1),
            "an acquire without a server took {took:?}"
        );
    }

    let server = RedisServer::start_on(port).expect("start redis-server on the reserved port");
    let up = Instant::now();
    let guard = first_ok(Duration::from_secs(5), || {
        lazy.lock("lazy:k")
            .wait(Duration::from_secs(1))
            .into_future()
    })
    .await
    .expect("the lazy locker acquires once redis is up");
    lock_testkit::figure(&format!(
        "lazy connect: acquire without a server failed in at most {slowest:?} \
         (command timeout 300 ms); first acquire after the server was up took {:?}",
        up.elapsed()
    ));
    assert!(guard.is_held());
    assert_eq!(server.keys("lock:*:lock:lazy:k").len(), 1);

    // Exclusive against a locker of another process (another connection).
    let other = locker(&server).await;
    let busy = other.lock("lazy:k").wait(Duration::ZERO).await;
    assert!(
        matches!(busy, Err(LockError::Busy { .. })),
        "{busy:?}: the key is held by the lazy locker"
    );
    guard
        .release()
        .await
        .expect("release through the lazy connection");

    // The other way round: the lazy locker waits, subscribed over its own pub/sub connection,
    // and is woken by the other locker's release.
    let held = other.lock("lazy:k").await.unwrap();
    let waiter = {
        let lazy = lazy.clone();
        tokio::spawn(async move { lazy.lock("lazy:k").wait(Duration::from_secs(10)).await })
    };
    assert!(
        common::eventually(Duration::from_secs(5), || server
            .pubsub_channels()
            .iter()
            .any(|c| c.ends_with(":released:lazy:k")))
        .await,
        "the lazy locker never subscribed to the release channel"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let woken = waiter.await.unwrap().expect("the waiter gets the lock");
    let handoff = released_at.elapsed();
    assert!(
        handoff < Duration::from_millis(500),
        "woken {handoff:?} after the release: not by the release message"
    );
    woken.release().await.unwrap();
    assert_nothing_left(&server, &[&lazy, &other]).await;
}

/// `connect_lazy` is the one-line form: it checks the URL, connects nothing.
#[tokio::test]
async fn connect_lazy_checks_the_url_only() {
    let port = free_port();
    let locker = Locker::connect_lazy(&format!("redis://127.0.0.1:{port}/"))
        .expect("nothing listens, and that is fine");
    assert_eq!(locker.stats().local_keys, 0);
    let refused = Locker::connect_lazy("nonsense://");
    assert!(
        matches!(refused, Err(LockError::Config(ConfigError::Url(_)))),
        "{refused:?}"
    );
}

/// `build_lazy` validates the configuration as `build` does, before anything else.
#[tokio::test]
async fn build_lazy_validates_the_configuration() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let bad_prefix = Locker::builder().url(&url).prefix("{x}").build_lazy();
    assert!(
        matches!(
            bad_prefix,
            Err(LockError::Config(ConfigError::Prefix { .. }))
        ),
        "{bad_prefix:?}"
    );
    let bad_lease = Locker::builder()
        .url(&url)
        .watchdog_lease(Duration::ZERO)
        .build_lazy();
    assert!(
        matches!(
            bad_lease,
            Err(LockError::Config(ConfigError::OutOfRange { .. }))
        ),
        "{bad_lease:?}"
    );
    let no_url = Locker::builder().build_lazy();
    assert!(
        matches!(no_url, Err(LockError::Config(ConfigError::MissingUrl))),
        "{no_url:?}"
    );
}

/// Cluster and Sentinel need a first answer (the slot map, the primary's address) before
/// they can route anything: `build_lazy` refuses them with a configuration error that says so.
#[tokio::test]
async fn build_lazy_refuses_cluster_and_sentinel() {
    let seeds = [format!("redis://127.0.0.1:{}/", free_port())];
    let cluster = Locker::builder().cluster(seeds.clone()).build_lazy();
    assert!(
        matches!(
            cluster,
            Err(LockError::Config(ConfigError::LazyTopology {
                topology: "cluster"
            }))
        ),
        "{cluster:?}"
    );
    let sentinel = Locker::builder().sentinel("locks", seeds).build_lazy();
    assert!(
        matches!(
            sentinel,
            Err(LockError::Config(ConfigError::LazyTopology {
                topology: "sentinel"
            }))
        ),
        "{sentinel:?}"
    );
}

/// RedLock lazily: every node is connected on first use, so a locker built while all of them
/// are down works once a majority is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_redlock_locker_works_once_a_majority_is_up() {
    let ports = [free_port(), free_port(), free_port()];
    let lazy = Locker::builder()
        .redlock(ports.map(|p| format!("redis://127.0.0.1:{p}/")))
        .connect_timeout(Duration::from_millis(200))
        .command_timeout(Duration::from_millis(300))
        .build_lazy()
        .expect("a lazy redlock locker needs no node");
    let error = lazy
        .lock("lazy:r")
        .wait(Duration::ZERO)
        .await
        .expect_err("no node up");
    assert!(error.is_backend(), "{error}");

    let nodes: Vec<RedisServer> = ports[..2]
        .iter()
        .map(|&p| RedisServer::start_on(p).expect("start a node"))
        .collect();
    let guard = first_ok(Duration::from_secs(5), || {
        lazy.lock("lazy:r")
            .wait(Duration::from_secs(1))
            .into_future()
    })
    .await
    .expect("a majority is up");
    for node in &nodes {
        assert_eq!(node.keys("lock:*:lock:lazy:r").len(), 1);
    }
    guard.release().await.unwrap();
    for node in &nodes {
        assert_nothing_left(node, &[&lazy]).await;
    }
}

/// Outside a tokio runtime there is nothing to run the background tasks on: an error, not a
/// panic.
#[test]
fn a_lazy_locker_outside_a_runtime_is_an_error() {
    let refused = Locker::connect_lazy("redis://127.0.0.1:1/");
    assert!(
        matches!(refused, Err(LockError::Config(ConfigError::NoRuntime))),
        "{refused:?}"
    );
}

/// Every kind a locker can hold, each in its own task that waits for its guard's `lost()`
/// and then releases (a nested guard inside the first); returns, per task, the loss reason
/// and what the release answered.
type Holder = tokio::task::JoinHandle<(Option<LostReason>, Vec<Result<(), LockError>>)>;

async fn hold_every_kind(locker: &Locker) -> Vec<Holder> {
    let mut holders = Vec::new();
    for kind in 0..5 {
        let locker = locker.clone();
        let (ready, held) = tokio::sync::oneshot::channel();
        holders.push(tokio::spawn(async move {
            let mut guards = match kind {
                0 => {
                    let outer = locker.lock("shut:a").await.unwrap();
                    let nested = locker.lock("shut:a").await.unwrap();
                    vec![nested, outer]
                }
                1 => vec![locker
                    .lock("shut:b")
                    .lease(Duration::from_secs(60))
                    .await
                    .unwrap()],
                2 => vec![locker.semaphore("shut:s", 2).acquire().await.unwrap()],
                3 => vec![locker.read("shut:r").await.unwrap()],
                _ => vec![locker.fair_lock("shut:f").await.unwrap()],
            };
            ready.send(()).unwrap();
            let lost = tokio::time::timeout(Duration::from_secs(10), guards[0].lost()).await;
            assert!(lost.is_ok(), "lost() of kind {kind} never fired");
            let reason = guards[0].lost_reason();
            let mut released = Vec::new();
            for guard in guards.drain(..) {
                released.push(guard.release().await);
            }
            (reason, released)
        }));
        held.await.expect("the holder got its lock");
    }
    holders
}

/// The Redis keys that hold something for this test's keys (locks, readers, semaphore
/// holders, lines), leaving out `except` (another locker's) and the releases' latches.
fn held_keys(server: &RedisServer, except: &str) -> Vec<String> {
    server
        .keys("lock:*")
        .into_iter()
        .filter(|k| !k.contains(except) && !k.contains(":unlocked:") && !k.contains(":fence:"))
        .collect()
}

/// Shutdown gives back at once everything the locker holds (mutexes, a nested one, a fixed
/// lease, a semaphore permit, a read lock, a fair lock), fires every live guard's `lost()`,
/// fails the acquire waiting at that moment and every later one with `ShutDown`, and leaves
/// no background work behind; a guard's release after it answers `Lost(Shutdown)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_everything_and_refuses_acquires() {
    let server = server();
    let locker = locker(&server).await;
    let other = common::locker(&server).await;
    let holders = hold_every_kind(&locker).await;
    assert!(held_keys(&server, "shut:w").len() >= 5);

    // A lock dropped just before the shutdown: its release runs in the background.
    drop(locker.lock("shut:dropped").await.unwrap());
    // An acquire waiting for another process's lock.
    let blocker = other.lock("shut:w").await.unwrap();
    let waiting = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("shut:w").wait(Duration::from_secs(30)).await })
    };
    assert!(
        common::eventually(Duration::from_secs(5), || server
            .pubsub_channels()
            .iter()
            .any(|c| c.ends_with(":released:shut:w")))
        .await,
        "the waiter never subscribed"
    );

    let clone = locker.clone();
    let started = Instant::now();
    locker
        .shutdown(Duration::from_secs(5))
        .await
        .expect("a clean shutdown");
    let took = started.elapsed();
    lock_testkit::figure(&format!(
        "shutdown of a locker holding 6 locks (5 kinds) with one acquire waiting: {took:?}"
    ));

    // Gone from Redis at once: no polling.
    assert_eq!(held_keys(&server, "shut:w"), Vec::<String>::new());
    assert_eq!(locker.stats().watchdog_locks, 0);

    let waited = tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("the waiting acquire ends with the shutdown")
        .unwrap();
    assert!(
        matches!(waited, Err(LockError::ShutDown)),
        "the waiting acquire: {waited:?}"
    );
    // The release listener stopped with its connection: the waiter's channel is gone at once,
    // not after the 500 ms a subscription lingers.
    assert!(
        common::eventually(Duration::from_millis(200), || server
            .pubsub_channels()
            .is_empty())
        .await,
        "still subscribed after the shutdown: {:?}",
        server.pubsub_channels()
    );
    for acquire in [
        clone
            .lock("shut:new")
            .wait(Duration::from_secs(5))
            .into_future(),
        clone.lock("shut:a").into_future(),
        clone.read("shut:r").into_future(),
        clone.semaphore("shut:s", 2).acquire().into_future(),
    ] {
        let started = Instant::now();
        let refused = acquire.await;
        assert!(matches!(refused, Err(LockError::ShutDown)), "{refused:?}");
        assert!(started.elapsed() < Duration::from_millis(100));
    }
    let refused = clone.lock_all(["shut:x", "shut:y"]).await;
    assert!(matches!(refused, Err(LockError::ShutDown)), "{refused:?}");

    let scripts_before = server.command_calls("evalsha");
    for holder in holders {
        let (reason, released) = holder.await.unwrap();
        assert_eq!(reason, Some(LostReason::Shutdown));
        for release in released {
            assert!(
                matches!(
                    release,
                    Err(LockError::Lost {
                        reason: LostReason::Shutdown,
                        ..
                    })
                ),
                "a release after the shutdown: {release:?}"
            );
        }
    }
    assert_eq!(
        server.command_calls("evalsha"),
        scripts_before,
        "the guards' releases after the shutdown went to redis again"
    );
    assert_eq!(locker.stats().local_keys, 0);
    // Idempotent, and the other process takes what this one held at once.
    clone.shutdown(Duration::from_secs(1)).await.unwrap();
    let taken = other
        .lock_all(["shut:a", "shut:b", "shut:f"])
        .wait(Duration::ZERO)
        .await
        .expect("free at once");
    taken.release().await.unwrap();
    blocker.release().await.unwrap();
    assert_nothing_left(&server, &[&locker, &other]).await;
}

/// Acquires `key` (waiting up to 30 s) in a task of its own: its answer, and when it came.
fn acquire_in_task(
    locker: &Locker,
    key: &'static str,
) -> tokio::task::JoinHandle<(Result<LockGuard, LockError>, Instant)> {
    let locker = locker.clone();
    tokio::spawn(async move {
        let answer = locker.lock(key).wait(Duration::from_secs(30)).await;
        (answer, Instant::now())
    })
}

/// Shutdown while acquires wait in two ways. One queued behind this locker's own holder
/// (waiting for its local place) ends with `ShutDown` at once. One whose Redis call is under
/// way (each way through a proxy delayed 700 ms) is left to get its answer: it ends with
/// `ShutDown` when the answer comes, the lock Redis granted it is given back, and `shutdown`
/// returns only after that, with nothing of the locker's left in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_a_local_waiter_at_once_and_a_call_in_flight_at_its_answer() {
    let server = server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let locker = Locker::builder()
        .url(proxy.url())
        .build()
        .await
        .expect("connect locker");
    let holder = locker.lock("shut:local").await.unwrap();
    let queued = acquire_in_task(&locker, "shut:local");
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(700)))
        .await;
    let in_flight = acquire_in_task(&locker, "shut:flight");
    // The call is on its way: its answer is due some 1.4 s after it was sent (a second to
    // spare for a loaded machine's late wake-ups before the assertions below).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!queued.is_finished() && !in_flight.is_finished());

    let started = Instant::now();
    locker
        .shutdown(Duration::from_secs(30))
        .await
        .expect("a clean shutdown");
    let returned = started.elapsed();
    let (queued, queued_at) = queued.await.unwrap();
    let (in_flight, in_flight_at) = in_flight.await.unwrap();
    lock_testkit::figure(&format!(
        "shutdown with a local waiter and an acquire's call in flight (700 ms each way): \
         waiter ended after {:?}, the call's acquire after {:?}, shutdown returned after {returned:?}",
        queued_at - started,
        in_flight_at - started,
    ));
    assert!(matches!(queued, Err(LockError::ShutDown)), "{queued:?}");
    assert!(
        queued_at - started < Duration::from_millis(300),
        "the local waiter ended {:?} after the shutdown began",
        queued_at - started
    );
    assert!(
        matches!(in_flight, Err(LockError::ShutDown)),
        "{in_flight:?}"
    );
    // Its answer came some 1.2 s after the shutdown began, not at once.
    assert!(
        in_flight_at - started > Duration::from_millis(300),
        "the acquire in flight ended {:?} after the shutdown began",
        in_flight_at - started
    );
    assert!(
        returned >= in_flight_at - started,
        "shutdown returned before the acquire in flight ended"
    );
    assert!(holder.release().await.is_err());
    proxy.set_mode(ProxyMode::Pass).await;
    assert_nothing_left(&server, &[&locker]).await;
}

/// Any timeout, from none to `Duration::MAX`: no panic, every acquire refused afterwards,
/// and the releases complete (in the background when the timeout was too short to wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_takes_any_timeout() {
    let server = server();
    for timeout in [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(1),
        Duration::from_secs(u64::MAX / 2),
        Duration::MAX,
    ] {
        let locker = locker(&server).await;
        let guards = [
            locker.lock("fuzz:a").await.unwrap(),
            locker.read("fuzz:r").await.unwrap(),
        ];
        let answer = locker.shutdown(timeout).await;
        if let Err(error) = &answer {
            assert!(
                error.is_timeout(),
                "{timeout:?}: only running out of time may fail here, got {error}"
            );
        }
        let refused = locker.lock("fuzz:a").await;
        assert!(matches!(refused, Err(LockError::ShutDown)), "{refused:?}");
        for guard in guards {
            guard.lost().await;
            assert!(guard.release().await.is_err());
        }
        assert_nothing_left(&server, &[&locker]).await;
    }
}

/// A rolling restart: instance A holds a watchdog lock (30 s lease) and shuts down; instance B
/// takes the key at once, not a lease later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_instance_finds_its_keys_free_at_once() {
    let server = server();
    let a = locker(&server).await;
    let held = a.lock("orders:7").await.unwrap();
    let b = common::locker(&server).await;
    let busy = b.lock("orders:7").wait(Duration::ZERO).await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");

    a.shutdown(Duration::from_secs(5)).await.unwrap();
    let started = Instant::now();
    let taken = b
        .lock("orders:7")
        .wait(Duration::ZERO)
        .await
        .expect("free at once after A's shutdown");
    lock_testkit::figure(&format!(
        "rolling restart: B acquired A's key {:?} after A's shutdown returned (lease 30 s)",
        started.elapsed()
    ));
    drop(held);
    taken.release().await.unwrap();
    assert_nothing_left(&server, &[&a, &b]).await;
}

/// The start-up check `build` runs (a warning when the server may evict lock keys) runs for a
/// lazy locker once Redis first answered an acquire, once.
#[tokio::test]
async fn a_lazy_locker_checks_the_eviction_policy_on_first_use() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "volatile-ttl"]).unwrap();
    let (logs, _guard) = lock_testkit::LogBuffer::capture(tracing::Level::WARN);
    let lazy = Locker::builder().url(server.url()).build_lazy().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !logs.text().contains("maxmemory"),
        "checked before first use: {}",
        logs.text()
    );
    for _ in 0..3 {
        lazy.lock("evict:k").await.unwrap().release().await.unwrap();
    }
    let warned = common::eventually(Duration::from_secs(5), || {
        logs.text().contains("volatile-ttl")
    })
    .await;
    assert!(
        warned,
        "no eviction warning after first use: {}",
        logs.text()
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        logs.text().matches("maxmemory-policy noeviction").count(),
        1,
        "{}",
        logs.text()
    );
    assert_nothing_left(&server, &[&lazy]).await;
}

/// Shutdown in the middle of a storm (24 tasks taking mutexes, read locks and semaphore
/// permits of 3 keys in a loop, handing them over locally, releasing or dropping them): every
/// task ends with `ShutDown`, and when `shutdown` returns nothing of the locker's is left in
/// Redis, whatever each task was doing at that moment (an acquire granted in Redis, a handoff
/// parked in a slot, a release under way, a waiter in a semaphore's line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_in_a_storm_of_acquires_leaves_nothing_behind() {
    let server = server();
    for round in 0..6u64 {
        let locker = locker(&server).await;
        let tasks: Vec<_> = (0..24usize)
            .map(|i| {
                let locker = locker.clone();
                tokio::spawn(async move {
                    let key = format!("storm:{}", i % 3);
                    let mut taken = 0u32;
                    loop {
                        let acquire = match i % 4 {
                            0 => locker.read(key.as_str()),
                            1 => locker.semaphore(key.as_str(), 2).acquire(),
                            _ => locker.lock(key.as_str()),
                        };
                        match acquire.wait(Duration::from_secs(10)).await {
                            Ok(guard) => {
                                taken += 1;
                                tokio::task::yield_now().await;
                                if i % 2 == 0 {
                                    drop(guard);
                                } else {
                                    let _ = guard.release().await;
                                }
                            }
                            Err(LockError::ShutDown) => return taken,
                            Err(other) => panic!("task {i}: {other}"),
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10 + 15 * round)).await;
        locker
            .shutdown(Duration::from_secs(10))
            .await
            .expect("a clean shutdown");
        assert_eq!(
            held_keys(&server, "no such key"),
            Vec::<String>::new(),
            "round {round}: left in redis when shutdown returned"
        );
        let mut taken = 0;
        for task in tasks {
            taken += tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("every task ends after the shutdown")
                .expect("no task panicked");
        }
        assert!(
            taken > 0,
            "round {round}: no lock was taken before the shutdown"
        );
        assert_nothing_left(&server, &[&locker]).await;
    }
}

/// The version refusal, with what it names; panics on any other answer.
fn too_old(result: Result<impl std::fmt::Debug, LockError>) -> (String, String, String) {
    match result {
        Err(LockError::Config(ConfigError::ServerTooOld {
            node,
            found,
            needed,
            for_what,
        })) => {
            let error = LockError::Config(ConfigError::ServerTooOld {
                node: node.clone(),
                found: found.clone(),
                needed: needed.clone(),
                for_what,
            });
            // The message names the version found, the one needed, and why.
            let shown = error.to_string();
            assert!(
                shown.contains(&found) && shown.contains(&needed) && shown.contains(for_what),
                "{shown}"
            );
            (node, found, needed)
        }
        other => panic!("expected ServerTooOld, got {other:?}"),
    }
}

/// `build` reads the server's version: a Redis 6.0 (below `SET .. PXAT`, 6.2) is refused,
/// naming the version found and the one needed; a Redis 6.2 builds and serves a plain lock,
/// and refuses a semaphore (`PEXPIRE .. GT`, 7.0) at its acquire with the same error,
/// without writing anything; the real 7.0 serves both.
#[tokio::test]
async fn build_refuses_a_server_too_old_and_a_semaphore_needs_7_0() {
    let server = server();
    let proxy = VersionProxy::start(server.port(), "6.0.16").await.unwrap();
    let refused = Locker::builder().url(proxy.url()).build().await;
    let (node, found, needed) = too_old(refused);
    assert_eq!((found.as_str(), needed.as_str()), ("6.0.16", "6.2.0"));
    assert_eq!(node, lock_core::redact_url(&proxy.url()));

    proxy.set_version("6.2.0");
    let locker = Locker::builder()
        .url(proxy.url())
        .build()
        .await
        .expect("6.2 serves the kit");
    let guard = locker.lock("v:plain").await.expect("a plain lock on 6.2");
    assert!(guard.fencing_token().await.is_ok());
    guard.release().await.unwrap();
    let semaphore = locker.semaphore("v:sem", 2);
    let (_, found, needed) = too_old(semaphore.acquire().wait(Duration::ZERO).await);
    assert_eq!((found.as_str(), needed.as_str()), ("6.2.0", "7.0.0"));
    // Refused from the version remembered at build: nothing was sent for it.
    assert_eq!(server.keys("lock:*v:sem*"), Vec::<String>::new());

    let real = common::locker(&server).await;
    let permit = real
        .semaphore("v:sem", 2)
        .acquire()
        .await
        .expect("7.0 serves semaphores");
    permit.release().await.unwrap();
    assert_nothing_left(&server, &[&locker, &real]).await;
}

/// A lazy locker has read no version when it is built: its first acquire reads it before
/// anything else, fails with the version refusal on a Redis 6.0, and takes nothing.
#[tokio::test]
async fn a_lazy_lockers_first_acquire_refuses_a_server_too_old_and_takes_nothing() {
    let server = server();
    let proxy = VersionProxy::start(server.port(), "6.0.16").await.unwrap();
    let lazy = Locker::connect_lazy(&proxy.url()).expect("nothing is read yet");
    for _ in 0..2 {
        let (_, found, needed) = too_old(lazy.lock("v:lazy").wait(Duration::from_secs(1)).await);
        assert_eq!((found.as_str(), needed.as_str()), ("6.0.16", "6.2.0"));
    }
    assert_eq!(server.keys("lock:*"), Vec::<String>::new(), "nothing taken");
    let other = locker(&server).await;
    let free = other
        .lock("v:lazy")
        .wait(Duration::ZERO)
        .await
        .expect("the lock is free");
    free.release().await.unwrap();
    assert_nothing_left(&server, &[&lazy, &other]).await;
}
