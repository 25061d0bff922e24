//! Lease renewal for every watchdog-managed lock of one `Locker`, by one background task.
//!
//! Every `lease / 3` the task renews all such locks at once: one `renew.lua` call per batch of
//! up to `store::BATCH` keys, all batches sent together on the multiplexed connection, so a tick
//! costs one round trip however many locks are held. A lock whose renewal reports another owner
//! (or no key) is marked lost at once; when renewals fail (Redis unreachable), the lock turns
//! lost by itself when its last confirmed lease runs out (see `Held::lost`). Locks past their
//! `max_hold` are no longer renewed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::held::HeldLock;
use crate::metrics;
use crate::store::{Renewal, Store};

/// The locks the watchdog keeps alive, and counters for tests and metrics.
#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    locks: Mutex<HashMap<u64, Arc<HeldLock>>>,
    /// Renewal script calls sent so far.
    pub(crate) renew_calls: AtomicU64,
}

impl Watchdog {
    fn locks(&self) -> MutexGuard<'_, HashMap<u64, Arc<HeldLock>>> {
        self.locks.lock()
    }

    pub(crate) fn insert(&self, held: Arc<HeldLock>) {
        self.locks().insert(held.id(), held);
    }

    pub(crate) fn remove(&self, id: u64) {
        self.locks().remove(&id);
    }

    pub(crate) fn len(&self) -> usize {
        self.locks().len()
    }

    /// Starts the renewal task; it ends when `shutdown` is cancelled.
    pub(crate) fn start(
        self: &Arc<Self>,
        store: Arc<Store>,
        lease: Duration,
        shutdown: CancellationToken,
    ) {
        let watchdog = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(lease / 3);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = ticks.tick() => watchdog.tick(&store).await,
                }
            }
        });
    }

    async fn tick(&self, store: &Store) {
        let now = Instant::now();
        let mut due: HashMap<Duration, Vec<Arc<HeldLock>>> = HashMap::new();
        self.locks().retain(|_, held| {
            if held.is_lost() {
                // Marks it lost, with the reason the clock gives, if nothing did yet.
                drop(held.lost_error());
                return false;
            }
            if let Some(lease) = held.wants_renewal(now) {
                due.entry(lease).or_default().push(held.clone());
            }
            true
        });
        if due.is_empty() {
            return;
        }
        // All watchdog locks share the locker's lease; grouping by lease keeps this correct
        // anyway. Every group is renewed at once.
        let calls = due.into_iter().map(|(lease, locks)| {
            let calls = Store::renew_calls(locks.len());
            self.renew_calls.fetch_add(calls, Ordering::Relaxed);
            metrics::renewal_calls(calls);
            async move {
                let sent_at = Instant::now();
                let pairs: Vec<_> = locks.iter().map(|h| (h.keys(), h.token())).collect();
                let answers = store.renew(&pairs, lease).await;
                for (held, answer) in locks.iter().zip(answers) {
                    metrics::renewed(held.keys().access, answer);
                    match answer {
                        Renewal::Renewed => held.confirm(sent_at, lease),
                        Renewal::NotOurs(gone) => {
                            held.mark_lost(held.reason_for(gone));
                            self.remove(held.id());
                        }
                        Renewal::Unknown => {}
                    }
                }
            }
        });
        futures_util::future::join_all(calls).await;
    }
}
