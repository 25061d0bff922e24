//! Symmetry reduction: the two processes are alike when their tasks run the same programs,
//! so a state and the one with the processes swapped (tasks and tokens renamed) behave the
//! same. The checker explores one of each pair (the smaller).

use crate::state::{
    Attempt, Baton, Call, Data, Finish, Hold, Job, Op, Owner, Phase, Process, Queued, State, Token,
    PROCESSES, TASKS, TASKS_PER_PROCESS,
};

/// The task (or token) of the other process in the same position.
fn other(task: u8) -> u8 {
    (task + TASKS_PER_PROCESS as u8) % TASKS as u8
}

fn op(op: Op) -> Op {
    match op {
        Op::Acquire { token } => Op::Acquire {
            token: other(token),
        },
        Op::Release { token } => Op::Release {
            token: other(token),
        },
        Op::Renew {
            token,
            lease,
            exact,
        } => Op::Renew {
            token: other(token),
            lease,
            exact,
        },
        Op::Confirm { token } => Op::Confirm {
            token: other(token),
        },
        Op::Fence { token } => Op::Fence {
            token: other(token),
        },
        Op::Withdraw { token } => Op::Withdraw {
            token: other(token),
        },
    }
}

fn call(call: Call) -> Call {
    Call {
        op: op(call.op),
        ..call
    }
}

fn job(job: Job) -> Job {
    match job {
        Job::Abandoned { token, tries } => Job::Abandoned {
            token: other(token),
            tries,
        },
        Job::Withdraw { token } => Job::Withdraw {
            token: other(token),
        },
        Job::Reclaim => Job::Reclaim,
    }
}

fn hold(hold: Hold) -> Hold {
    Hold {
        token: other(hold.token),
        call: hold.call.map(call),
        ..hold
    }
}

fn phase(phase: Phase) -> Phase {
    match phase {
        Phase::Queued { .. } | Phase::Placed { .. } | Phase::Done(_) => phase,
        Phase::Acquiring(a) => Phase::Acquiring(Attempt {
            token: other(a.token),
            call: a.call.map(call),
            ..a
        }),
        Phase::Inside(h) => Phase::Inside(hold(h)),
        Phase::Releasing(h, Finish::Confirm(c)) => {
            Phase::Releasing(hold(h), Finish::Confirm(call(c)))
        }
        Phase::Releasing(h, Finish::Release { call: c, was_lost }) => Phase::Releasing(
            hold(h),
            Finish::Release {
                call: call(c),
                was_lost,
            },
        ),
    }
}

fn process(p: &Process) -> Process {
    Process {
        queue: p.queue.iter().map(|&t| other(t)).collect(),
        place: p.place.map(other),
        records: p
            .records
            .iter()
            .map(|&(t, k)| (other(t), other(k)))
            .collect(),
        baton: p.baton.map(|b| Baton {
            token: other(b.token),
            ..b
        }),
        renewal: p.renewal.map(call),
        paused: p.paused,
        missed_round: p.missed_round,
        conn: p
            .conn
            .iter()
            .map(|q| Queued {
                op: op(q.op),
                owner: match q.owner {
                    Owner::Task(t) => Owner::Task(other(t)),
                    Owner::Job(j) => Owner::Job(job(j)),
                    o @ (Owner::Watchdog | Owner::Abandoned) => o,
                },
            })
            .collect(),
        jobs: p.jobs.iter().map(|&j| job(j)).collect(),
    }
}

fn by_token<T: Copy>(values: [T; TASKS]) -> [T; TASKS] {
    let mut out = values;
    for (i, v) in values.into_iter().enumerate() {
        out[usize::from(other(i as u8))] = v;
    }
    out
}

fn data(d: &Data) -> Data {
    let mut waiting = 0;
    for token in 0..TASKS as Token {
        if d.waiting & (1 << token) != 0 {
            waiting |= 1 << other(token);
        }
    }
    Data {
        lock: d.lock.map(|mut k| {
            k.token = other(k.token);
            k
        }),
        waiting,
        waiting_expires: d.waiting_expires,
        latches: by_token(d.latches),
        fence: d.fence,
    }
}

/// `state` with the processes swapped.
pub fn swapped(state: &State) -> State {
    let mut out = state.clone();
    for p in 0..PROCESSES {
        out.processes[(p + 1) % PROCESSES] = process(&state.processes[p]);
    }
    out.tasks = by_token(state.tasks.map(phase));
    out.redis.data = data(&state.redis.data);
    out.redis.snapshot = state.redis.snapshot.as_ref().map(data);
    out
}

/// The smaller of `state` and its swap: one state stands for both.
pub fn representative(state: State) -> State {
    let other = swapped(&state);
    if other < state {
        other
    } else {
        state
    }
}

#[cfg(test)]
mod tests {
    use stateright::Model;

    use super::*;
    use crate::config::Config;
    use crate::model::LockModel;

    /// Every state of a few steps from the start, in breadth order.
    fn some_states(model: &LockModel, count: usize) -> Vec<State> {
        let mut states = model.init_states();
        let mut i = 0;
        while states.len() < count && i < states.len() {
            let next = model.next_states(&states[i]);
            states.extend(next);
            i += 1;
        }
        states
    }

    #[test]
    fn swapping_twice_changes_nothing_and_the_representative_is_stable() {
        let model = LockModel::new(Config {
            symmetry: false,
            ..Config::protocol()
        });
        for state in some_states(&model, 2000) {
            assert_eq!(swapped(&swapped(&state)), state);
            let one = representative(state.clone());
            assert_eq!(representative(swapped(&state)), one);
            assert_eq!(representative(one.clone()), one);
        }
    }

    #[test]
    fn a_swapped_state_has_the_swapped_successors() {
        // Symmetry is sound when the model treats the processes alike: the successors of a
        // swapped state are the swapped successors.
        let model = LockModel::new(Config {
            symmetry: false,
            ..Config::protocol()
        });
        for state in some_states(&model, 500) {
            let mut direct: Vec<State> = model.next_states(&state).iter().map(swapped).collect();
            let mut of_swapped = model.next_states(&swapped(&state));
            direct.sort();
            of_swapped.sort();
            assert_eq!(direct, of_swapped);
        }
    }
}
