//! The state of the modelled system: one Redis, two processes, four tasks, the background
//! releasers' jobs, and the ghost variables the properties read (never the protocol).

use crate::config::Tick;

/// Number of processes (`Locker`s).
pub const PROCESSES: usize = 2;
/// Tasks per process.
pub const TASKS_PER_PROCESS: usize = 2;
/// Number of tasks.
pub const TASKS: usize = PROCESSES * TASKS_PER_PROCESS;

/// A task, `0..TASKS`; task `t` runs in process `t / TASKS_PER_PROCESS`.
pub type TaskId = u8;
/// A process, `0..PROCESSES`.
pub type ProcessId = u8;
/// A Redis token (lock-core `token.rs`, `Token::new`). Every task makes one acquire in Redis at most,
/// so a token is named by the task that drew it; a local handoff passes it on to the next
/// holder of the same process.
pub type Token = u8;

/// The process task `task` runs in.
pub fn process_of(task: TaskId) -> ProcessId {
    task / TASKS_PER_PROCESS as u8
}

/// The lock key (`lock:{h}:lock:<key>`): the holder's token and when the key expires (it
/// exists while the clock is before `expires`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockKey {
    /// The holder's token.
    pub token: Token,
    /// When the key expires.
    pub expires: Tick,
}

/// A release latch (`…:unlocked:<token>`, written by `release.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Latch {
    /// Whether another locker waited when the release deleted the key (the latch's value).
    pub waited: bool,
    /// When the latch expires.
    pub expires: Tick,
}

/// The fence key (`…:fence:<key>`, written by `fence.lua`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FenceKey {
    /// The last fencing token issued.
    pub last: u8,
    /// When the key expires.
    pub expires: Tick,
}

/// The data set of the Redis server: what a snapshot saves and a restart loses.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Data {
    /// The lock key.
    pub lock: Option<LockKey>,
    /// The waiting writers (`acquire.lua` `KEYS[2]`): a bit per token.
    pub waiting: u8,
    /// When the waiting writers' set expires (the set has one TTL, set by its last joiner).
    pub waiting_expires: Tick,
    /// The release latches, by token.
    pub latches: [Option<Latch>; TASKS],
    /// The fence key.
    pub fence: Option<FenceKey>,
}

impl Data {
    /// Removes what has expired at `now`; returns the lock key's token if the lock key was
    /// among it.
    pub fn expire(&mut self, now: Tick) -> Option<Token> {
        let mut expired = None;
        if let Some(lock) = self.lock {
            if lock.expires <= now {
                expired = Some(lock.token);
                self.lock = None;
            }
        }
        if self.waiting != 0 && self.waiting_expires <= now {
            self.waiting = 0;
            self.waiting_expires = 0;
        }
        for latch in &mut self.latches {
            if latch.is_some_and(|l| l.expires <= now) {
                *latch = None;
            }
        }
        if self.fence.is_some_and(|f| f.expires <= now) {
            self.fence = None;
        }
        expired
    }

    /// Whether nothing is left (the restart guard's epoch key, which has no TTL, is not part
    /// of the model's data).
    pub fn is_empty(&self) -> bool {
        self.lock.is_none()
            && self.waiting == 0
            && self.latches.iter().all(Option::is_none)
            && self.fence.is_none()
    }
}

/// The Redis server.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Redis {
    /// The data set.
    pub data: Data,
    /// The restart guard (`guard.lua`): the server grants nothing before this tick.
    pub guard_until: Tick,
    /// Fencing tokens issued in this tick: `fence.lua` reads the server's clock, which is
    /// `now * FENCE_SCALE` plus this (the clock moves between two scripts; a restart does
    /// not turn it back).
    pub fences_this_tick: u8,
    /// The snapshot a restart may load (`Save`), if one was taken.
    pub snapshot: Option<Data>,
}

/// Fencing tokens per tick of the server clock (more than can be issued in one tick).
pub const FENCE_SCALE: u8 = 8;

/// A Redis command: one script (or `SET NX`), run atomically.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// `acquire.lua` with `guard.lua` prepended (`Store::acquire`).
    Acquire {
        /// The acquirer's token.
        token: Token,
    },
    /// `release.lua` (`Store::release`).
    Release {
        /// The holder's token.
        token: Token,
    },
    /// `renew.lua` (`Store::renew`): a watchdog renewal or a handoff's confirmation
    /// (`NewLease::AtLeast(lease)`), or an extension (`NewLease::Exactly(extension)`).
    Renew {
        /// The holder's token.
        token: Token,
        /// The lease asked for.
        lease: Tick,
        /// `NewLease::Exactly`: set even if it shortens the TTL.
        exact: bool,
    },
    /// `GET` of the lock key (`Store::confirm`): a handoff's confirmation while the lease Redis
    /// last confirmed is mostly left; compares the token, writes nothing.
    Confirm {
        /// The holder's token.
        token: Token,
    },
    /// `fence.lua` (`Store::issue_fence`).
    Fence {
        /// The holder's token.
        token: Token,
    },
    /// `withdraw.lua` (`Store::withdraw`).
    Withdraw {
        /// The acquirer's token.
        token: Token,
    },
}

/// `acquire.lua`'s reply (`AcquireReply`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AcquireReply {
    /// `{1, 0}`: the key holds the caller's token (set now, or already: the lease re-applied).
    Acquired,
    /// `{0, pttl}`: another token holds it.
    Busy,
    /// `{2, ms}`: the restart guard runs.
    Guarded,
}

/// `release.lua`'s reply (`ReleaseReply`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReleaseReply {
    /// 1 or 2: deleted now (2: another locker waited and was told).
    Deleted {
        /// Another locker waited.
        waited: bool,
    },
    /// 3 or 4: not held, but the latch says an earlier try with this token deleted it.
    Latched {
        /// Another locker waited then.
        waited: bool,
    },
    /// -1: no key, no latch.
    Absent,
    /// 0: another token, no latch.
    Replaced,
}

/// `renew.lua`'s reply for one key (`Renewal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RenewReply {
    /// 1: renewed.
    Renewed,
    /// 0: the key is absent (`Gone::Absent`).
    Absent,
    /// -1: another token (`Gone::Replaced`).
    Replaced,
}

/// A script's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reply {
    /// Of [`Op::Acquire`].
    Acquire(AcquireReply),
    /// Of [`Op::Release`].
    Release(ReleaseReply),
    /// Of [`Op::Renew`] and [`Op::Confirm`].
    Renew(RenewReply),
    /// Of [`Op::Fence`]: the token, or `None` (-1) when the key is not the caller's.
    Fence(Option<u8>),
    /// Of [`Op::Withdraw`].
    Withdrawn,
}

/// Where a command's reply stands, as its caller sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Wire {
    /// Sent; queued on the process's connection.
    Sent,
    /// Run by Redis; the reply is on its way (a running process's task handles its reply in
    /// the step Redis runs the command; a paused one's waits here, and so does every
    /// watchdog answer). `fresh` (ghost): the command ran after its token's key was lost
    /// behind its holder's back (see `Ghosts::unseen_loss`).
    Replied {
        /// The reply.
        reply: Reply,
        /// Ghost: ran after an unseen loss.
        fresh: bool,
    },
    /// The connection died: the caller gets an error (the command ran or not).
    Failed,
}

/// A command in flight and what its caller keeps of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Call {
    /// The command.
    pub op: Op,
    /// When the caller sent its first try (a grant's or renewal's validity counts from here).
    pub sent_at: Tick,
    /// Where the reply stands.
    pub wire: Wire,
    /// Tries left after this one (`node.rs` `retry_dropped`: two more after a dropped
    /// connection).
    pub retries: u8,
}

/// Who waits for a command on a process's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Owner {
    /// A task's call.
    Task(TaskId),
    /// The process's watchdog renewal.
    Watchdog,
    /// Nobody any more: an acquire that gave up at its deadline with the command still on the
    /// connection (it runs; its reply is dropped), or the release of a baton an acquirer
    /// could not use (`Acquire::give_back`, whose answer does not matter).
    Abandoned,
    /// A job of the background releaser.
    Job(Job),
}

/// A command on a process's connection, in send order (a multiplexed connection runs them
/// in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Queued {
    /// The command.
    pub op: Op,
    /// Whose reply it is.
    pub owner: Owner,
}

/// Ghost variables of one hold of a token (an acquire whose command may have granted it, a
/// held lock, a lock being released, a baton), read by the properties only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ghosts {
    /// The lock key has held this token without a break since Redis granted it (or since a
    /// restart from a snapshot gave it back): it did not expire, and no other token took it.
    pub kept: bool,
    /// The key was lost behind the holder's back (deleted: `force_unlock`, `DEL`, eviction; or
    /// forgotten by a restart), and no answer of a command that ran after that loss has
    /// reached the holder yet. The one window the protocol cannot close.
    pub unseen_loss: bool,
}

/// A task's acquire in Redis (`Acquire::acquire_in_redis`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attempt {
    /// The acquire's token.
    pub token: Token,
    /// The acquire's deadline.
    pub deadline: Tick,
    /// The try in flight, if any (none while sleeping between tries).
    pub call: Option<Call>,
    /// A try found the lock held (`seen_busy`): the acquire is subscribed to the release
    /// channel, and joined the waiting writers (its `Waiting` drop-guard is armed).
    pub seen_busy: bool,
    /// A release message arrived since the last try was sent.
    pub woken: bool,
    /// Sleeping until the next tick (the fallback retry, or the holder's TTL), unless woken.
    pub asleep: bool,
    /// Ghost: of the grant a try may have made.
    pub ghosts: Ghosts,
}

/// A held lock (`Hold`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hold {
    /// The Redis token.
    pub token: Token,
    /// The validity clock: believed held while the clock is before this.
    pub valid_until: Tick,
    /// When the last explicit extension was sent.
    pub extended_at: Option<Tick>,
    /// Marked lost.
    pub lost: bool,
    /// Local handoffs in a row that led to this holder.
    pub streak: u8,
    /// Entered again (a nested guard taken and left) once already.
    pub nested: bool,
    /// Extended once already.
    pub extended: bool,
    /// A `Fence` handle of it is alive (it asked for a fencing token).
    pub fence_handle: bool,
    /// The holder's extension or fence request in flight.
    pub call: Option<Call>,
    /// Ghost: see [`Ghosts`].
    pub ghosts: Ghosts,
    /// Ghost: the last Redis proof this release rests on: `Some(kept)` when a confirmation
    /// found the key holding the token, or `release.lua` deleted it while it did.
    pub proof: Option<bool>,
}

impl Hold {
    /// `Hold::is_lost`: marked lost, or the validity ran out.
    pub fn is_lost(&self, now: Tick) -> bool {
        self.lost || now >= self.valid_until
    }

    /// `LockGuard::is_held`.
    pub fn believes(&self, now: Tick) -> bool {
        !self.is_lost(now)
    }

    /// `Hold::confirm`: Redis renewed `lease` for a command sent at `sent_at`.
    pub fn confirm(&mut self, sent_at: Tick, lease: Tick, margin: Tick) {
        if self.extended_at.is_some_and(|at| sent_at < at) {
            return;
        }
        self.valid_until = self.valid_until.max(sent_at + lease - margin);
    }

    /// `Hold::confirm_extension`.
    pub fn confirm_extension(&mut self, sent_at: Tick, by: Tick, margin: Tick) {
        if self.extended_at.is_some_and(|at| sent_at < at) {
            return;
        }
        self.valid_until = sent_at + by - margin;
        self.extended_at = Some(sent_at);
    }
}

/// How a finished lock is being finished (`LocalLocks::finish`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Finish {
    /// The handoff's confirmation (`LocalLocks::confirm`) in flight.
    Confirm(Call),
    /// The Redis release (`release::release_held`) in flight; `was_lost`: the lock was lost
    /// when it started.
    Release {
        /// The call.
        call: Call,
        /// `held.is_lost()` before the release was sent.
        was_lost: bool,
    },
}

/// A task's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Answer {
    /// `release()` said `Ok(())`.
    Ok {
        /// By a local handoff.
        handed_over: bool,
        /// Ghost: the proof it rests on (see [`Hold::proof`]).
        proof: Option<bool>,
    },
    /// `LockError::Lost`, from the release (or the acquire, for a reentry of a lost lock).
    Lost,
    /// `LockError::Busy`: the wait ran out.
    Busy,
    /// `LockError::Backend`.
    Backend,
}

/// Where a task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Waiting for the key's local place (`queue_for`), until `deadline`.
    Queued {
        /// The acquire's deadline.
        deadline: Tick,
    },
    /// Given the place while a baton waits in the slot: woken, about to take it over
    /// (`LocalLocks::take_over`).
    Placed {
        /// The acquire's deadline.
        deadline: Tick,
    },
    /// Acquiring in Redis.
    Acquiring(Attempt),
    /// Inside its critical section.
    Inside(Hold),
    /// Left its section; finishing the lock.
    Releasing(Hold, Finish),
    /// Finished, with its answer.
    Done(Answer),
}

/// A lock left in the slot for the next local holder (`slot::Baton`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Baton {
    /// The Redis token.
    pub token: Token,
    /// The confirmed validity.
    pub valid_until: Tick,
    /// Handoffs in a row.
    pub streak: u8,
    /// Ghost: see [`Ghosts`].
    pub ghosts: Ghosts,
}

/// A job of a process's background releaser (`release::start`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Job {
    /// `ReleaseJob::Abandoned`: an acquire gave up with a try that may still land; release
    /// the token (`release.lua`), up to `tries` times while it is not ours.
    Abandoned {
        /// The attempt's token.
        token: Token,
        /// Tries left.
        tries: u8,
    },
    /// `ReleaseJob::Withdraw`: `withdraw.lua` for an acquire that joined the waiting
    /// writers and stopped waiting.
    Withdraw {
        /// The attempt's token.
        token: Token,
    },
    /// The reclaim a handoff spawns (`LocalLocks::hand_over`): after `PICKUP`, a baton
    /// nobody took is released in Redis.
    Reclaim,
}

/// One process: a `Locker` with its `LocalLocks`, watchdog, background releaser and
/// multiplexed connection.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Process {
    /// The slot's local queue (`queue_for` waiters), first come first served.
    pub queue: Vec<TaskId>,
    /// The task (its `Hold`) that has the slot's one place.
    pub place: Option<TaskId>,
    /// `LocalLocks::held`: the records by token the watchdog renews, and their holder.
    pub records: Vec<(Token, TaskId)>,
    /// The baton in the slot, if any.
    pub baton: Option<Baton>,
    /// The watchdog's renewal in flight.
    pub renewal: Option<Call>,
    /// Paused (a fault: stopped, in a long GC, or cut off by a slow network): it takes no
    /// step, its watchdog renews nothing, its replies wait.
    pub paused: bool,
    /// A tick passed while paused: the watchdog renews as soon as it resumes.
    pub missed_round: bool,
    /// The commands on the connection, in send order.
    pub conn: Vec<Queued>,
    /// The background releaser's jobs not sent yet (a reclaim waits for `PICKUP`; an
    /// abandoned acquire's release tries again).
    pub jobs: Vec<Job>,
}

/// Ghost variables of the whole run.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Trace {
    /// The largest fencing token issued so far.
    pub max_fence: Option<u8>,
    /// A fencing token was issued out of grant order: not larger than one issued before, or
    /// to a token the lock key did not hold.
    pub fence_out_of_order: bool,
    /// A retried release was answered from its latch.
    pub latch_used: bool,
    /// The restart guard refused an acquire.
    pub guard_refused: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct State {
    /// The clock.
    pub now: Tick,
    /// Faults injected so far.
    pub faults: u8,
    /// The Redis server.
    pub redis: Redis,
    /// The processes.
    pub processes: [Process; PROCESSES],
    /// The tasks.
    pub tasks: [Phase; TASKS],
    /// Ghosts of the run.
    pub trace: Trace,
}

impl State {
    /// Redis empty, every task queued for the key's local place at tick 0 with deadline
    /// `wait`, no place given yet (see `LockModel::init_states`).
    pub fn new(wait: Tick) -> Self {
        let process = Process {
            queue: Vec::new(),
            place: None,
            records: Vec::new(),
            baton: None,
            renewal: None,
            paused: false,
            missed_round: false,
            conn: Vec::new(),
            jobs: Vec::new(),
        };
        Self {
            now: 0,
            faults: 0,
            redis: Redis::default(),
            processes: [0, 1].map(|p: u8| Process {
                queue: (0..TASKS_PER_PROCESS as u8)
                    .map(|i| p * TASKS_PER_PROCESS as u8 + i)
                    .collect(),
                ..process.clone()
            }),
            tasks: [Phase::Queued { deadline: wait }; TASKS],
            trace: Trace::default(),
        }
    }

    /// Whether every task has its answer.
    pub fn all_done(&self) -> bool {
        self.tasks.iter().all(|t| matches!(t, Phase::Done(_)))
    }

    /// Whether nothing is in flight or pending in any process, and none is paused.
    pub fn quiet(&self) -> bool {
        self.processes
            .iter()
            .all(|p| p.conn.is_empty() && p.jobs.is_empty() && p.renewal.is_none() && !p.paused)
    }

    /// The ghosts of every live hold of `token` (an attempt, a held lock, a lock being
    /// finished, a baton), to update.
    pub fn holds_of(&mut self, token: Token) -> Vec<&mut Ghosts> {
        let mut holds = Vec::new();
        for phase in &mut self.tasks {
            match phase {
                Phase::Acquiring(a) if a.token == token => holds.push(&mut a.ghosts),
                Phase::Inside(h) | Phase::Releasing(h, _) if h.token == token => {
                    holds.push(&mut h.ghosts);
                }
                _ => {}
            }
        }
        for process in &mut self.processes {
            if let Some(baton) = process.baton.as_mut().filter(|b| b.token == token) {
                holds.push(&mut baton.ghosts);
            }
        }
        holds
    }

    /// One line per step of a trace: the clock, the lock key, and each task.
    pub fn summary(&self) -> String {
        let lock = match self.redis.data.lock {
            Some(l) => format!("t{}..{}", l.token, l.expires),
            None => "-".to_owned(),
        };
        let tasks: Vec<String> = self
            .tasks
            .iter()
            .enumerate()
            .map(|(i, t)| format!("T{i}:{}", phase_summary(t, self.now)))
            .collect();
        let paused: Vec<String> = self
            .processes
            .iter()
            .enumerate()
            .filter(|(_, p)| p.paused)
            .map(|(i, _)| format!(" P{i} paused"))
            .collect();
        format!(
            "now={} faults={} key={} guard<{}{} | {}",
            self.now,
            self.faults,
            lock,
            self.redis.guard_until,
            paused.concat(),
            tasks.join(" ")
        )
    }
}

fn phase_summary(phase: &Phase, now: Tick) -> String {
    match phase {
        Phase::Queued { .. } => "queued".to_owned(),
        Phase::Placed { .. } => "woken".to_owned(),
        Phase::Acquiring(a) => format!("acquiring(t{})", a.token),
        Phase::Inside(h) => format!(
            "INSIDE(t{},{}{})",
            h.token,
            if h.believes(now) {
                "believes"
            } else {
                "knows lost"
            },
            if h.ghosts.unseen_loss {
                ",unseen loss"
            } else {
                ""
            }
        ),
        Phase::Releasing(h, Finish::Confirm(_)) => format!("confirming(t{})", h.token),
        Phase::Releasing(h, Finish::Release { .. }) => format!("releasing(t{})", h.token),
        Phase::Done(a) => format!("{a:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(valid_until: Tick) -> Hold {
        Hold {
            token: 0,
            valid_until,
            extended_at: None,
            lost: false,
            streak: 0,
            nested: false,
            extended: false,
            fence_handle: false,
            call: None,
            ghosts: Ghosts::default(),
            proof: None,
        }
    }

    #[test]
    fn validity_counts_from_the_send_and_never_shrinks_by_a_renewal() {
        let mut h = hold(2);
        assert!(h.believes(1));
        assert!(!h.believes(2));
        // A renewal sent at 1 with lease 3 and margin 1: until 3.
        h.confirm(1, 3, 1);
        assert_eq!(h.valid_until, 3);
        // An older renewal answering late does not shorten it.
        h.confirm(0, 3, 1);
        assert_eq!(h.valid_until, 3);
    }

    #[test]
    fn a_renewal_sent_before_an_extension_does_not_undo_it() {
        // `held.rs` `a_renewal_sent_before_a_shortening_extension_does_not_undo_it`.
        let mut h = hold(2);
        h.confirm_extension(2, 2, 1);
        assert_eq!(h.valid_until, 3);
        h.confirm(1, 30, 1);
        assert_eq!(h.valid_until, 3);
        h.confirm(3, 3, 1);
        assert_eq!(h.valid_until, 5);
    }
}
