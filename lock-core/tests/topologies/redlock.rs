//! RedLock over five independent redis-server processes.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lock_core::{ConfigError, LockError, Locker};
use lock_testkit::oracle::Oracle;
use lock_testkit::{FaultProxy, ProxyMode, RedisServer};

fn five() -> Vec<RedisServer> {
    (0..5).map(|_| RedisServer::start().unwrap()).collect()
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

async fn redlock(servers: &[RedisServer], lease: Duration) -> Locker {
    Locker::builder()
        .redlock(urls(servers))
        .watchdog_lease(lease)
        .command_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap()
}

/// A RedLock locker on `urls` whose waiters are woken before `fallback` only by release
/// messages: the tests of the messages give it a fallback retry longer than their waits.
async fn woken_by_messages(urls: Vec<String>, fallback: Duration) -> Locker {
    Locker::builder()
        .redlock(urls)
        .fallback_retry(fallback)
        .build()
        .await
        .unwrap()
}

/// The entries of waiting writers (scored 0 up) on `node`, over every key. Not the readers'
/// mark (-1): a reader that won its quorum can leave it on a third node, when its late try
/// there meets a writer's split grant; it holds nobody back and ends with its TTL.
fn waiting_writers(node: &RedisServer) -> usize {
    node.keys("lock:*")
        .iter()
        .filter(|k| k.contains(":waiters:"))
        .map(|k| node.cmd::<usize>(&["ZCOUNT", k, "0", "+inf"]))
        .sum()
}

/// `acquire` with `wait`, in a task of its own: when it got the lock, and the guard.
fn timed(
    acquire: lock_core::Acquire,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<(Instant, lock_core::LockGuard), LockError>> {
    tokio::spawn(async move {
        let guard = acquire.wait(wait).await?;
        Ok((Instant::now(), guard))
    })
}

fn lock_keys(server: &RedisServer) -> Vec<String> {
    server.cmd(&["KEYS", "lock:*:lock:*"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_with_two_of_five_nodes_down() {
    let mut servers = five();
    let a = redlock(&servers, Duration::from_secs(5)).await;
    let b = redlock(&servers, Duration::from_secs(5)).await;
    servers[0].kill9();
    servers[3].kill9();
    let referee = RedisServer::start().unwrap();
    let oracle = Oracle::connect(&referee.url(), "redlock", "main")
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let locker = if i % 2 == 0 { a.clone() } else { b.clone() };
        let oracle = oracle.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let guard = locker
                    .lock("k")
                    .wait(Duration::from_secs(20))
                    .await
                    .unwrap();
                let work = tokio::time::sleep(Duration::from_millis(2));
                let ((), accepted) = oracle
                    .section(
                        "k",
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
    assert_eq!((report.cycles, report.overlaps), (80, 0), "{report}");
    for server in servers.iter().filter(|s| s.is_running()) {
        common::assert_nothing_left(server, &[&a, &b]).await;
    }
}

#[tokio::test]
async fn no_acquire_with_three_of_five_nodes_down() {
    let mut servers = five();
    let locker = redlock(&servers, Duration::from_secs(5)).await;
    for i in [1, 2, 4] {
        servers[i].kill9();
    }
    let err = locker.lock("k").wait(Duration::ZERO).await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    for i in [0, 3] {
        assert!(
            lock_keys(&servers[i]).is_empty(),
            "partial acquire undone on node {i}"
        );
    }
    for server in servers.iter().filter(|s| s.is_running()) {
        common::assert_nothing_left(server, &[&locker]).await;
    }
}

#[tokio::test]
async fn success_if_and_only_if_a_majority_is_free() {
    let servers = five();
    let locker = redlock(&servers, Duration::from_secs(5)).await;
    // Learn the Redis name of the lock once.
    let guard = locker.lock("k").await.unwrap();
    // Node 0's grant may land just after the majority decided.
    assert!(
        common::eventually(Duration::from_secs(2), || !lock_keys(&servers[0])
            .is_empty())
        .await
    );
    let name = lock_keys(&servers[0]).pop().unwrap();
    guard.release().await.unwrap();
    for mask in 0u32..32 {
        for (i, s) in servers.iter().enumerate() {
            if mask & (1 << i) != 0 {
                let _: () = s.cmd(&["SET", &name, "someone-else", "PX", "60000"]);
            }
        }
        let free = 5 - mask.count_ones();
        let result = locker.lock("k").wait(Duration::ZERO).await;
        match result {
            Ok(guard) => {
                assert!(
                    free >= 3,
                    "acquired with only {free} free nodes (mask {mask:05b})"
                );
                guard.release().await.unwrap();
            }
            Err(e) => {
                assert!(
                    free < 3,
                    "refused with {free} free nodes (mask {mask:05b}): {e}"
                );
                assert!(e.is_busy(), "{e:?}");
            }
        }
        // Nothing of ours is left anywhere (nodes that answered after the outcome was decided
        // are undone in the background); the foreign locks are untouched.
        let ours_gone = common::eventually(Duration::from_secs(2), || {
            servers.iter().enumerate().all(|(i, s)| {
                mask & (1 << i) != 0 || s.cmd::<Option<String>>(&["GET", &name]).is_none()
            })
        })
        .await;
        assert!(ours_gone, "stray keys (mask {mask:05b})");
        for (i, s) in servers.iter().enumerate() {
            let value: Option<String> = s.cmd(&["GET", &name]);
            if mask & (1 << i) != 0 {
                assert_eq!(value.as_deref(), Some("someone-else"));
            } else {
                assert_eq!(value, None, "stray key on node {i} (mask {mask:05b})");
            }
            let _: () = s.cmd(&["DEL", &name]);
        }
    }
    for server in servers.iter().filter(|s| s.is_running()) {
        common::assert_nothing_left(server, &[&locker]).await;
    }
}

#[tokio::test]
async fn fencing_tokens_increase_across_changing_majorities() {
    let mut servers = five();
    let locker = redlock(&servers, Duration::from_secs(5)).await;
    let mut last = 0;
    for round in 0..3 {
        // A different node is down in every round, so the granting majority changes.
        if round > 0 {
            servers[round].kill9();
            servers[round - 1].restart().unwrap();
        }
        for _ in 0..20 {
            let guard = locker.lock("k").wait(Duration::from_secs(5)).await.unwrap();
            assert!(guard.fencing_token().await.unwrap() > last, "round {round}");
            last = guard.fencing_token().await.unwrap();
            guard.release().await.unwrap();
        }
    }
    for server in servers.iter().filter(|s| s.is_running()) {
        common::assert_nothing_left(server, &[&locker]).await;
    }
}

#[tokio::test]
async fn watchdog_keeps_a_redlock_alive_and_release_clears_every_node() {
    let servers = five();
    let locker = redlock(&servers, Duration::from_millis(300)).await;
    let guard = locker.lock("k").await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(guard.is_held());
    assert!(locker.is_locked("k").await.unwrap());
    guard.release().await.unwrap();
    // The release answers once a majority confirmed; the other nodes follow in the background.
    assert!(
        common::eventually(Duration::from_secs(2), || servers
            .iter()
            .all(|s| lock_keys(s).is_empty()))
        .await,
        "lock keys left after release"
    );
    for server in servers.iter().filter(|s| s.is_running()) {
        common::assert_nothing_left(server, &[&locker]).await;
    }
}

#[tokio::test]
async fn bad_redlock_configuration() {
    let servers = five();
    let err = Locker::builder()
        .redlock(urls(&servers[..2]))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err}");
    let err = Locker::builder()
        .redlock(urls(&servers))
        .min_replicas(1, Duration::from_millis(100))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err}");
    for server in servers.iter().filter(|s| s.is_running()) {
        common::assert_nothing_left(server, &[]).await;
    }
}

/// Every builder duration at its edges (0, 1 ns, around 1 ms and 10 ms, the limits, `MAX`) on
/// a RedLock: refused by name, or a locker that locks, fences and releases (or answers an
/// error), never a panic. The RedLock acquire's per-node limit was `(lease / 50).clamp(10 ms,
/// command timeout)`, and `clamp` panics with its minimum above its maximum ("a RedLock acquire
/// with command_timeout(1ms) panicked: assertion failed: min <= max").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_edge_of_every_builder_duration_locks_a_redlock_or_answers_an_error() {
    type Set = fn(lock_core::LockerBuilder, Duration) -> lock_core::LockerBuilder;
    let settings: [(&str, Set); 9] = [
        ("command_timeout", |b, d| b.command_timeout(d)),
        ("connect_timeout", |b, d| b.connect_timeout(d)),
        ("watchdog_lease", |b, d| b.watchdog_lease(d)),
        ("default_wait", |b, d| b.default_wait(d)),
        ("max_hold", |b, d| b.max_hold(d)),
        ("fence_retention", |b, d| b.fence_retention(d)),
        ("fallback_retry", |b, d| b.fallback_retry(d)),
        ("release_retry_window", |b, d| b.release_retry_window(d)),
        ("restart_guard", |b, d| b.restart_guard(d)),
    ];
    let ms = Duration::from_millis(1);
    let hour = Duration::from_secs(3600);
    let year = Duration::from_secs(365 * 24 * 3600);
    let edges = [
        Duration::ZERO,
        Duration::from_nanos(1),
        ms - Duration::from_nanos(1),
        ms,
        ms * 9,
        ms * 10,
        ms * 30,
        hour,
        hour + Duration::from_nanos(1),
        year,
        Duration::MAX,
    ];
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let mut panicked = Vec::new();
    for (name, set) in settings {
        for value in edges {
            let builder = set(Locker::builder().redlock(urls(&servers)), value);
            let locker = match builder.build().await {
                Ok(locker) => locker,
                // Refused by name, or a connect timeout too short to connect.
                Err(
                    LockError::Config(
                        ConfigError::OutOfRange { .. }
                        | ConfigError::MaxHoldTooShortForRedLock { .. },
                    )
                    | LockError::Backend { .. },
                ) => continue,
                Err(error) => panic!("{name} {value:?}: build: {error}"),
            };
            let cycle = tokio::spawn({
                let locker = locker.clone();
                async move {
                    let acquire = locker.lock("edges").lease(Duration::from_secs(1));
                    let acquire = if name == "default_wait" {
                        acquire
                    } else {
                        acquire.wait(Duration::from_millis(200))
                    };
                    let guard = acquire.await?;
                    let fenced = guard.fencing_token().await;
                    guard.release().await?;
                    fenced.map(drop)
                }
            });
            match cycle.await {
                Err(error) if error.is_panic() => {
                    panicked.push(format!("{name} {value:?}: {error}"))
                }
                // Locked, or an answer (busy inside a restart guard, a timeout too short).
                _ => {}
            }
            // Whatever it answered, it leaves nothing (a try cut short is undone) but the
            // restart guard's epoch.
            for server in &servers {
                common::assert_nothing_left_under(server, "lock:", &["node-epoch"], &[&locker])
                    .await;
            }
        }
    }
    assert!(panicked.is_empty(), "{}", panicked.join("\n"));
}

/// A fixed lease too short for RedLock's drift allowance (2 ms and a hundredth of the lease)
/// is refused by name before anything is sent; before, a 1 or 2 ms lease was tried until the
/// wait ran out and answered `Busy` ("the holder's lease ends in 0s") on a free lock.
#[tokio::test]
async fn a_lease_too_short_for_redlock_is_refused_by_name() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let locker = redlock(&servers, Duration::from_secs(30)).await;
    for ms in [1, 2] {
        let refused = locker
            .lock("short")
            .lease(Duration::from_millis(ms))
            .wait(Duration::from_millis(300))
            .await;
        match refused {
            Err(LockError::Config(ConfigError::OutOfRange { min, .. })) => {
                assert_eq!(min, Duration::from_millis(3));
            }
            other => panic!("a {ms} ms RedLock lease: {other:?}"),
        }
    }
    // The shortest one accepted is tried (on loopback it is granted, or busy if the tries
    // took too long: never a configuration error).
    let tried = locker
        .lock("short")
        .lease(Duration::from_millis(3))
        .wait(Duration::from_millis(300))
        .await;
    assert!(!matches!(tried, Err(LockError::Config(_))), "{tried:?}");
    if let Ok(guard) = tried {
        // Its 3 ms are over by now, or about to be: `Ok` or `Lost`.
        drop(guard.release().await);
    }
    for server in &servers {
        common::assert_nothing_left(server, &[&locker]).await;
    }
}

/// A RedLock is built only if every node that answers serves the kit: one node reporting
/// Redis 6.0 is refused by name. Built lazily, nothing is read before the first acquire:
/// a node too old then cannot vote (it is sent nothing), so a majority of such nodes fails
/// the acquire with the version refusal and takes nothing, and a majority of good ones still
/// carries it.
#[tokio::test]
async fn a_node_too_old_is_refused_by_name() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let old = lock_testkit::VersionProxy::start(servers[1].port(), "6.0.16")
        .await
        .unwrap();
    let nodes = vec![servers[0].url(), old.url(), servers[2].url()];
    let refused = Locker::builder().redlock(nodes.clone()).build().await;
    match refused {
        Err(LockError::Config(ConfigError::ServerTooOld {
            node,
            found,
            needed,
            ..
        })) => {
            assert_eq!(node, lock_core::redact_url(&old.url()));
            assert_eq!((found.as_str(), needed.as_str()), ("6.0.16", "6.2.0"));
        }
        other => panic!("expected ServerTooOld, got {:?}", other.map(drop)),
    }

    let older = lock_testkit::VersionProxy::start(servers[2].port(), "5.0.14")
        .await
        .unwrap();
    let lazy = Locker::builder()
        .redlock([servers[0].url(), old.url(), older.url()])
        .build_lazy()
        .unwrap();
    let error = lazy.lock("v:r").wait(Duration::from_millis(200)).await;
    assert!(
        matches!(
            error,
            Err(LockError::Config(ConfigError::ServerTooOld { .. }))
        ),
        "{:?}",
        error.map(drop)
    );
    for server in &servers {
        assert_eq!(lock_keys(server), Vec::<String>::new(), "nothing taken");
    }

    let lazy = Locker::builder().redlock(nodes).build_lazy().unwrap();
    let guard = lazy.lock("v:r").await.expect("two good nodes of three");
    assert_eq!(lock_keys(&servers[1]), Vec::<String>::new());
    guard.release().await.unwrap();
    for server in &servers {
        common::assert_nothing_left(server, &[&lazy]).await;
    }
}

/// The child side of the pause test: holds a RedLock lock and reports when it learns it lost it.
#[test]
#[ignore = "run as a child process by paused_holder_learns_it_lost_the_lock"]
fn redlock_child() {
    let Ok(urls) = std::env::var("REDLOCK_CHILD_URLS") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let locker = Locker::builder()
            .redlock(urls.split(',').map(str::to_owned))
            .watchdog_lease(Duration::from_millis(600))
            .build()
            .await
            .unwrap();
        let guard = locker.lock("k").await.unwrap();
        println!("HELD {}", guard.fencing_token().await.unwrap());
        guard.lost().await;
        println!("LOST");
        let released = guard.release().await;
        println!(
            "RELEASE {}",
            if released.is_err_and(|e| e.is_lost()) {
                "lost"
            } else {
                "ok"
            }
        );
    });
}

#[tokio::test]
async fn a_paused_holder_learns_it_lost_the_lock_after_resume() {
    let servers = five();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(crate::common::child::only_test_args(
            module_path!(),
            "redlock_child",
        ))
        .env("REDLOCK_CHILD_URLS", urls(&servers).join(","))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let held = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("HELD"))
        .unwrap();
    let child_fence: u64 = held.rsplit(' ').next().unwrap().parse().unwrap();
    let pid = child.id().to_string();
    Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    // Past the child's validity: the key expires everywhere and another client takes over.
    let locker = redlock(&servers, Duration::from_secs(5)).await;
    let started = Instant::now();
    let guard = locker.lock("k").wait(Duration::from_secs(3)).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(1500));
    assert!(guard.fencing_token().await.unwrap() > child_fence);
    Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    let resumed = Instant::now();
    let lost = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        for line in lines.map_while(Result::ok) {
            out.push(line);
        }
        out
    });
    let out = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .unwrap()
        .unwrap();
    assert!(out.iter().any(|l| l.ends_with("LOST")), "{out:?}");
    assert!(out.iter().any(|l| l.ends_with("RELEASE lost")), "{out:?}");
    assert!(resumed.elapsed() < Duration::from_secs(2));
    assert!(
        guard.is_held(),
        "the new holder's lock was not touched by the stale one"
    );
    guard.release().await.unwrap();
    child.wait().unwrap();
    for server in servers.iter().filter(|s| s.is_running()) {
        common::assert_nothing_left(server, &[&locker]).await;
    }
}

/// A grant that lands on a slow node after the majority was out of reach is undone before the
/// failed acquire answers. Before, the acquire answered at once and the late grant stayed
/// until its own undo came back through the slow node: the caller's next try (under a fresh
/// token) took it for another holder's lock with a whole lease left, and a waiter with a long
/// fallback retry waited out its deadline (two CI runs: `Busy` after 10 s, "holder" TTL
/// 29.999 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_of_a_failed_try_is_gone_when_the_acquire_answers() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let slow = FaultProxy::start(servers[1].port()).await.unwrap();
    let urls = vec![servers[0].url(), slow.url(), servers[2].url()];
    let locker = Locker::builder().redlock(urls).build().await.unwrap();
    // Someone else holds nodes 0 and 2: two refusals decide the try while node 1, free but
    // slow, is still answering.
    let name = {
        // The lock's Redis name, read off a lock of "k" on node 0 alone.
        let probe = Locker::builder()
            .url(servers[0].url())
            .build()
            .await
            .unwrap();
        let guard = probe.lock("k").await.unwrap();
        let name = common::lock_key(&servers[0], "k");
        guard.release().await.unwrap();
        name
    };
    for s in [&servers[0], &servers[2]] {
        let _: () = s.cmd(&["SET", &name, "someone", "PX", "60000"]);
    }
    slow.set_mode(ProxyMode::Delay(Duration::from_millis(100)))
        .await;
    let busy = locker.lock("k").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    // From the answer on, node 1 never holds the caller's grant.
    let until = Instant::now() + Duration::from_millis(600);
    while Instant::now() < until {
        assert!(
            lock_keys(&servers[1]).is_empty(),
            "a grant of the failed try is still on the slow node after the acquire answered"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    slow.set_mode(ProxyMode::Pass).await;
    for s in [&servers[0], &servers[2]] {
        let _: i64 = s.cmd(&["DEL", &name]);
    }
    locker.lock("k").await.unwrap().release().await.unwrap();
}

/// K23 (review item K1): on RedLock, a waiting writer keeps its place among the waiting
/// writers on every node, so readers let it go first and releases wake it by their message.
/// Three nodes; every locker has a 20 s fallback retry, so only a release message wakes a
/// waiter before its 10 s wait ends. A reader holds `doc`; a writer of another locker waits:
/// a new reader is refused (writer preference), and the reader's release lets the writer in
/// within 500 ms, and no entry of it stays on any node once it holds. Then a writer waits
/// behind a writer and is woken by its release, and a writer that gives up lets a waiting
/// reader in at once. Before: every busy try of the
/// writer was undone on every node by the release script, whose not-ours branch took the
/// writer's entry out: the new reader was admitted and the writer stayed out for its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_waiting_writers_hold_readers_back_and_releases_wake_them() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let build = || woken_by_messages(urls(&nodes), Duration::from_secs(20));
    let (a, b, c) = (build().await, build().await, build().await);

    // Readers let a waiting writer go first; the last reader's release wakes it.
    let held = a.read("doc").await.unwrap();
    let writer = timed(b.write("doc"), Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let marks: Vec<usize> = nodes.iter().map(waiting_writers).collect();
    let new_reader = c.read("doc").wait(Duration::ZERO).await;
    assert!(
        matches!(new_reader, Err(LockError::Busy { .. })),
        "a new reader while a writer waits (waiting writers per node: {marks:?}): {:?}",
        new_reader.map(|g| g.is_held())
    );
    let released = Instant::now();
    held.release().await.unwrap();
    let (in_at, write) = writer.await.unwrap().unwrap_or_else(|e| {
        panic!(
            "writer behind a reader: {e} ({:?} after the release)",
            released.elapsed()
        )
    });
    let read_to_write = in_at - released;
    // The winner waits no more: no entry of it stays on any node while it holds.
    let left = common::eventually(Duration::from_millis(500), || {
        nodes.iter().map(waiting_writers).sum::<usize>() == 0
    })
    .await;
    assert!(
        left,
        "the winning writer's waiting entries stayed: {:?}",
        nodes.iter().map(waiting_writers).collect::<Vec<_>>()
    );

    // A writer behind a writer is woken by its release.
    let second = timed(c.write("doc"), Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    write.release().await.unwrap();
    let (in_at, write) = second.await.unwrap().unwrap_or_else(|e| {
        panic!(
            "writer behind a writer: {e} ({:?} after the release)",
            released.elapsed()
        )
    });
    let write_to_write = in_at - released;
    write.release().await.unwrap();
    lock_testkit::figure(&format!(
        "K23 redlock (3 nodes, fallback retry 20 s): writer in {read_to_write:?} after the last reader's release, {write_to_write:?} after a writer's"
    ));
    for took in [read_to_write, write_to_write] {
        assert!(
            took < Duration::from_millis(500),
            "woken {took:?} after the release"
        );
    }

    // A writer that gives up leaves every node's waiting writers: a waiting reader gets in.
    let held = a.read("doc").await.unwrap();
    let quitter = tokio::spawn({
        let b = b.clone();
        async move { b.write("doc").wait(Duration::from_millis(400)).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let reader = timed(c.read("doc"), Duration::from_secs(10));
    let gave_up = quitter.await.unwrap().unwrap_err();
    let gave_up_at = Instant::now();
    assert!(gave_up.is_busy(), "{gave_up}");
    let (in_at, read) = reader.await.unwrap().unwrap();
    let after = in_at.saturating_duration_since(gave_up_at);
    assert!(
        after < Duration::from_millis(500),
        "reader in {after:?} after the writer gave up"
    );
    read.release().await.unwrap();
    held.release().await.unwrap();
    for node in &nodes {
        common::assert_nothing_left_under(node, "lock:", &[], &[&a, &b, &c]).await;
    }
}

/// A waiter listens for release messages on one RedLock node (the first), and a release tells
/// waiters on the nodes where they marked that they wait. When a release reaches the listened-to
/// node first, its message wakes the waiter, whose next try can reach the other nodes before
/// the release does: it wins the first node, loses the others and undoes its grant, and the
/// release's later messages go to nodes nobody listens on. The waiter then slept until its
/// fallback retry although the lock was free. Here the holder's connections to nodes 1 and 2
/// go through proxies that delay each way by 150 ms. Seen in CI under load: a writer behind a
/// writer, busy after its whole 10 s wait (its fallback retry 20 s) with every node empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_a_waiter_whose_try_split_the_nodes_is_not_left_asleep() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let mut proxies = Vec::new();
    for node in &nodes[1..] {
        proxies.push(FaultProxy::start(node.port()).await.unwrap());
    }
    let build = |urls: Vec<String>| woken_by_messages(urls, Duration::from_secs(20));
    let holder = build(
        std::iter::once(nodes[0].url())
            .chain(proxies.iter().map(FaultProxy::url))
            .collect(),
    )
    .await;
    let waiter = build(urls(&nodes)).await;
    let held = holder.lock("doc").await.unwrap();
    let waiting = timed(waiter.lock("doc"), Duration::from_secs(10));
    let joined = common::eventually(Duration::from_secs(3), || {
        nodes.iter().map(waiting_writers).collect::<Vec<_>>() == [1, 1, 1]
    })
    .await;
    assert!(
        joined,
        "{:?}",
        nodes.iter().map(waiting_writers).collect::<Vec<_>>()
    );
    for proxy in &proxies {
        proxy
            .set_mode(ProxyMode::Delay(Duration::from_millis(150)))
            .await;
    }
    held.release().await.unwrap();
    let released = Instant::now();
    let (in_at, guard) = waiting
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e} ({:?} after the release)", released.elapsed()));
    let after = in_at.saturating_duration_since(released);
    lock_testkit::figure(&format!(
        "redlock split try (3 nodes, fallback retry 20 s): the waiter in {after:?} after the release"
    ));
    assert!(
        after < Duration::from_secs(2),
        "the waiter got in {after:?} after the release"
    );
    guard.release().await.unwrap();
    for node in &nodes {
        common::assert_nothing_left_under(node, "lock:", &[], &[&holder, &waiter]).await;
    }
}

/// K23 (review item K1), the remote waiter's turn on RedLock (3 nodes): four tasks of one
/// process pass a lock among themselves without pause, and a waiter of another process (its
/// fallback retry 30 s) asks for it five times. Its entry among the waiting writers stays on
/// the nodes while it waits, so after at most 6 local handoffs a release goes through Redis,
/// tells it, and the busy process holds back its next acquirer for a moment: the waiter gets
/// its turn after a few of their sections. Before: its entry was taken out by the undo of its
/// own busy tries, the releases told nobody and nobody held back; it starved until its wait
/// ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_a_remote_waiter_behind_local_tasks_gets_its_turn() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let build = || woken_by_messages(urls(&nodes), Duration::from_secs(30));
    let (hot, waiter) = (build().await, build().await);
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
    let (mut passed_over, mut waits) = (Vec::new(), Vec::new());
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
        "K23 redlock remote waiter behind 4 local tasks: passed over {passed_over:?} times, waits {waits:?}"
    ));
    assert!(
        passed_over.iter().all(|n| *n <= 20),
        "the local tasks kept the lock from the remote waiter: passed over {passed_over:?} times"
    );
    for node in &nodes {
        common::assert_nothing_left(node, &[&hot, &waiter]).await;
    }
}

/// K23 (review item K1), a waiter listening on a node the holder does not hold: a waiter's
/// subscriber connects to one node (the first), and a node's release script publishes only
/// where a waiter's entry is. Here the holder's key is gone from node 0 (as after a restart
/// of that node) while it still holds nodes 1 and 2: the waiter's tries are granted on node 0
/// (and undone there) and refused on the others, so its entries are on nodes 1 and 2 only.
/// The release must still wake it (fallback retry 30 s) within 500 ms: a RedLock release that
/// finds a waiter on any node tells every node. Before: the messages went out on nodes 1 and
/// 2, where nobody listened, and the waiter slept until its wait ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_a_release_wakes_a_waiter_listening_on_a_node_the_holder_lost() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let build = || woken_by_messages(urls(&nodes), Duration::from_secs(30));
    let (holder, waiter) = (build().await, build().await);
    let held = holder.lock("k").await.unwrap();
    let name = common::lock_key(&nodes[0], "k");
    let _: i64 = nodes[0].cmd(&["DEL", &name]);
    let waiting = timed(waiter.lock("k"), Duration::from_secs(3));
    let listening = common::eventually(Duration::from_secs(2), || {
        !nodes[0].pubsub_channels().is_empty()
    })
    .await;
    assert!(listening, "the waiter's subscriber is not on node 0");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let entries: Vec<usize> = nodes
        .iter()
        .map(|n| {
            n.keys("lock:*:waiters:k")
                .iter()
                .map(|k| n.cmd::<usize>(&["ZCARD", k]))
                .sum()
        })
        .collect();
    assert_eq!(entries, vec![0, 1, 1], "the waiter's entries per node");
    let released = Instant::now();
    held.release().await.unwrap();
    let (in_at, guard) = waiting.await.unwrap().unwrap_or_else(|e| {
        panic!(
            "the waiter: {e} ({:?} after the release)",
            released.elapsed()
        )
    });
    let after = in_at - released;
    assert!(
        after < Duration::from_millis(500),
        "the waiter got in {after:?} after the release"
    );
    guard.release().await.unwrap();
    for node in &nodes {
        common::assert_nothing_left(node, &[&holder, &waiter]).await;
    }
}

/// A writer that stops waiting on RedLock lets waiting readers in, although they listen on a
/// node that does not agree with the majority. A waiter listens on one node (the first); a
/// withdrawal publishes only where it took an entry out and no writer holds the key; and a
/// writer's entries end on their own when its wait runs out. Here node 0 still holds an
/// earlier writer's key (as when that writer's release reached a majority first and node 0
/// later): a reader holds nodes 1 and 2, a writer waits with entries on all three nodes, and a
/// second reader waits (fallback retry 20 s). When the writer stops waiting, first by being
/// dropped and then by its wait running out, the reader must get in within 500 ms: nodes 1
/// and 2 are a majority. Before: the withdrawal told nodes 1 and 2 only, and the reader slept
/// for the longest hold it saw, node 0's minute, not the writer's entries' end on the
/// majority. Seen in CI: a reader busy after its whole 10 s wait behind a writer that gave up
/// while node 0 held that writer's grant of a split try (30 s lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_a_writer_that_stops_waiting_lets_readers_in_on_a_majority() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let build = || woken_by_messages(urls(&nodes), Duration::from_secs(20));
    let (a, b, c) = (build().await, build().await, build().await);
    let held = a.read("doc").await.unwrap();
    // A majority answered; the third node's grant may still be on its way.
    let everywhere = common::eventually(Duration::from_secs(2), || {
        nodes.iter().all(|node| !lock_keys(node).is_empty())
    })
    .await;
    assert!(everywhere, "the reader's grant is not on every node");
    // Node 0 now holds an earlier writer's key instead of the readers'.
    for key in nodes[0].keys("lock:*") {
        let _: i64 = nodes[0].cmd(&["DEL", &key]);
    }
    let name = common::lock_key(&nodes[1], "doc");
    let _: () = nodes[0].cmd(&["SET", &name, "earlier|writer", "PX", "60000"]);

    for dropped in [true, false] {
        let wait = if dropped {
            Duration::from_secs(10)
        } else {
            Duration::from_secs(1)
        };
        let writer = tokio::spawn({
            let b = b.clone();
            async move { b.write("doc").wait(wait).await }
        });
        let joined = common::eventually(Duration::from_millis(700), || {
            nodes.iter().map(waiting_writers).collect::<Vec<_>>() == [1, 1, 1]
        })
        .await;
        assert!(
            joined,
            "the writer's entries per node: {:?}",
            nodes.iter().map(waiting_writers).collect::<Vec<_>>()
        );
        let reader = timed(c.read("doc"), Duration::from_secs(10));
        let listening = common::eventually(Duration::from_secs(2), || {
            !nodes[0].pubsub_channels().is_empty()
        })
        .await;
        assert!(listening, "the reader's subscriber is not on node 0");
        if dropped {
            tokio::time::sleep(Duration::from_millis(100)).await;
            writer.abort();
            assert!(writer.await.unwrap_err().is_cancelled());
        } else {
            let gave_up = writer.await.unwrap().unwrap_err();
            assert!(gave_up.is_busy(), "{gave_up}");
        }
        let left_at = Instant::now();
        let (in_at, read) = reader.await.unwrap().unwrap_or_else(|e| {
            panic!(
                "the reader (writer dropped: {dropped}): {e} ({:?} after the writer left)",
                left_at.elapsed()
            )
        });
        let after = in_at.saturating_duration_since(left_at);
        assert!(
            after < Duration::from_millis(500),
            "reader in {after:?} after the writer left (dropped: {dropped})"
        );
        read.release().await.unwrap();
    }
    held.release().await.unwrap();
    let _: i64 = nodes[0].cmd(&["DEL", &name]);
    // The readers' mark of the reader that waited behind the writer stays until it expires
    // (as long as that reader might have waited); nothing else is left.
    for node in &nodes {
        common::assert_nothing_left_under(node, "lock:", &[":waiters:doc"], &[&a, &b, &c]).await;
    }
}

/// T14: T11 refuses a RedLock fixed lease under 3 ms, but a `max_hold` cuts the watchdog lease
/// to itself (at least 1 ms), so a watchdog lock with a `max_hold` of 0 to 2 ms asked RedLock for
/// a lease it never grants (the drift allowance is 2 ms): the acquire of a free lock waited out
/// its wait and answered `Busy` ("max_hold 1 ms on a free RedLock lock: lock `short-hold` is
/// busy (waited 301ms, ...)"). Such a max_hold is now refused by name, on the acquire and on
/// the builder; 3 ms is accepted. The same acquire on one server locks (the control).
#[tokio::test]
async fn a_max_hold_too_short_for_redlock_is_refused_by_name_not_busy_on_a_free_lock() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let locker = redlock(&servers, Duration::from_secs(30)).await;
    // The control: a single server takes the same acquire at once.
    let single = Locker::builder()
        .url(servers[0].url())
        .build()
        .await
        .unwrap();
    let control = single
        .lock("short-hold-control")
        .max_hold(Duration::from_millis(2))
        .wait(Duration::from_millis(300))
        .await;
    assert!(control.is_ok(), "single server: {control:?}");
    drop(control);
    let mut wrong = Vec::new();
    for max_hold in [0, 1, 2]
        .map(Duration::from_millis)
        .into_iter()
        .chain([Duration::from_nanos(1), Duration::from_micros(2_999)])
    {
        let started = Instant::now();
        let answer = locker
            .lock("short-hold")
            .max_hold(max_hold)
            .wait(Duration::from_millis(300))
            .await;
        match answer {
            Err(LockError::Config(ConfigError::MaxHoldTooShortForRedLock { max_hold: m, min }))
                if m == max_hold && min == Duration::from_millis(3) => {}
            other => wrong.push(format!(
                "max_hold {max_hold:?} on a free RedLock lock: {other:?} after {:?}",
                started.elapsed()
            )),
        }
        let built = Locker::builder()
            .redlock(urls(&servers))
            .max_hold(max_hold)
            .build()
            .await;
        match built {
            Err(LockError::Config(ConfigError::MaxHoldTooShortForRedLock { .. })) => {}
            other => wrong.push(format!(
                "a RedLock locker with max_hold {max_hold:?}: {other:?}"
            )),
        }
    }
    // From 3 ms, and with a fixed lease (which ignores the max_hold), the acquire goes ahead.
    let built = Locker::builder()
        .redlock(urls(&servers))
        .max_hold(Duration::from_millis(3))
        .build()
        .await;
    assert!(built.is_ok(), "max_hold 3 ms: {:?}", built.err());
    let fixed = locker
        .lock("short-hold")
        .max_hold(Duration::from_millis(1))
        .lease(Duration::from_secs(5))
        .wait(Duration::from_secs(2))
        .await;
    assert!(
        fixed.is_ok(),
        "a fixed lease with a short max_hold: {fixed:?}"
    );
    drop(fixed);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    for server in &servers {
        common::assert_nothing_left_under(server, "lock:", &[], &[&locker, &single]).await;
    }
}
