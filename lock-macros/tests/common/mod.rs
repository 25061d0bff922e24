//! Shared end-of-test check of the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use lock_core::Locker;
use lock_testkit::RedisServer;

/// The end state every test must reach: the lockers hold, queue, renew and subscribe nothing,
/// and the server has no lock key, no key without an expiry and no subscribed channel under
/// `lock:`. Polls, since releases run in the background and subscriptions linger 500 ms after
/// their last use.
pub async fn assert_nothing_left(server: &RedisServer, lockers: &[&Locker]) {
    let idle =
        |l: &&Locker| l.watchdog_locks() == 0 && l.local_keys() == 0 && l.subscriptions() == 0;
    let start = Instant::now();
    while !(lockers.iter().all(idle) && server.leftovers("lock:", &[]).is_empty()) {
        if start.elapsed() > Duration::from_secs(3) {
            panic!(
                "left behind on the server: {}; per locker (watchdog locks, local keys, subscriptions): {:?}",
                server.leftovers("lock:", &[]),
                lockers
                    .iter()
                    .map(|l| (l.watchdog_locks(), l.local_keys(), l.subscriptions()))
                    .collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
