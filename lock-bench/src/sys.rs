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

fn clock_ticks() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| sysconf_or(SysconfVar::CLK_TCK, 100))
}

fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| sysconf_or(SysconfVar::PAGE_SIZE, 4096))
}

/// User + system CPU time of this process so far, in seconds (`/proc/self/stat` utime+stime).
pub(crate) fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    parse_cpu_ticks(&stat) as f64 / clock_ticks() as f64
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line; the command name (field 2)
/// may contain spaces and parentheses, so fields are counted after its last `)`.
fn parse_cpu_ticks(stat: &str) -> u64 {
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, index 11.
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
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
    fn parses_stat_with_odd_command_names() {
        let line = "42 (a b) c)) S 1 2 3 4 5 6 7 8 9 10 111 222 13 14 15";
        assert_eq!(parse_cpu_ticks(line), 333);
    }

    #[test]
    fn clocks_move_forward() {
        let a = mono_ns();
        let b = mono_ns();
        assert!(b >= a && a > 0);
        assert!(rss_bytes() > 0);
        assert!(cpu_seconds() >= 0.0);
    }
}
