//! A review of two fixes: O4 (a RedLock node's answer counts only while no other node's server
//! said the same `run_id`) and N4's second shape as first fixed (acquires and renewals with
//! `min_replicas` sharing their `WAIT`s, since replaced by one acquire's `WAIT` at a time).
//! Each test shows one finding and failed on the code it was written against (794bec9); its
//! doc comment says what it shows (RELIABILITY, "A tenth read").

use crate::common;

use std::time::{Duration, Instant};

use lock_core::{LockError, Locker};
use lock_testkit::{FaultProxy, ProxyMode, RedisServer};

/// Finding R1 (O4's fix): each node's `run_id` is read once, before its first call, and never
/// again on a plain server connection (its generation stays 0). One server `a` under two
/// names (directly and through a proxy, in a deployment `localhost` and `127.0.0.1` or a DNS
/// alias), the second name down when the lockers start: each locker reads `a`'s `run_id`
/// under the first name only. Then `a` restarts without persistence: it forgets the first
/// holder's grant and answers with a new `run_id` under the second name once that is up.
/// The first name still remembers the old `run_id`, so the two names no longer match and
/// both count: a second locker wins `a` twice (two of three votes) while the first holder
/// still holds the lock on `c`. Before: "double holder: .. second locker's acquire of k:
/// Ok(true); first holder's is_held() = true".
///
/// This is RedLock's restart hazard, which the crate documents ("a node restarted without
/// persistence may vote again for a lock it forgot, unless `restart_guard` is set"): with a
/// distinct third server in place of the alias, the same steps give the same double holder
/// (`r1_control_..`, which asserts it). The restart guard closes both: here the restarted
/// server refuses under both names until the leases it may have granted are over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r1_a_server_restarted_before_its_second_name_is_read_does_not_vote_twice() {
    let double_holder = restart_between_first_reads(true, Some(Duration::from_secs(5))).await;
    assert!(double_holder.is_none(), "{double_holder:?}");
}

/// R1's control: a distinct server in place of the alias and no restart guard: the restart
/// without persistence gives the double holder RedLock's documentation warns of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r1_control_a_distinct_server_gives_the_documented_restart_hazard_without_the_guard() {
    let double_holder = restart_between_first_reads(false, None).await;
    assert!(
        double_holder.is_some(),
        "expected the documented double holder"
    );
}

/// R1's steps: nodes `[a, b, c]`, `b` down when two lockers are built (`alias`: `b` is `a`
/// through a proxy; otherwise a server of its own); the first locker takes `k` on `a` and
/// `c`; `a` restarts without persistence and `b` comes up; the second locker tries `k`.
/// `Some(what was seen)` when both say they hold it.
async fn restart_between_first_reads(alias: bool, guard: Option<Duration>) -> Option<String> {
    let mut a = RedisServer::start().unwrap();
    let c = RedisServer::start().unwrap();
    let own = RedisServer::start().unwrap();
    let b = FaultProxy::start(if alias { a.port() } else { own.port() })
        .await
        .unwrap();
    b.set_mode(ProxyMode::Refuse).await;
    let urls = vec![a.url(), b.url(), c.url()];
    let build = || {
        let builder = Locker::builder()
            .redlock(urls.clone())
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_millis(500));
        match guard {
            Some(guard) => builder.restart_guard(guard),
            None => builder,
        }
        .build()
    };
    let first = build().await.expect("a and c are up and distinct");
    let second = build().await.expect("a and c are up and distinct");
    // A fresh server starts its guard too: waited out.
    let held = first
        .lock("k")
        .lease(Duration::from_secs(30))
        .wait(Duration::from_secs(10))
        .await
        .expect("a and c grant it");
    tokio::task::block_in_place(|| a.restart().unwrap());
    b.set_mode(ProxyMode::Pass).await;
    let taken = second
        .lock("k")
        .lease(Duration::from_secs(30))
        .wait(Duration::from_secs(3))
        .await;
    let observed = format!(
        "redlock([a, b (a through a proxy: {alias}; down at build), c]), restart guard \
         {guard:?}; first locker holds k on a and c; a restarted, b up; second locker's \
         acquire of k: {:?}; first holder's is_held() = {}; k on a: {:?}, on c: {:?}",
        taken.as_ref().map(|g| g.is_held()),
        held.is_held(),
        common::lock_key_pttl(&a, "k"),
        common::lock_key_pttl(&c, "k"),
    );
    lock_testkit::figure(&format!("R1: {observed}"));
    let double_holder = taken.as_ref().is_ok_and(|g| g.is_held()) && held.is_held();
    drop(taken);
    drop(held);
    double_holder.then_some(observed)
}

/// The `id` of the client on `server` whose last command was `cmd` (`CLIENT LIST`).
fn client_whose_last_command_was(server: &RedisServer, cmd: &str) -> Vec<i64> {
    let list: String = server.cmd(&["CLIENT", "LIST"]);
    list.lines()
        .filter(|line| line.split(' ').any(|f| f == format!("cmd={cmd}")))
        .filter_map(|line| {
            line.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .and_then(|id| id.parse().ok())
        })
        .collect()
}

/// Finding R2 (N4's shared `WAIT`s): an acquire's write and the shared `WAIT` that counts it
/// are told to be on the same connection by `CLIENT ID` alone (a single server's connection
/// generation is always 0). A client id is unique only while the server runs: a restarted
/// server numbers its clients from the start again (and another server behind the same
/// address, after a failover that moves a DNS name or a virtual IP, has its own numbers). An
/// acquire waiting for the `WAIT` under way (sent before its write was answered) sends the
/// next one after the server restarted, on the connection manager's new connection, which
/// can carry the same id; that connection has written nothing of the acquire's, and its
/// `WAIT` is answered as soon as the replica, resynced from the restarted server, catches
/// up. The acquire of `b` is answered `Ok` ("replicated") although no replica ever
/// acknowledged its write (the replica's link was a black hole from before that write until
/// after the restart), and the key is nowhere: another locker takes `b` while its guard says
/// held. Before the shared `WAIT`s the acquire and its `WAIT` went in one pipeline, which a
/// restart in between fails.
///
/// The interleaving (the locker's link to the primary delayed 300 ms each way, the
/// replica's link a black hole): `a`'s write is answered at 600 ms and its `WAIT` sent then;
/// `b`'s write, sent at 100 ms, is answered at 700 ms, after `a`'s `WAIT` was sent, so `b`
/// waits for the next one. `a`'s `WAIT` times out in Redis (no acknowledgement) and its
/// answer is held in the proxy; meanwhile the primary restarts (no persistence), the
/// replica's link heals and it resyncs, and the new server's client ids are used up to just
/// below the old connection's (as other clients' connections would); the proxy then resets
/// the old connection, `a`'s `WAIT` fails, and `b` sends its `WAIT` on the new connection,
/// which gets the old connection's id.
///
/// Expected: `b` is not answered as replicated while no replica has its key (it ended
/// `NotReplicated` when the new connection's id differed: `R2_CONTROL=1` lines the ids up one
/// further). Fixed by dropping the shared `WAIT`s: an acquire's command and its `WAIT` go in
/// one pipeline again, one acquire's at a time (before: "b: Ok(true) (is_held); b's key on the
/// primary None, on the replica None; another locker's acquire of b: Ok(true)").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_a_shared_wait_on_a_restarted_server_is_not_taken_for_the_old_connections() {
    let (mut primary, replica, link) = common::replica_behind_a_proxy().await;
    // The locker's connection gets an id well above those of a fresh server's first clients.
    for _ in 0..40 {
        let _: String = primary.cmd(&["PING"]);
    }
    let front = FaultProxy::start(primary.port()).await.unwrap();
    let locker = Locker::builder()
        .url(front.url())
        .min_replicas(1, Duration::from_secs(1))
        .command_timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    // Scripts loaded, and the replica acknowledging.
    let mut warm = None;
    for _ in 0..50 {
        match locker.lock("warm").wait(Duration::ZERO).await {
            Ok(guard) => {
                warm = Some(guard);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    warm.expect("a replicated lock while the replica is up")
        .release()
        .await
        .unwrap();
    link.set_mode(ProxyMode::Hole).await;
    front
        .set_mode(ProxyMode::Delay(Duration::from_millis(300)))
        .await;
    let started = Instant::now();
    let a = tokio::spawn({
        let locker = locker.clone();
        async move {
            locker
                .lock("a")
                .lease(Duration::from_secs(60))
                .wait(Duration::ZERO)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = tokio::spawn({
        let locker = locker.clone();
        async move {
            locker
                .lock("b")
                .lease(Duration::from_secs(60))
                .wait(Duration::ZERO)
                .await
        }
    });
    // `a`'s WAIT reaches the primary at about 900 ms and times out there at 1.9 s; its
    // answer is held in the proxy.
    tokio::time::sleep(Duration::from_millis(1200).saturating_sub(started.elapsed())).await;
    front.set_mode(ProxyMode::Hole).await;
    let waited_on = client_whose_last_command_was(&primary, "wait");
    let b_before = common::lock_key_pttl(&primary, "b");
    let b_on_replica_before = common::lock_key_pttl(&replica, "b");
    assert!(!waited_on.is_empty(), "the locker runs `a`'s WAIT");
    // Since N4's third fix every acquire sends its write and `WAIT` in one pipeline on a
    // connection of its own: `a`'s and `b`'s each run their own, and the reset fails both.
    // The interleaving cannot happen, and the answer must still not be a replicated `Ok`
    // for a key no replica has. The ids are lined up with the newest connection's.
    let old_id = waited_on.iter().copied().max().unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(2200).saturating_sub(started.elapsed())).await;
    tokio::task::block_in_place(|| primary.restart().unwrap());
    link.set_mode(ProxyMode::Pass).await;
    assert!(
        common::eventually(Duration::from_secs(10), || {
            replica
                .try_cmd::<String>(&["INFO", "replication"])
                .is_ok_and(|info| info.contains("master_link_status:up"))
        })
        .await,
        "the replica resynced"
    );
    // Other clients connect meanwhile: the new server's ids reach the old connection's.
    let line_up = old_id - 1 + std::env::var("R2_CONTROL").map_or(0, |_| 1);
    let mut last_id: i64 = 0;
    while last_id < line_up {
        last_id = primary.cmd(&["CLIENT", "ID"]);
    }
    assert_eq!(last_id, line_up, "the ids can be lined up");
    front.set_mode(ProxyMode::Reset).await;
    let b_answer = b.await.unwrap();
    let a_answer = a.await.unwrap();
    let took = started.elapsed();
    let b_on_primary = common::lock_key_pttl(&primary, "b");
    let b_on_replica = common::lock_key_pttl(&replica, "b");
    let other = Locker::builder().url(primary.url()).build().await.unwrap();
    let taken = other.lock("b").wait(Duration::ZERO).await;
    let observed = format!(
        "old connection id {old_id}; before the restart b's key on the primary {b_before:?}, \
         on the replica (its link a black hole) {b_on_replica_before:?}; after {took:?}: a: \
         {:?}, b: {:?} (is_held); b's key on the primary {b_on_primary:?}, on the replica \
         {b_on_replica:?}; another locker's acquire of b: {:?}",
        a_answer.as_ref().map(|g| g.is_held()),
        b_answer.as_ref().map(|g| g.is_held()),
        taken.as_ref().map(|g| g.is_held()),
    );
    lock_testkit::figure(&format!("R2: {observed}"));
    assert!(
        !matches!(&b_answer, Ok(guard) if guard.is_held()) || b_on_replica.is_some(),
        "an acquire no replica acknowledged was answered as replicated: {observed}"
    );
    drop(a_answer);
}

/// Finding R3 (O4's fix): only an acquire reads a node's `run_id` (`Node::require`, before
/// its first call); `is_locked`, `inspect` (and a release or renewal) never do. On a
/// `build_lazy()` locker that has not acquired yet, O4's check therefore knows no `run_id`,
/// and a server named twice casts two votes there: with the lock key on `a` alone (here left
/// by another locker of `a`), `is_locked` over `[a, a through a proxy, c]` answers `true`
/// from `a`'s two names against `c`, and `inspect` reports the lock held by a majority.
///
/// Expected: as O4 documents ("a node's answer counts only while no other node's server
/// said the same `run_id` ... read before its first call, so before its first answer
/// counts"), `is_locked` fails with `RedLockNodeTwice`, or counts `a` once (`false`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r3_is_locked_on_a_lazy_locker_does_not_count_one_server_twice() {
    let a = RedisServer::start().unwrap();
    let c = RedisServer::start().unwrap();
    let alias = FaultProxy::start(a.port()).await.unwrap();
    // Another locker's lock on `a` alone.
    let on_a = Locker::builder().url(a.url()).build().await.unwrap();
    let held = on_a.lock("k").lease(Duration::from_secs(30)).await.unwrap();
    let lazy = Locker::builder()
        .redlock(vec![a.url(), alias.url(), c.url()])
        .build_lazy()
        .unwrap();
    let locked = lazy.is_locked("k").await;
    let inspected = lazy.inspect("k").await;
    let observed = format!(
        "redlock([a, a through a proxy, c]).build_lazy(), k held on a only: is_locked: \
         {locked:?}; inspect: {:?}",
        inspected.as_ref().map(Option::is_some)
    );
    drop(held);
    assert!(
        matches!(
            locked,
            Ok(false)
                | Err(LockError::Config(
                    lock_core::ConfigError::RedLockNodeTwice { .. }
                ))
        ),
        "one server counted twice: {observed}"
    );
}

/// Finding R4 (N4's shared `WAIT`s, renewals): a renewal (or an extension) takes the answer
/// of the next shared `WAIT` whatever connection, and whatever run of the server, it ran on
/// (`client` `None`; a single server's generation is always 0), though its write was
/// answered on the old one. A restart while another caller's `WAIT` is under way sends the
/// next `WAIT` on the connection manager's new connection to the restarted server, where it
/// is answered once the replica has resynced: the extension is counted as replicated,
/// although no replica ever acknowledged it (the replica's link was a black hole from before
/// it until after the restart) and the key is nowhere. The holder's guard says held for the
/// extension's 30 s; another locker takes the lock. Unlike R2 no client id has to line up.
/// Before the shared `WAIT`s the extension's own `WAIT` followed its answer at once (the
/// restart would have had to fall in between, not anywhere in another call's `WAIT`).
///
/// The interleaving (the locker's link delayed 300 ms each way, the replica's a black
/// hole): the extension of `g` is answered at 600 ms and sends its `WAIT`, which times out
/// in Redis at 1.9 s and whose answer is held in the proxy; the extension of `h`, sent at
/// 100 ms, is answered at 700 ms, after that `WAIT` was sent, and waits for the next one;
/// the primary restarts (no persistence), the replica's link heals and it resyncs; the proxy
/// resets the old connection: `g`'s `WAIT` fails, `h`'s goes out on the new connection.
///
/// Expected: `h`'s extension fails (no replica acknowledged it), as it does when only the
/// connection is reset (`R4_CONTROL=1`: no restart, the replica's link stays a black hole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_a_renewal_is_not_counted_by_a_wait_on_a_restarted_server() {
    let (mut primary, replica, link) = common::replica_behind_a_proxy().await;
    let front = FaultProxy::start(primary.port()).await.unwrap();
    let locker = Locker::builder()
        .url(front.url())
        .min_replicas(1, Duration::from_secs(1))
        .command_timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let mut held = Vec::new();
    for key in ["g", "h"] {
        for _ in 0..50 {
            match locker
                .lock(key)
                .lease(Duration::from_secs(60))
                .wait(Duration::ZERO)
                .await
            {
                Ok(guard) => {
                    held.push(guard);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
    assert_eq!(held.len(), 2, "replicated locks while the replica is up");
    held[0]
        .extend(Duration::from_secs(60))
        .await
        .expect("scripts loaded, the replica acknowledging");
    let control = std::env::var("R4_CONTROL").is_ok();
    link.set_mode(ProxyMode::Hole).await;
    front
        .set_mode(ProxyMode::Delay(Duration::from_millis(300)))
        .await;
    let started = Instant::now();
    let (g, h) = (&held[0], &held[1]);
    let (g_extended, h_extended, ()) = tokio::join!(
        g.extend(Duration::from_secs(30)),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            h.extend(Duration::from_secs(30)).await
        },
        async {
            tokio::time::sleep(Duration::from_millis(1200).saturating_sub(started.elapsed())).await;
            front.set_mode(ProxyMode::Hole).await;
            tokio::time::sleep(Duration::from_millis(2200).saturating_sub(started.elapsed())).await;
            if !control {
                tokio::task::block_in_place(|| primary.restart().unwrap());
                link.set_mode(ProxyMode::Pass).await;
                assert!(
                    common::eventually(Duration::from_secs(10), || {
                        replica
                            .try_cmd::<String>(&["INFO", "replication"])
                            .is_ok_and(|info| info.contains("master_link_status:up"))
                    })
                    .await,
                    "the replica resynced"
                );
            }
            front.set_mode(ProxyMode::Reset).await;
        }
    );
    let on_primary = common::lock_key_pttl(&primary, "h");
    let on_replica = common::lock_key_pttl(&replica, "h");
    let other = Locker::builder().url(primary.url()).build().await.unwrap();
    let taken = other.lock("h").wait(Duration::ZERO).await;
    let observed = format!(
        "extension of g to 30 s: {g_extended:?}; extension of h to 30 s: {h_extended:?}, \
         is_held() = {}; h on the primary {on_primary:?}, on the replica {on_replica:?}; \
         another locker's acquire of h: {:?}",
        h.is_held(),
        taken.as_ref().map(|g| g.is_held())
    );
    link.set_mode(ProxyMode::Pass).await;
    lock_testkit::figure(&format!("R4: {observed}"));
    assert!(
        h_extended.is_err(),
        "an extension no replica acknowledged was counted: {observed}"
    );
}

/// Finding R5 (N4's shared `WAIT`s; low, availability only, a note for upgrades): the
/// acquire now sends `CLIENT ID` beside its write, and the ACL documented until 794bec9 has
/// no `+client|id`. With that ACL every acquire with `min_replicas` fails with `NOPERM`
/// after its write ran, although the replica acknowledges, and `build()` says nothing (it
/// refuses a server too old, not a right missing). The failed acquire's key is removed by
/// the background releaser (nothing is left 3 s later), so it is no safety hole; the
/// CHANGELOG names the new right.
///
/// Expected: `build()` refuses the missing right (a `ConfigError`, as for a server too old),
/// or the acquire works without it (`WAIT` alone, as before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r5_the_previously_documented_acl_still_takes_locks_with_min_replicas() {
    let primary = common::server();
    let replica = common::server();
    common::attach_replica(&replica, primary.port()).await;
    common::create_documented_user(&primary, |rule| rule != "+client|id");
    let built = Locker::builder()
        .url(common::documented_user_url(primary.port()))
        .min_replicas(1, Duration::from_millis(500))
        .build()
        .await;
    let locker = match built {
        Ok(locker) => locker,
        Err(LockError::Config(_)) => return, // refused at build: fine
        Err(other) => panic!("build: {other:?}"),
    };
    let answer = locker
        .lock("k")
        .lease(Duration::from_secs(30))
        .wait(Duration::ZERO)
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let left = common::lock_key_pttl(&primary, "k");
    let observed = format!(
        "min_replicas(1) with the ACL documented before 794bec9 (no +client|id): acquire: \
         {:?}; 3 s later the lock key {left:?}",
        answer.as_ref().map(|g| g.is_held())
    );
    assert!(
        left.is_none() || answer.is_ok(),
        "a failed acquire left its key: {observed}"
    );
    assert!(answer.is_ok(), "{observed}");
}
