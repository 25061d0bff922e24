//! Fault injection: which writes of an instance stall, and for how long (`PUT /debug/chaos`).
//! The stall itself happens in the [`AttemptLayer`](crate::recorder::AttemptLayer), as a
//! write's span opens.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest stall `PUT /debug/chaos` accepts: a debug endpoint must not let anyone stall an
/// instance's writes, and the locks held over them, at will.
pub const MAX_PAUSE: Duration = Duration::from_secs(10);

/// Which writes of an instance stall, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChaosPlan {
    /// How long a stalled write waits (a GC pause, a VM migration, a swapped-out process).
    pub pause_ms: u64,
    /// Stall the 1st, `every + 1`-th, `2 * every + 1`-th, ... write of this instance.
    pub every: u64,
    /// Stall at most this many writes.
    pub max: u64,
}

/// The plan of one instance and how far it got; disarmed by default.
#[derive(Debug, Default)]
pub struct Chaos {
    state: Mutex<ChaosState>,
}

#[derive(Debug, Default)]
struct ChaosState {
    plan: Option<ChaosPlan>,
    writes: u64,
    pauses: u64,
}

impl Chaos {
    /// Arms `plan` (`None` disarms), counting writes from zero again.
    pub fn arm(&self, plan: Option<ChaosPlan>) {
        *self.state() = ChaosState {
            plan,
            writes: 0,
            pauses: 0,
        };
    }

    /// Counts one write and says whether it stalls.
    pub fn next_pause(&self) -> Option<Duration> {
        let mut state = self.state();
        let plan = state.plan?;
        let n = state.writes;
        state.writes += 1;
        if n.is_multiple_of(plan.every.max(1)) && state.pauses < plan.max {
            state.pauses += 1;
            return Some(Duration::from_millis(plan.pause_ms));
        }
        None
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ChaosState> {
        // The state is replaced or counted in one step: a panic cannot leave it half-updated.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chaos_stalls_every_nth_write_up_to_max() {
        let chaos = Chaos::default();
        assert_eq!(chaos.next_pause(), None, "disarmed");
        chaos.arm(Some(ChaosPlan {
            pause_ms: 400,
            every: 3,
            max: 2,
        }));
        let stalled: Vec<bool> = (0..10).map(|_| chaos.next_pause().is_some()).collect();
        assert_eq!(
            stalled,
            [true, false, false, true, false, false, false, false, false, false]
        );
        // Arming again starts over.
        chaos.arm(Some(ChaosPlan {
            pause_ms: 5,
            every: 1,
            max: 1,
        }));
        assert_eq!(chaos.next_pause(), Some(Duration::from_millis(5)));
        assert_eq!(chaos.next_pause(), None);
    }
}
