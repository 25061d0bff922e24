//! [`Leftovers`]: what a test left on a server under the kit's key prefix. Every test must end
//! with none: no lock key, no key without an expiry, no release channel with a subscriber.

use std::fmt;
use std::time::{Duration, Instant};

use crate::server::RedisServer;

/// What remains on one server under a key prefix.
///
/// Fence counters (`<prefix>{..}:fence:<key>`) and release latches (`..:unlocked:<token>`) are
/// allowed while they expire: they outlive the lock by design. Everything else the kit writes
/// is gone once the locks are released and waiters have left, whatever its expiry (a held
/// permit's set lives as long as its lease; subscriptions linger for 500 ms after their last
/// use, so poll for a second).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leftovers {
    /// Lock keys still present (`<prefix>{..}:lock:<key>`), read locks' reader sets
    /// (`..:readers:<key>`) and semaphores' permit sets (`..:semaphore:<key>`): a lock, a read
    /// lock or a permit still held.
    pub lock_keys: Vec<String>,
    /// What waiters leave while they wait: waiting marks (`..:waiters:<key>`) and the lines of
    /// fair locks and semaphores (`..:line:`, `..:line-alive:`, `..:semaphore-line:`,
    /// `..:semaphore-line-alive:`), gone once nobody waits.
    pub waiting: Vec<String>,
    /// Other keys under the prefix without an expiry (they would stay forever).
    pub keys_without_ttl: Vec<String>,
    /// Pub/sub channels under the prefix that still have subscribers.
    pub channels: Vec<String>,
    /// Pattern subscriptions on the server (the kit uses none).
    pub patterns: u64,
}

impl Leftovers {
    /// Nothing left.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl fmt::Display for Leftovers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lock keys {:?}, waiting {:?}, keys without TTL {:?}, channels {:?}, pattern \
             subscriptions {}",
            self.lock_keys, self.waiting, self.keys_without_ttl, self.channels, self.patterns
        )
    }
}

impl RedisServer {
    /// What is left under `prefix` on this server (see [`Leftovers`]). Keys whose name ends
    /// in one of `allowed` (e.g. a RedLock node's `node-epoch`) are not counted.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub fn leftovers(&self, prefix: &str, allowed: &[&str]) -> Leftovers {
        let pattern = format!("{prefix}*");
        let mut leftovers = Leftovers::default();
        for key in self.keys(&pattern) {
            if allowed.iter().any(|suffix| key.ends_with(suffix)) {
                continue;
            }
            match kit_name(&key) {
                Some("lock" | "readers" | "semaphore") => leftovers.lock_keys.push(key),
                Some(
                    "waiters" | "line" | "line-alive" | "semaphore-line" | "semaphore-line-alive",
                ) => leftovers.waiting.push(key),
                _ if self.cmd::<i64>(&["PTTL", &key]) == -1 => {
                    leftovers.keys_without_ttl.push(key);
                }
                _ => {}
            }
        }
        leftovers.channels = self.cmd(&["PUBSUB", "CHANNELS", &pattern]);
        leftovers.patterns = self.cmd(&["PUBSUB", "NUMPAT"]);
        leftovers
    }
}

/// What a key of the kit is: the name after its hash tag (`lock` in `p{h}:lock:k`), read from
/// the tag on, so that a user key holding `:lock:` is not mistaken for one.
fn kit_name(key: &str) -> Option<&str> {
    let after_tag = &key[key.find("}:")? + 2..];
    after_tag.split(':').next()
}

/// The end-of-test check: polls for up to 3 s (releases run in the background, subscriptions
/// linger after their last use) until `server` has no [`Leftovers`] under `prefix` and
/// `clients_busy` (the lock clients' own state) returns `None`.
///
/// # Panics
///
/// With what was left, when the 3 s pass first, or when the server cannot be reached.
pub async fn assert_nothing_left(
    server: &RedisServer,
    prefix: &str,
    allowed: &[&str],
    clients_busy: impl Fn() -> Option<String>,
) {
    let start = Instant::now();
    loop {
        let leftovers = server.leftovers(prefix, allowed);
        let busy = clients_busy();
        if leftovers.is_empty() && busy.is_none() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "left behind on the server under {prefix:?}: {leftovers}; clients: {}",
            busy.as_deref().unwrap_or("idle")
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
