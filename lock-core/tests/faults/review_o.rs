//! Review of the fixes since 339ada3 (T27-T29, N1-N9). Each test names its finding and fails
//! on the code it was written against (c08356c).

use crate::common;

use std::time::Duration;

use lock_testkit::{ProxyMode, RedisServer};
use tokio::time::Instant;

/// The lock's Redis key (`lock:{tag}:lock:<key>`), if it exists.
fn lock_key_opt(server: &RedisServer, key: &str) -> Option<String> {
    common::keys(server, "lock:")
        .into_iter()
        .find(|k| k.ends_with(&format!(":lock:{key}")))
}

/// The PTTL of the lock of `key` in ms (-2: no such key).
fn pttl(server: &RedisServer, key: &str) -> i64 {
    lock_key_opt(server, key).map_or(-2, |name| server.cmd(&["PTTL", &name]))
}

/// Finding O1 (T29's fix, a double holder): `LocalLocks::extend_again` is an extension the
/// process sends on its own, concurrently with the holder's own `extend` calls, and like any
/// extension it is retried on a new connection after a dropped one (`retry_dropped`, 5 and
/// 50 ms later). Retried after a *later* lengthening `extend` of the holder, it runs in Redis
/// after it and cuts the key back to the short lease; locally the later extension wins
/// (`confirm_extension` ignores the older `sent_at`), so the hold believes the long lease
/// while Redis lets the key expire. Another locker takes the key; the holder's `is_held()`
/// says true until the watchdog's next round finds the key gone (up to a third of the
/// watchdog lease: 10 s by default).
///
/// Interleaving (proxy `Delay(300 ms)`, watchdog lease 9 s, rounds 3 s apart):
/// t0 the round sends renewal R; t0+5 `extend(1100 ms)` E1 (shortening: R would give 9 s);
/// t0+600 R's answer comes back: `renewed` sees R sent before E1 and sends E1 again
/// (`extend_again`: the ~490 ms the hold keeps) as A; t0+750 Hole holds A; t0+800 Reset drops
/// it, its retry (+5 ms) is held again; t0+830 Reset drops that too (last retry at +50 ms);
/// t0+831 the holder's `extend(10 s)` E2 runs at once on the fresh connection; t0+880 A's last
/// retry runs after it: PEXPIRE ~490 ms. The key is gone at about t0+1370.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o1_an_extension_sent_again_does_not_cut_back_a_later_extend() {
    let (server, proxy, holder, other) =
        common::holder_behind_a_proxy(Duration::from_secs(9)).await;
    let mut seen = Vec::new();
    for round in 0..4 {
        let key = format!("k{round}");
        let guard = holder.lock(key.clone()).await.unwrap();
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
        let (e1, e2) = tokio::join!(guard.extend(Duration::from_millis(1100)), async {
            tokio::time::sleep_until(ms(750)).await;
            proxy.set_mode(ProxyMode::Hole).await;
            tokio::time::sleep_until(ms(800)).await;
            proxy.set_mode(ProxyMode::Reset).await;
            proxy.set_mode(ProxyMode::Hole).await;
            tokio::time::sleep_until(ms(830)).await;
            proxy.set_mode(ProxyMode::Reset).await;
            proxy.set_mode(ProxyMode::Pass).await;
            guard.extend(Duration::from_secs(10)).await
        });
        // Past A's short lease in Redis, well before the watchdog's next round (t0+3 s).
        tokio::time::sleep_until(ms(1700)).await;
        let held = guard.is_held();
        let left = pttl(&server, &key);
        let taken = other.lock(key.clone()).wait(Duration::ZERO).await;
        let both = held && guard.is_held() && taken.is_ok();
        let at = t0.elapsed();
        seen.push(format!(
            "round {round}: extend(1100 ms) {e1:?}, extend(10 s) {e2:?}, at {at:?} is_held() = \
             {held}, PTTL {left} ms, another locker: {}",
            if taken.is_ok() { "took it" } else { "refused" }
        ));
        if let Ok(g) = taken {
            g.release().await.unwrap();
        }
        drop(guard);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !both,
            "double holder: {}\n(extend(10 s) answered Ok; an `extend_again` of the earlier \
             1100 ms extension, retried after it, cut the key back in Redis)",
            seen.join("\n")
        );
    }
    eprintln!("{}", seen.join("\n"));
}
