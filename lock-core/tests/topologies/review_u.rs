//! A twelfth read, of the session's library diff (21b6527..a34ae27): O4's `run_id` check on
//! every RedLock node's answer (`Identities::counted`), `BackendError`'s `Config` repr, and
//! the Sentinel generation check of the `WAIT` after renewals and releases. Each test shows
//! one finding and fails on a34ae27; its doc comment says what it shows (RELIABILITY, "A
//! twelfth read").

use crate::common;

use std::time::{Duration, Instant};

use lock_core::Locker;
use lock_testkit::{RedisSentinel, RedisServer};

/// The role (`master`, `slave`) the server on `server` reports; `?` when it cannot be asked.
fn role(server: &RedisServer) -> String {
    let Ok(reply) = server.try_cmd::<redis::Value>(&["ROLE"]) else {
        return "?".to_owned();
    };
    match reply {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(redis::Value::SimpleString(s)) => s.clone(),
            other => format!("{other:?}"),
        },
        other => format!("{other:?}"),
    }
}

/// Finding U1 (Sentinel, `min_replicas`): the generation check of the `WAIT` after renewals
/// refuses renewals that ran on the new primary. `Node::renew` takes the connection's
/// generation before sending; when the renewal meets the demoted old primary (`READONLY`, or
/// a dropped connection), `SentinelPrimary::check` switches to the primary Sentinel names, and
/// `retry_dropped` sends the renewal again 5 ms later, on the new primary, where it renews the
/// key; the `WAIT` after it runs there too and its replica acknowledges. The generation then
/// differs from the one taken before the first try, so `replicas_acked` answers 0 and every
/// renewal of the round becomes `Unknown`: `extend()` fails although the new primary extended
/// the lock and its replica has the extension. 21b6527 counted that `WAIT` (same steps: `Ok`).
/// A watchdog round crossing the switch is refused the same way (not shown here: a lock whose
/// lease is nearly spent when the locker switches would then be lost although renewed).
///
/// Steps: a lock taken with `min_replicas(1, 500 ms)`; `SENTINEL FAILOVER`; as soon as Sentinel
/// names the promoted replica, the old primary is made its replica (`REPLICAOF`, as N3 does,
/// what Sentinel does to it later), its link up; then `extend(20 s)` until the new primary
/// shows the 20 s lease.
///
/// Expected: the extension the new primary applied, acknowledged by its replica, is `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn u1_a_renewal_retried_on_the_new_sentinel_primary_and_replicated_counts() {
    let mut sentinel = RedisSentinel::start("locks").unwrap();
    let holder = Locker::builder()
        .sentinel(sentinel.master_name(), sentinel.sentinel_urls())
        .watchdog_lease(Duration::from_secs(5))
        .min_replicas(1, Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let guard = common::replicated_lock(&holder, "k").await;
    // Up to three failovers: the round crosses the switch only when the locker's own question
    // to Sentinel (after an error, at most every 200 ms, or once a second) comes on a first or
    // second try of the renewal, not its last.
    let mut tries = Vec::new();
    let mut hole = None;
    for attempt in 0..3 {
        let (observed, refused) = failover_and_extend(&sentinel, &guard).await;
        tries.push(format!("failover {attempt}: {observed}"));
        let _ = sentinel.wait_for_failover(Duration::from_secs(15)).unwrap();
        if refused {
            hole = Some(observed);
            break;
        }
        // Sentinel refuses a new failover while the last one is in progress.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    drop(guard);
    drop(holder);
    assert!(
        hole.is_none(),
        "an extension applied on the new primary and replicated was answered an error: {}",
        tries.join(" || ")
    );
}

/// One manual failover of `sentinel` (see U1), then `extend(20 s)` until the new primary shows
/// the 20 s lease: what was seen, and whether that extension was answered an error while the
/// new primary's replica had it.
async fn failover_and_extend(
    sentinel: &RedisSentinel,
    guard: &lock_core::LockGuard,
) -> (String, bool) {
    let promoted_port = sentinel.current_replica().port();
    let started = Instant::now();
    loop {
        let asked: Result<(), _> =
            sentinel.sentinels()[0].try_cmd(&["SENTINEL", "FAILOVER", "locks"]);
        if asked.is_ok() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no failover: {asked:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // As soon as Sentinel names the promoted replica (before the locker's once-a-second
    // question, most of the time).
    while sentinel.current_master_port().ok() != Some(promoted_port) {
        assert!(started.elapsed() < Duration::from_secs(15), "no failover");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let named_after = started.elapsed();
    let old = sentinel.master();
    let demote = ["REPLICAOF", "127.0.0.1", &promoted_port.to_string()];
    while old.try_cmd::<()>(&demote).is_err() {
        assert!(started.elapsed() < Duration::from_secs(15), "no demotion");
    }
    while !old
        .try_cmd::<String>(&["INFO", "replication"])
        .is_ok_and(|info| info.contains("master_link_status:up"))
    {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "old primary not linked"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let linked_after = started.elapsed();
    let new = sentinel.current_replica(); // the fixture's view is not updated yet
    assert_eq!(role(new), "master");
    let mut rounds = Vec::new();
    let mut refused = false;
    while started.elapsed() < Duration::from_secs(8) {
        let sent = started.elapsed();
        let result = guard.extend(Duration::from_secs(20)).await;
        let on_new = common::lock_pttl(new, "k");
        let on_old = common::lock_pttl(old, "k");
        rounds.push(format!(
            "at {sent:?}: extend(20 s) {:?}; PTTL on the new primary {on_new} ms, on its \
             replica (the old primary) {on_old} ms",
            result.as_ref().map_err(ToString::to_string)
        ));
        if on_new > 15_000 {
            refused = result.is_err() && on_old > 15_000;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Back to a shorter lease, so the next round tells an applied extension again.
    let _ = guard.extend(Duration::from_secs(5)).await;
    let observed = format!(
        "Sentinel named the promoted replica {named_after:?} after SENTINEL FAILOVER, old \
         primary linked as its replica at {linked_after:?}; {}",
        rounds.join("; ")
    );
    (observed, refused)
}
