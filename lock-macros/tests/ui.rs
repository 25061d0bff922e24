//! Compile-time behaviour of `#[distributed_lock]`: every supported fn shape compiles (and its
//! future is `Send`), every misuse is a compile error on the offending token, and a fn with an
//! error stays callable (the macro's error is the only one). Pass cases also run: `main` of
//! `crate_path_calls.rs` checks the values the generated code hands lock-core, against a real
//! `redis-server`.
//!
//! Regenerate the `.stderr` snapshots with `TRYBUILD=overwrite cargo test -p lock-macros --test ui`
//! and read each one before committing it.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
