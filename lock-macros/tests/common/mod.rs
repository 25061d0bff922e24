//! Shared end-of-test check of the integration tests.
#![allow(dead_code, unreachable_pub)]

use lock_core::Locker;
use lock_testkit::RedisServer;

/// The end state every test must reach: the lockers hold, queue, renew and subscribe nothing,
/// and the server has no lock key, no key without an expiry and no subscribed channel under
/// `lock:`. Polls, since releases run in the background and subscriptions linger 500 ms after
/// their last use.
pub async fn assert_nothing_left(server: &RedisServer, lockers: &[&Locker]) {
    lock_testkit::assert_nothing_left(server, "lock:", &[], || busy(lockers)).await;
}

/// `None` when every locker is idle (no watchdog entry, local key or subscription), else their
/// counters.
fn busy(lockers: &[&Locker]) -> Option<String> {
    let counters: Vec<_> = lockers
        .iter()
        .map(|l| {
            (
                l.stats().watchdog_locks,
                l.stats().local_keys,
                l.stats().subscriptions,
            )
        })
        .collect();
    counters
        .iter()
        .any(|c| *c != (0, 0, 0))
        .then(|| format!("per locker (watchdog locks, local keys, subscriptions): {counters:?}"))
}
