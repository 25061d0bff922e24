//! [`InFlight`]: counts the work a locker has under way that ends in Redis (acquires running,
//! releases finishing, background releases and clean-ups queued or running), so that
//! [`Locker::shutdown`](crate::Locker::shutdown) can wait until all of it is done.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// The counter of work under way; clones share it.
#[derive(Debug, Clone)]
pub(crate) struct InFlight {
    shared: Arc<Shared>,
}

/// One piece of work under way: counted until dropped.
#[derive(Debug)]
pub(crate) struct Working {
    shared: Arc<Shared>,
}

/// Every acquire and release passes through here twice, so counting is two atomic operations
/// and nothing else; only the end of the last piece of work, while a shutdown waits, wakes
/// anybody.
#[derive(Debug, Default)]
struct Shared {
    count: AtomicUsize,
    /// Someone waits in [`InFlight::idle`] (set for good: a locker shuts down once).
    watched: AtomicBool,
    idle: Notify,
}

impl InFlight {
    pub(crate) fn new() -> Self {
        Self {
            shared: Arc::default(),
        }
    }

    /// Counts one piece of work until the returned value is dropped.
    pub(crate) fn enter(&self) -> Working {
        self.shared.count.fetch_add(1, Ordering::SeqCst);
        Working {
            shared: self.shared.clone(),
        }
    }

    /// Resolves when no work is under way.
    pub(crate) async fn idle(&self) {
        let shared = &*self.shared;
        shared.watched.store(true, Ordering::SeqCst);
        loop {
            // Registered before the count is read: the last piece of work ending after the
            // read sees `watched` (both sequentially consistent) and wakes this.
            let notified = shared.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if shared.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        let shared = &*self.shared;
        if shared.count.fetch_sub(1, Ordering::SeqCst) == 1 && shared.watched.load(Ordering::SeqCst)
        {
            shared.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn idle_waits_for_every_piece_of_work() {
        let in_flight = InFlight::new();
        in_flight.idle().await;
        let first = in_flight.enter();
        let second = in_flight.clone().enter();
        let idle = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.idle().await }
        });
        drop(first);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!idle.is_finished(), "idle while work was under way");
        drop(second);
        tokio::time::timeout(Duration::from_secs(1), idle)
            .await
            .expect("idle once all work ended")
            .unwrap();
    }

    /// Work ending on other threads while `idle` waits: it resolves once, and only after the
    /// last piece ended (a lost wake-up would hang it; an early one would see work left).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_is_woken_by_the_last_piece_of_work_on_another_thread() {
        for _ in 0..200 {
            let in_flight = InFlight::new();
            let done = Arc::new(AtomicUsize::new(0));
            let pieces: Vec<Working> = (0..8).map(|_| in_flight.enter()).collect();
            let workers: Vec<_> = pieces
                .into_iter()
                .map(|working| {
                    let done = done.clone();
                    tokio::spawn(async move {
                        tokio::task::yield_now().await;
                        done.fetch_add(1, Ordering::SeqCst);
                        drop(working);
                    })
                })
                .collect();
            tokio::time::timeout(Duration::from_secs(5), in_flight.idle())
                .await
                .expect("idle once the work ended");
            assert_eq!(done.load(Ordering::SeqCst), 8, "idle before the work ended");
            for worker in workers {
                worker.await.unwrap();
            }
        }
    }
}
