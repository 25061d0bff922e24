//! When the next held lock ends by design: a fixed lease, or the last renewal before a
//! `max_hold`. The watchdog wakes then and marks such a lock lost if its holder keeps its
//! guard, which gives its local place back at once: other lockers take the key the moment it
//! ends in Redis, and the tasks of this process waiting for it must not wait for the
//! watchdog's next round (a third of its lease later, 10 s by default) to learn it.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The earliest planned end of the held locks, and the watchdog's alarm for an earlier one.
#[derive(Debug)]
pub(crate) struct HoldEnds {
    /// What the ends count from.
    epoch: Instant,
    /// The earliest end, in nanoseconds after `epoch`; `u64::MAX` for none.
    next: AtomicU64,
    /// Rung when a lock that ends before `next` was noted: the watchdog sleeps until `next`.
    alarm: Notify,
}

impl HoldEnds {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            next: AtomicU64::new(u64::MAX),
            alarm: Notify::new(),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// Notes that a held lock ends at `end` unless renewed or extended, and rings the alarm
    /// when that is earlier than the watchdog planned to look. One load for the usual lock,
    /// which ends after the earliest one noted already.
    pub(crate) fn note(&self, end: Instant) {
        if self.keep(end) {
            self.alarm.notify_one();
        }
    }

    /// [`note`](Self::note) without the alarm (the watchdog's own look); whether `end` is now
    /// the earliest.
    pub(crate) fn keep(&self, end: Instant) -> bool {
        let at = self.nanos(end);
        at < self.next.load(Ordering::Acquire) && at < self.next.fetch_min(at, Ordering::AcqRel)
    }

    /// Forgets every end noted, before the watchdog looks at every held lock again (ends noted
    /// meanwhile stay).
    pub(crate) fn clear(&self) {
        self.next.store(u64::MAX, Ordering::Release);
    }

    /// The earliest end noted, if any.
    pub(crate) fn next(&self) -> Option<Instant> {
        match self.next.load(Ordering::Acquire) {
            u64::MAX => None,
            at => Some(self.epoch + std::time::Duration::from_nanos(at)),
        }
    }

    /// Resolves when an earlier end was noted since the last time (a ring before this call
    /// counts: the watchdog reads [`next`](Self::next), then waits here).
    pub(crate) fn alarm(&self) -> Notified<'_> {
        self.alarm.notified()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::FutureExt;

    use super::*;

    #[tokio::test]
    async fn the_earliest_end_wins_and_rings_the_alarm_once() {
        let ends = HoldEnds::new();
        assert_eq!(ends.next(), None);
        let now = Instant::now();
        ends.note(now + Duration::from_secs(30));
        assert!(ends.alarm().now_or_never().is_some(), "the first end rings");
        ends.note(now + Duration::from_secs(40));
        assert!(
            ends.alarm().now_or_never().is_none(),
            "a later end is not news"
        );
        ends.note(now + Duration::from_secs(1));
        assert!(ends.alarm().now_or_never().is_some(), "an earlier one is");
        let next = ends.next().unwrap();
        assert!(
            next <= now + Duration::from_secs(1)
                && next + Duration::from_millis(1) > now + Duration::from_secs(1)
        );
        ends.clear();
        assert_eq!(ends.next(), None);
        assert!(
            ends.keep(now + Duration::from_secs(1)),
            "the first after a clear"
        );
        assert!(
            ends.alarm().now_or_never().is_none(),
            "kept without the alarm"
        );
        // An end before the epoch counts as the epoch, never as none.
        ends.clear();
        ends.note(now - Duration::from_secs(1));
        assert!(ends.next().is_some());
    }
}
