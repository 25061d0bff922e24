//! [`WarnLimit`]: at most one warning of a kind a second, so that an outage (Redis down, every
//! request rejected) writes a line a second with a count rather than a line per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often a warning of one kind may be written.
const EVERY: Duration = Duration::from_secs(1);

/// The warnings of one kind, process-wide.
#[derive(Debug)]
pub(crate) struct WarnLimit {
    /// When the next one may be written, in milliseconds since [`epoch`].
    next_ms: AtomicU64,
    /// How many were left out since the last one written.
    left_out: AtomicU64,
}

/// The clock's origin for [`WarnLimit::next_ms`].
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl WarnLimit {
    pub(crate) const fn new() -> Self {
        Self {
            next_ms: AtomicU64::new(0),
            left_out: AtomicU64::new(0),
        }
    }

    /// `Some(left_out)` when this warning is to be written (with the number of its kind left
    /// out since the last one), `None` when it is one too many: log it at debug level only.
    pub(crate) fn admit(&self) -> Option<u64> {
        let now = u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX);
        let next = self.next_ms.load(Ordering::Acquire);
        let due = now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now.saturating_add(EVERY.as_millis() as u64),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok();
        if due {
            Some(self.left_out.swap(0, Ordering::AcqRel))
        } else {
            self.left_out.fetch_add(1, Ordering::AcqRel);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_a_second_with_the_count_left_out() {
        let limit = WarnLimit::new();
        assert_eq!(limit.admit(), Some(0));
        for _ in 0..99 {
            assert_eq!(limit.admit(), None);
        }
        std::thread::sleep(EVERY + Duration::from_millis(20));
        assert_eq!(limit.admit(), Some(99));
        assert_eq!(limit.admit(), None);
    }
}
