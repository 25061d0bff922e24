//! The clock every interval is stamped with.

use nix::time::{clock_gettime, ClockId};

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on this host (unlike
/// `std::time::Instant`, which cannot be sent to another process), so intervals logged by
/// different processes can be compared.
///
/// # Panics
///
/// Never on Linux (`CLOCK_MONOTONIC` always exists).
pub fn monotonic_ns() -> u64 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is available");
    let secs = u64::try_from(now.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec()).unwrap_or(0);
    secs * 1_000_000_000 + nanos
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_monotonic_clock_is_monotonic_and_in_nanoseconds() {
        let a = monotonic_ns();
        std::thread::sleep(Duration::from_millis(5));
        let b = monotonic_ns();
        assert!(b - a >= 5 * MS && b - a < 5_000 * MS, "{a} {b}");
    }
}
