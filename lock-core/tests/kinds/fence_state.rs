//! What fencing and releases keep in Redis, and that fencing tokens still increase.
//!
//! A key whose holder asked for a fencing token has a fence key (its last token). It lives as
//! long as the lock plus the fence window (`fence_retention`, 10 s by default), and until the
//! server's clock has passed its token plus the window: what fencing keeps is bounded by the
//! locks held now plus those of the last lease and window, not by every key fenced in an hour.

use crate::common;

use std::time::{Duration, Instant};

use common::{assert_nothing_left, assert_nothing_left_under, server};
use lock_core::{LockGuard, Locker};
use lock_testkit::{RedisServer, RedisServers};

/// The fence keys on `server`.
fn fence_keys(server: &RedisServer) -> Vec<String> {
    server.keys("lock:*:fence:*")
}

/// The server's clock in microseconds (`TIME`).
fn server_clock_us(server: &RedisServer) -> u64 {
    let time: Vec<String> = server.cmd(&["TIME"]);
    let secs: u64 = time[0].parse().unwrap();
    let micros: u64 = time[1].parse().unwrap();
    secs * 1_000_000 + micros
}

/// What releases leave with a latch: 32 tasks lock and release fresh keys as fast as they can
/// for a second; a release's latch (the proof a retried release looks for) lives the release
/// retry window (1 s here; none by default), so once it passed nothing is left. Before, each release left a
/// latch for 10 s (four command timeouts, at least 10 s): every key released in the last 10 s,
/// hundreds of thousands at full speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_leave_nothing_once_the_retry_window_passed() {
    let server = server();
    let locker = Locker::builder()
        .url(server.url())
        .release_retry_window(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..32)
        .map(|task| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let mut cycles = 0_u64;
                while started.elapsed() < Duration::from_secs(1) {
                    let guard = locker.lock(format!("fresh-{task}-{cycles}")).await.unwrap();
                    guard.release().await.unwrap();
                    cycles += 1;
                }
                cycles
            })
        })
        .collect();
    let mut cycles = 0;
    for task in tasks {
        cycles += task.await.unwrap();
    }
    let ended = Instant::now();
    let used_memory = || -> i64 {
        let info: String = server.cmd(&["INFO", "memory"]);
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("used_memory")
    };
    let memory_right_after = used_memory();
    let right_after = server.keys("lock:*").len();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let left = server.keys("lock:*");
    let freed = memory_right_after - used_memory();
    lock_testkit::figure(&format!(
        "releases of fresh keys: {cycles} in 1 s, {right_after} keys right after ({freed} bytes, {} bytes a latch), {} keys {:?} after",
        freed / i64::try_from(right_after.max(1)).unwrap(),
        left.len(),
        ended.elapsed()
    ));
    assert!(cycles > 100, "only {cycles} cycles");
    assert!(
        right_after > 0,
        "the latches are there right after the releases"
    );
    assert!(
        left.is_empty(),
        "{} of {cycles} releases left keys 1.5 s after: {:?}",
        left.len(),
        &left[..left.len().min(3)]
    );
    assert_nothing_left(&server, &[&locker]).await;
}

/// By default (a zero release retry window) a release writes no latch: a release of each kind
/// (lock, fair lock, read lock, semaphore permit) leaves no key at all, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_releases_leave_nothing_at_all() {
    let server = server();
    let locker = Locker::connect(&server.url()).await.unwrap();
    for round in 0..50 {
        locker
            .lock(format!("m{round}"))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        locker
            .fair_lock(format!("f{round}"))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        locker
            .read(format!("r{round}"))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let permit = locker
            .semaphore(format!("s{round}"), 2)
            .acquire()
            .await
            .unwrap();
        permit.release().await.unwrap();
        let left = server.keys("*");
        assert!(left.is_empty(), "round {round} left {left:?}");
    }
    // The control: a window leaves a latch per release, for that window.
    let control = Locker::builder()
        .url(server.url())
        .release_retry_window(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    control.lock("m").await.unwrap().release().await.unwrap();
    assert_eq!(server.keys("lock:*").len(), 1, "{:?}", server.keys("*"));
    assert_nothing_left(&server, &[&locker, &control]).await;
}

/// Many distinct keys fenced and released, then silence: with the default retention their
/// fence state is gone within the lease plus the 10 s window. Before, every key fenced left
/// its fence key for an hour (at 1,000 new keys a second, GBs an hour; under `noeviction`
/// Redis then refuses writes and every lock fails).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_state_of_released_keys_is_gone_after_the_lease_and_the_window() {
    const KEYS: usize = 5_000;
    const TASKS: usize = 50;
    // Renewing 5,000 locks is a round of 5,000 script calls, every third of the lease: with a
    // 1 s lease a debug build beside other test threads on two cores fell behind and lost
    // locks. What the test shows does not depend on the lease.
    let lease = Duration::from_secs(3);
    let server = server();
    let locker = Locker::builder()
        .url(server.url())
        .watchdog_lease(lease)
        .build()
        .await
        .unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let mut held: Vec<LockGuard> = Vec::new();
                for i in (task..KEYS).step_by(TASKS) {
                    let guard = locker.lock(format!("order:{i}")).await.unwrap();
                    assert!(guard.fencing_token().await.unwrap() > 0);
                    held.push(guard);
                }
                held
            })
        })
        .collect();
    let mut held = Vec::new();
    for task in tasks {
        held.extend(task.await.unwrap());
    }
    assert_eq!(
        fence_keys(&server).len(),
        KEYS,
        "one fence key per lock held"
    );
    // Held past a few renewals: the renewals carry the fence keys along with their locks.
    tokio::time::sleep(lease * 2).await;
    assert_eq!(
        fence_keys(&server).len(),
        KEYS,
        "a held lock keeps its fence key"
    );
    let mut releases = Vec::new();
    let mut held = held.into_iter();
    loop {
        let chunk: Vec<LockGuard> = held.by_ref().take(KEYS / TASKS).collect();
        if chunk.is_empty() {
            break;
        }
        releases.push(tokio::spawn(async move {
            for guard in chunk {
                guard.release().await.unwrap();
            }
        }));
    }
    for release in releases {
        release.await.unwrap();
    }
    let released = Instant::now();
    // The lock's end (one lease) plus the 10 s window, and 2 s for Redis's active expiry.
    let bound = lease + Duration::from_secs(10) + Duration::from_secs(2);
    let gone = common::eventually(bound, || fence_keys(&server).is_empty()).await;
    let left = fence_keys(&server).len();
    lock_testkit::figure(&format!(
        "fence state: {KEYS} keys fenced and released under a {lease:?} lease: {left} fence keys left {:.1?} after the last release",
        released.elapsed()
    ));
    assert!(
        gone,
        "{left} of {KEYS} fence keys left {:.1?} after the last release (lease {lease:?}, default fence retention)",
        released.elapsed()
    );
    assert_nothing_left(&server, &[&locker]).await;
}

/// Tokens of one key increase across holders, an expired lock, silence past the window (the
/// fence state gone), an empty restart (with the restart guard), and a counter ahead of the
/// server's clock (what a backward clock step leaves): the fence key then lives until the
/// clock has passed it, so the next token is still larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_holders_expiry_silence_and_an_empty_restart() {
    let window = Duration::from_millis(200);
    let lease = Duration::from_millis(500);
    let guard_for = Duration::from_millis(1500);
    let mut server = server();
    let build = || {
        Locker::builder()
            .url(server.url())
            .watchdog_lease(lease)
            .fence_retention(window)
            .restart_guard(guard_for)
            .build()
    };
    let a = build().await.unwrap();
    let b = build().await.unwrap();
    let wait = Duration::from_secs(5);
    let mut tokens = Vec::new();
    // Holders one after the other.
    for locker in [&a, &b, &a] {
        let guard = locker.lock("k").wait(wait).await.unwrap();
        tokens.push(("holder", guard.fencing_token().await.unwrap()));
        guard.release().await.unwrap();
    }
    // A lock that expires under its holder; the next holder's token is larger.
    let expired = a
        .lock("k")
        .lease(Duration::from_millis(150))
        .wait(wait)
        .await
        .unwrap();
    tokens.push(("expiring", expired.fencing_token().await.unwrap()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = b.lock("k").wait(Duration::ZERO).await.unwrap();
    tokens.push(("after expiry", next.fencing_token().await.unwrap()));
    assert!(expired.release().await.unwrap_err().is_lost());
    next.release().await.unwrap();
    // Silence: the fence state is gone after the lock's end (at most a lease after the
    // release) and the window.
    assert!(
        common::eventually(Duration::from_secs(3), || fence_keys(&server).is_empty()).await,
        "fence keys left: {:?}",
        fence_keys(&server)
    );
    let guard = a.lock("k").wait(wait).await.unwrap();
    tokens.push(("after silence", guard.fencing_token().await.unwrap()));
    guard.release().await.unwrap();
    // An empty restart: the guard keeps the server from granting anything at once.
    server.restart().unwrap();
    let guard = b.lock("k").wait(wait).await.unwrap();
    tokens.push(("after restart", guard.fencing_token().await.unwrap()));
    guard.release().await.unwrap();
    // A counter 5 s ahead of the server's clock, as a backward step of 5 s leaves it: the
    // next token is the counter plus one, and its fence key lives until the clock passed it,
    // not only the lock's end and the window (a fixed lease of 200 ms here).
    let fence_key = fence_keys(&server).pop().expect("the fence key of k");
    let ahead = server_clock_us(&server) + 5_000_000;
    let _: () = server.cmd(&["SET", &fence_key, &ahead.to_string(), "PX", "1000"]);
    let guard = a
        .lock("k")
        .lease(Duration::from_millis(200))
        .wait(wait)
        .await
        .unwrap();
    let token = guard.fencing_token().await.unwrap();
    assert_eq!(token, ahead + 1, "the counter plus one");
    tokens.push(("counter ahead of the clock", token));
    guard.release().await.unwrap();
    let pttl: i64 = server.cmd(&["PTTL", &fence_key]);
    assert!(
        pttl > 4_000,
        "the fence key lives until the clock passed its token plus the window, not {pttl} ms"
    );
    // Past the lock's end and the window, not past the token: the next token is still larger.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let guard = b.lock("k").wait(wait).await.unwrap();
    tokens.push((
        "after the window, clock behind the counter",
        guard.fencing_token().await.unwrap(),
    ));
    guard.release().await.unwrap();
    for pair in tokens.windows(2) {
        assert!(
            pair[0].1 < pair[1].1,
            "tokens do not increase: {pair:?} (all: {tokens:?})"
        );
    }
    assert_nothing_left_under(&server, "lock:", &["node-epoch"], &[&a, &b]).await;
}

/// RedLock's write-back: the largest token of the quorum is written to every node of it, and
/// each node keeps it until its own clock has passed it. A node whose counter ran 5 s ahead
/// issues the largest token; once it is gone, the other two still issue a larger one after
/// the lock's end and the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_nodes_keep_a_written_back_token_until_their_clock_passed_it() {
    let window = Duration::from_millis(200);
    let mut nodes = RedisServers::start(3).unwrap();
    let locker = Locker::builder()
        .redlock(nodes.urls())
        .fence_retention(window)
        .build()
        .await
        .unwrap();
    let guard = locker.lock("k").await.unwrap();
    let first = guard.fencing_token().await.unwrap();
    guard.release().await.unwrap();
    let ahead = first + 5_000_000;
    let fence_key = nodes.servers()[0]
        .keys("lock:*:fence:*")
        .pop()
        .expect("the fence key of k");
    let _: () = nodes.servers()[0].cmd(&["SET", &fence_key, &ahead.to_string(), "PX", "60000"]);
    // The node ahead issues the largest token when it is one of the majority that issues:
    // on a loaded machine its answer can come after the other two decided (a majority is
    // all RedLock waits for), and the token is then theirs, from the clock. Such a try says
    // nothing about the write-back; it is taken again.
    let mut tries = Vec::new();
    let raised = loop {
        let guard = locker
            .lock("k")
            .lease(Duration::from_millis(200))
            .await
            .unwrap();
        let token = guard.fencing_token().await.unwrap();
        guard.release().await.unwrap();
        // From the node ahead: one above its counter, or a few more when it answered late
        // in earlier tries (after the others decided) and issued a token of its own each time.
        if token > ahead {
            assert!(
                token <= ahead + 1 + tries.len() as u64,
                "a token past the counter ahead and its tries: {token} ({} tries)",
                tries.len()
            );
            break token;
        }
        tries.push(token);
        assert!(
            tries.len() < 20,
            "the node ahead never issued the largest token (ahead {ahead}): {tries:?}"
        );
    };
    nodes.servers_mut()[0].kill9();
    // Past the lock's end and the window on the other two nodes, not past the token.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let guard = locker.lock("k").await.unwrap();
    let after = guard.fencing_token().await.unwrap();
    guard.release().await.unwrap();
    assert!(
        after > raised,
        "the other nodes issued {after} after the write-back of {raised}"
    );
    for node in &nodes.servers()[1..] {
        assert_nothing_left(node, &[&locker]).await;
    }
}
