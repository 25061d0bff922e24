//! A test binary re-executing itself as a worker process: the test named `child_worker` of the
//! same module (ignored when run normally), told what to do by environment variables.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// What the child does (the test file's own modes).
pub const MODE: &str = "LOCK_CHILD_MODE";
/// The Redis URL the child locks on.
pub const URL: &str = "LOCK_CHILD_URL";
/// The oracle's referee URL (empty when the mode needs none).
pub const REFEREE: &str = "LOCK_CHILD_REFEREE";

/// The name the test harness gives the test `test` of the module `module` (its
/// `module_path!()`, which starts with the binary's name: the harness leaves that out).
pub fn test_name(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_owned(),
    }
}

/// The arguments that run only the ignored test `test` of `module` (the caller's
/// `module_path!()`), in this test binary started again: one thread, output shown.
pub fn only_test_args(module: &str, test: &str) -> [String; 5] {
    [
        test_name(module, test),
        "--exact".to_owned(),
        "--ignored".to_owned(),
        "--nocapture".to_owned(),
        "--test-threads=1".to_owned(),
    ]
}

/// Starts the `child_worker` test of `module` (the caller's `module_path!()`) in this test
/// binary, in `mode`, stdout piped for [`wait_for_line`].
pub fn spawn_child(module: &str, mode: &str, url: &str, referee: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(only_test_args(module, "child_worker"))
        .env(MODE, mode)
        .env(URL, url)
        .env(REFEREE, referee)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Blocks until the child prints `line` on stdout.
pub fn wait_for_line(child: &mut Child, line: &str) {
    let stdout = child.stdout.as_mut().unwrap();
    let mut reader = BufReader::new(stdout);
    let mut buf = String::new();
    loop {
        buf.clear();
        assert!(
            reader.read_line(&mut buf).unwrap() > 0,
            "child exited before printing {line}"
        );
        if buf.trim_end().ends_with(line) {
            return;
        }
    }
}

/// Set in a process that [`run_alone`] started.
pub const ALONE: &str = "LOCK_TEST_ALONE";

/// Runs the ignored test `test` of `module` (the caller's `module_path!()`) in a process of
/// its own (this test binary again), for a test that sets process-wide state (a metrics
/// recorder, rustls's default provider), and fails unless it ran and passed. The test returns
/// at once when [`ALONE`] is not set, so that `--ignored` among the others does not run it.
pub fn run_alone(module: &str, test: &str) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(only_test_args(module, test))
        .env(ALONE, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{test} in a process of its own: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Whether this process was started by [`run_alone`].
pub fn alone() -> bool {
    std::env::var_os(ALONE).is_some()
}
