//! Running a check and reporting it: states explored, time, and the traces of the
//! properties' discoveries.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model, Path};

use crate::config::Config;
use crate::model::{Action, LockModel};
use crate::state::State;

/// What a check found.
#[derive(Debug)]
pub struct Report {
    /// States generated (with repeats).
    pub states: usize,
    /// Distinct states.
    pub unique_states: usize,
    /// The longest path explored.
    pub max_depth: usize,
    /// How long it took.
    pub elapsed: Duration,
    /// The violated properties (`always` with a counterexample, `eventually` with a path that
    /// ends without it), with their traces.
    pub violations: BTreeMap<&'static str, Path<State, Action>>,
    /// The `sometimes` properties that were reached, with an example each.
    pub examples: BTreeMap<&'static str, Path<State, Action>>,
    /// The `sometimes` properties never reached.
    pub unreached: Vec<&'static str>,
}

/// Explores every state of `config`'s model (breadth first, on `threads` threads), or stops at
/// the first violation when `stop_at_first_violation`.
pub fn check(config: Config, threads: usize, stop_at_first_violation: bool) -> Report {
    let model = LockModel::new(config);
    let properties = model.properties();
    let started = Instant::now();
    let mut builder = model.checker().threads(threads);
    if stop_at_first_violation {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker = builder.spawn_bfs().join();
    let elapsed = started.elapsed();
    let mut discoveries = checker.discoveries();
    let mut violations = BTreeMap::new();
    let mut examples = BTreeMap::new();
    let mut unreached = Vec::new();
    for property in &properties {
        match (
            property.expectation.clone(),
            discoveries.remove(property.name),
        ) {
            (Expectation::Sometimes, Some(path)) => {
                examples.insert(property.name, path);
            }
            (Expectation::Sometimes, None) => unreached.push(property.name),
            (_, Some(path)) => {
                violations.insert(property.name, path);
            }
            (_, None) => {}
        }
    }
    Report {
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        violations,
        examples,
        unreached,
    }
}

impl Report {
    /// One line: states, distinct states, depth, time.
    pub fn summary(&self) -> String {
        format!(
            "{} states generated, {} distinct, depth {}, in {:.1?}",
            self.states, self.unique_states, self.max_depth, self.elapsed
        )
    }
}

/// A trace, one step a line: each state (clock, lock key, tasks), then the action taken
/// from it.
pub fn trace(path: &Path<State, Action>) -> String {
    let mut out = String::new();
    for (state, action) in path.clone().into_vec() {
        let _ = writeln!(out, "    {}", state.summary());
        if let Some(action) = action {
            let _ = writeln!(out, "  -> {action:?}");
        }
    }
    out
}
