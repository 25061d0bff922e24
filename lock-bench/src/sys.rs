//! Process measurements: a monotonic clock comparable across processes, CPU time and RSS.

use std::sync::OnceLock;

use nix::time::{clock_gettime, ClockId};
use nix::unistd::{sysconf, SysconfVar};

/// `CLOCK_MONOTONIC` in nanoseconds. Unlike `std::time::Instant`, the raw value is the same
/// clock in every process of the machine, so timestamps of different processes compare.
pub(crate) fn mono_ns() -> u64 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is available");
    u64::try_from(now.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(now.tv_nsec()).unwrap_or(0)
}

fn sysconf_or(var: SysconfVar, default: u64) -> u64 {
    sysconf(var)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| sysconf_or(SysconfVar::PAGE_SIZE, 4096))
}

/// User + system CPU time of this process so far (all its threads), in seconds:
/// `CLOCK_PROCESS_CPUTIME_ID`, to the nanosecond (`/proc/self/stat` counts 10 ms ticks, too
/// coarse for W1's slices of a few tens of milliseconds).
pub(crate) fn cpu_seconds() -> f64 {
    clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
        .unwrap_or(0.0)
}

/// Resident set size of this process in bytes (`/proc/self/statm`, second field, in pages).
pub(crate) fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse::<u64>().ok())
        .unwrap_or(0)
        * page_size()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_move_forward() {
        let a = mono_ns();
        let b = mono_ns();
        assert!(b >= a && a > 0);
        assert!(rss_bytes() > 0);
        let cpu = cpu_seconds();
        // Some work, so that the process clock has something to count.
        let spun = (0..2_000_000u64).fold(0u64, |a, i| a.wrapping_add(i * i));
        assert!(std::hint::black_box(spun) > 0);
        assert!(cpu > 0.0 && cpu_seconds() > cpu);
    }
}
