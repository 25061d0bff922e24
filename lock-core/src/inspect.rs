//! [`LockInfo`]: who holds a lock, for how long, and who waits, as one read of Redis
//! ([`Locker::inspect`](crate::Locker::inspect), `scripts/inspect.lua`).

use std::time::Duration;

use crate::holder::{parse_lock, parse_permit};
use crate::store::{HeldAs, Inspected};

/// How a key is held, as [`LockInfo::kind`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// A mutex or a write lock ([`Locker::lock`](crate::Locker::lock),
    /// [`Locker::write`](crate::Locker::write), [`Locker::lock_all`](crate::Locker::lock_all)).
    Exclusive,
    /// A fair lock ([`Locker::fair_lock`](crate::Locker::fair_lock)).
    Fair,
    /// Read locks ([`Locker::read`](crate::Locker::read)), one or more.
    Read,
    /// Permits of a semaphore ([`Locker::semaphore`](crate::Locker::semaphore)).
    Semaphore,
}

/// A snapshot of a held lock, from [`Locker::inspect`](crate::Locker::inspect).
///
/// It is what Redis held at the moment of the read: the holder may release (or lose) it right
/// after. Use it to show an operator who holds what, never to decide whether to enter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    pub(crate) kind: LockKind,
    pub(crate) holders: Vec<String>,
    pub(crate) remaining: Option<Duration>,
    pub(crate) readers: u32,
    pub(crate) permits_in_use: u32,
    pub(crate) waiters: u32,
}

impl LockInfo {
    /// How the key is held.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// The holder's name (see [`LockerBuilder::holder_name`](crate::LockerBuilder::holder_name)).
    /// For read locks and semaphores: the holder whose lease ends last (the one
    /// [`remaining`](Self::remaining) is about). `None` when the stored value carries no name
    /// (written by an older version of the kit).
    ///
    /// The name is what the holder's locker was given: show it escaped (as the kit's own
    /// messages do) if it may come from an untrusted process.
    pub fn holder(&self) -> Option<&str> {
        self.holders.first().map(String::as_str)
    }

    /// Every holder's name, the one whose lease ends last first: one for an exclusive or fair
    /// lock, one per reader or permit holder (a locker that holds twice is named twice). At
    /// most 32 are read.
    pub fn holders(&self) -> &[String] {
        &self.holders
    }

    /// How long the lock stays held if nobody renews or releases it: the holder's lease (the
    /// longest of the readers' or permit holders' leases). With the watchdog it is renewed
    /// every third of the lease, so it says when a crashed holder's lock ends, not when a live
    /// one releases. [`Duration::MAX`] for a key without expiry (written by someone else).
    pub fn remaining(&self) -> Duration {
        self.remaining.unwrap_or(Duration::MAX)
    }

    /// Read locks held ([`LockKind::Read`]); 0 for other kinds.
    pub fn readers(&self) -> u32 {
        self.readers
    }

    /// Permits held ([`LockKind::Semaphore`]), summed over the holders; 0 for other kinds.
    pub fn permits_in_use(&self) -> u32 {
        self.permits_in_use
    }

    /// Acquirers waiting for it in Redis: the waiting writers of a mutex or a read-write lock,
    /// the line of a fair lock or a semaphore. A locker's own tasks queue in its process and
    /// only its first waiting one waits in Redis, so this counts waiting lockers more than
    /// waiting tasks; readers waiting for a writer are not counted (they leave one mark for all).
    pub fn waiters(&self) -> u32 {
        self.waiters
    }
}

impl LockInfo {
    /// The info in what the inspect script found: holder names are parsed out of the stored
    /// values (see `holder.rs`); a value without a name (an older kit) names nobody.
    pub(crate) fn from_inspected(found: Inspected) -> Self {
        let Inspected {
            what,
            remaining,
            waiting_writers,
            in_line,
            count,
            values,
        } = found;
        let mut info = Self {
            kind: LockKind::Exclusive,
            holders: Vec::new(),
            remaining,
            readers: 0,
            permits_in_use: 0,
            waiters: waiting_writers,
        };
        let names = |parse: fn(&str) -> Option<&str>| -> Vec<String> {
            values
                .iter()
                .filter_map(|value| parse(value).map(str::to_owned))
                .collect()
        };
        match what {
            HeldAs::Lock => {
                let fair = values.first().is_some_and(|v| parse_lock(v).fair);
                info.holders = names(|v| parse_lock(v).holder);
                if fair {
                    // A fair lock's waiters stand in its line (they are waiting writers too,
                    // but the line drops the ones that stopped trying).
                    info.kind = LockKind::Fair;
                    info.waiters = in_line;
                }
            }
            HeldAs::Readers => {
                info.kind = LockKind::Read;
                info.holders = names(|v| parse_lock(v).holder);
                info.readers = count;
            }
            HeldAs::Semaphore => {
                info.kind = LockKind::Semaphore;
                info.holders = names(|v| parse_permit(v).0);
                info.permits_in_use = count;
                info.waiters = in_line;
            }
        }
        info
    }
}
