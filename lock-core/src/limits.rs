//! The ranges of the duration settings, checked in one place.
//!
//! Every duration the API takes is either checked here against its range (a value outside it
//! is a [`ConfigError::OutOfRange`] naming the setting and the range) or saturates where a
//! larger value has a natural meaning (a wait or a `max_hold` beyond a century is no bound).
//! The bounds keep every computation on a user duration far from overflow: `Instant`
//! arithmetic, `Duration` sums and multiples (a waiting flag lives three fallback retries), and millisecond arguments of Redis commands and Lua scripts,
//! which must fit Redis's `long long` after adding the server's clock, and stay exact in a Lua
//! double (below 2^53).

use std::time::Duration;

use crate::error::{ConfigError, DurationSetting};

const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest lease accepted (Redis takes millisecond TTLs up to `i64::MAX`; this keeps every
/// deadline computation far from overflow).
pub const MAX_LEASE: Duration = YEAR;

/// The shortest lease: Redis counts TTLs in milliseconds.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(1);

/// The shortest fixed lease on RedLock: a grant counts only if the tries took less than the
/// lease less its drift allowance (lease / 100 + 2 ms, `store/redlock.rs`), which a lease of
/// 2 ms or less never leaves room for (every acquire would end `Busy`).
pub(crate) const MIN_REDLOCK_LEASE: Duration = Duration::from_millis(3);

/// A `max_hold` that a locker on RedLock (`redlock`) can keep: one shorter than
/// [`MIN_REDLOCK_LEASE`] would cut the watchdog lease to a length RedLock never grants.
pub(crate) fn check_max_hold(max_hold: Duration, redlock: bool) -> Result<(), ConfigError> {
    if redlock && max_hold < MIN_REDLOCK_LEASE {
        return Err(ConfigError::MaxHoldTooShortForRedLock {
            max_hold,
            min: MIN_REDLOCK_LEASE,
        });
    }
    Ok(())
}

/// The shortest watchdog lease: it is renewed every third of it, so shorter ones cannot be
/// renewed in time over a network.
pub(crate) const MIN_WATCHDOG_LEASE: Duration = Duration::from_millis(30);

/// Waits longer than this have no deadline (they wait until the lock is free): a century is
/// forever for a lock, and it keeps `Instant` arithmetic far from overflow.
pub(crate) const WAIT_FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A `max_hold` longer than this is no limit: as for [`WAIT_FOREVER`], a century is forever,
/// and the watchdog's `sent_at + max_hold` stays far from overflow.
pub(crate) const MAX_HOLD: Duration = WAIT_FOREVER;

/// The shortest command, connect and `min_replicas` timeout: Redis's `WAIT` counts in
/// milliseconds, and a shorter limit fails every call.
pub(crate) const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// The longest command, connect and `min_replicas` timeout and release retry window: a reply
/// later than an hour is no reply.
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// The shortest fallback retry: below it a waiter that misses the release messages asks Redis
/// more than 100 times a second (at 1 ms it is a busy loop on the server).
pub(crate) const MIN_FALLBACK_RETRY: Duration = Duration::from_millis(10);

/// The longest fallback retry: a waiter of a fair lock or a semaphore whose process is cut off
/// keeps its place in line for three of them, holding everyone behind it back.
pub(crate) const MAX_FALLBACK_RETRY: Duration = Duration::from_secs(600);

/// The shortest fence retention: the fence key's TTL is in milliseconds.
pub(crate) const MIN_FENCE_RETENTION: Duration = Duration::from_millis(1);

/// The longest fence retention, ten years: in milliseconds (3.2e11) exact in a Lua double, and
/// with the server's clock and the longest lease added far from overflowing an expiry time.
pub(crate) const MAX_FENCE_RETENTION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The default fence retention: a fence key lives 10 s past its lock and its last token. Long
/// enough for the backward steps time synchronisation makes (a leap second, an NTP step past
/// its 128 ms threshold); short enough that the keys fenced in the last window, not the last
/// hour, stay in Redis.
pub(crate) const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(10);

/// How long a release's latch lives unless the builder says otherwise: not at all. A release
/// then leaves nothing in Redis and costs one key write less; the price is paid only by a
/// release whose connection dropped after its first try ran, which reports a loss it cannot
/// rule out (`LostReason::Unknown`) instead of `Ok`. A window of a second covers the retries
/// (5 ms and 50 ms after a dropped connection) for those who want that answer exact.
pub(crate) const DEFAULT_RELEASE_RETRY_WINDOW: Duration = Duration::ZERO;

/// `value` if it lies in `min..=max`, else the error that names the setting and its range.
pub(crate) fn check(
    setting: DurationSetting,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<Duration, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ConfigError::OutOfRange {
            setting,
            value,
            min,
            max,
        })
    }
}

/// Checks a lease-like duration: 1 ms to [`MAX_LEASE`].
pub(crate) fn check_lease(
    setting: DurationSetting,
    value: Duration,
) -> Result<Duration, ConfigError> {
    check(setting, value, MIN_LEASE, MAX_LEASE)
}

/// Checks a command, connect or `min_replicas` timeout: [`MIN_TIMEOUT`] to [`MAX_TIMEOUT`].
pub(crate) fn check_timeout(
    setting: DurationSetting,
    value: Duration,
) -> Result<Duration, ConfigError> {
    check(setting, value, MIN_TIMEOUT, MAX_TIMEOUT)
}

/// A wait as the acquire uses it: `None` (no deadline) beyond [`WAIT_FOREVER`].
pub(crate) fn wait(wait: Duration) -> Option<Duration> {
    (wait <= WAIT_FOREVER).then_some(wait)
}

/// A `max_hold` as the watchdog uses it: `None` (no limit) beyond [`MAX_HOLD`].
pub(crate) fn max_hold(max: Duration) -> Option<Duration> {
    (max <= MAX_HOLD).then_some(max)
}

/// The watchdog lease of a lock held at most `max_hold`: the locker's lease, shortened to the
/// max_hold when that is shorter (at least [`MIN_LEASE`], so a zero max_hold ends the lock at
/// once rather than leaving it for a lease).
pub(crate) fn lease_within(lease: Duration, max_hold: Option<Duration>) -> Duration {
    max_hold.map_or(lease, |max| lease.min(max).max(MIN_LEASE))
}

/// A duration in whole milliseconds for a script argument, at least 1 (`PEXPIRE 0` would delete
/// the key).
pub(crate) fn lease_ms(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The limits, one nanosecond either side of each, and durations of any size.
    fn durations() -> impl Strategy<Value = Duration> {
        let ns = Duration::from_nanos(1);
        let mut edges = vec![Duration::ZERO, ns, Duration::MAX];
        for limit in [
            MIN_LEASE,
            MAX_LEASE,
            MIN_WATCHDOG_LEASE,
            WAIT_FOREVER,
            MIN_TIMEOUT,
            MAX_TIMEOUT,
            MIN_FALLBACK_RETRY,
            MAX_FALLBACK_RETRY,
            MAX_FENCE_RETENTION,
        ] {
            edges.extend([limit - ns, limit, limit + ns]);
        }
        prop_oneof![
            proptest::sample::select(edges),
            (any::<u64>(), 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// A checked value is accepted exactly inside its range, and the refusal carries the
        /// value and the range.
        #[test]
        fn check_accepts_exactly_the_range(value in durations()) {
            let result = check_timeout(DurationSetting::CommandTimeout, value);
            let inside = (MIN_TIMEOUT..=MAX_TIMEOUT).contains(&value);
            match result {
                Ok(accepted) => prop_assert!(inside && accepted == value),
                Err(ConfigError::OutOfRange { setting, value: refused, min, max }) => {
                    prop_assert!(!inside);
                    prop_assert_eq!(setting, DurationSetting::CommandTimeout);
                    prop_assert_eq!((refused, min, max), (value, MIN_TIMEOUT, MAX_TIMEOUT));
                }
                Err(other) => prop_assert!(false, "{other}"),
            }
        }

        /// What the kit computes from accepted values cannot overflow: the watchdog's
        /// `sent_at + max_hold`, a wait's deadline, the latch (four command timeouts), the
        /// waiting flag (three fallback retries), a command plus its `WAIT`, twice a lease.
        #[test]
        fn accepted_values_leave_room_for_the_arithmetic(value in durations()) {
            let now = tokio::time::Instant::now();
            if let Some(max) = max_hold(value) {
                prop_assert!(now.checked_add(max).is_some());
            }
            if let Some(wait) = wait(value) {
                prop_assert!(now.checked_add(wait).is_some());
            }
            if let Ok(timeout) = check_timeout(DurationSetting::CommandTimeout, value) {
                prop_assert!(timeout.checked_mul(4).is_some());
                prop_assert!(now.checked_add(timeout * 2).is_some());
            }
            let retry = check(
                DurationSetting::FallbackRetry,
                value,
                MIN_FALLBACK_RETRY,
                MAX_FALLBACK_RETRY,
            );
            if let Ok(retry) = retry {
                prop_assert!(retry.checked_mul(3).is_some());
            }
            if let Ok(lease) = check_lease(DurationSetting::Lease, value) {
                prop_assert!(lease_ms(lease * 2) <= lease_ms(MAX_FENCE_RETENTION));
            }
            // Millisecond arguments stay exact in a Lua double.
            prop_assert!(lease_ms(MAX_FENCE_RETENTION) < 1 << 53);
        }
    }
}
