//! The bound of a check: durations in ticks, the fault budget, and the mutations that prove
//! the checker bites.

/// A point or a span of the discrete clock. One tick is a third of the watchdog lease (the
/// watchdog's renewal interval, `watchdog.rs`).
pub type Tick = u8;

/// A change to the protocol that must make the checker find a counterexample (each one undoes
/// a fix the kit made; see `RELIABILITY.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// Row A1 undone: `LocalLocks::finish` hands a lock to the next local task on local state
    /// alone, without the `GET` (or compare-and-`PEXPIRE`) that asks Redis whether the token
    /// still holds it.
    HandoffWithoutProof,
    /// Row S1 undone: `release.lua` leaves no latch, and a retried release (its first try's
    /// reply lost) that finds the key absent or another holder's trusts that its first try
    /// deleted it: `Ok`.
    ReleaseWithoutLatch,
    /// Row A2 undone: `renew.lua` sets the watchdog's lease whatever the key's TTL, so a
    /// renewal (or a handoff's confirmation) cuts back an explicit extension.
    RenewalsShorten,
    /// The fix of 84cb768 undone: `LocalLocks::renewed` drops a "not ours" answer when no
    /// record holds the token, even while the token waits in the slot's baton, so the next
    /// local task takes over a lock Redis already said was lost. Checked with
    /// [`Config::pickup_step`], the only bound where a baton waits for its taker.
    AnswerMissesTheBaton,
}

/// The kinds of fault the checker may inject (each one costs one of the budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultKinds {
    /// A connection dies, with or without the command at its head having run.
    pub reset: bool,
    /// A process pauses (and resumes when the checker likes).
    pub pause: bool,
    /// The lock key is deleted behind its holder.
    pub delete: bool,
    /// The server restarts empty.
    pub restart: bool,
    /// The server restarts from an older snapshot (taken by `Save`, which costs nothing).
    pub snapshot: bool,
}

impl FaultKinds {
    /// No fault.
    pub const NONE: Self = Self {
        reset: false,
        pause: false,
        delete: false,
        restart: false,
        snapshot: false,
    };

    /// Every kind.
    pub const ALL: Self = Self {
        reset: true,
        pause: true,
        delete: true,
        restart: true,
        snapshot: true,
    };
}

/// What a task may do while it holds the lock, besides releasing it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Program {
    /// Enter the lock again and leave it (a nested acquire, depth 1).
    pub nested: bool,
    /// Ask for the fencing token (`LockGuard::fencing_token`); its `Fence` handle lives until
    /// the release.
    pub fence: bool,
    /// Extend the lock by [`Config::extension`] (`LockGuard::extend`).
    pub extend: bool,
}

/// What one check explores: the protocol's durations (in ticks), how far the clock runs, the
/// faults the checker may inject, and an optional mutation.
///
/// Two processes (each a `Locker` with its own local queue, watchdog, background releaser and
/// multiplexed connection) with two tasks each; every task makes one acquire of the one key
/// (watchdog mode) and, if granted, may take a fencing token, extend the lock, enter it again
/// (depth 1), then releases it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    /// The watchdog lease `L`: what an acquire, a renewal and a handoff's confirmation ask for.
    pub lease: Tick,
    /// The safety margin of the local validity (`held.rs` `safety_margin`): a grant or renewal
    /// sent at `s` is believed until `s + lease - margin`, strictly before the key can expire
    /// in Redis (whose TTL counts from the command's execution, never before it was sent).
    pub margin: Tick,
    /// The one explicit extension a holder may make (`LockGuard::extend`), longer than the
    /// lease, so that a renewal that shortened it would matter.
    pub extension: Tick,
    /// How long an acquire waits (`Acquire::wait`): its deadline is its start plus this.
    pub wait: Tick,
    /// The clock stops here (the bound of the check).
    pub horizon: Tick,
    /// How many faults the checker may inject in one run.
    pub faults: u8,
    /// Which faults it may inject.
    pub kinds: FaultKinds,
    /// The restart guard (`LockerBuilder::restart_guard`): a restarted server grants nothing
    /// for this long. `None`: no guard.
    pub restart_guard: Option<Tick>,
    /// Life of a release latch (`store::latch_ttl`).
    pub latch_ttl: Tick,
    /// Life of the waiting writers' entry an acquire leaves (`acquire.lua` `ARGV[3]`).
    pub waiting_ttl: Tick,
    /// How long the fence key outlives its lock (`fence_retention`, the scripts' fence
    /// window: `fence.lua` and `renew.lua` keep it alive until the lock's end plus this).
    pub fence_window: Tick,
    /// Local handoffs in a row before a lock goes back through Redis (`local.rs` `MAX_STREAK`).
    pub max_streak: u8,
    /// What each task may do inside its section besides releasing, each at most once, in any
    /// order, at any time (task `t` runs in process `t / 2`).
    pub programs: [Program; crate::state::TASKS],
    /// Whether a baton waits in the slot for its taker's own step (the real code: the
    /// woken task runs `take_over` a moment after `hand_over`). Off, the taker takes it over
    /// in the handoff's step: a watchdog answer can then never arrive while the token waits
    /// in the baton, and the state space is half the size.
    pub pickup_step: bool,
    /// Explore one of each pair of states that differ only by swapping the two processes
    /// (when both processes' tasks run the same programs). Traces may then show the
    /// processes swapped midway.
    pub symmetry: bool,
    /// The protocol change under test, if any.
    pub mutation: Option<Mutation>,
}

impl Config {
    /// The durations every check uses: lease 3 ticks (renewed every tick), margin 1, an
    /// extension of 6, waits of 3, the restart guard 6 (the longest lease any client uses:
    /// the extension), latches and waiting entries 2, fence retention 6; the clock stops at
    /// tick 7; one fault of any kind; plain programs.
    pub fn base() -> Self {
        Self {
            lease: 3,
            margin: 1,
            extension: 6,
            wait: 3,
            horizon: 7,
            faults: 1,
            kinds: FaultKinds::ALL,
            restart_guard: Some(6),
            latch_ttl: 2,
            waiting_ttl: 2,
            fence_window: 2,
            max_streak: 6,
            programs: [Program::default(); crate::state::TASKS],
            pickup_step: false,
            symmetry: true,
            mutation: None,
        }
    }

    /// The main check: [`base`](Self::base), and in each process the first task enters its
    /// lock again and extends it, the second takes a fencing token (usually on a lock handed
    /// over by the first).
    pub fn protocol() -> Self {
        let first = Program {
            nested: true,
            fence: false,
            extend: true,
        };
        let second = Program {
            fence: true,
            ..Program::default()
        };
        Self {
            programs: [first, second, first, second],
            ..Self::base()
        }
    }

    /// The fencing check: [`base`](Self::base), and in each process the first task takes a
    /// fencing token (so its lock goes back through Redis, never handed over while its
    /// `Fence` lives), the second extends its lock.
    pub fn fencing() -> Self {
        let first = Program {
            fence: true,
            ..Program::default()
        };
        let second = Program {
            extend: true,
            ..Program::default()
        };
        Self {
            programs: [first, second, first, second],
            ..Self::base()
        }
    }

    /// Two faults of any kinds (a deletion then a restart from a snapshot that brings the
    /// key back, a reset then a deletion, ...): [`base`](Self::base) with plain programs and
    /// the clock stopping at tick 6.
    pub fn two_faults() -> Self {
        Self {
            faults: 2,
            horizon: 6,
            ..Self::base()
        }
    }

    /// The window of a parked baton: the baton waits for its taker's own step
    /// ([`pickup_step`](Self::pickup_step)), with two faults among resets and deletions (a
    /// watchdog renewal retried after the handoff's confirmation, the key deleted between
    /// them), plain locks, the clock stopping at tick 5.
    pub fn parked_baton() -> Self {
        Self {
            pickup_step: true,
            faults: 2,
            horizon: 5,
            kinds: FaultKinds {
                reset: true,
                delete: true,
                ..FaultKinds::NONE
            },
            ..Self::base()
        }
    }

    /// The main check's bound with `mutation` applied (without the symmetry reduction, so
    /// that traces keep the processes' names).
    pub fn mutated(mutation: Mutation) -> Self {
        Self {
            mutation: Some(mutation),
            symmetry: false,
            ..Self::protocol()
        }
    }

    /// Whether the symmetry reduction applies: asked for, and the processes are alike.
    pub fn reduces_symmetry(&self) -> bool {
        let half = self.programs.len() / 2;
        self.symmetry && self.programs[..half] == self.programs[half..]
    }

    /// Whether `mutation` is the one under test.
    pub fn has(&self, mutation: Mutation) -> bool {
        self.mutation == Some(mutation)
    }

    /// How long after the last write to Redis every key it wrote has surely expired: the
    /// longest TTL the protocol sets (a fence key outlives the longest lease by its window).
    pub fn cleanup_window(&self) -> Tick {
        (self.lease.max(self.extension) + self.fence_window)
            .max(self.latch_ttl)
            .max(self.waiting_ttl)
    }
}
