//! The bounded check of the lock protocol's model (see the crate docs): every property in
//! every reachable state of each bound, and a counterexample for each mutation that undoes
//! one of the kit's fixes.
//!
//! The summaries and traces are written to stderr directly, so that `cargo test` shows them
//! without `--nocapture`.

use std::io::Write as _;

use lock_model::properties::{EXCLUSION, RELEASE_TRUTH};
use lock_model::{check, trace, Config, Mutation, Report};

/// Checker threads (the CI machine has two cores).
const THREADS: usize = 2;

fn say(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// Explores every state of `config` and fails on any violation, showing its trace.
fn holds(name: &str, config: Config) -> Report {
    let report = check(config, THREADS, false);
    say(&format!("{name}: {}", report.summary()));
    for (property, path) in &report.violations {
        say(&format!("VIOLATED: {property}\n{}", trace(path)));
    }
    assert!(
        report.violations.is_empty(),
        "{name}: a property is violated"
    );
    report
}

/// Explores `config` until a property fails; that property's name and trace, shown.
fn counterexample(name: &str, config: Config) -> (&'static str, String) {
    let report = check(config, THREADS, true);
    say(&format!("{name}: {}", report.summary()));
    let Some((property, path)) = report.violations.into_iter().next() else {
        panic!("{name}: no counterexample: the checker does not see this change");
    };
    let trace = trace(&path);
    say(&format!(
        "{name}: counterexample to \"{property}\":\n{trace}"
    ));
    (property, trace)
}

#[test]
fn the_protocol_keeps_every_property_with_one_fault() {
    let report = holds("protocol, one fault", Config::protocol());
    // Not vacuous: every situation the properties are about is reached.
    assert!(
        report.unreached.is_empty(),
        "never reached: {:?}",
        report.unreached
    );
}

#[test]
fn fencing_first_holders_keep_every_property_with_one_fault() {
    let report = holds("fencing, one fault", Config::fencing());
    assert!(
        report.unreached.is_empty(),
        "never reached: {:?}",
        report.unreached
    );
}

#[test]
fn the_protocol_keeps_every_property_with_two_faults() {
    let report = holds("plain locks, two faults", Config::two_faults());
    // Nobody asks for a fencing token here.
    assert_eq!(
        report.unreached,
        [lock_model::properties::FENCE_ISSUED],
        "never reached"
    );
}

#[test]
fn a_handoff_without_the_proof_is_caught() {
    let (property, trace) = counterexample(
        "mutation: handoff without proof",
        Config::mutated(Mutation::HandoffWithoutProof),
    );
    assert!(
        property == RELEASE_TRUTH || property == EXCLUSION,
        "{property}"
    );
    assert!(trace.contains("DeleteKey"), "{trace}");
}

#[test]
fn a_release_without_the_latch_is_caught() {
    let (property, _) = counterexample(
        "mutation: release without latch",
        Config::mutated(Mutation::ReleaseWithoutLatch),
    );
    assert_eq!(property, RELEASE_TRUTH);
}

#[test]
fn renewals_that_shorten_an_extension_are_caught() {
    let (property, trace) = counterexample(
        "mutation: renewals shorten",
        Config::mutated(Mutation::RenewalsShorten),
    );
    assert_eq!(property, EXCLUSION);
    assert!(trace.contains("Extend"), "{trace}");
}

#[test]
fn a_watchdog_answer_reaches_a_handoff_parked_in_the_slot() {
    holds("parked baton, two faults", Config::parked_baton());
}

/// The window the model found (and 84cb768 closed meanwhile): a "not ours" answer that
/// arrives while the token waits in the slot's baton, dropped, lets the next task enter a lock
/// Redis already said was lost, beside the new holder.
#[test]
fn an_answer_that_misses_a_parked_handoff_is_caught() {
    let (property, trace) = counterexample(
        "mutation: answer misses the baton",
        Config {
            mutation: Some(Mutation::AnswerMissesTheBaton),
            symmetry: false,
            ..Config::parked_baton()
        },
    );
    assert_eq!(property, EXCLUSION);
    assert!(trace.contains("TakeOver"), "{trace}");
}
