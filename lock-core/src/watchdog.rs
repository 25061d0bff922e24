//! Lease renewal for every watchdog-managed lock of one `Locker`, by one background task that
//! renews the records [`LocalLocks`] keeps (it keeps no list of its own).
//!
//! Every `lease / 3` the task renews all such locks at once: one `renew.lua` call per batch of
//! up to `store::BATCH` keys, all batches sent together on the multiplexed connection, so a tick
//! costs one round trip however many locks are held. Each answer goes to whoever holds its
//! token when it arrives (see [`LocalLocks::renewed`]): a lock whose renewal reports another
//! owner (or no key) is marked lost at once; when renewals fail (Redis unreachable), the lock
//! turns lost by itself when its last confirmed lease runs out (see `Hold::lost`). A lock
//! with a `max_hold` is renewed only up to it (the last renewals are cut), so its key ends in
//! Redis when the hold does. A renewal never shortens a lease (an explicit
//! extension longer than the watchdog's lease stays).
//!
//! Between its rounds the task also wakes when a held lock ends by design (a fixed lease, a
//! `max_hold`; see [`HoldEnds`](crate::hold_ends::HoldEnds)) and marks it lost if its holder
//! still keeps the guard, which gives its local place back to the tasks waiting for it.
//!
//! The task cannot fail silently: a tick that panics (a bug) is logged as an error and every
//! lock it served is marked lost at once ([`LostReason::RenewalStopped`]), and so is every
//! lock still held if the task is ever dropped without the locker shutting down.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::FutureExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::LostReason;
use crate::hold_ends::HoldEnds;
use crate::local::LocalLocks;
use crate::store::NewLease;

/// Starts the renewal task of `local`'s locks; it ends when `shutdown` is cancelled or the
/// locks are gone.
pub(crate) fn start(local: Weak<LocalLocks>, lease: Duration, shutdown: CancellationToken) {
    let mut ticks = ticks(lease);
    // Its own reference: the task must not keep the locks alive while it sleeps.
    let Some(ends) = local.upgrade().map(|local| local.ends.clone()) else {
        return;
    };
    tokio::spawn(async move {
        let mut stopped = Stopped {
            local: local.clone(),
            ended: false,
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                // Returns only when the locks are gone.
                () = serve_ends(&ends, &local) => break,
                _ = ticks.tick() => {
                    let Some(held) = local.upgrade() else { break };
                    let tick = std::panic::AssertUnwindSafe(tick(&held)).catch_unwind();
                    // The round's calls may wait for a slow Redis up to the command timeout:
                    // the ends of held locks are served meanwhile, not after it (`held` keeps
                    // the locks alive until the round is over, so `serve_ends` goes on).
                    let panicked = tokio::select! {
                        done = tick => done.is_err(),
                        () = serve_ends(&ends, &local) => false,
                    };
                    if panicked {
                        tracing::error!(
                            "the lock watchdog failed while renewing (a bug); every lock it \
                             renewed is reported lost now"
                        );
                        held.lose_renewed(LostReason::RenewalStopped);
                    }
                }
            }
        }
        stopped.ended = true;
    });
}

/// The watchdog's ticks: every third of the lease, the first a third of the lease after the
/// locker started. Not at once, as `interval`'s first tick would be: nothing is due then, but
/// a task first run late (a busy runtime) would renew the locks just taken, one wasted
/// script call each (seen in a test that counts a lock's Redis calls).
fn ticks(lease: Duration) -> tokio::time::Interval {
    let period = lease / 3;
    let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// Marks the locks that end by design lost as they end (see `HoldEnds`): sleeps until the
/// earliest end noted, or until an earlier one is noted. Returns only when the locks are gone.
async fn serve_ends(ends: &HoldEnds, local: &Weak<LocalLocks>) {
    loop {
        let next_end = ends.next();
        let alarm = ends.alarm();
        tokio::select! {
            () = until(next_end) => {
                let Some(local) = local.upgrade() else { return };
                local.mark_ended();
            }
            () = alarm => {}
        }
    }
}

/// Resolves at `at`; never without one.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Marks every renewed lock lost if the task ends any other way than by the locker's shutdown
/// (the runtime dropped it, say): nothing renews them any more.
struct Stopped {
    local: Weak<LocalLocks>,
    /// The loop ended as it should (shutdown, or no locker left).
    ended: bool,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if let Some(local) = self.local.upgrade() {
            tracing::error!("the lock watchdog stopped; every lock it renewed is reported lost");
            local.lose_renewed(LostReason::RenewalStopped);
        }
    }
}

/// Renews every record due now, each group of one lease in one round trip, all at once.
async fn tick(local: &Arc<LocalLocks>) {
    let due = local.due_for_renewal(Instant::now());
    if due.is_empty() {
        return;
    }
    // All watchdog locks share the locker's lease; grouping by lease keeps this correct
    // anyway.
    let calls = due.into_iter().map(|(lease, locks)| {
        async move {
            let sent_at = Instant::now();
            // Held locks keep no names or stored values: built for the call.
            let built: Vec<_> = locks
                .iter()
                .map(|h| (h.redis_keys(), h.token().stored()))
                .collect();
            let pairs: Vec<_> = built
                .iter()
                .map(|(keys, token)| (keys, token.as_str()))
                .collect();
            local.count_renew_calls(local.store.renew_calls(&pairs));
            // Each answer applied as it comes (a Cluster's slow shard holds back no other).
            // An extension a renewal may have undone is sent again in a task of its own: it
            // waits for the hold's extension turn, and a slow shard must not hold up the
            // round (the other locks' next renewals).
            let mut apply = |i: usize, answer| {
                if let Some(held) = local.renewed(&locks[i], sent_at, lease, answer) {
                    let (local, answered_at) = (local.clone(), Instant::now());
                    tokio::spawn(async move { local.extend_again(&held, answered_at).await });
                }
            };
            local
                .store
                .renew_each(&pairs, NewLease::AtLeast(lease), &mut apply)
                .await;
        }
    });
    join_all(calls).await;
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    /// The first renewal round comes a third of the lease after the start, not at once.
    #[tokio::test(start_paused = true)]
    async fn the_first_tick_is_a_third_of_the_lease_after_the_start() {
        let lease = Duration::from_secs(30);
        let mut ticks = ticks(lease);
        assert!(ticks.tick().now_or_never().is_none(), "a tick at once");
        tokio::time::advance(lease / 3 - Duration::from_millis(1)).await;
        assert!(ticks.tick().now_or_never().is_none(), "a tick too early");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            ticks.tick().now_or_never().is_some(),
            "no tick after a third"
        );
    }
}
