//! Every duration the API takes, fed with edge values (0, 1 ns, 1 µs, 1 ms, each limit and one
//! nanosecond either side of it, `Duration::MAX`) and random ones: nothing panics (in the
//! caller or in a background task), and each value is either refused with a
//! `ConfigError::OutOfRange` that names the setting and its range, or gives a locker (a lock)
//! that works. Settings whose meaning saturates (a wait, a `max_hold`) accept every value.
//!
//! The Redis-backed property tests run a modest number of cases (each builds a locker and
//! takes locks), plus a deterministic sweep of every edge value.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{eventually, server};
use lock_core::{ConfigError, LockError, LockGuard, Locker, LockerBuilder, LostReason};
use lock_testkit::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const MS: Duration = Duration::from_millis(1);
const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
const HOUR: Duration = Duration::from_secs(3600);
/// A wait or a `max_hold` beyond this means "no bound".
const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// Redis-backed cases per setting.
const CASES: u32 = 32;

/// A watchdog lease short enough for a tick within a case (renewed every 200 ms), long enough
/// for a loaded machine not to lose locks.
const SHORT_LEASE: Duration = Duration::from_millis(600);

/// How long a case waits for a watchdog tick (generous: the machine may be loaded).
const TICK_LIMIT: Duration = Duration::from_secs(10);

/// Timeouts and leases under this may run out on a loaded machine: a backend error or a lost
/// lock is then no bug.
const TIGHT: Duration = Duration::from_secs(1);

/// A duration setting of the builder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setting {
    WatchdogLease,
    DefaultWait,
    MaxHold,
    FenceRetention,
    FallbackRetry,
    ConnectTimeout,
    CommandTimeout,
    ReplicaTimeout,
    RestartGuard,
    ReleaseRetryWindow,
}

const SETTINGS: [Setting; 10] = [
    Setting::WatchdogLease,
    Setting::DefaultWait,
    Setting::MaxHold,
    Setting::FenceRetention,
    Setting::FallbackRetry,
    Setting::ConnectTimeout,
    Setting::CommandTimeout,
    Setting::ReplicaTimeout,
    Setting::RestartGuard,
    Setting::ReleaseRetryWindow,
];

impl Setting {
    fn apply(self, builder: LockerBuilder, value: Duration) -> LockerBuilder {
        match self {
            Self::WatchdogLease => builder.watchdog_lease(value),
            Self::DefaultWait => builder.default_wait(value),
            // A short lease, so that the watchdog ticks within the case.
            Self::MaxHold => builder.max_hold(value).watchdog_lease(SHORT_LEASE),
            Self::FenceRetention => builder.fence_retention(value),
            Self::FallbackRetry => builder.fallback_retry(value),
            Self::ConnectTimeout => builder.connect_timeout(value),
            Self::CommandTimeout => builder.command_timeout(value),
            Self::ReplicaTimeout => builder.min_replicas(0, value),
            Self::RestartGuard => builder.restart_guard(value),
            Self::ReleaseRetryWindow => builder.release_retry_window(value),
        }
    }

    /// The name `ConfigError::OutOfRange` gives the setting.
    fn name(self) -> &'static str {
        match self {
            Self::WatchdogLease => "watchdog lease",
            Self::DefaultWait => "default wait",
            Self::MaxHold => "max hold",
            Self::FenceRetention => "fence retention",
            Self::FallbackRetry => "fallback retry",
            Self::ConnectTimeout => "connect timeout",
            Self::CommandTimeout => "command timeout",
            Self::ReplicaTimeout => "min_replicas timeout",
            Self::RestartGuard => "restart guard",
            Self::ReleaseRetryWindow => "release retry window",
        }
    }

    /// The documented range; `None` for a setting that accepts every value (saturating).
    fn range(self) -> Option<(Duration, Duration)> {
        match self {
            Self::WatchdogLease => Some((Duration::from_millis(30), YEAR)),
            Self::DefaultWait | Self::MaxHold => None,
            Self::FenceRetention => Some((MS, YEAR * 10)),
            Self::FallbackRetry => Some((Duration::from_millis(10), Duration::from_secs(600))),
            Self::ConnectTimeout | Self::CommandTimeout | Self::ReplicaTimeout => Some((MS, HOUR)),
            Self::RestartGuard => Some((MS, YEAR)),
            // Zero is a setting of its own: no latch.
            Self::ReleaseRetryWindow => Some((Duration::ZERO, HOUR)),
        }
    }

    /// The values where its behaviour changes.
    fn limits(self) -> Vec<Duration> {
        match self.range() {
            Some((min, max)) => vec![min, max],
            None => vec![CENTURY],
        }
    }
}

/// 0, 1 ns, 1 µs, 1 ms, each limit and one nanosecond either side, `Duration::MAX`.
fn edges(limits: &[Duration]) -> Vec<Duration> {
    let mut edges = vec![
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_micros(1),
        MS,
        Duration::MAX,
    ];
    for &limit in limits {
        let ns = Duration::from_nanos(1);
        edges.extend(limit.checked_sub(ns));
        edges.push(limit);
        edges.extend(limit.checked_add(ns));
    }
    edges
}

/// The edges, random durations of any size, and random ones up to twice the largest limit.
fn durations(limits: &[Duration]) -> impl Strategy<Value = Duration> {
    let largest = limits.iter().copied().max().unwrap_or(HOUR);
    let near = u64::try_from((largest * 2).as_nanos()).unwrap_or(u64::MAX);
    prop_oneof![
        3 => proptest::sample::select(edges(limits)),
        1 => (any::<u64>(), 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
        1 => (0..=near).prop_map(Duration::from_nanos),
        1 => (0..=3_600_000u64).prop_map(Duration::from_millis),
    ]
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        // Each case talks to Redis: keep the shrinking short.
        max_shrink_iters: 64,
        ..Config::default()
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A new key for each case.
fn fresh_key(stem: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{stem}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Fails the case with `what`.
fn fail<T>(what: String) -> Result<T, TestCaseError> {
    Err(TestCaseError::fail(what))
}

/// Checks a refusal: `ConfigError::OutOfRange` naming `name`, with `value`, outside `range`
/// (the range the error states, and the one documented).
fn check_refusal(
    error: &LockError,
    name: &str,
    value: Duration,
    range: Option<(Duration, Duration)>,
) -> Result<(), TestCaseError> {
    let LockError::Config(ConfigError::OutOfRange {
        setting,
        value: refused,
        min,
        max,
    }) = error
    else {
        return fail(format!("{name} {value:?}: not a range error: {error}"));
    };
    let Some(range) = range else {
        return fail(format!(
            "{name} {value:?} saturates, yet it was refused: {error}"
        ));
    };
    let message = error.to_string();
    if setting.to_string() != name || !message.contains(name) {
        return fail(format!(
            "{name} {value:?}: the error names another setting: {message}"
        ));
    }
    if *refused != value || (*min..=*max).contains(&value) || (*min, *max) != range {
        return fail(format!(
            "{name} {value:?}: refused with the wrong range (documented {range:?}): {message}"
        ));
    }
    if !message.contains(&format!("{min:?}")) || !message.contains(&format!("{max:?}")) {
        return fail(format!(
            "{name}: the message does not state the range: {message}"
        ));
    }
    Ok(())
}

/// Whether an acceptance of `value` agrees with the documented `range`.
fn check_accepted(
    name: &str,
    value: Duration,
    range: Option<(Duration, Duration)>,
) -> Result<(), TestCaseError> {
    match range {
        Some((min, max)) if !(min..=max).contains(&value) => fail(format!(
            "{name} {value:?} is outside {min:?}..={max:?}, yet it was accepted"
        )),
        _ => Ok(()),
    }
}

/// A failure that is no bug for the setting: a timeout too tight for a loaded machine, a lock
/// lost under a tiny lease, a lock refused inside the restart guard.
fn excused(setting: Setting, value: Duration, error: &LockError) -> bool {
    match setting {
        Setting::ConnectTimeout | Setting::CommandTimeout => value < TIGHT && error.is_backend(),
        Setting::WatchdogLease => value < TIGHT && error.is_lost(),
        Setting::RestartGuard => error.is_busy(),
        // A lock past a short max_hold is not renewed, and the short lease this case uses may
        // run out on a loaded machine (the watchdog's life is checked on its own).
        Setting::MaxHold => error.is_lost(),
        _ => false,
    }
}

/// Builds a locker with `value` for `setting` and checks it is refused or works.
async fn builder_case(
    server: &RedisServer,
    holder: &LockGuard,
    setting: Setting,
    value: Duration,
) -> Result<(), TestCaseError> {
    let name = setting.name();
    let builder = setting.apply(Locker::builder().url(server.url()), value);
    let locker = match builder.build().await {
        Ok(locker) => locker,
        Err(error @ LockError::Config(_)) => {
            return check_refusal(&error, name, value, setting.range());
        }
        Err(error) if excused(setting, value, &error) => return Ok(()),
        Err(error) => return fail(format!("{name} {value:?}: build failed: {error}")),
    };
    let excuse = |error: LockError, step: &str| {
        if excused(setting, value, &error) {
            Ok(())
        } else {
            fail(format!("{name} {value:?}: {step}: {error}"))
        }
    };

    // Inside the restart guard every acquire is busy: no use waiting long.
    let patience = if setting == Setting::RestartGuard {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(2)
    };

    // A free lock: taken, fenced (the fence retention goes to Redis), released.
    let key = fresh_key("k");
    match locker.lock(&key).wait(patience).await {
        Ok(guard) => {
            if let Err(error) = guard.fencing_token().await {
                excuse(error, "fencing token")?;
            }
            if let Err(error) = guard.release().await {
                excuse(error, "release")?;
            }
        }
        Err(error) => excuse(error, "acquire")?,
    }

    // A held lock: the waiter sleeps between tries (fallback retry, command timeout,
    // min_replicas timeout all enter its timing) and gives up as busy, without spinning.
    let before = server.total_calls();
    match locker
        .lock(holder.key())
        .wait(Duration::from_millis(40))
        .await
    {
        Ok(_) => return fail(format!("{name} {value:?}: a held lock was granted")),
        Err(error) if error.is_busy() => {}
        Err(error) => excuse(error, "waiting for a held lock")?,
    }
    let calls = server.total_calls().saturating_sub(before);
    if calls > 40 {
        return fail(format!(
            "{name} {value:?}: a waiter spun on Redis ({calls} commands in a 40 ms wait)"
        ));
    }

    // Several keys (with the default wait when that is the setting).
    let all = locker.lock_all([fresh_key("a"), fresh_key("b")]);
    let all = if setting == Setting::DefaultWait {
        all
    } else {
        all.wait(patience)
    };
    match all.await {
        Ok(both) => {
            if let Err(error) = both.release().await {
                excuse(error, "release of lock_all")?;
            }
        }
        Err(error) => excuse(error, "lock_all")?,
    }

    if setting == Setting::MaxHold {
        watchdog_survives(&locker, name, value, |acquire| acquire).await?;
    }
    // Checked last, so that what an out-of-range value does is seen first.
    check_accepted(name, value, setting.range())
}

/// Holds `held` (a lock configured by `configure`, e.g. with a `max_hold`) and another lock
/// across watchdog ticks: the watchdog renews the other one (it did not die on `held`).
async fn watchdog_survives(
    locker: &Locker,
    name: &str,
    value: Duration,
    configure: impl FnOnce(lock_core::Acquire) -> lock_core::Acquire,
) -> Result<(), TestCaseError> {
    let held = configure(locker.lock(fresh_key("held")))
        .await
        .map_err(|e| TestCaseError::fail(format!("{name} {value:?}: acquire: {e}")))?;
    let other = locker
        .lock(fresh_key("other"))
        .max_hold(HOUR)
        .await
        .map_err(|e| TestCaseError::fail(format!("{name} {value:?}: other acquire: {e}")))?;
    // A tick after both were taken.
    let before = locker.stats().renewal_calls;
    let renewed = eventually(TICK_LIMIT, || locker.stats().renewal_calls > before).await;
    if !renewed || !other.is_held() {
        return fail(format!(
            "{name} {value:?}: the watchdog stopped renewing (renewal calls: {}, other held: {})",
            locker.stats().renewal_calls,
            other.is_held()
        ));
    }
    if value >= Duration::from_secs(10) && !held.is_held() {
        return fail(format!(
            "{name} {value:?}: the lock itself was not renewed ({:?}, {:?} left)",
            held.lost_reason(),
            held.remaining()
        ));
    }
    if let Err(error) = other.release().await {
        return fail(format!(
            "{name} {value:?}: release of the other lock: {error}"
        ));
    }
    match held.release().await {
        Ok(()) => Ok(()),
        Err(LockError::Lost {
            reason: LostReason::MaxHold | LostReason::Expired,
            ..
        }) if value < Duration::from_secs(10) => Ok(()),
        Err(error) => fail(format!("{name} {value:?}: release: {error}")),
    }
}

/// A lock held by another locker for the whole test, for the waiters.
async fn holder(server: &RedisServer) -> (Locker, LockGuard) {
    let locker = common::locker(server).await;
    let guard = locker
        .lock("held-by-another")
        .lease(Duration::from_secs(600))
        .await
        .expect("the holder's lock");
    (locker, guard)
}

/// Runs `builder_case` for every builder setting, over the edges or as a property test;
/// panics with the first failure of each setting that failed.
fn for_every_builder_setting(edges_only: bool) {
    let server = server();
    let rt = runtime();
    let (_holder_locker, held) = rt.block_on(holder(&server));
    let mut failures = Vec::new();
    for setting in SETTINGS {
        let limits = setting.limits();
        let case = |value| rt.block_on(builder_case(&server, &held, setting, value));
        if let Err(error) = run(edges_only, &durations(&limits), &edges(&limits), case) {
            failures.push(format!("{setting:?}: {error}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every edge value in turn (`edges_only`; every failing one is reported), or a property test
/// over `strategy` (its first failure, shrunk).
fn run<S: Strategy>(
    edges_only: bool,
    strategy: &S,
    edges: &[S::Value],
    case: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> Result<(), String>
where
    S::Value: Clone + std::fmt::Debug,
{
    if !edges_only {
        return runner().run(strategy, case).map_err(|e| e.to_string());
    }
    let mut failed = Vec::new();
    for value in edges {
        // A panic is a failure, as in the property test.
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(value.clone())));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(error)) => failed.push(format!("\n  {value:?}: {error}")),
            Err(panic) => failed.push(format!("\n  {value:?}: panicked: {}", panic_text(&*panic))),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.concat())
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[test]
fn builder_durations_are_refused_by_name_or_work() {
    for_every_builder_setting(false);
}

#[test]
fn every_edge_of_every_builder_duration_is_refused_by_name_or_works() {
    for_every_builder_setting(true);
}

/// A per-acquire duration option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcquireOption {
    Wait,
    Lease,
    MaxHold,
    Extend,
}

/// What is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mutex,
    Read,
    Fair,
    Permits,
    All,
}

impl AcquireOption {
    fn name(self) -> &'static str {
        match self {
            Self::Wait => "wait",
            Self::Lease => "lease",
            Self::MaxHold => "max hold",
            Self::Extend => "extension",
        }
    }

    fn range(self) -> Option<(Duration, Duration)> {
        match self {
            Self::Wait | Self::MaxHold => None,
            Self::Lease | Self::Extend => Some((MS, YEAR)),
        }
    }

    fn limits(self) -> Vec<Duration> {
        match self.range() {
            Some((min, max)) => vec![min, max],
            None => vec![CENTURY],
        }
    }
}

/// A held lock of any kind, one key or several.
enum Held {
    One(LockGuard),
    All(lock_core::MultiLockGuard),
}

impl Held {
    async fn extend(&self, by: Duration) -> Result<(), LockError> {
        match self {
            Self::One(guard) => guard.extend(by).await,
            Self::All(guard) => guard.extend(by).await,
        }
    }

    async fn release(self) -> Result<(), LockError> {
        match self {
            Self::One(guard) => guard.release().await,
            Self::All(guard) => guard.release().await,
        }
    }
}

/// Takes a lock of `kind` with `option` set to `value` (when it is an acquire option), within
/// `limit`; `None` when the limit passed first.
async fn take(
    locker: &Locker,
    kind: Kind,
    key: &str,
    option: AcquireOption,
    value: Duration,
    limit: Duration,
) -> Option<Result<Held, LockError>> {
    let set = |acquire: lock_core::Acquire| match option {
        AcquireOption::Wait => acquire.wait(value),
        AcquireOption::Lease => acquire.lease(value),
        AcquireOption::MaxHold => acquire.max_hold(value),
        AcquireOption::Extend => acquire,
    };
    let taking = async {
        match kind {
            Kind::Mutex => set(locker.lock(key)).await.map(Held::One),
            Kind::Read => set(locker.read(key)).await.map(Held::One),
            Kind::Fair => set(locker.fair_lock(key)).await.map(Held::One),
            Kind::Permits => set(locker.semaphore(key, 2).acquire_many(2))
                .await
                .map(Held::One),
            Kind::All => {
                let all = locker.lock_all([format!("{key}:1"), format!("{key}:2")]);
                let all = match option {
                    AcquireOption::Wait => all.wait(value),
                    AcquireOption::Lease => all.lease(value),
                    AcquireOption::MaxHold => all.max_hold(value),
                    AcquireOption::Extend => all,
                };
                all.await.map(Held::All)
            }
        }
    };
    tokio::time::timeout(limit, taking).await.ok()
}

async fn acquire_case(
    server: &RedisServer,
    option: AcquireOption,
    kind: Kind,
    value: Duration,
) -> Result<(), TestCaseError> {
    let name = option.name();
    let locker = Locker::builder()
        .url(server.url())
        .watchdog_lease(SHORT_LEASE)
        .build()
        .await
        .map_err(|e| TestCaseError::fail(format!("build: {e}")))?;
    let key = fresh_key("acq");
    let Some(taken) = take(&locker, kind, &key, option, value, Duration::from_secs(10)).await
    else {
        return fail(format!(
            "{name} {value:?} {kind:?}: a free lock was not granted in 10 s"
        ));
    };
    // Whether the value was refused (by `extend`, after the acquire).
    let mut refused = false;
    let held = match taken {
        Ok(held) => held,
        Err(error) => return check_refusal(&error, name, value, option.range()),
    };
    match option {
        AcquireOption::Wait => {
            // Another locker waits for the held lock with the same wait: busy, or still
            // waiting when the test stops it; a long wait saturates.
            let other = common::locker(server).await;
            match take(&other, kind, &key, option, value, Duration::from_millis(50)).await {
                None | Some(Err(LockError::Busy { .. })) => {}
                Some(Ok(_)) if kind == Kind::Read => {}
                Some(Ok(_)) => return fail(format!("{name} {value:?} {kind:?}: granted twice")),
                Some(Err(error)) => {
                    return fail(format!("{name} {value:?} {kind:?}: waiting: {error}"))
                }
            }
        }
        AcquireOption::MaxHold => {
            // The watchdog renews this lock (or stops at its max_hold) and keeps renewing
            // another one.
            let other = locker
                .lock(fresh_key("other"))
                .await
                .map_err(|e| TestCaseError::fail(format!("other acquire: {e}")))?;
            // A tick after both were taken.
            let before = locker.stats().renewal_calls;
            let renewed = eventually(TICK_LIMIT, || locker.stats().renewal_calls > before).await;
            if !renewed || !other.is_held() {
                return fail(format!(
                    "{name} {value:?} {kind:?}: the watchdog stopped renewing (calls {})",
                    locker.stats().renewal_calls
                ));
            }
            other
                .release()
                .await
                .map_err(|e| TestCaseError::fail(format!("release of the other lock: {e}")))?;
        }
        AcquireOption::Extend => {
            if let Err(error) = held.extend(value).await {
                check_refusal(&error, name, value, option.range())?;
                refused = true;
            }
        }
        AcquireOption::Lease => {}
    }
    match held.release().await {
        Ok(()) => {}
        // A short lease, extension or max_hold may end before the release, and the short
        // watchdog lease of these cases may run out on a loaded machine.
        Err(LockError::Lost { .. }) if value < Duration::from_secs(10) => {}
        Err(LockError::Lost {
            reason: LostReason::Expired,
            ..
        }) => {}
        Err(error) => return fail(format!("{name} {value:?} {kind:?}: release: {error}")),
    }
    // Checked last, so that what an out-of-range value does is seen first.
    if refused {
        return Ok(());
    }
    check_accepted(name, value, option.range())
}

const OPTIONS: [AcquireOption; 4] = [
    AcquireOption::Wait,
    AcquireOption::Lease,
    AcquireOption::MaxHold,
    AcquireOption::Extend,
];

const KINDS: [Kind; 5] = [
    Kind::Mutex,
    Kind::Read,
    Kind::Fair,
    Kind::Permits,
    Kind::All,
];

/// Runs `acquire_case` for every option, over the edges (every kind in turn) or as a property
/// test; panics with the first failure of each option that failed.
fn for_every_acquire_option(edges_only: bool) {
    let server = server();
    let rt = runtime();
    let mut failures = Vec::new();
    for option in OPTIONS {
        let limits = option.limits();
        let strategy = (durations(&limits), proptest::sample::select(KINDS.to_vec()));
        let edges: Vec<_> = edges(&limits)
            .into_iter()
            .enumerate()
            .map(|(n, value)| (value, KINDS[n % KINDS.len()]))
            .collect();
        let case = |(value, kind)| rt.block_on(acquire_case(&server, option, kind, value));
        if let Err(error) = run(edges_only, &strategy, &edges, case) {
            failures.push(format!("{option:?}: {error}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn acquire_durations_are_refused_by_name_or_work() {
    for_every_acquire_option(false);
}

#[test]
fn every_edge_of_every_acquire_duration_is_refused_by_name_or_works() {
    for_every_acquire_option(true);
}

/// The review's case: a lock taken with `.max_hold(Duration::MAX)` and held across watchdog
/// ticks must not stop the renewal of the locker's other locks (it used to panic the watchdog
/// task on `sent_at + max_hold`).
#[tokio::test]
async fn the_longest_max_hold_does_not_stop_the_renewal_of_other_locks() {
    const LEASE: Duration = Duration::from_millis(300);
    let server = server();
    let locker = common::locker_with_lease(&server, LEASE).await;
    let observer = common::locker(&server).await;
    let other = locker.lock("other").await.unwrap();
    let forever = locker
        .lock("forever")
        .max_hold(Duration::MAX)
        .await
        .unwrap();
    tokio::time::sleep(LEASE * 4).await;
    assert!(other.is_held(), "the other lock was not renewed");
    assert!(forever.is_held(), "the max_hold(MAX) lock was not renewed");
    for key in ["other", "forever"] {
        assert!(
            observer.is_locked(key).await.unwrap(),
            "{key} is no longer held in Redis after four leases"
        );
    }
    other.release().await.unwrap();
    forever.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker, &observer]).await;
}

/// The same through the builder: `max_hold(Duration::MAX)` for every lock of the locker.
#[tokio::test]
async fn the_longest_builder_max_hold_keeps_the_watchdog_renewing() {
    const LEASE: Duration = Duration::from_millis(300);
    let server = server();
    let locker = Locker::builder()
        .url(server.url())
        .watchdog_lease(LEASE)
        .max_hold(Duration::MAX)
        .build()
        .await
        .unwrap();
    let observer = common::locker(&server).await;
    let first = locker.lock("first").await.unwrap();
    let second = locker.lock("second").max_hold(HOUR).await.unwrap();
    tokio::time::sleep(LEASE * 4).await;
    for (key, guard) in [("first", &first), ("second", &second)] {
        assert!(guard.is_held(), "{key} was not renewed");
        assert!(
            observer.is_locked(key).await.unwrap(),
            "{key} expired in Redis"
        );
    }
    first.release().await.unwrap();
    second.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker, &observer]).await;
}
