//! The ranges of the duration settings, checked in one place.

use std::time::Duration;

use crate::error::{ConfigError, DurationSetting};

/// The longest lease accepted (Redis takes millisecond TTLs up to `i64::MAX`; this keeps every
/// deadline computation far from overflow).
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The shortest lease: Redis counts TTLs in milliseconds.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(1);

/// The shortest watchdog lease: it is renewed every third of it, so shorter ones cannot be
/// renewed in time over a network.
pub(crate) const MIN_WATCHDOG_LEASE: Duration = Duration::from_millis(30);

/// Waits longer than this have no deadline (they wait until the lock is free): a century is
/// forever for a lock, and it keeps `Instant` arithmetic far from overflow.
pub(crate) const WAIT_FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

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

/// A duration in whole milliseconds for a script argument, at least 1 (`PEXPIRE 0` would delete
/// the key).
pub(crate) fn lease_ms(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1)
}
