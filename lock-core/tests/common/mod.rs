//! Shared set-up of the integration tests: a fresh redis-server and locker per test.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use lock_core::Locker;
use lock_testkit::RedisServer;

pub fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server (apt-get install redis-server)")
}

pub async fn locker(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .build()
        .await
        .expect("connect locker")
}

pub async fn locker_with_lease(server: &RedisServer, lease: Duration) -> Locker {
    Locker::builder()
        .url(server.url())
        .watchdog_lease(lease)
        .build()
        .await
        .expect("connect locker")
}

/// Every Redis key under `prefix`.
pub fn keys(server: &RedisServer, prefix: &str) -> Vec<String> {
    server.cmd(&["KEYS", &format!("{prefix}*")])
}

/// The Redis name of the lock of `key` (the only `:lock:` key for it).
pub fn lock_key(server: &RedisServer, key: &str) -> String {
    keys(server, "lock:")
        .into_iter()
        .find(|k| k.ends_with(&format!(":lock:{key}")))
        .expect("lock key exists")
}

/// Polls `cond` every 5 ms until it holds or `limit` passes; returns whether it held.
pub async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cond()
}
