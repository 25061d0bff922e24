//! A review of e7c87f4 (N4's third fix with X1–X4 and Y1–Y2 fixed): the pool of connections
//! of their own for writes and their `WAIT`s (`store/wait.rs`), its `PING` before lending an
//! idle connection and its connect loop. Each test shows one finding and fails on e7c87f4;
//! its doc comment says what it shows and what 4effc48 did.
//!
//! Fixed after this read (RELIABILITY, "A fifteenth read"): checking an idle connection and
//! opening one take the connect timeout in all, the `PING` at most half of it (Z1: "after
//! 2.001592456s"); a connect loop refused until its end answers a timeout, which callers do
//! not retry (Z2: "after 1.932767411s").
//!
//! Since E1 and E2 (`review_e.rs`) explicit extensions go on the shared connection again:
//! the tests here that extend now meet it, not the pool (`y2_acquires_..` keeps Y2's check
//! on the pool through acquires; X1's restart and Sentinel release tests keep X1's).

use crate::common;

use std::time::{Duration, Instant};

use lock_core::{LockError, LockGuard, Locker};
use lock_testkit::{FaultProxy, ProxyMode};

/// The error text, or `Ok`.
fn shown<T>(answer: &Result<T, LockError>) -> String {
    match answer {
        Ok(_) => "Ok".to_owned(),
        Err(e) => e.to_string(),
    }
}

/// `h` taken with a 30 s lease once the replica acknowledges (tried every 100 ms for 5 s).
async fn held_30s(locker: &Locker) -> LockGuard {
    common::replicated_lock_leased(locker, "h", Some(Duration::from_secs(30))).await
}

/// A locker on `front` with X4's settings (connect timeout 2 s).
async fn x4_locker(front: &FaultProxy) -> Locker {
    common::replicated_locker_via(front, Duration::from_secs(2)).await
}

/// Finding Z1: Y2's `PING` before lending undoes X4's bound. A pool connection idle for
/// over 500 ms is `PING`ed first, with the connection's response timeout (the command
/// timeout); through a partition the `PING` waits all of it, and then the pool opens a new
/// connection, which waits all of the connect timeout: the first `extend()` after a quiet
/// spell takes the command timeout *plus* the connect timeout, before it sends anything.
/// X4 bounded a call that must open a connection by the connect timeout ("a call that must
/// open one answers within it"); 4effc48's extension went on the shared connection and
/// failed after the command timeout. Nothing bounds `extend()` from outside.
///
/// Interleaving: X4's (the primary behind a proxy, command timeout 1 s, connect timeout 2 s,
/// `min_replicas(1, 400 ms)`; `h` taken with a 30 s lease), except that the locker is quiet
/// for 700 ms (its pool connection idle over 500 ms) before the proxy becomes a blackhole;
/// then `extend(30 s)`.
///
/// Expected: the extension fails within X4's threshold, 2.5 s, as on 4effc48 ("extend(30 s):
/// \"redis error on lock `h`: the extension got no decisive answer from redis\" after
/// 1.001373385s"). Observed on e7c87f4: "after 700 ms quiet, the link a blackhole (command
/// timeout 1 s, connect timeout 2 s): extend(30 s): \"redis error on lock `h`: the extension
/// got no decisive answer from redis\" after 3.004072873s" (the `PING`'s 1 s, then the
/// connect timeout's 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn z1_an_extension_through_a_partition_after_a_quiet_spell_keeps_x4s_bound() {
    let (primary, _replica, _link) = common::replica_behind_a_proxy().await;
    let front = FaultProxy::start(primary.port()).await.unwrap();
    let locker = x4_locker(&front).await;
    let held = held_30s(&locker).await;
    // Warm: an extension that works, so the pool has a connection and the script is loaded.
    held.extend(Duration::from_secs(30)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    front.set_mode(ProxyMode::Hole).await;
    let asked = Instant::now();
    let answer = held.extend(Duration::from_secs(30)).await;
    let took = asked.elapsed();
    front.set_mode(ProxyMode::Pass).await;
    let observed = format!(
        "after 700 ms quiet, the link a blackhole (command timeout 1 s, connect timeout 2 s): \
         extend(30 s): {:?} after {took:?}",
        shown(&answer)
    );
    lock_testkit::figure(&format!("Z1: {observed}"));
    drop(held);
    assert!(took < Duration::from_millis(2500), "{observed}");
}

/// Finding Z2: Y1's connect loop runs inside the callers' own retries. A pool connection
/// is opened with tries again after a refusal, "within the connect timeout in all"; but the
/// refusal that ends the loop is a dropped-connection error, which `retry_dropped` (an
/// extension's, a handoff renewal's, a Sentinel release's) answers with two more tries, each
/// looping for the connect timeout again: while the server is down (refusing connections)
/// an `extend()` takes about three connect timeouts, X4's hang again by another way.
/// (By reading, not run: b6195aa's one connect try would fail each try at once.)
/// 4effc48's extension went on the shared connection.
///
/// Interleaving: X4's settings (command timeout 1 s, connect timeout 2 s,
/// `min_replicas(1, 400 ms)`), `h` taken with a 30 s lease and extended once; the proxy in
/// front of the primary closes its connections and refuses new ones (a stopped server),
/// for longer than the test; `extend(30 s)`.
///
/// Expected: the extension fails within X4's threshold, 2.5 s, as on 4effc48 ("extend(30 s):
/// \"redis error on lock `h`: the extension got no decisive answer from redis\" after
/// 1.081287369s"). Observed on e7c87f4: "the server refusing connections (command timeout 1 s,
/// connect timeout 2 s): extend(30 s): \"redis error on lock `h`: the extension got no
/// decisive answer from redis\" after 3.918384157s" (the first try on the closed pool
/// connection, then two retries, each looping on refusals for the 2 s connect timeout; with
/// the defaults, 5 s, about 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn z2_an_extension_while_the_server_refuses_fails_within_the_connect_timeout() {
    let (primary, _replica, _link) = common::replica_behind_a_proxy().await;
    let front = FaultProxy::start(primary.port()).await.unwrap();
    let locker = x4_locker(&front).await;
    let held = held_30s(&locker).await;
    held.extend(Duration::from_secs(30)).await.unwrap();
    front.set_mode(ProxyMode::Refuse).await;
    let asked = Instant::now();
    let answer = held.extend(Duration::from_secs(30)).await;
    let took = asked.elapsed();
    front.set_mode(ProxyMode::Pass).await;
    let observed = format!(
        "the server refusing connections (command timeout 1 s, connect timeout 2 s): \
         extend(30 s): {:?} after {took:?}",
        shown(&answer)
    );
    lock_testkit::figure(&format!("Z2: {observed}"));
    drop(held);
    assert!(took < Duration::from_millis(2500), "{observed}");
}
