//! A model of the kit's lock protocol (the mutex of `lock-core` on one Redis), checked
//! exhaustively within a bound by [`stateright`]. `cargo test -p lock-model` runs the
//! checks; `tests/check.rs` lists them.
//!
//! # What is modelled
//!
//! - **One Redis server**: the lock key, the waiting writers, the release latches and the
//!   fence key (kept alive past the lock's end by its window), each with a TTL on the model's
//!   clock; the restart guard; a snapshot a restart may load. Each script is one atomic step ([`redis`]): `acquire.lua` with `guard.lua`
//!   prepended, `release.lua` (compare-and-delete, latch, publish when another locker waits),
//!   `renew.lua` (never shortening unless exact), `fence.lua` (a token only while the key
//!   holds the caller's token), `withdraw.lua`. `PUBLISH` wakes every subscribed waiter.
//! - **Two processes** (`Locker`s), each with the key's local queue (one place, first come
//!   first served), `LocalLocks`' records by token, the slot's baton, a watchdog, a
//!   background releaser, and one multiplexed connection that runs its commands in order.
//! - **Two tasks per process**, each making one acquire (watchdog mode, a wait of 3 ticks):
//!   the local queue, the local handoff *with* its proof (`LocalLocks::finish`: a `GET`, or a
//!   compare-and-`PEXPIRE` when the holder's validity is older than this tick's grant or
//!   renewal would give, confirms the token before the lock is left in the slot; `Ok` only
//!   then, `Lost` when Redis lost it), the tries in Redis (busy: subscribe, try again on a
//!   release message or at the next tick), retries on a new connection, the drop-guards'
//!   background jobs (an abandoned acquire's release, the withdrawal, a baton's reclaim).
//!   Inside, a task may (by its [`Program`]) enter the lock again (depth 1), ask for a
//!   fencing token (its `Fence` handle then lives until the release, which keeps the lock
//!   from being handed over), and extend the lock; then it releases it.
//! - **The watchdog**: a round per tick (a third of the lease) renews the held records; its
//!   answer is applied to whoever holds the token when it arrives (`LocalLocks::renewed`),
//!   and a "not ours" answer for a token nobody holds withdraws a handoff of it still waiting
//!   in the slot.
//! - **Time**: a discrete clock the checker advances ([`model::Action::Tick`]). A tick is a
//!   third of the lease (seconds); a command takes milliseconds, so the clock moves only
//!   once every running process has settled (its commands ran and their replies were
//!   handled, its due retries went out, its expired waits ended). A process that does not
//!   keep up is the fault *pause*, which lasts as long as the checker likes.
//!
//! Every action of [`model::Action`] names the function or script of `lock-core` it stands
//! for.
//!
//! # Faults
//!
//! Each costs one of the run's budget, at any step: a connection reset with the command at
//! its head run or not (its reply lost, the rest never run; callers retry on a new
//! connection where the code does), a process paused (stopped, GC, slow network: a holder
//! paused past its lease), the lock key deleted (`force_unlock`, `DEL`, eviction), an empty
//! restart, a restart from an older snapshot (`Save` is free). Every restart kills every
//! connection and starts the restart guard. The clock moving is the checker's choice too.
//!
//! # The properties
//!
//! A task *believes* it holds the lock exactly as `LockGuard::is_held` says: not marked
//! lost, and its validity not run out. The validity counts from when the granting command
//! (or renewal, confirmation, extension) was **sent**, plus the lease, minus a margin of one
//! tick; the key's TTL counts from when Redis ran the command, never earlier. (The properties
//! also hold with no margin at all: at the model's resolution the margin is not what keeps
//! holders apart; in the code it covers clock drift and scheduling within a tick.)
//!
//! 1. **Exclusion** ([`properties::EXCLUSION`]). No two tasks are inside their sections
//!    while both believe they hold, unless one of them has an *unseen loss*: its key was
//!    deleted behind its back (`force_unlock`, `DEL`, eviction) or forgotten by a restart,
//!    and no answer of a command Redis ran after that loss (a renewal, the extension, a
//!    fence request) has reached it yet. A holder cannot know of such a loss before the next
//!    answer: that window, and only it, is allowed, and it closes at the first answer (the
//!    answer marks the lock lost; the property checks that it did). The excuse belongs to a
//!    hold: a lock taken over locally carries its predecessor's only for a loss after the
//!    confirmation that proved it, so a handoff on local state alone is not excused. An
//!    expiry is never excused: the validity must end first.
//! 2. **Release truth** ([`properties::RELEASE_TRUTH`]). A release that answered `Ok` rests
//!    on a Redis answer found while the key held the token it had kept since its grant (no
//!    expiry, no other holder in between): `release.lua` deleted it (in this try, or in an
//!    earlier one whose latch the retry found), or, for a handoff, the confirmation found it.
//!    A restart from a snapshot that brings the token back counts as granting it again.
//! 3. **Fencing order** ([`properties::FENCING_ORDER`]). Every fencing token issued is larger
//!    than every token issued before it and goes to the key's current holder; so tokens
//!    increase in the order of the grants (a restart from a snapshot that brings a token back
//!    grants it again).
//! 4. **Nothing left** ([`properties::NOTHING_LEFT`]). Once every task has its answer and
//!    nothing is in flight, every key left expires within the cleanup window (the longest
//!    TTL the protocol sets): nothing is left once it passed.
//! 5. **Every task finishes** ([`properties::EVERY_TASK_FINISHES`], an `eventually`
//!    property: checked on every path to a final state, which all runs reach since the clock
//!    stops and every step makes progress). Every task gets the lock and releases it, or its
//!    wait runs out, or it learns of a loss: no waiter is stuck once the holder stops.
//!
//! `sometimes` properties show the bound is not vacuous: a handoff happens, a fencing token
//! is issued, two tasks believe at once after an unseen loss, a retried release is answered
//! by its latch, the restart guard refuses an acquire.
//!
//! # The bound
//!
//! [`Config::base`]: lease 3 ticks, margin 1, extension 6, waits 3, restart guard 6 (the
//! longest lease any client uses), fence window 2, the clock stopping at tick 7. Four bounds
//! are checked, with the two processes' symmetry reduced ([`symmetry`]):
//!
//! - [`Config::protocol`], the main one: one fault of any kind; the first task of each
//!   process enters its lock again and extends it, the second takes a fencing token (usually
//!   on a lock handed over by the first). About 2.5 million distinct states.
//! - [`Config::fencing`]: one fault; the first task takes a fencing token (so its lock goes
//!   back through Redis), the second extends. About 5.7 million.
//! - [`Config::two_faults`]: two faults of any kinds, plain locks, the clock stopping at
//!   tick 6. About 4.7 million.
//! - [`Config::parked_baton`]: a baton waits for its taker's own step, two faults among
//!   resets and deletions, the clock stopping at tick 5. About 0.8 million.
//!
//! The test binary takes under a minute on two cores (debug, with the checker and the model
//! optimized). Two faults together with the programs are beyond reach: that check had not
//! finished after several minutes and 14 GB of states, so the two-fault bounds run plain
//! locks.
//!
//! Four mutations, each undoing a fix, must give a counterexample ([`Mutation`]): the
//! handoff without its proof (`RELIABILITY.md` A1), the release without its latch (S1),
//! renewals that shorten an extension (A2), and an answer that misses a parked handoff.
//!
//! # The parked handoff
//!
//! The last one is a window this model found in the code it was first written against, and
//! that commit 84cb768 closed meanwhile: a watchdog answer arriving while the token waits in
//! the slot's baton found no record (`LocalLocks::renewed` looked only at the records) and was
//! dropped, so the next task took over a lock Redis had already said was gone and entered it
//! beside a new holder, until its own first renewal. It takes the watchdog's renewal to run
//! after the handoff's confirmation (a connection reset: both retried, the confirmation
//! first), the key deleted in between, and the answer landing between `hand_over` and
//! `take_over`. The model follows the fix (the answer withdraws the baton), which the
//! parked-baton bound checks; [`Mutation::AnswerMissesTheBaton`] brings the window back.
//! The other bounds take a baton over in the handoff's step ([`Config::pickup_step`] off),
//! where no answer can arrive in between.
//!
//! # Not modelled
//!
//! - RedLock (quorums, undo of partial grants), Cluster (slots, migrations), Sentinel and
//!   `min_replicas` (`WAIT`, failovers): one logical Redis only.
//! - The other kinds (read locks, fair locks, semaphores) and `lock_all`; fixed leases and
//!   `max_hold`; the tower layer and the macro (thin users of the mutex).
//! - Real time: no clock drift, no time inside a tick (the margin, the 1 ms hold-back for
//!   other lockers' waiters, `PICKUP`'s 5 ms, `retry_dropped`'s pauses, jitter); a server
//!   paused as a whole (a paused client and a reset cover delayed and lost commands).
//! - A command of a dead connection running after its retry on the new one (a delayed
//!   duplicate); pub/sub messages lost (waiters retry at the next tick anyway); a guard
//!   dropped instead of released (the same `finish`), a release or acquire cancelled midway;
//!   a guard moved to another task (reentrancy's escape).
//! - Abstractions that change no outcome: a running process handles a task's reply in the
//!   step Redis runs the command, background jobs are sent when created, a nested acquire
//!   and its release are one step, a first busy try subscribes and tries again in one step.

pub mod check;
pub mod config;
pub mod model;
pub mod properties;
pub mod redis;
pub mod state;
pub mod symmetry;

pub use check::{check, trace, Report};
pub use config::{Config, FaultKinds, Mutation, Program, Tick};
pub use model::{Action, LockModel};
pub use state::State;
