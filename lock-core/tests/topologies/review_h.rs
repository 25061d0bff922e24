//! A read of ead2de5: pooled extensions ordered by their answer, `Undecided::Unreplicated`
//! (G1), rounds counted up to an unanswered extension's least (G2). Each test shows one
//! finding and fails on ead2de5; its doc comment says what 52f9ecd (extensions on the shared
//! connection) does. H1 is fixed (RELIABILITY, "A seventeenth read"): an extension for which
//! no connection could be had was never sent (`BackendError::was_unsent`,
//! `Undecided::Unsent`) and caps nothing.

use crate::common;

use std::time::{Duration, Instant};

use lock_core::Locker;

/// A locker on `primary` with `min_replicas(1, 500 ms)` (its pool of connections of their
/// own), a 2 s command timeout, a 1 s connect timeout and a 3 s watchdog lease.
async fn replicated_locker(primary: &lock_testkit::RedisServer) -> Locker {
    Locker::builder()
        .url(primary.url())
        .min_replicas(1, Duration::from_millis(500))
        .command_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(1))
        .watchdog_lease(Duration::from_secs(3))
        .build()
        .await
        .unwrap()
}

/// `(id, line)` of each normal client of the server, seen on `admin`.
fn normal_clients(admin: &mut redis::Connection) -> Vec<(u64, String)> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
    list.lines()
        .filter(|l| l.contains(" flags=N "))
        .filter_map(|l| {
            let id = l.strip_prefix("id=")?.split(' ').next()?.parse().ok()?;
            Some((id, l.to_owned()))
        })
        .collect()
}

/// Finding H1 (availability): an `extend` that never reached Redis (no connection of its own
/// could be opened: the server at `maxclients`, while the locker's shared connection works)
/// caps a watchdog lock for good. `LocalLocks::extend_in_turn` calls `expect_extension` with
/// `ExtensionPath::OwnConnection` before the pool lends a connection; `WaitPool::lend` fails
/// (the write never left the process), the answer is `Unknown`, `unanswered` stays set, and
/// every later round counts only up to `sent + by - margin` ("may still run in Redis at any
/// time"; it cannot: it was never sent). The lock is lost locally at the extension's end
/// while the watchdog's rounds keep its key under the holder's token, and it is never handed
/// to a local waiter again (`extension_may_still_run`).
///
/// Interleaving: a watchdog lock (lease 3 s); the pool's idle connection killed, a filler
/// connection takes its slot and `maxclients` is set to the clients connected; `extend(4 s)`
/// (lengthening); `maxclients` back; 4.5 s later.
///
/// Expected: `is_held()` true (the key's PTTL ~2 s, the holder's token, renewed by the
/// rounds). On 52f9ecd (the extension on the shared connection) `extend` answers `Ok` and the
/// lock stays held. Observed on ead2de5: see the `figure` line.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn h1_an_extension_that_never_left_the_process_does_not_cap_the_lock_for_good() {
    let (primary, _replica, _link) = common::replica_behind_a_proxy().await;
    let locker = replicated_locker(&primary).await;
    let guard = common::replicated_lock(&locker, "h1").await;
    let name = common::lock_key(&primary, "h1");
    let token: Option<String> = primary.cmd(&["GET", &name]);

    let mut admin = primary.client();
    let admin_id: u64 = redis::cmd("CLIENT").arg("ID").query(&mut admin).unwrap();
    // The locker's: its shared connection (opened first) and its pool's idle one(s).
    let mut ours: Vec<u64> = normal_clients(&mut admin)
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| *id != admin_id)
        .collect();
    ours.sort_unstable();
    assert!(ours.len() >= 2, "no pooled connection: {ours:?}");
    let total: u64 = {
        let info: String = redis::cmd("INFO").arg("clients").query(&mut admin).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg((total + 1).to_string())
        .query(&mut admin)
        .unwrap();
    for id in &ours[1..] {
        let _: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id.to_string())
            .query(&mut admin)
            .unwrap();
    }
    // Fillers take the freed slots (and any left).
    let mut fillers = Vec::new();
    for _ in 0..10 {
        match redis::Client::open(primary.url())
            .unwrap()
            .get_connection()
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c).map(|_| c))
        {
            Ok(c) => fillers.push(c),
            Err(_) => break,
        }
    }
    let sent = Instant::now();
    let answer = match guard.extend(Duration::from_secs(4)).await {
        Ok(()) => "Ok".to_owned(),
        Err(e) => format!("{e}"),
    };
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg("10000")
        .query(&mut admin)
        .unwrap();
    drop(fillers);
    tokio::time::sleep_until((sent + Duration::from_millis(4500)).into()).await;
    let (is_held, remaining) = (guard.is_held(), guard.remaining());
    let pttl: i64 = primary.cmd(&["PTTL", &name]);
    let value: Option<String> = primary.cmd(&["GET", &name]);
    let observed = format!(
        "extend(4 s) with no connection of its own to be had: {answer:?}; 4.5 s later: \
         is_held() = {is_held}, remaining() = {remaining:?}; the key's PTTL {pttl}, still the \
         holder's token: {}",
        value.is_some() && value == token
    );
    lock_testkit::figure(&format!("H1: {observed}"));
    assert!(pttl > 500 && value == token, "{observed}");
    assert!(
        is_held,
        "the lock is lost locally while Redis keeps it for the holder: {observed}"
    );
}
