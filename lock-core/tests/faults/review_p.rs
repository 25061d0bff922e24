//! Review of the extension turn (O1), `extend_again` (T29, O3) and T28 at 07fedbc. Each test
//! names its finding and fails on the code it was written against.

use crate::common;

use std::time::Duration;

use lock_testkit::{ProxyMode, RedisServer};
use tokio::time::Instant;

/// The value (token) of the lock of `key`, if the key exists.
fn lock_value(server: &RedisServer, key: &str) -> Option<String> {
    common::lock_key_opt(server, key).and_then(|name| server.cmd::<Option<String>>(&["GET", &name]))
}

/// Finding P1 (O1's fix, incomplete; a double holder): the extension turn belongs to one
/// `Hold`, and `extend_again` keeps running for the hold it was spawned for after that hold's
/// guard left. A local handoff passes the *same Redis token* to the next holder, in a new
/// `Hold` with a turn of its own, so nothing orders the predecessor's extension sent again
/// (A) after the handoff. A, dropped with its connection and retried (`retry_dropped`, 5 and
/// 50 ms later), runs in Redis after the handoff's confirmation (`AtLeast(lease)`, which the
/// next holder counts) and cuts the key back to the predecessor's short lease. The next
/// holder's `is_held()` says true until the watchdog's next round, while another locker
/// takes the key. (`extend_again` checks neither `is_ended()` nor that its hold is still the
/// token's record.)
///
/// Interleaving (proxy `Delay(300 ms)`, watchdog lease 9 s, rounds 3 s apart; a task W of the
/// same locker waits for the key): t0 the round sends renewal R; t0+5 `extend(1100 ms)` E1;
/// t0+600 R's answer spawns `extend_again` (A waits for the turn); t0+605 E1 answers, A is
/// sent (~490 ms); t0+750 Hole holds A; t0+800 Reset drops it, its retry is held; t0+830
/// Reset drops that too; Pass; the holder releases: the handoff's renewal runs at once, W
/// takes the lock over (same token, ~9 s counted); t0+880 A's last retry: PEXPIRE ~490 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_an_extension_sent_again_does_not_cut_the_next_local_holders_key() {
    let (server, proxy, holder, other) =
        common::holder_behind_a_proxy(Duration::from_secs(9)).await;
    let mut seen = Vec::new();
    for round in 0..4 {
        let key = format!("k{round}");
        let guard = holder.lock(key.clone()).await.unwrap();
        let token_a = lock_value(&server, &key);
        // W: another task of the process, queued behind the guard.
        let waiter = {
            let (holder, key) = (holder.clone(), key.clone());
            tokio::spawn(async move { holder.lock(key).wait(Duration::from_secs(20)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let calls = holder.stats().renewal_calls;
        proxy
            .set_mode(ProxyMode::Delay(Duration::from_millis(300)))
            .await;
        // t0: the watchdog's round sends R.
        let limit = Instant::now() + Duration::from_secs(4);
        while holder.stats().renewal_calls == calls && Instant::now() < limit {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let e1 = guard.extend(Duration::from_millis(1100)).await;
        tokio::time::sleep_until(ms(750)).await;
        proxy.set_mode(ProxyMode::Hole).await;
        tokio::time::sleep_until(ms(800)).await;
        proxy.set_mode(ProxyMode::Reset).await;
        proxy.set_mode(ProxyMode::Hole).await;
        tokio::time::sleep_until(ms(830)).await;
        proxy.set_mode(ProxyMode::Reset).await;
        proxy.set_mode(ProxyMode::Pass).await;
        let released = guard.release().await;
        let next = waiter.await.unwrap();
        let token_b = lock_value(&server, &key);
        let handed = token_a.is_some() && token_a == token_b;
        // Past A's short lease in Redis, well before the watchdog's next round (t0+3 s).
        tokio::time::sleep_until(ms(1700)).await;
        let held = next.as_ref().is_ok_and(|g| g.is_held());
        let left = common::lock_pttl(&server, &key);
        let taken = other.lock(key.clone()).wait(Duration::ZERO).await;
        let both = held && next.as_ref().is_ok_and(|g| g.is_held()) && taken.is_ok();
        let at = t0.elapsed();
        seen.push(format!(
            "round {round}: extend(1100 ms) {e1:?}, release {released:?}, W got {} ({}), at \
             {at:?} W's is_held() = {held}, PTTL {left} ms, another locker: {}",
            if next.is_ok() { "the lock" } else { "an error" },
            if handed {
                "handed over: same token"
            } else {
                "a new token"
            },
            if taken.is_ok() { "took it" } else { "refused" }
        ));
        if let Ok(g) = taken {
            g.release().await.unwrap();
        }
        drop(next);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !both,
            "double holder: {}\n(the released holder's `extend_again`, retried after the \
             local handoff, cut the next holder's key: same token)",
            seen.join("\n")
        );
    }
    eprintln!("{}", seen.join("\n"));
}
