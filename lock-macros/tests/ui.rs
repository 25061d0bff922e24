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
    // trybuild builds its project in a target directory of its own with cargo's default dev
    // profile, full debug info for every dependency: 2 GB, and a link of each pass case that
    // takes long. Nothing here is debugged, so none (its clean run: 117 s -> 99 s, 757 MB).
    // The variable reaches only trybuild's cargo; this binary has this one test.
    if std::env::var_os("CARGO_PROFILE_DEV_DEBUG").is_none() {
        std::env::set_var("CARGO_PROFILE_DEV_DEBUG", "false");
    }
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
