//! The properties the checker verifies in every reachable state (see the crate docs for
//! their exact statement and why each is stated so).

use stateright::Property;

use crate::model::LockModel;
use crate::state::{Answer, Phase, State};

/// "no two tasks inside while both believe they hold".
pub const EXCLUSION: &str = "exclusion: no two tasks inside while both believe they hold, but \
                             for a loss one of them could not see yet";
/// "a release that answered Ok had the key".
pub const RELEASE_TRUTH: &str =
    "a release answers Ok only if it had the key from its grant to its deletion or handoff";
/// "fencing tokens increase in grant order".
pub const FENCING_ORDER: &str = "fencing tokens increase in grant order";
/// "nothing is left in Redis".
pub const NOTHING_LEFT: &str =
    "nothing is left in Redis once every task stopped and the cleanup window passed";
/// "every task finishes" (liveness).
pub const EVERY_TASK_FINISHES: &str =
    "every task is eventually granted and done, or times out, or learns its loss";
/// Non-vacuity: a local handoff happens.
pub const HANDOFF_HAPPENS: &str = "a lock is handed over locally";
/// Non-vacuity: a fencing token is issued.
pub const FENCE_ISSUED: &str = "a fencing token is issued";
/// Non-vacuity: the window the protocol cannot close is reached.
pub const UNSEEN_LOSS_WINDOW: &str = "two tasks believe they hold at once after an unseen loss";
/// Non-vacuity: a retried release is answered by its latch.
pub const LATCH_USED: &str = "a retried release is answered from its latch";
/// Non-vacuity: the restart guard refuses an acquire.
pub const GUARD_REFUSES: &str = "the restart guard refuses an acquire";

/// Every property of the model.
pub fn all() -> Vec<Property<LockModel>> {
    vec![
        Property::always(EXCLUSION, |_, s| exclusion(s)),
        Property::always(RELEASE_TRUTH, |_, s| release_truth(s)),
        Property::always(FENCING_ORDER, |_, s| fencing_order(s)),
        Property::always(NOTHING_LEFT, nothing_left),
        Property::eventually(EVERY_TASK_FINISHES, |_, s: &State| s.all_done()),
        Property::sometimes(HANDOFF_HAPPENS, |_, s: &State| {
            s.tasks.iter().any(|t| {
                matches!(
                    t,
                    Phase::Done(Answer::Ok {
                        handed_over: true,
                        ..
                    })
                )
            })
        }),
        Property::sometimes(FENCE_ISSUED, |_, s: &State| s.trace.max_fence.is_some()),
        Property::sometimes(UNSEEN_LOSS_WINDOW, |_, s: &State| believers(s).len() >= 2),
        Property::sometimes(LATCH_USED, |_, s: &State| s.trace.latch_used),
        Property::sometimes(GUARD_REFUSES, |_, s: &State| s.trace.guard_refused),
    ]
}

/// The tasks inside their section that believe they hold (`is_held()`), with whether their
/// key was lost behind their back and no answer since told them.
fn believers(state: &State) -> Vec<bool> {
    state
        .tasks
        .iter()
        .filter_map(|t| match t {
            Phase::Inside(hold) if hold.believes(state.now) => Some(hold.ghosts.unseen_loss),
            _ => None,
        })
        .collect()
}

/// Two believers at once only if one of them has an unseen loss.
pub fn exclusion(state: &State) -> bool {
    let believers = believers(state);
    believers.len() < 2 || believers.iter().filter(|unseen| !**unseen).count() <= 1
}

/// Every `Ok` of a release rests on a Redis answer that found the key holding the token it
/// had kept since its grant.
pub fn release_truth(state: &State) -> bool {
    state.tasks.iter().all(|t| match t {
        Phase::Done(Answer::Ok { proof, .. }) => *proof == Some(true),
        _ => true,
    })
}

/// Every fencing token issued was larger than all issued before it, and went to the key's
/// current holder: so tokens increase in the order of the grants (a grant happens while the
/// key is free; a token issued later than another went to a holder granted later, or again).
pub fn fencing_order(state: &State) -> bool {
    !state.trace.fence_out_of_order
}

/// Once every task has its answer and nothing is in flight, nothing will write to Redis any
/// more; then every key left must expire within the cleanup window (the longest TTL the
/// protocol sets), so that nothing is left once the window passed.
pub fn nothing_left(model: &LockModel, state: &State) -> bool {
    if !(state.all_done() && state.quiet()) {
        return true;
    }
    let by = state.now.saturating_add(model.config.cleanup_window());
    let data = &state.redis.data;
    data.lock.is_none_or(|k| k.expires <= by)
        && (data.waiting == 0 || data.waiting_expires <= by)
        && data.latches.iter().flatten().all(|l| l.expires <= by)
        && data.fence.is_none_or(|f| f.expires <= by)
}
