//! [`figure`]: a measured figure written to the test log even when the test passes.

use std::io::Write;

/// Writes `FIGURE <line>` straight to the process's stderr. The test harness captures
/// `println!`/`eprintln!` of passing tests, so figures printed that way never reach a CI log;
/// this write bypasses the capture, so every run of the suite reports what it measured.
pub fn figure(line: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "FIGURE {line}");
}
