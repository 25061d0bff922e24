//! The actions and how each changes the state: the protocol's steps (each naming the code it
//! stands for), the clock, and the faults.

use stateright::{Model, Property};

use crate::config::{Config, Mutation, Tick};
use crate::state::{
    process_of, AcquireReply, Answer, Attempt, Baton, Call, Finish, Ghosts, Hold, Job, Op, Owner,
    Phase, Process, ProcessId, Queued, ReleaseReply, RenewReply, Reply, State, TaskId, Wire,
    PROCESSES, TASKS,
};
use crate::{properties, symmetry};

/// Tries of a release, a renewal or an extension after a dropped connection
/// (`node.rs` `retry_dropped`: the first call and two more).
const RETRIES: u8 = 2;

/// Tries of the background release of an abandoned acquire (`release::start`: a not-ours
/// answer ends it from the third try on).
const ABANDONED_TRIES: u8 = 3;

/// One step of the system.
///
/// Time: a tick is a third of the lease (seconds), a command takes milliseconds. So the clock
/// moves only once every running process has settled: its commands ran and their replies
/// were handled, its due retries were sent, its expired waits ended. A process that does not
/// settle in time is a fault ([`Action::Pause`]: stopped, in a long GC, behind a slow
/// network); while paused its commands may still run in Redis (or not before the clock
/// moves), and their replies wait for it.
///
/// A running process's task handles its reply in the step Redis runs the command (the
/// handling is local, and reads nothing a later delivery would change: a grant's or
/// renewal's validity counts from when it was sent); a reply lost on its way is the fault
/// [`Action::RunThenReset`]. The watchdog's answer is delivered apart
/// ([`Action::DeliverRenewal`]), because where it lands (to whoever holds its token then) is
/// part of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The clock moves one tick: keys expire, sleeping acquires wake (the fallback retry, or
    /// the holder's TTL), and every running process's watchdog makes its round
    /// (`watchdog::tick`, `LocalLocks::due_for_renewal`: records lost by the clock are marked
    /// lost and dropped, the others renewed with `renew.lua`, `NewLease::AtLeast`).
    Tick,
    /// `queue_for` runs out of wait: `LockError::Busy`.
    QueueTimeout(TaskId),
    /// The task given the place while a baton waits takes it over (`LocalLocks::take_over`),
    /// or, when too little validity is left, gives it back to Redis (`Acquire::give_back`)
    /// and tries in Redis. (Given the place with no baton, a task sends its first try in the
    /// same step.)
    TakeOver(TaskId),
    /// `acquire_in_redis`: the next try after a busy one (on a release message, or once the
    /// next tick woke it), `Acquire::try_once` (`acquire.lua`).
    Try(TaskId),
    /// `acquire_in_redis`: the wait ran out between tries: `LockError::Busy`.
    WaitEnds(TaskId),
    /// `try_once`'s `timeout_at(bound)`: the deadline passed with a try in flight; the
    /// command still runs (`ReleaseOnDrop` of the `Attempt` sends the release of an abandoned
    /// acquire, and of `Waiting` the withdrawal).
    GiveUp(TaskId),
    /// Redis runs the next command of a process's connection (one script, atomically), and a
    /// task handles the reply: the acquire's (`try_once` and the loop of `acquire_in_redis`:
    /// the grant, `LocalLocks::register`; busy: subscribe, wait), the fence's (`Fence::issue`),
    /// the extension's (`LockGuard::extend`), the handoff's confirmation (`LocalLocks::confirm`
    /// then `hand_over`, and the next task's `LocalLocks::take_over`), the release's
    /// (`release::release_in_redis`, then `LocalLocks::settle`).
    Execute(ProcessId),
    /// A task handles a reply that waited for it (its process was paused), or a connection
    /// error: retried on a new connection where the code retries (`node.rs` `retry_dropped`
    /// for releases, renewals, extensions; `try_once` for acquires while in time), else its
    /// error (an undecided confirmation falls back to the Redis release).
    Deliver(TaskId),
    /// The watchdog's renewal answer (or error) arrives: `watchdog::tick`, then
    /// `LocalLocks::renewed` (applied to whoever holds the token now; a "not ours" answer for
    /// a token nobody holds withdraws a handoff of it still waiting in the slot,
    /// `LocalKey::withdraw_baton`).
    DeliverRenewal(ProcessId),
    /// `LockGuard::fencing_token` (`Fence::issue`, `fence.lua`); the `Fence` handle lives until
    /// the release.
    Fence(TaskId),
    /// `LockGuard::extend` by the configured extension (`renew.lua`, `NewLease::Exactly`).
    Extend(TaskId),
    /// A nested acquire of the held lock and its release (`LocalLocks::reenter`: `Err(Lost)`
    /// when the lock is lost, which marks it; then `LocalLocks::leave`, `Leave::Nested`). The
    /// nested guard changes nothing else, so it is one step.
    Nested(TaskId),
    /// `LockGuard::release`: `LocalLocks::leave` (unregister), then `LocalLocks::finish`:
    /// the confirmation of a handoff (`may_hand_over`, `confirm`), or the Redis release
    /// (`release::release_held`).
    Release(TaskId),
    /// The reclaim a handoff spawned, after `PICKUP` (`LocalLocks::hand_over`): a baton nobody
    /// took is taken back and released in Redis.
    Reclaim(ProcessId),
    /// Fault: a process's connection dies (`CLIENT KILL`, a proxy reset) before Redis ran
    /// any more of its commands: none of them runs, the watchdog's reply on its way is lost;
    /// each caller gets an error.
    Reset(ProcessId),
    /// Fault: Redis runs the next command of a process's connection, then the connection dies
    /// before the reply left: the command ran, its caller gets an error, the rest never runs.
    RunThenReset(ProcessId),
    /// Fault: a process stops taking steps (SIGSTOP, a long GC, a slow network) until
    /// [`Action::Resume`], as long as the checker likes: a holder paused past its lease.
    Pause(ProcessId),
    /// The paused process goes on (not a fault); its watchdog makes the round it missed.
    Resume(ProcessId),
    /// Fault: the lock key is deleted behind its holder (`force_unlock`, `DEL`, eviction).
    DeleteKey,
    /// The server saves a snapshot (RDB) that a later restart may load (not a fault).
    Save,
    /// Fault: the server restarts with nothing (no persistence, or `FLUSHALL`); every
    /// connection dies; the restart guard starts.
    EmptyRestart,
    /// Fault: the server restarts from the older snapshot (keys expired since are dropped);
    /// every connection dies; the restart guard starts.
    RestartFromSnapshot,
}

/// The model: the protocol under `config`.
#[derive(Clone, Debug)]
pub struct LockModel {
    /// The bound and the mutation.
    pub config: Config,
}

impl LockModel {
    /// The model of `config`.
    pub fn new(config: Config) -> Self {
        Self { config }
    }
}

impl Model for LockModel {
    type State = State;
    type Action = Action;

    /// Every task queued at tick 0, the first of each process given the place (its first
    /// try sent).
    fn init_states(&self) -> Vec<State> {
        let mut state = State::new(self.config.wait);
        let mut step = Step {
            config: &self.config,
            state: &mut state,
        };
        for p in 0..PROCESSES {
            step.assign_place(p as ProcessId);
        }
        if self.config.reduces_symmetry() {
            state = symmetry::representative(state);
        }
        vec![state]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let config = &self.config;
        let now = state.now;
        let settled = state
            .processes
            .iter()
            .enumerate()
            .all(|(p, process)| process.paused || settled(state, p as ProcessId, process));
        if now < config.horizon && settled {
            actions.push(Action::Tick);
        }
        for (i, phase) in state.tasks.iter().enumerate() {
            let task = i as TaskId;
            if state.processes[usize::from(process_of(task))].paused {
                continue;
            }
            match phase {
                Phase::Queued { deadline } if now >= *deadline => {
                    actions.push(Action::QueueTimeout(task));
                }
                Phase::Placed { .. } => actions.push(Action::TakeOver(task)),
                Phase::Acquiring(attempt) => match attempt.call {
                    None if now >= attempt.deadline => actions.push(Action::WaitEnds(task)),
                    None if attempt.woken || !attempt.asleep => actions.push(Action::Try(task)),
                    Some(call) if call.wire != Wire::Sent => actions.push(Action::Deliver(task)),
                    Some(_) if now >= attempt.deadline => actions.push(Action::GiveUp(task)),
                    _ => {}
                },
                Phase::Inside(hold) => match hold.call {
                    Some(call) if call.wire != Wire::Sent => actions.push(Action::Deliver(task)),
                    Some(_) => {}
                    None => {
                        let program = config.programs[i];
                        if program.fence && !hold.fence_handle && hold.believes(now) {
                            actions.push(Action::Fence(task));
                        }
                        if program.extend && !hold.extended && hold.believes(now) {
                            actions.push(Action::Extend(task));
                        }
                        if program.nested && !hold.nested {
                            actions.push(Action::Nested(task));
                        }
                        actions.push(Action::Release(task));
                    }
                },
                Phase::Releasing(_, Finish::Confirm(call) | Finish::Release { call, .. })
                    if call.wire != Wire::Sent =>
                {
                    actions.push(Action::Deliver(task));
                }
                _ => {}
            }
        }
        for (p, process) in state.processes.iter().enumerate() {
            let p = p as ProcessId;
            if !process.conn.is_empty() {
                actions.push(Action::Execute(p));
            }
            if process.paused {
                actions.push(Action::Resume(p));
                continue;
            }
            if process.renewal.is_some_and(|call| call.wire != Wire::Sent) {
                actions.push(Action::DeliverRenewal(p));
            }
            if process.jobs.contains(&Job::Reclaim) {
                actions.push(Action::Reclaim(p));
            }
        }
        if state.faults < config.faults {
            let kinds = config.kinds;
            for (p, process) in state.processes.iter().enumerate() {
                let p = p as ProcessId;
                if kinds.reset && in_flight(state, p, process) {
                    actions.push(Action::Reset(p));
                }
                if kinds.reset && !process.conn.is_empty() {
                    actions.push(Action::RunThenReset(p));
                }
                if kinds.pause && !process.paused {
                    actions.push(Action::Pause(p));
                }
            }
            if kinds.delete && state.redis.data.lock.is_some() {
                actions.push(Action::DeleteKey);
            }
            if kinds.restart {
                actions.push(Action::EmptyRestart);
            }
            if kinds.snapshot {
                if state.redis.snapshot.is_some() {
                    actions.push(Action::RestartFromSnapshot);
                } else if settled {
                    // A periodic save, between two ticks' activity.
                    actions.push(Action::Save);
                }
            }
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        let mut step = Step {
            config: &self.config,
            state: &mut next,
        };
        step.apply(action);
        if next.faults >= self.config.faults {
            // No restart can load it any more.
            next.redis.snapshot = None;
        }
        if next == *state {
            return None;
        }
        if self.config.reduces_symmetry() {
            next = symmetry::representative(next);
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}

/// Whether a running process has nothing left to do before the clock moves: no command
/// queued, no reply or error to handle, no retry due, no wait run out, no reclaim due.
fn settled(state: &State, p: ProcessId, process: &Process) -> bool {
    let now = state.now;
    process.conn.is_empty()
        && process.renewal.is_none()
        && process.jobs.is_empty()
        && state
            .tasks
            .iter()
            .enumerate()
            .filter(|(i, _)| process_of(*i as TaskId) == p)
            .all(|(_, phase)| match phase {
                Phase::Queued { deadline } => now < *deadline,
                Phase::Placed { .. } => false,
                Phase::Acquiring(a) => a.call.is_none() && now < a.deadline && a.asleep && !a.woken,
                Phase::Inside(hold) => hold.call.is_none(),
                Phase::Releasing(..) => false,
                Phase::Done(_) => true,
            })
}

/// Whether a process has a command sent or a reply on its way (something a reset can hit).
fn in_flight(state: &State, p: ProcessId, process: &Process) -> bool {
    if !process.conn.is_empty() || process.renewal.is_some_and(|c| c.wire != Wire::Failed) {
        return true;
    }
    state
        .tasks
        .iter()
        .enumerate()
        .filter(|(i, _)| process_of(*i as TaskId) == p)
        .any(|(_, phase)| call_of(phase).is_some_and(|c| c.wire != Wire::Failed))
}

/// The call a task waits for, if any.
fn call_of(phase: &Phase) -> Option<Call> {
    match phase {
        Phase::Acquiring(attempt) => attempt.call,
        Phase::Inside(hold) => hold.call,
        Phase::Releasing(_, Finish::Confirm(call) | Finish::Release { call, .. }) => Some(*call),
        _ => None,
    }
}

fn call_mut(phase: &mut Phase) -> Option<&mut Call> {
    match phase {
        Phase::Acquiring(attempt) => attempt.call.as_mut(),
        Phase::Inside(hold) => hold.call.as_mut(),
        Phase::Releasing(_, Finish::Confirm(call) | Finish::Release { call, .. }) => Some(call),
        _ => None,
    }
}

/// `local.rs` `worth_handing_over`: at least half a lease of validity left.
fn worth_handing_over(config: &Config, now: Tick, valid_until: Tick) -> bool {
    u16::from(valid_until) * 2 >= u16::from(now) * 2 + u16::from(config.lease)
}

/// A fresh hold of `token`, valid until `valid_until`.
fn hold(token: u8, valid_until: Tick, streak: u8, ghosts: Ghosts) -> Hold {
    Hold {
        token,
        valid_until,
        extended_at: None,
        lost: false,
        streak,
        nested: false,
        extended: false,
        fence_handle: false,
        call: None,
        ghosts,
        proof: None,
    }
}

/// One action being applied.
struct Step<'a> {
    config: &'a Config,
    state: &'a mut State,
}

impl Step<'_> {
    fn apply(&mut self, action: Action) {
        match action {
            Action::Tick => self.tick(),
            Action::QueueTimeout(task) => {
                self.process(task).queue.retain(|&t| t != task);
                *self.phase(task) = Phase::Done(Answer::Busy);
            }
            Action::TakeOver(task) => {
                if let Phase::Placed { deadline } = *self.phase(task) {
                    self.take_place(task, deadline);
                }
            }
            Action::Try(task) => self.try_again(task),
            Action::WaitEnds(task) => {
                if let Phase::Acquiring(attempt) = *self.phase(task) {
                    self.acquire_failed(task, attempt, Answer::Busy, false);
                }
            }
            Action::GiveUp(task) => self.give_up(task),
            Action::Execute(p) => self.execute(p, false),
            Action::Deliver(task) => self.deliver(task),
            Action::DeliverRenewal(p) => {
                self.deliver_renewal(p);
                self.catch_up(p);
            }
            Action::Fence(task) => self.fence(task),
            Action::Extend(task) => self.extend(task),
            Action::Nested(task) => self.nested(task),
            Action::Release(task) => self.release(task),
            Action::Reclaim(p) => self.reclaim(p),
            Action::Reset(p) => {
                self.state.faults += 1;
                self.reset(p);
            }
            Action::RunThenReset(p) => {
                self.state.faults += 1;
                self.execute(p, true);
                self.reset(p);
            }
            Action::Pause(p) => {
                self.state.faults += 1;
                self.state.processes[usize::from(p)].paused = true;
            }
            Action::Resume(p) => {
                self.state.processes[usize::from(p)].paused = false;
                self.catch_up(p);
            }
            Action::DeleteKey => {
                self.state.faults += 1;
                if let Some(lock) = self.state.redis.data.lock.take() {
                    self.state.lost_unseen(lock.token);
                }
            }
            Action::Save => self.state.redis.snapshot = Some(self.state.redis.data.clone()),
            Action::EmptyRestart => {
                self.state.faults += 1;
                let data = std::mem::take(&mut self.state.redis.data);
                self.restarted(data.lock.map(|l| l.token));
            }
            Action::RestartFromSnapshot => {
                self.state.faults += 1;
                let Some(mut data) = self.state.redis.snapshot.clone() else {
                    return;
                };
                data.expire(self.state.now);
                let old = std::mem::replace(&mut self.state.redis.data, data);
                self.restarted(old.lock.map(|l| l.token));
            }
        }
    }

    fn phase(&mut self, task: TaskId) -> &mut Phase {
        &mut self.state.tasks[usize::from(task)]
    }

    fn process(&mut self, task: TaskId) -> &mut Process {
        &mut self.state.processes[usize::from(process_of(task))]
    }

    fn tick(&mut self) {
        let state = &mut *self.state;
        state.now += 1;
        state.redis.fences_this_tick = 0;
        if let Some(token) = state.redis.data.expire(state.now) {
            state.expired(token);
        }
        for phase in &mut state.tasks {
            if let Phase::Acquiring(attempt) = phase {
                attempt.asleep = false;
            }
        }
        for p in 0..PROCESSES {
            if self.state.processes[p].paused {
                self.state.processes[p].missed_round = true;
            } else {
                self.watchdog(p as ProcessId);
            }
        }
    }

    /// Queues `op` on process `p`'s connection; the caller's view of it.
    fn send(&mut self, p: ProcessId, owner: Owner, op: Op, sent_at: Tick, retries: u8) -> Call {
        self.state.processes[usize::from(p)]
            .conn
            .push(Queued { op, owner });
        Call {
            op,
            sent_at,
            wire: Wire::Sent,
            retries,
        }
    }

    /// The same command again, on a new connection (a retry keeps the first try's time).
    fn resend(&mut self, p: ProcessId, owner: Owner, call: Call) -> Call {
        let retries = call.retries.saturating_sub(1);
        self.send(p, owner, call.op, call.sent_at, retries)
    }

    /// The local queue's semaphore: a free place goes to the first queued task, which takes
    /// over a baton (`LocalLocks::take_over`) or starts its acquire in Redis
    /// (`acquire_in_redis`).
    fn assign_place(&mut self, p: ProcessId) {
        let process = &mut self.state.processes[usize::from(p)];
        if process.place.is_some() || process.queue.is_empty() {
            return;
        }
        let task = process.queue.remove(0);
        process.place = Some(task);
        let baton = process.baton.is_some();
        let Phase::Queued { deadline } = self.state.tasks[usize::from(task)] else {
            return;
        };
        if baton && self.config.pickup_step {
            // Woken; it takes the baton over in a step of its own.
            self.state.tasks[usize::from(task)] = Phase::Placed { deadline };
        } else {
            self.take_place(task, deadline);
        }
    }

    /// `Hold::give_back_place` (once).
    fn give_back_place(&mut self, task: TaskId) {
        let process = self.process(task);
        if process.place == Some(task) {
            process.place = None;
            self.assign_place(process_of(task));
        }
    }

    /// `local_then_in_redis` with the place: a baton taken over, or given back to Redis
    /// (`Acquire::give_back`) when too little validity is left; then the first try.
    fn take_place(&mut self, task: TaskId, deadline: Tick) {
        let now = self.state.now;
        let p = process_of(task);
        if let Some(baton) = self.process(task).baton.take() {
            // The reclaim spawned with it will find nothing.
            self.process(task).jobs.retain(|&job| job != Job::Reclaim);
            if worth_handing_over(self.config, now, baton.valid_until) {
                let held = hold(baton.token, baton.valid_until, baton.streak, baton.ghosts);
                self.register(task, baton.token);
                *self.phase(task) = Phase::Inside(held);
                return;
            }
            let _ = self.send(
                p,
                Owner::Abandoned,
                Op::Release { token: baton.token },
                now,
                0,
            );
        }
        let token = task;
        let call = self.send(p, Owner::Task(task), Op::Acquire { token }, now, 0);
        *self.phase(task) = Phase::Acquiring(Attempt {
            token,
            deadline,
            call: Some(call),
            seen_busy: false,
            woken: false,
            asleep: false,
            ghosts: Ghosts::default(),
        });
    }

    fn try_again(&mut self, task: TaskId) {
        let now = self.state.now;
        let Phase::Acquiring(mut attempt) = *self.phase(task) else {
            return;
        };
        let op = Op::Acquire {
            token: attempt.token,
        };
        attempt.call = Some(self.send(process_of(task), Owner::Task(task), op, now, 0));
        attempt.woken = false;
        *self.phase(task) = Phase::Acquiring(attempt);
    }

    fn give_up(&mut self, task: TaskId) {
        let Phase::Acquiring(attempt) = *self.phase(task) else {
            return;
        };
        // The command stays on the connection and runs; nobody reads its reply.
        for queued in &mut self.process(task).conn {
            if queued.owner == Owner::Task(task) {
                queued.owner = Owner::Abandoned;
            }
        }
        let answer = if attempt.seen_busy {
            Answer::Busy
        } else {
            Answer::Backend
        };
        self.acquire_failed(task, attempt, answer, true);
    }

    /// An acquire ends without the lock: its answer, the place given back, and what the armed
    /// drop-guards hand to the background releaser (sent at once).
    fn acquire_failed(&mut self, task: TaskId, attempt: Attempt, answer: Answer, armed: bool) {
        let now = self.state.now;
        let p = process_of(task);
        *self.phase(task) = Phase::Done(answer);
        let token = attempt.token;
        if armed {
            let job = Job::Abandoned {
                token,
                tries: ABANDONED_TRIES,
            };
            let _ = self.send(p, Owner::Job(job), Op::Release { token }, now, 0);
        }
        if attempt.seen_busy {
            let job = Job::Withdraw { token };
            let _ = self.send(p, Owner::Job(job), Op::Withdraw { token }, now, 0);
        }
        self.give_back_place(task);
    }

    /// Redis runs the head of `p`'s connection; its caller handles the reply, unless it is
    /// lost (`reply_lost`: the connection dies right after, see [`Action::RunThenReset`]).
    fn execute(&mut self, p: ProcessId, reply_lost: bool) {
        let process = &mut self.state.processes[usize::from(p)];
        if process.conn.is_empty() {
            return;
        }
        let paused = process.paused;
        let Queued { op, owner } = process.conn.remove(0);
        let (reply, fresh) = self.state.run(self.config, op, owner);
        match owner {
            Owner::Task(task) if reply_lost || paused => {
                if let Some(call) = call_mut(self.phase(task)) {
                    call.wire = if reply_lost {
                        Wire::Failed
                    } else {
                        Wire::Replied { reply, fresh }
                    };
                }
            }
            Owner::Task(task) => self.handle_reply(task, reply, fresh),
            Owner::Watchdog => {
                if let Some(call) = self.state.processes[usize::from(p)].renewal.as_mut() {
                    call.wire = if reply_lost {
                        Wire::Failed
                    } else {
                        Wire::Replied { reply, fresh }
                    };
                }
            }
            Owner::Abandoned | Owner::Job(Job::Withdraw { .. } | Job::Reclaim) => {}
            Owner::Job(Job::Abandoned { token, tries }) => {
                // `release::start`: tried again while it is not ours, a few times.
                let ours = matches!(
                    reply,
                    Reply::Release(ReleaseReply::Deleted { .. } | ReleaseReply::Latched { .. })
                );
                if (reply_lost || !ours) && tries > 1 {
                    let job = Job::Abandoned {
                        token,
                        tries: tries - 1,
                    };
                    let _ = self.send(p, Owner::Job(job), op, self.state.now, 0);
                }
            }
        }
    }

    fn handle_reply(&mut self, task: TaskId, reply: Reply, fresh: bool) {
        match *self.phase(task) {
            Phase::Acquiring(attempt) => self.acquire_reply(task, attempt, reply),
            Phase::Inside(hold) => self.inside_reply(task, hold, reply, fresh),
            Phase::Releasing(hold, Finish::Confirm(call)) => {
                self.confirm_reply(task, hold, call, reply);
            }
            Phase::Releasing(hold, Finish::Release { call, was_lost }) => {
                self.release_reply(task, hold, call, was_lost, reply);
            }
            _ => {}
        }
    }

    fn register(&mut self, task: TaskId, token: u8) {
        let records = &mut self.process(task).records;
        records.retain(|&(t, _)| t != token);
        records.push((token, task));
    }

    fn unregister(&mut self, task: TaskId, token: u8) {
        self.process(task)
            .records
            .retain(|&record| record != (token, task));
    }

    /// `Hold::mark_lost`: marked, and the local place given back at once.
    fn mark_lost(&mut self, task: TaskId) {
        if let Phase::Inside(hold) | Phase::Releasing(hold, _) = self.phase(task) {
            hold.lost = true;
        }
        self.give_back_place(task);
    }

    /// `try_once` and the loop of `acquire_in_redis` around it.
    fn acquire_reply(&mut self, task: TaskId, mut attempt: Attempt, reply: Reply) {
        let now = self.state.now;
        let Some(call) = attempt.call else {
            return;
        };
        if reply == Reply::Acquire(AcquireReply::Acquired) {
            // The grant: valid from when the winning try was sent, less the margin.
            let valid_until = (call.sent_at + self.config.lease).saturating_sub(self.config.margin);
            self.register(task, attempt.token);
            *self.phase(task) = Phase::Inside(hold(attempt.token, valid_until, 0, attempt.ghosts));
            return;
        }
        // Busy, or the restart guard: the try joined the waiting writers.
        attempt.call = None;
        let first = !attempt.seen_busy;
        attempt.seen_busy = true;
        if now >= attempt.deadline {
            self.acquire_failed(task, attempt, Answer::Busy, false);
            return;
        }
        if first {
            // Subscribe, then try again at once (a release may have come before).
            let op = Op::Acquire {
                token: attempt.token,
            };
            attempt.call = Some(self.send(process_of(task), Owner::Task(task), op, now, 0));
            attempt.woken = false;
        } else {
            attempt.asleep = true;
        }
        *self.phase(task) = Phase::Acquiring(attempt);
    }

    /// The answer to a holder's fence request (`Fence::issue`) or extension
    /// (`LockGuard::extend`).
    fn inside_reply(&mut self, task: TaskId, mut hold: Hold, reply: Reply, fresh: bool) {
        let now = self.state.now;
        let Some(call) = hold.call.take() else {
            return;
        };
        let lost = match reply {
            Reply::Fence(Some(_)) if !hold.is_lost(now) => false,
            // Issued, but the lock was lost meanwhile: `lost_error`.
            Reply::Fence(Some(_)) => true,
            Reply::Renew(RenewReply::Renewed) => {
                if let Op::Renew { lease, .. } = call.op {
                    hold.confirm_extension(call.sent_at, lease, self.config.margin);
                }
                false
            }
            _ => true,
        };
        *self.phase(task) = Phase::Inside(hold);
        if fresh {
            self.state.loss_answered(hold.token);
        }
        if lost {
            self.mark_lost(task);
        }
    }

    /// `LocalLocks::confirm`, then `hand_over` (or the loss).
    fn confirm_reply(&mut self, task: TaskId, mut hold: Hold, call: Call, reply: Reply) {
        let now = self.state.now;
        if reply != Reply::Renew(RenewReply::Renewed) {
            // Lost before the handoff: the next local acquirer contends in Redis.
            *self.phase(task) = Phase::Done(Answer::Lost);
            self.give_back_place(task);
            return;
        }
        if let Op::Renew { lease, .. } = call.op {
            hold.confirm(call.sent_at, lease, self.config.margin);
        }
        // A `Confirm` renewed nothing: the next holder inherits the validity Redis confirmed.
        if hold.is_lost(now) {
            // Marked lost meanwhile, or its validity ran out: believe the loss.
            *self.phase(task) = Phase::Done(Answer::Lost);
            self.give_back_place(task);
            return;
        }
        if !self.hand_over(task, hold) {
            self.release_in_redis(task, hold);
        }
    }

    /// `LocalLocks::hand_over`: the lock left in the slot, the place to the next local
    /// acquirer, a reclaim spawned.
    fn hand_over(&mut self, task: TaskId, hold: Hold) -> bool {
        if self.process(task).baton.is_some() {
            return false;
        }
        let ghosts = if self.config.has(Mutation::HandoffWithoutProof) {
            // No Redis answer after the holder left: the next hold begins at the handoff, and
            // a loss before it is not one it may be excused for.
            Ghosts {
                kept: hold.ghosts.kept,
                unseen_loss: false,
            }
        } else {
            hold.ghosts
        };
        let process = self.process(task);
        process.baton = Some(Baton {
            token: hold.token,
            valid_until: hold.valid_until,
            streak: hold.streak + 1,
            ghosts,
        });
        process.jobs.push(Job::Reclaim);
        *self.phase(task) = Phase::Done(Answer::Ok {
            handed_over: true,
            proof: hold.proof,
        });
        self.give_back_place(task);
        true
    }

    /// `release::release_held`: `was_lost` first, then `release.lua`.
    fn release_in_redis(&mut self, task: TaskId, mut hold: Hold) {
        let now = self.state.now;
        hold.proof = None;
        let was_lost = hold.is_lost(now);
        let op = Op::Release { token: hold.token };
        let call = self.send(process_of(task), Owner::Task(task), op, now, RETRIES);
        *self.phase(task) = Phase::Releasing(hold, Finish::Release { call, was_lost });
    }

    /// `release::release_in_redis`'s decision, then `LocalLocks::settle`.
    fn release_reply(
        &mut self,
        task: TaskId,
        hold: Hold,
        call: Call,
        was_lost: bool,
        reply: Reply,
    ) {
        let Reply::Release(reply) = reply else {
            return;
        };
        let is_retry = call.retries < RETRIES;
        let ours = match reply {
            ReleaseReply::Deleted { .. } => true,
            ReleaseReply::Latched { .. } => {
                self.state.trace.latch_used = true;
                true
            }
            // Before the latch: a retry that found the key gone or another's trusted that its
            // first try had deleted it.
            ReleaseReply::Absent | ReleaseReply::Replaced => {
                is_retry && self.config.has(Mutation::ReleaseWithoutLatch)
            }
        };
        let answer = if ours && !was_lost {
            Answer::Ok {
                handed_over: false,
                proof: hold.proof,
            }
        } else {
            Answer::Lost
        };
        *self.phase(task) = Phase::Done(answer);
        self.give_back_place(task);
    }

    /// A task handles what waited for it: a reply, or an error.
    fn deliver(&mut self, task: TaskId) {
        let Some(call) = call_of(self.phase(task)) else {
            return;
        };
        match call.wire {
            Wire::Sent => {}
            Wire::Replied { reply, fresh } => self.handle_reply(task, reply, fresh),
            Wire::Failed => self.deliver_error(task),
        }
    }

    /// A task's call met a dead connection.
    fn deliver_error(&mut self, task: TaskId) {
        let now = self.state.now;
        let p = process_of(task);
        let owner = Owner::Task(task);
        match *self.phase(task) {
            Phase::Acquiring(mut attempt) => {
                let Some(call) = attempt.call else {
                    return;
                };
                if now < attempt.deadline {
                    // A transient error in time: the same token again.
                    attempt.call = Some(self.resend(p, owner, call));
                    *self.phase(task) = Phase::Acquiring(attempt);
                } else {
                    self.acquire_failed(task, attempt, Answer::Backend, true);
                }
            }
            Phase::Inside(mut hold) => {
                let Some(call) = hold.call else {
                    return;
                };
                // A renewal (the extension) is retried; a fence request is not. Either way the
                // caller's error changes nothing else.
                hold.call = match call.op {
                    Op::Renew { .. } if call.retries > 0 => Some(self.resend(p, owner, call)),
                    _ => None,
                };
                *self.phase(task) = Phase::Inside(hold);
            }
            Phase::Releasing(hold, Finish::Confirm(call)) => {
                if call.retries > 0 {
                    let again = self.resend(p, owner, call);
                    *self.phase(task) = Phase::Releasing(hold, Finish::Confirm(again));
                } else {
                    // Undecided: released through Redis instead.
                    self.release_in_redis(task, hold);
                }
            }
            Phase::Releasing(hold, Finish::Release { call, was_lost }) => {
                if call.retries > 0 {
                    let again = self.resend(p, owner, call);
                    let finish = Finish::Release {
                        call: again,
                        was_lost,
                    };
                    *self.phase(task) = Phase::Releasing(hold, finish);
                    return;
                }
                let answer = if was_lost {
                    Answer::Lost
                } else {
                    Answer::Backend
                };
                *self.phase(task) = Phase::Done(answer);
                self.give_back_place(task);
            }
            _ => {}
        }
    }

    fn deliver_renewal(&mut self, p: ProcessId) {
        let process = &mut self.state.processes[usize::from(p)];
        let Some(call) = process.renewal.take() else {
            return;
        };
        let Op::Renew { token, lease, .. } = call.op else {
            return;
        };
        let (reply, fresh) = match call.wire {
            Wire::Sent => {
                process.renewal = Some(call);
                return;
            }
            Wire::Failed if call.retries > 0 => {
                let again = self.resend(p, Owner::Watchdog, call);
                self.state.processes[usize::from(p)].renewal = Some(again);
                return;
            }
            // Unknown: nothing changes; the validity clock runs on.
            Wire::Failed => return,
            Wire::Replied { reply, fresh } => (reply, fresh),
        };
        // `LocalLocks::renewed`: to whoever holds the token now.
        let holder = process
            .records
            .iter()
            .find(|&&(t, _)| t == token)
            .map(|&(_, task)| task);
        if fresh {
            self.state.loss_answered(token);
        }
        let Some(task) = holder else {
            // Nobody holds the token now: a "not ours" answer withdraws a handoff of it still
            // waiting in the slot, so the next local acquirer goes to Redis.
            let process = &mut self.state.processes[usize::from(p)];
            let withdraws = reply != Reply::Renew(RenewReply::Renewed)
                && !self.config.has(Mutation::AnswerMissesTheBaton)
                && process.baton.is_some_and(|b| b.token == token);
            if withdraws {
                process.baton = None;
                process.jobs.retain(|&job| job != Job::Reclaim);
            }
            return;
        };
        if reply == Reply::Renew(RenewReply::Renewed) {
            let margin = self.config.margin;
            if let Phase::Inside(hold) = self.phase(task) {
                hold.confirm(call.sent_at, lease, margin);
            }
        } else {
            self.mark_lost(task);
            self.unregister(task, token);
        }
    }

    fn fence(&mut self, task: TaskId) {
        let now = self.state.now;
        let Phase::Inside(mut hold) = *self.phase(task) else {
            return;
        };
        hold.fence_handle = true;
        let op = Op::Fence { token: hold.token };
        hold.call = Some(self.send(process_of(task), Owner::Task(task), op, now, 0));
        *self.phase(task) = Phase::Inside(hold);
    }

    fn extend(&mut self, task: TaskId) {
        let now = self.state.now;
        let Phase::Inside(mut hold) = *self.phase(task) else {
            return;
        };
        hold.extended = true;
        let op = Op::Renew {
            token: hold.token,
            lease: self.config.extension,
            exact: true,
        };
        hold.call = Some(self.send(process_of(task), Owner::Task(task), op, now, RETRIES));
        *self.phase(task) = Phase::Inside(hold);
    }

    fn nested(&mut self, task: TaskId) {
        let now = self.state.now;
        let Phase::Inside(hold) = self.phase(task) else {
            return;
        };
        hold.nested = true;
        if hold.is_lost(now) {
            // `Err(Lost)` for the nested acquire; the loss is marked (`lost_error`).
            self.mark_lost(task);
        }
    }

    fn release(&mut self, task: TaskId) {
        let now = self.state.now;
        let Phase::Inside(hold) = *self.phase(task) else {
            return;
        };
        self.unregister(task, hold.token);
        let max_streak = self.config.max_streak;
        let queued = !self.process(task).queue.is_empty();
        let may_hand_over =
            hold.streak < max_streak && !hold.fence_handle && queued && !hold.is_lost(now);
        if !may_hand_over {
            self.release_in_redis(task, hold);
            return;
        }
        if self.config.has(Mutation::HandoffWithoutProof) {
            let mut hold = hold;
            hold.proof = Some(hold.ghosts.kept);
            if !self.hand_over(task, hold) {
                self.release_in_redis(task, hold);
            }
            return;
        }
        // `LocalLocks::confirm` (`fresh`): a lock whose validity is as fresh as a grant or
        // renewal of this tick gives (the real rule: at most an eighth of the lease used), and
        // not extended past the lease, is compared only; otherwise the confirmation renews it.
        let lease = self.config.lease;
        let fresh =
            hold.valid_until >= now + lease - self.config.margin && hold.valid_until <= now + lease;
        let op = if fresh {
            Op::Confirm { token: hold.token }
        } else {
            Op::Renew {
                token: hold.token,
                lease: self.config.lease,
                exact: false,
            }
        };
        let call = self.send(process_of(task), Owner::Task(task), op, now, RETRIES);
        *self.phase(task) = Phase::Releasing(hold, Finish::Confirm(call));
    }

    /// A resumed process's watchdog makes the round it missed (tokio's interval fires a
    /// missed tick at once), after the answer of one still on its way.
    fn catch_up(&mut self, p: ProcessId) {
        let process = &mut self.state.processes[usize::from(p)];
        if !process.paused && process.renewal.is_none() && process.missed_round {
            process.missed_round = false;
            self.watchdog(p);
        }
    }

    /// The watchdog's round of a running process at a tick.
    fn watchdog(&mut self, p: ProcessId) {
        let now = self.state.now;
        let records = self.state.processes[usize::from(p)].records.clone();
        let mut due = None;
        for (token, task) in records {
            let lost = match self.phase(task) {
                Phase::Inside(hold) => hold.is_lost(now),
                _ => true,
            };
            if lost {
                self.mark_lost(task);
                self.unregister(task, token);
            } else if due.is_none() {
                due = Some(token);
            }
        }
        if let Some(token) = due {
            let op = Op::Renew {
                token,
                lease: self.config.lease,
                exact: false,
            };
            let call = self.send(p, Owner::Watchdog, op, now, RETRIES);
            self.state.processes[usize::from(p)].renewal = Some(call);
        }
    }

    fn reclaim(&mut self, p: ProcessId) {
        let now = self.state.now;
        let process = &mut self.state.processes[usize::from(p)];
        let Some(j) = process.jobs.iter().position(|&job| job == Job::Reclaim) else {
            return;
        };
        process.jobs.remove(j);
        // `slot.reclaim_baton`, then `store.release`.
        if let Some(baton) = process.baton.take() {
            let op = Op::Release { token: baton.token };
            let _ = self.send(p, Owner::Job(Job::Reclaim), op, now, 0);
        }
    }

    /// A connection dies: commands not run never run, replies on their way are lost.
    fn reset(&mut self, p: ProcessId) {
        let now = self.state.now;
        let process = &mut self.state.processes[usize::from(p)];
        let lost = std::mem::take(&mut process.conn);
        if let Some(call) = process.renewal.as_mut() {
            call.wire = Wire::Failed;
        }
        for i in 0..TASKS {
            if process_of(i as TaskId) == p {
                if let Some(call) = call_mut(&mut self.state.tasks[i]) {
                    call.wire = Wire::Failed;
                }
            }
        }
        for queued in lost {
            // The abandoned acquire's release is tried again after an error.
            if let Owner::Job(Job::Abandoned { token, tries }) = queued.owner {
                if tries > 1 {
                    let job = Job::Abandoned {
                        token,
                        tries: tries - 1,
                    };
                    let _ = self.send(p, Owner::Job(job), queued.op, now, 0);
                }
            }
        }
    }

    /// After a restart: the key `old` held is lost behind its holders' backs (unless the
    /// snapshot has the same token), a token the snapshot brings back is granted again,
    /// every connection dies, the restart guard starts.
    fn restarted(&mut self, old: Option<u8>) {
        let new = self.state.redis.data.lock.map(|l| l.token);
        if old != new {
            if let Some(token) = old {
                self.state.lost_unseen(token);
            }
            if let Some(token) = new {
                self.state.granted(token);
            }
        }
        if let Some(guard) = self.config.restart_guard {
            self.state.redis.guard_until = self.state.now + guard;
        }
        for p in 0..PROCESSES {
            self.reset(p as ProcessId);
        }
    }
}
