//! A double-holder oracle (RELIABILITY.md C.1): three independent checks that a lock never had
//! two holders at once, usable by the tasks of one process and by several processes on one
//! host at the same time.
//!
//! Each section is entered with a [`Kind`] of lock that says who may be inside with it:
//! [`Kind::Exclusive`] (the default, [`Oracle::enter`]: a mutex or a write lock, alone),
//! [`Kind::Shared`] ([`Oracle::enter_shared`]: readers together, never with a writer) or
//! [`Kind::Permits`]`(n)` (at most `n` holders at once, a semaphore). "Two holders at once"
//! below means two that exclude each other, or more permit holders than permits; shared and
//! permit sections have no fencing token and take no part in the fenced resource (check 3).
//!
//! Every check lives on a separate, never-faulted **referee** `redis-server`, so faults injected
//! into the lock server (or a holder's network) cannot hide a violation:
//!
//! 1. **Occupancy counter.** [`Oracle::enter`] runs `INCR occ:<key>` (it must return 1) and
//!    [`Oracle::leave`] runs `DECR` before the lock is released. A value above 1 is a
//!    *collision*; the ids of the holders already inside are recorded with it. The referee
//!    also keeps every occupant's access: a shared enter collides only with the exclusive
//!    (and permit) sections inside, a permit enter with the non-permit ones and, once `n`
//!    permit holders are inside, with all of them.
//! 2. **Interval log.** Each critical section becomes an [`Interval`]: key, fencing token,
//!    `CLOCK_MONOTONIC` enter and exit times (one clock for every process on the host, see
//!    [`monotonic_ns`]), the last time the holder checked that it still held the lock, and
//!    when it learned that it had lost it. [`check`] sorts them per key and classifies every
//!    overlap (see below).
//! 3. **Fenced resource.** A Lua script stands for a storage system that takes fencing tokens:
//!    a holder's token is registered when it enters (a claim that raises the key's high-water
//!    mark; a token not above it is a *fence regression*), and [`Oracle::write`] is accepted
//!    only with a token at least as high as the highest one seen, i.e. only from the newest
//!    holder. Every write is logged with a global sequence number shared with the enters, and
//!    [`check`] recounts stale writes from that log, independently of the script's verdict.
//!
//! # The verdict on an overlap
//!
//! Two intervals of one key overlap when one enters before the other exits. Of the two, the
//! *older* holder is the one with the lower fencing token (it acquired first), the other is the
//! *younger*; an exclusive holder may enter without a token (fence 0: it did not ask for one,
//! so it claims nothing on the fenced resource and never writes), and then, as for shared and
//! permit sections, the older is the one that got its lock first ([`Interval::granted_at`]:
//! the stamp a holder took as its acquire returned, [`Oracle::enter_granted`], or else its
//! enter). The overlap is
//!
//! - **signalled** when the older holder had learned that its lock was lost no later than the
//!   younger one entered (`lost_at <= younger.t_enter`): the kit said so in time;
//! - **late-signalled** when the older holder did learn it, but later, and never confirmed
//!   holding the lock (`is_held()` true) at or after the younger one entered: it was not
//!   running in between (SIGSTOP, a long scheduling stall) - the window that only fencing
//!   tokens close (Kleppmann), so it is reported but not a violation;
//! - **killed** when the older holder was SIGKILLed before it could learn anything and had
//!   not confirmed holding the lock at or after the younger one entered (its last check is
//!   recorded on the referee on enter and on leave): a dead process is never signalled, and
//!   one that was stalled when its lease ran out and then killed did nothing meanwhile;
//! - **wiped** when the test recorded a [`Wipe`] of the key (`DEL`, a forced unlock,
//!   `FLUSHALL`, a restart without persistence) that took the older holder's lock (granted
//!   before the wipe ended), the younger getting the key after the wipe began, and the older
//!   noticed the loss (or
//!   died) within the wipe's `notice` and its release did not answer `Ok`: nobody can know of a
//!   deletion before looking at Redis, so it is reported, not a violation;
//! - **unsignalled** otherwise: the older holder never learned it lost the lock, or believed
//!   it still held it after the younger one had entered. That is a violation. It covers a
//!   holder that got a lock already gone (a local handoff of a deleted lock): whichever of the
//!   two entered first, the other entered beside it and neither was told
//!   ([`Report::untold_after_wipe`] counts those after a wipe). When the order comes from enter
//!   times alone, a younger holder that entered knowing its lock was lost (its enter check said
//!   so) makes the overlap signalled: it may have acquired first and been paused before it
//!   entered.
//!
//! # False `Ok` releases
//!
//! Each section may record what its release answered ([`Entry::record_release`]). `Ok` is a
//! violation ([`Report::false_ok_releases`]) when the lock was not the section's own to the end:
//! it is the older of two overlapping holders ordered by fencing tokens (the younger's token
//! was issued while the key held the younger's token, before the older left), or it held the
//! lock from before a [`Wipe`] of its key was sent (granted) until after it was answered (left).
//!
//! Only pairs that exclude each other are judged so; two readers (or two permit holders)
//! overlapping are counted as [`Report::shared_overlaps`]. A permit holder entering while `n`
//! others were inside whose overlaps with it would each be unsignalled is
//! [`Report::over_limit`], a violation. Without fencing tokens on one side of a pair, the
//! older holder is the one that got its lock first.
//!
//! An occupancy collision is a violation under the same idea: unless the older of the two
//! holders was marked lost, or was SIGKILLed without a confirmation after the younger one
//! entered (or before the younger one entered, and only its clean-up was late).
//!
//! # Across processes
//!
//! Each process connects its own [`Oracle`] with the same `run` name and a distinct `worker`
//! name. A worker that is SIGKILLed mid-section leaves its enter behind; the parent closes it
//! with [`Oracle::close_worker`] (decrementing the occupancy and logging the interval as
//! [`Outcome::Killed`]); a section is logged once: a holder's `finish` that reaches the
//! referee after `close_worker` (sent just before the process died) replaces the killed copy. [`Oracle::report`] reads everything back and runs [`check`].
//!
//! # On the referee
//!
//! A run's keys are under `oracle:<run>:`. Every record there is a JSON object with named
//! fields, read into the struct of `record.rs` that defines it ([`Interval`], [`FencedWrite`],
//! [`Wipe`] and the open sections); the Lua scripts that write them are the files in `scripts/`, each
//! starting with its keys, arguments and reply. [`check`] needs the records only, so a log
//! read back from the referee, or written by hand in a test, is checked the same way.
//!
//! # Limits
//!
//! Times are stamped by the holder around its own calls: `t_granted` as the acquire returned,
//! `t_enter` after that (and after a fencing token's round trip), `t_exit` before the release
//! is sent, `last_held` *before* a positive `is_held()`, `lost_at` *after* the loss was
//! observed. Pauses between a stamp and the action it describes can only shrink an interval or
//! delay a loss, so they never make a correct lock look wrong; they can hide a violation in a
//! window of a few instructions. One rule reads a stamp the other way: a wipe excuses the
//! holder whose lock was granted before it ended, and a grant is known only by the stamp after
//! it. A holder that enters without a grant stamp and is slowed between its acquire and its
//! enter can be blamed for a wipe that took its lock (the chaos soak under heavy load showed
//! it with 1-18 ms between a token's round trip and the enter); with the stamp, the window is
//! the wake-up of the task the acquire answered. A holder paused after stamping its
//! enter but before the enter reached the referee overlaps without an occupancy collision.
//! What a SIGKILLed holder checked is known only as of its enter or its leave.

mod check;
mod clock;
mod record;
mod referee;

pub use check::{check, check_with_wipes, Report};
pub use clock::monotonic_ns;
pub use record::{FencedWrite, Interval, Kind, Outcome, Release, Wipe};
pub use referee::{Entry, Oracle};
