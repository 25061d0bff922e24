//! [`InFlight`]: counts the work a locker has under way that ends in Redis (acquires running,
//! releases finishing, background releases and clean-ups queued or running), so that
//! [`Locker::shutdown`](crate::Locker::shutdown) can wait until all of it is done.

use std::sync::Arc;

use tokio::sync::watch;

/// The counter of work under way; clones share it.
#[derive(Debug, Clone)]
pub(crate) struct InFlight {
    count: Arc<watch::Sender<usize>>,
}

/// One piece of work under way: counted until dropped.
#[derive(Debug)]
pub(crate) struct Working {
    count: Arc<watch::Sender<usize>>,
}

impl InFlight {
    pub(crate) fn new() -> Self {
        Self {
            count: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Counts one piece of work until the returned value is dropped.
    pub(crate) fn enter(&self) -> Working {
        self.count.send_modify(|n| *n += 1);
        Working {
            count: self.count.clone(),
        }
    }

    /// Resolves when no work is under way.
    pub(crate) async fn idle(&self) {
        let mut count = self.count.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let _ = count.wait_for(|n| *n == 0).await;
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        self.count.send_modify(|n| *n = n.saturating_sub(1));
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
}
