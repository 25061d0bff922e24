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
    // trybuild builds its project twice, first the dependencies, then every case with one
    // more rustc flag (`--diagnostic-width=140`), and the changed flags rebuilt the whole
    // dependency tree. It passes its flags as cargo `--config` values, which this variable
    // overrides: set to trybuild's flags with that one included, both builds share one tree
    // (clean run 91 s -> 54 s). A value already set (a coverage tool's) is left alone. The
    // flags are trybuild 1.0.122's (`src/rustflags.rs`, `src/cargo.rs`): this variable
    // replaces trybuild's own, so a trybuild upgrade checks them again.
    if std::env::var_os("CARGO_ENCODED_RUSTFLAGS").is_none() {
        let flags = [
            "--cfg",
            "trybuild",
            "--verbose",
            "-A",
            "dead_code",
            "--diagnostic-width=140",
        ];
        std::env::set_var("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
    }
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
