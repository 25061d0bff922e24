//! [`Kind`]: the kinds of lock a key can be held as, and every rule that differs between them.
//!
//! One kind, one name in every crate:
//!
//! | `Kind` | taken by | metric `kind` | lock-tower `Mode` | macro `mode` | test oracle |
//! |---|---|---|---|---|---|
//! | `Exclusive` | `Locker::lock`, `write`, `lock_all` | `mutex` | `Exclusive` | `"write"` | `Kind::Exclusive` |
//! | `Fair` | `Locker::fair_lock` | `fair` | | | `Kind::Exclusive` |
//! | `Shared` | `Locker::read` | `read` | `Read` | `"read"` | `Kind::Shared` |
//! | `Permits` | `Semaphore::acquire`, `acquire_many` | `semaphore` | `Limit(n)` | | `Kind::Permits(n)` |
//!
//! The rules are asked of the kind (`kind.hands_over_locally()`), never matched on where they
//! are used, so that a new kind is one variant and the compiler's list of methods to answer.
//! What a topology can serve is the store's answer ([`Capabilities`](crate::capabilities)).

/// A kind of lock: alone (a mutex, a write lock), alone in the order of arrival, shared with
/// other readers, or some of a semaphore's permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One holder at a time: a mutex, the write lock of a read-write key.
    Exclusive,
    /// Exclusive, taken in the order of arrival (`scripts/fair_acquire.lua`).
    Fair,
    /// Any number of readers together while no exclusive holder holds or waits.
    Shared,
    /// Permits of a semaphore of `limit` permits.
    Permits { limit: u32 },
}

/// Where an acquire of a kind waits first: in this process, or in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// The local key's queue (one task per key per process contends in Redis), then Redis.
    LocalFirst,
    /// A semaphore's (of `limit` permits): a place of the local queue, then the turn of one
    /// local waiter, then Redis.
    PermitsTurn { limit: u32 },
    /// A fair lock's: the line in Redis first (every waiter of every process in it), then the
    /// local place.
    LineFirst,
}

impl Kind {
    /// The label of the kind in metrics (`kind`).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Self::Exclusive => "mutex",
            Self::Shared => "read",
            Self::Fair => "fair",
            Self::Permits { .. } => "semaphore",
        }
    }

    /// Whether one holder has the key alone (a mutex, a write lock, a fair lock).
    pub(crate) const fn is_exclusive(self) -> bool {
        matches!(self, Self::Exclusive | Self::Fair)
    }

    /// Where its acquire waits first.
    pub(crate) const fn order(self) -> Order {
        match self {
            Self::Exclusive | Self::Shared => Order::LocalFirst,
            Self::Fair => Order::LineFirst,
            Self::Permits { limit } => Order::PermitsTurn { limit },
        }
    }

    /// Whether a lock of this kind passes from a local holder to the next local waiter without
    /// a Redis round trip. A fair lock does not (the next in line may be elsewhere), nor does a
    /// read lock (readers do not wait for each other).
    pub(crate) const fn hands_over_locally(self) -> bool {
        matches!(self, Self::Exclusive | Self::Permits { .. })
    }

    /// Whether a waiter of this kind has a place in a line in Redis between its tries, so its
    /// attempt stays armed (a dropped or failed acquire has it taken out at once): a fair
    /// waiter, and a semaphore's, which may be next (see `scripts/permit_acquire.lua`).
    pub(crate) const fn stands_in_line(self) -> bool {
        matches!(self, Self::Fair | Self::Permits { .. })
    }

    /// Whether a waiter of this kind joins the key's waiting writers, which readers let go
    /// first (see `scripts/acquire.lua`). A fair waiter stands in its line instead.
    pub(crate) const fn joins_waiting_writers(self) -> bool {
        matches!(self, Self::Exclusive)
    }

    /// Whether a waiter of this kind that won after waiting leaves the release channel at once,
    /// so that the next wait of this process subscribes again behind the waiters of other
    /// processes (see `Subscription::leave_now`). The kinds with a line in Redis have their
    /// order kept there; readers do not wait for each other.
    pub(crate) const fn leaves_channel_after_waiting(self) -> bool {
        matches!(self, Self::Exclusive)
    }

    /// Whether every holder must be counted by one Redis: a RedLock quorum cannot serve it
    /// (see [`Capabilities::serves`](crate::capabilities::Capabilities::serves)).
    pub(crate) const fn needs_one_redis(self) -> bool {
        matches!(self, Self::Fair | Self::Permits { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Kind; 4] = [
        Kind::Exclusive,
        Kind::Fair,
        Kind::Shared,
        Kind::Permits { limit: 3 },
    ];

    #[test]
    fn labels_are_the_metric_labels_and_distinct() {
        let labels: Vec<_> = ALL.map(Kind::label).into();
        assert_eq!(labels, ["mutex", "fair", "read", "semaphore"]);
    }

    #[test]
    fn what_differs_between_kinds() {
        // (kind, exclusive, hands over, in line, joins writers, one Redis)
        let table = [
            (Kind::Exclusive, true, true, false, true, false),
            (Kind::Fair, true, false, true, false, true),
            (Kind::Shared, false, false, false, false, false),
            (Kind::Permits { limit: 3 }, false, true, true, false, true),
        ];
        for (kind, exclusive, hands_over, in_line, joins, one_redis) in table {
            assert_eq!(kind.is_exclusive(), exclusive, "{kind:?}");
            assert_eq!(kind.hands_over_locally(), hands_over, "{kind:?}");
            assert_eq!(kind.stands_in_line(), in_line, "{kind:?}");
            assert_eq!(kind.joins_waiting_writers(), joins, "{kind:?}");
            assert_eq!(kind.needs_one_redis(), one_redis, "{kind:?}");
        }
    }
}
