//! Review of the changes since 5cc550f (HoldEnds, the background release retry, the
//! RELEASE_SENT / RELEASED_OURS marks, with_lock's Lost/Ok decision, the handoff's Undecided).
//! Each test names its finding and failed on the code it was written against.

use crate::common;

use std::time::Duration;

use lock_core::Locker;
use lock_testkit::{FaultProxy, ProxyMode};
use tokio::time::Instant;

/// Finding M1 (T17 incomplete): a watchdog lock without `max_hold` whose lease a shortening
/// `extend` cut ends by design when that shorter lease runs out before the watchdog's next
/// round: the key is gone from Redis and another locker takes it at once, but `planned_end`
/// is `None` for such a lock, so `HoldEnds` is never told and the hold is marked lost (its
/// local place given back) only at the watchdog's next round, a third of the watchdog lease
/// later (10 s by default). The holder keeps its guard (hung); a sibling task of the same
/// process waits 3 s and gets `Busy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m1_a_watchdog_lock_cut_short_by_extend_frees_its_local_place_when_it_ends() {
    let server = common::server();
    // Default watchdog lease (30 s): the watchdog's rounds are 10 s apart.
    let locker = common::locker(&server).await;
    let other = common::locker(&server).await;
    let hung = locker.lock("cut").await.unwrap();
    hung.extend(Duration::from_millis(300)).await.unwrap();
    let started = Instant::now();
    let sibling = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.lock("cut").wait(Duration::from_secs(3)).await })
    };
    let result = sibling.await.unwrap();
    let waited = started.elapsed();
    let elsewhere = other.lock("cut").wait(Duration::ZERO).await;
    let desc = format!("{result:?}");
    let elsewhere_desc = if elsewhere.is_ok() {
        "took it at once"
    } else {
        "refused"
    };
    if let Ok(g) = elsewhere {
        g.release().await.unwrap();
    }
    if let Ok(g) = result {
        g.release().await.unwrap();
    } else {
        drop(hung);
        panic!(
            "another task of the process: {desc} after {waited:?}, although the hung holder's \
             lease, cut to 300 ms by extend, ended its lock in Redis (another locker then: \
             {elsewhere_desc})"
        );
    }
    drop(hung);
}

/// Suspicion (1), confirmed as finding M2: a shortening `extend` undone in Redis by a
/// watchdog renewal that was sent before it and retried on a new connection after it
/// (`retry_dropped` tries again 5 ms and 50 ms after a dropped connection). The hold ignores
/// that renewal's answer (`before_extension`), so locally the lock ends with the short lease
/// and is marked lost; in Redis the retried renewal (`ttl < lease`: it grows the key) gave the
/// key a whole watchdog lease again under the holder's token. While the holder keeps its
/// guard, the key is held by nobody for up to a lease after the shortened one ended.
///
/// Interleaving: the proxy holds (Hole) the round's renewal; Reset drops it; Hole holds its
/// first retry (+5 ms); Reset drops that too; the holder's `extend(200 ms)` runs at once on
/// the fresh connection; the renewal's last retry (+50 ms) runs after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m2_a_shortening_extend_is_not_undone_by_a_renewal_retried_after_it() {
    let lease = Duration::from_secs(3);
    let (server, proxy, holder, other) = common::holder_behind_a_proxy(lease).await;
    // A race against `retry_dropped`'s 5 ms and 50 ms pauses: tried up to eight times, each
    // on a key of its own; one round that leaves the key behind is the finding.
    let mut seen = Vec::new();
    for round in 0..8 {
        let key = format!("k{round}");
        let guard = holder.lock(key.clone()).await.unwrap();
        let calls = holder.stats().renewal_calls;
        proxy.set_mode(ProxyMode::Hole).await;
        // The watchdog's next round sends the renewal (held by the proxy).
        assert!(
            common::eventually(Duration::from_secs(3), || holder.stats().renewal_calls
                > calls)
            .await,
            "no renewal round"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        proxy.set_mode(ProxyMode::Reset).await;
        proxy.set_mode(ProxyMode::Hole).await;
        tokio::time::sleep(Duration::from_millis(25)).await;
        proxy.set_mode(ProxyMode::Reset).await;
        proxy.set_mode(ProxyMode::Pass).await;
        let extended = guard.extend(Duration::from_millis(200)).await;
        let extended_at = Instant::now();
        tokio::time::sleep(Duration::from_millis(600)).await;
        let held = guard.is_held();
        let left = common::lock_pttl(&server, &key);
        let taken = other.lock(key.clone()).wait(Duration::ZERO).await;
        let taken_desc = format!("{:?}", taken.as_ref().map(|_| "taken"));
        let after = extended_at.elapsed();
        if let Ok(g) = taken {
            g.release().await.unwrap();
        }
        drop(guard);
        seen.push(format!(
            "round {round}: extend {extended:?}, PTTL {left} ms"
        ));
        assert!(
            left < 0,
            "round {round}: extend(200 ms) answered {extended:?}; {after:?} later the guard \
             says is_held() = {held}, yet the key is still in Redis under its token (PTTL \
             {left} ms), held by nobody; another locker: {taken_desc}"
        );
        // Let the dropped guard's release and the watchdog settle.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("{}", seen.join("\n"));
}

/// M2's fix, the other way round: the extension sent again after a renewal that may have
/// undone it is for shortening extensions only. A lengthening `extend(10 s)` sent while the
/// watchdog's renewal (sent before it) still waits for its answer must stand: the renewal is
/// answered first, while the extension is still unanswered (the hold still keeps the old
/// lease), and sending "the lease the hold keeps" again then would cut the key back after the
/// extension ran: the lock would be lost at the old lease although `extend` answered `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m2_a_lengthening_extend_sent_while_a_renewal_waits_is_not_cut_back() {
    let server = common::server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let lease = Duration::from_secs(3);
    let holder = Locker::builder()
        .url(proxy.url())
        .watchdog_lease(lease)
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    common::load_scripts(&holder).await;
    let guard = holder.lock("long").await.unwrap();
    let calls = holder.stats().renewal_calls;
    // Every chunk held 300 ms each way: the renewal's answer comes back before the answer of
    // an extension sent after it, and anything sent on that answer reaches Redis after the
    // extension ran.
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(300)))
        .await;
    // The watchdog's next round sends the renewal.
    assert!(
        common::eventually(Duration::from_secs(3), || holder.stats().renewal_calls
            > calls)
        .await,
        "no renewal round"
    );
    let extended = guard.extend(Duration::from_secs(10)).await;
    proxy.set_mode(ProxyMode::Pass).await;
    assert!(extended.is_ok(), "extend(10 s): {extended:?}");
    // Past the renewal's lease (3 s) and the watchdog's next round.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let left = common::lock_pttl(&server, "long");
    let held = guard.is_held();
    guard.release().await.unwrap();
    assert!(
        held && left > 5000,
        "extend(10 s) answered Ok, sent while a renewal of the watchdog waited; 3.5 s later \
         is_held() = {held} and the key's PTTL is {left} ms (expected about 6,500)"
    );
}

/// Finding M3: `Locker::shutdown` answers `Ok` and leaves a key of its own in Redis. A lock
/// lost by its local clock alone while Redis still holds its key under the holder's token
/// (here a fixed lease of 1.5 s whose `extend(20 s)` ran on the server but timed out on its
/// way back: T23's shape) is dropped from the held records by `retain_live` as soon as
/// `HoldEnds` wakes the watchdog at its end (`mark_ended`). `give_back_all` releases only the
/// records, so the shutdown never sends its release: the key stays for the rest of the 20 s,
/// held by nobody once the service exits, although F27 says every key is gone from Redis
/// when `shutdown` returns (a lost lock's release would have deleted it: the key still holds
/// its token). Passes on 5cc550f, where only the watchdog's round (a third of its lease later,
/// 10 s here) dropped such records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m3_a_shutdown_gives_back_a_lock_lost_by_its_clock_whose_key_redis_kept() {
    let server = common::server();
    let proxy = FaultProxy::start(server.port()).await.unwrap();
    let holder = Locker::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_millis(800))
        .build()
        .await
        .unwrap();
    common::load_scripts(&holder).await;
    let guard = holder
        .lock("k")
        .lease(Duration::from_millis(1500))
        .await
        .unwrap();
    proxy
        .set_mode(ProxyMode::Delay(Duration::from_millis(500)))
        .await;
    // Runs on the server at +500 ms; its reply would come at +1 s: the call times out.
    let extended = guard.extend(Duration::from_secs(20)).await;
    proxy.set_mode(ProxyMode::Pass).await;
    // The 1.5 s lease ends locally (the watchdog marks it lost there); Redis keeps 20 s.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let held = guard.is_held();
    let before = common::lock_pttl(&server, "k");
    let shut = holder.shutdown(Duration::from_secs(2)).await;
    let after = common::lock_pttl(&server, "k");
    drop(guard);
    assert!(
        after < 0,
        "extend(20 s) answered {extended:?}; the 1.5 s lease ended locally (is_held() = \
         {held}) while Redis kept the key (PTTL {before} ms); the shutdown answered {shut:?} \
         and left the key in Redis (PTTL {after} ms), held by nobody"
    );
}
