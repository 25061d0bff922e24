//! A review of the eleventh round of fixes (058dc7e): N4's second shape redone as one
//! acquire's command and `WAIT` at a time on a server or Sentinel primary (the others waiting
//! for their turn up to the `WAIT`'s timeout, then `NotReplicated` without sending), the
//! generation check of the `WAIT` after renewals and releases, and O4's `run_id` check.
//! Each test shows one finding and fails on 058dc7e; its doc comment says what it shows.
//! The turn was withdrawn after this read (S2 passes again); S1 was fixed with N4's second
//! shape, by the connections of their own of `store/wait.rs`; S4 was too, until E1 and E2
//! sent extensions back to the shared connection, and again since a hold orders a pooled
//! extension by its answer (`held.rs`, `Extended`); S3 is fixed (RELIABILITY, "An eleventh
//! read").

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lock_core::{LockError, Locker};
use lock_testkit::{FaultProxy, ProxyMode, RedisServer};

/// Finding S1: the turn does not outlive a cancelled acquire. An acquire's future dropped
/// while its [command, `WAIT`] pipeline is under way (a `tokio::time::timeout` or `select!`
/// around `lock()`, the request timeouts the security notes tell operators to put in front of
/// the layer) gives the turn back at once, while its `WAIT` still blocks the shared connection
/// in Redis. The next acquire takes the turn and sends its own pipeline behind it, and so on:
/// the `WAIT`s pile up in Redis one after the other exactly as before the fix, and the renewals
/// of a lock held all along queue behind them until they time out.
///
/// Setup as `acquires_waiting_for_a_lagging_replica_do_not_lose_the_lockers_other_locks`
/// (replica link 100 ms each way, `min_replicas` 400 ms, command timeout 1 s, lease 3 s), but
/// each of 40 tasks wraps its acquire in a 50 ms timeout and tries again, for 4 s.
///
/// Expected (the docs of `min_replicas`): "a burst of acquires holds the locker's other
/// commands up for one `timeout` at most"; the held lock is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_cancelled_acquires_do_not_pile_their_waits_up_on_the_connection() {
    let (primary, _replica, link) = common::replica_behind_a_proxy().await;
    let locker = Locker::builder()
        .url(primary.url())
        .min_replicas(1, Duration::from_millis(400))
        .command_timeout(Duration::from_secs(1))
        .watchdog_lease(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    let held = common::replicated_lock(&locker, "h").await;
    link.set_mode(ProxyMode::Delay(Duration::from_millis(100)))
        .await;
    let started = Instant::now();
    let run_for = Duration::from_secs(4);
    let tasks: Vec<_> = (0..40)
        .map(|t| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let mut answers = BTreeMap::<String, usize>::new();
                let mut i = 0;
                while started.elapsed() < run_for {
                    i += 1;
                    let key = format!("x{t}-{i}");
                    let acquire = locker.lock(key.as_str()).wait(Duration::from_secs(10));
                    let answer =
                        match tokio::time::timeout(Duration::from_millis(50), acquire).await {
                            Err(_) => "cancelled after 50 ms".to_owned(),
                            Ok(Ok(guard)) => {
                                let _ = guard.release().await;
                                "Ok".to_owned()
                            }
                            Ok(Err(LockError::NotReplicated { .. })) => "NotReplicated".to_owned(),
                            Ok(Err(e)) => e.to_string().replace(&format!("`{key}`"), "`x..`"),
                        };
                    *answers.entry(answer).or_default() += 1;
                }
                answers
            })
        })
        .collect();
    // Half-way: the locker's command connection in Redis (blocked in a `WAIT`, with what it
    // has not read yet in its query buffer).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let list: String = primary.cmd(&["CLIENT", "LIST"]);
    let blocked: Vec<String> = list
        .lines()
        .filter(|line| line.split(' ').any(|f| f == "cmd=wait"))
        .map(|line| {
            line.split(' ')
                .filter(|f| ["flags=", "qbuf=", "age="].iter().any(|p| f.starts_with(p)))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let mut answers = BTreeMap::<String, usize>::new();
    for task in tasks {
        for (answer, n) in task.await.unwrap() {
            *answers.entry(answer).or_default() += n;
        }
    }
    let held_is_held = held.is_held();
    let h_in_redis = common::lock_key_pttl(&primary, "h");
    link.set_mode(ProxyMode::Pass).await;
    let observed = format!(
        "40 tasks, each acquire cut after 50 ms, for {run_for:?} with the replica's link 100 ms \
         each way (min_replicas 400 ms, command timeout 1 s): {answers:?}; the lock held all \
         along (lease 3 s): is_held() = {held_is_held}, its key on the primary {h_in_redis:?}; at 2 s the \
         connection(s) last in a WAIT: {blocked:?}"
    );
    lock_testkit::figure(&format!("S1: {observed}"));
    drop(held);
    assert!(held_is_held, "{observed}");
}

/// Finding S2: with healthy replicas, a burst of acquires is answered `NotReplicated`, and an
/// acquire allowed to wait 10 s gives up at once. Each acquire's [command, `WAIT`] takes one
/// replica round trip, and the acquires queue for their turn; the turn is waited for at most
/// `min.timeout`, which is the budget of one `WAIT`, not of a queue of them. So the 17th
/// acquire of a burst fails when a round trip is a sixteenth of the timeout, although every
/// replica acknowledges every write well within it. `NotReplicated` is an error of the
/// acquire (not a `Busy` the loop waits out), so `lock().wait(10 s)` returns it at once.
///
/// Here the replica is 2 ms away (a proxy delaying each chunk 2 ms each way, a replica in
/// another zone), `min_replicas(1, 150 ms)`: a `WAIT` takes about 5 ms, and a queue of the 64
/// acquires' turns about 320 ms, past the timeout (50 ms when the finding was made; 150 ms
/// leaves a busy machine's stall room). 64 acquires of distinct keys at once, each allowed to
/// wait 10 s.
///
/// Expected (docs: the others "fail with `NotReplicated` without sending anything if [their
/// turn] does not come (replicas that slow are behind)"): replicas that acknowledge each write
/// in a thirtieth of the timeout are not behind; every acquire is `Ok` (or at least a waiting
/// acquire tries again rather than failing). On 21b6527 (each acquire's own pipeline, no
/// turn) the same burst was all `Ok`: "{\"Ok\": 64} in 408.692599ms".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_a_burst_of_acquires_with_a_healthy_replica_is_not_answered_not_replicated() {
    let (primary, _replica, link) = common::replica_behind_a_proxy().await;
    let locker = Locker::builder()
        .url(primary.url())
        .min_replicas(1, Duration::from_millis(150))
        .build()
        .await
        .unwrap();
    common::replicated_lock(&locker, "warm")
        .await
        .release()
        .await
        .unwrap();
    link.set_mode(ProxyMode::Delay(Duration::from_millis(2)))
        .await;
    // One acquire alone: how long a replicated acquire takes now.
    let alone = Instant::now();
    let one = locker.lock("alone").wait(Duration::from_secs(10)).await;
    let alone = alone.elapsed();
    let one = one.map(|_| ()).map_err(|e| e.to_string());
    let started = Instant::now();
    let burst: Vec<_> = (0..64)
        .map(|i| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let asked = Instant::now();
                let answer = match locker
                    .lock(format!("b{i}"))
                    .wait(Duration::from_secs(10))
                    .await
                {
                    Ok(guard) => {
                        let _ = guard.release().await;
                        "Ok".to_owned()
                    }
                    Err(LockError::NotReplicated { acked, .. }) => {
                        format!("NotReplicated(acked {acked})")
                    }
                    Err(e) => e.to_string().replace(&format!("`b{i}`"), "`b..`"),
                };
                (answer, asked.elapsed())
            })
        })
        .collect();
    let mut answers = BTreeMap::<String, usize>::new();
    let mut slowest_not_replicated = Duration::ZERO;
    for task in burst {
        let (answer, took) = task.await.unwrap();
        if answer.starts_with("NotReplicated") {
            slowest_not_replicated = slowest_not_replicated.max(took);
        }
        *answers.entry(answer).or_default() += 1;
    }
    let burst_took = started.elapsed();
    link.set_mode(ProxyMode::Pass).await;
    let observed = format!(
        "replica 2 ms away, min_replicas(1, 150 ms): one acquire alone {one:?} in {alone:?}; 64 \
         acquires at once, each allowed to wait 10 s: {answers:?} in {burst_took:?} (the last \
         NotReplicated answered after {slowest_not_replicated:?})"
    );
    lock_testkit::figure(&format!("S2: {observed}"));
    assert_eq!(answers.get("Ok"), Some(&64), "{observed}");
}

/// Finding S4: the turn covers acquires only; every extension (and every release on a
/// Sentinel primary) still sends a `WAIT` of its own after its renewal, on the one shared
/// connection. A burst of `extend()` calls on distinct locks while the replica is slow to
/// acknowledge blocks the connection in Redis for the sum of their `WAIT`s, one after the
/// other, exactly as a burst of acquires did before N4's second fix: the renewals of a lock
/// held all along queue behind them, time out, and the lock is lost.
///
/// Setup as `acquires_waiting_for_a_lagging_replica_do_not_lose_the_lockers_other_locks`
/// (replica link 100 ms each way, `min_replicas` 400 ms, command timeout 1 s, lease 3 s): 40
/// locks taken while the link is fast, then the link slows and each of the 40 is extended
/// at once.
///
/// Expected (RELIABILITY N4: "so the connection is held up by one `WAIT` at a time"; the
/// builder: other commands "queue behind it for up to `timeout`"): the held lock is kept.
/// (Not new in 058dc7e: it fails on 21b6527 too; the fix's turn does not reach it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_a_burst_of_extensions_does_not_pile_their_waits_up_on_the_connection() {
    let (primary, _replica, link) = common::replica_behind_a_proxy().await;
    let locker = Locker::builder()
        .url(primary.url())
        .min_replicas(1, Duration::from_millis(400))
        .command_timeout(Duration::from_secs(1))
        .watchdog_lease(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    let held = common::replicated_lock(&locker, "h").await;
    let mut others = Vec::new();
    for i in 0..40 {
        others.push(common::replicated_lock(&locker, &format!("e{i}")).await);
    }
    link.set_mode(ProxyMode::Delay(Duration::from_millis(100)))
        .await;
    let started = Instant::now();
    let extensions = futures_util::future::join_all(
        others
            .iter()
            .map(|guard| guard.extend(Duration::from_secs(30))),
    )
    .await;
    let burst_took = started.elapsed();
    let mut answers = BTreeMap::<String, usize>::new();
    for answer in extensions {
        let answer = match answer {
            Ok(()) => "Ok".to_owned(),
            Err(e) => {
                let text = e.to_string();
                match (text.find('`'), text.rfind('`')) {
                    (Some(a), Some(b)) if a < b => format!("{}`e..`{}", &text[..a], &text[b + 1..]),
                    _ => text,
                }
            }
        };
        *answers.entry(answer).or_default() += 1;
    }
    // Past the held lock's lease, counted from the burst's start.
    tokio::time::sleep(Duration::from_millis(3500).saturating_sub(started.elapsed())).await;
    let held_is_held = held.is_held();
    let h_in_redis = common::lock_key_pttl(&primary, "h");
    link.set_mode(ProxyMode::Pass).await;
    let observed = format!(
        "40 extensions at once with the replica's link 100 ms each way (min_replicas 400 ms, \
         command timeout 1 s): {answers:?}, burst took {burst_took:?}; the lock held all along \
         (lease 3 s): is_held() = {held_is_held}, its key on the primary {h_in_redis:?}"
    );
    lock_testkit::figure(&format!("S4: {observed}"));
    drop(others);
    drop(held);
    assert!(held_is_held, "{observed}");
}

/// Tries `k` ten times on a RedLock of `nodes` (each a proxy delaying every chunk 3 ms each
/// way in front of a server whose user is the documented one, less `+info` when `info` is
/// false), with a 500 ms lease (a node's answer is waited for 10 ms); the answers counted.
async fn redlock_acquires_3_ms_away(info: bool) -> BTreeMap<String, usize> {
    let servers: Vec<RedisServer> = (0..3).map(|_| common::server()).collect();
    let mut proxies = Vec::new();
    for server in &servers {
        common::create_documented_user(server, |rule| info || rule != "+info");
        let proxy = FaultProxy::start(server.port()).await.unwrap();
        proxy
            .set_mode(ProxyMode::Delay(Duration::from_millis(3)))
            .await;
        proxies.push(proxy);
    }
    let urls: Vec<String> = proxies
        .iter()
        .map(|p| common::documented_user_url(p.port()))
        .collect();
    let locker = Locker::builder().redlock(urls).build().await.unwrap();
    let mut answers = BTreeMap::<String, usize>::new();
    for _ in 0..10 {
        let answer = match locker
            .lock("k")
            .lease(Duration::from_millis(500))
            .wait(Duration::from_millis(200))
            .await
        {
            Ok(guard) => {
                let _ = guard.release().await;
                "Ok".to_owned()
            }
            Err(e) => e.to_string(),
        };
        *answers.entry(answer).or_default() += 1;
    }
    answers
}

/// Finding S3 (O4): a node's answer counts "once its `run_id` is read ([..] or it is read
/// now)". A server that does not say its `run_id` (a user without `+info`, which the crate
/// supports: "not checked", with a warning) is never read, so every call to every node is
/// followed by another `INFO server` (refused again, warned about again) before its answer
/// counts, a second round trip. An acquire waits for a node's answer a fiftieth of the lease
/// (at least 10 ms): with nodes 3 ms away each way (a round trip of about 6.5 ms, well under
/// the 10 ms) and a 500 ms lease, the grant and the second `INFO` together take about 13 ms,
/// every node's answer is cut, and no acquire ever wins, though every node granted.
///
/// Control: the same nodes with `+info` (the `run_id` read once): every acquire is `Ok`.
///
/// Expected: the same answers with and without `+info` (before O4's fix, a node's answer was
/// its acquire's reply alone; on 21b6527: "without +info {\"Ok\": 10}").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_redlock_nodes_that_do_not_say_their_run_id_still_grant_within_the_per_node_limit() {
    let with_info = redlock_acquires_3_ms_away(true).await;
    let without_info = redlock_acquires_3_ms_away(false).await;
    let observed = format!(
        "redlock of 3 nodes 3 ms away each way, lease 500 ms (10 ms per node), 10 acquires of \
         k: with +info {with_info:?}; without +info {without_info:?}"
    );
    lock_testkit::figure(&format!("S3: {observed}"));
    assert_eq!(with_info.get("Ok"), Some(&10), "control: {observed}");
    assert_eq!(without_info.get("Ok"), Some(&10), "{observed}");
}
