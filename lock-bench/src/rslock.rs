//! The third contender: `rslock`, the common Rust Redis lock crate (a Redlock client), on the
//! benchmark's one server.
//!
//! What rslock 0.10 does, read in its source: a `LockManager` holds one lazily opened
//! multiplexed connection per server, shared by its clones, behind two tokio mutexes (the
//! server list, locked twice per acquire and once per release; the connection slot, locked per
//! command). An acquire is `SET key <20 random bytes> NX PX ttl`; when it fails, rslock sends
//! the compare-and-delete script too (in case the `SET` landed on a server without its reply)
//! before reporting `Unavailable`. A release is that compare-and-delete script by `EVALSHA`
//! (`SCRIPT LOAD` and again after a `NOSCRIPT`), its SHA-1 computed on every call, and reports
//! nothing: a lock lost before its release goes unnoticed. No reentrancy, no waiting other
//! than retries spaced by random sleeps (3 tries, up to 200 ms apart, by default), no
//! watchdog.

use std::time::Duration;

use rslock::{LockError, LockManager};
use tokio::time::Instant;

use crate::lock::BoxError;

/// An rslock client on one server.
#[derive(Clone)]
pub(crate) struct Rslock {
    manager: LockManager,
    prefix: String,
    lease: Duration,
    retry: Duration,
}

/// A held rslock lock (it carries its manager, and releases through it).
pub(crate) type RslockGuard = rslock::Lock;

impl Rslock {
    /// A manager of one server. It connects on its first command (the warm-up's).
    pub(crate) fn connect(
        url: &str,
        prefix: String,
        lease_ms: u64,
        retry: Duration,
    ) -> Result<Self, BoxError> {
        // `from_clients`, not `new`: `new` unwraps the URL's parse.
        let mut manager = LockManager::from_clients(vec![redis::Client::open(url)?]);
        // One try per `lock` call: a waiting acquire busy-retries below, as the floor does,
        // rather than rslock's default of 3 tries with random sleeps of up to 200 ms, which
        // would leave the hot key idle for most of each wait. The delay is never used with
        // one try.
        manager.set_retry(1, Duration::from_millis(1));
        Ok(Self {
            manager,
            prefix,
            lease: Duration::from_millis(lease_ms),
            retry,
        })
    }

    /// Acquires `key`, retrying rslock's one try until `wait` has passed (`ZERO`: one try).
    /// `Ok(None)` when the wait ran out. rslock reports a busy key and an unreachable server
    /// alike (`Unavailable`), so a connection failure shows up as a busy key here.
    pub(crate) async fn lock(
        &self,
        key: &str,
        wait: Duration,
    ) -> Result<Option<RslockGuard>, BoxError> {
        let deadline = Instant::now() + wait;
        let resource = format!("{}{key}", self.prefix);
        loop {
            match self.manager.lock(resource.as_bytes(), self.lease).await {
                Ok(lock) => return Ok(Some(lock)),
                Err(LockError::Unavailable) => {}
                Err(e) => return Err(e.into()),
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            if !self.retry.is_zero() {
                tokio::time::sleep(self.retry).await;
            }
        }
    }

    /// rslock's release: best effort, it tells nothing of the outcome.
    pub(crate) async fn unlock(&self, lock: RslockGuard) {
        self.manager.unlock(&lock).await;
    }
}
