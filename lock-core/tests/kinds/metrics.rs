//! The `metrics` feature against a real redis-server: what acquisitions, a busy lock, a
//! cancelled wait, a loss, renewals and releases record, through a small recorder installed as
//! the process's global one. The test runs in a process of its own (this test binary started
//! again for that one test), so that nothing else records meanwhile.
//!
//! Built with the feature because lock-core's dev-dependency on itself enables it, so
//! `cargo test --workspace` runs it without a flag.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, lock_key, locker_with_lease, server};
use lock_core::metrics as names;
use lock_core::LockError;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use parking_lot::Mutex;

/// One series: a counter's total, a gauge's value, a histogram's samples.
#[derive(Debug, Default)]
struct Series {
    count: AtomicU64,
    gauge: Mutex<f64>,
    samples: Mutex<Vec<f64>>,
}

impl CounterFn for Series {
    fn increment(&self, value: u64) {
        self.count.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.count.store(value, Ordering::Relaxed);
    }
}

impl GaugeFn for Series {
    fn increment(&self, value: f64) {
        *self.gauge.lock() += value;
    }
    fn decrement(&self, value: f64) {
        *self.gauge.lock() -= value;
    }
    fn set(&self, value: f64) {
        *self.gauge.lock() = value;
    }
}

impl HistogramFn for Series {
    fn record(&self, value: f64) {
        self.samples.lock().push(value);
    }
}

/// Series by `name{label=value,...}` (labels sorted), and the described names.
#[derive(Debug, Default)]
struct Store {
    series: Mutex<HashMap<String, Arc<Series>>>,
    described: Mutex<Vec<(String, Option<Unit>)>>,
}

#[derive(Debug, Clone, Default)]
struct TestRecorder(Arc<Store>);

fn series_name(key: &Key) -> String {
    let labels: BTreeMap<_, _> = key.labels().map(|l| (l.key(), l.value())).collect();
    let labels: Vec<_> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl TestRecorder {
    fn series(&self, key: &Key) -> Arc<Series> {
        self.0
            .series
            .lock()
            .entry(series_name(key))
            .or_default()
            .clone()
    }

    fn find(&self, name: &str) -> Option<Arc<Series>> {
        self.0.series.lock().get(name).cloned()
    }

    fn count(&self, name: &str) -> u64 {
        self.find(name)
            .map_or(0, |s| s.count.load(Ordering::Relaxed))
    }

    fn gauge(&self, name: &str) -> f64 {
        self.find(name).map_or(0.0, |s| *s.gauge.lock())
    }

    fn samples(&self, name: &str) -> Vec<f64> {
        self.find(name)
            .map_or_else(Vec::new, |s| s.samples.lock().clone())
    }

    /// Every series name that starts with `prefix`.
    fn names(&self, prefix: &str) -> Vec<String> {
        let mut names: Vec<_> = self
            .0
            .series
            .lock()
            .keys()
            .filter(|n| n.starts_with(prefix))
            .cloned()
            .collect();
        names.sort();
        names
    }

    fn describe(&self, key: KeyName, unit: Option<Unit>) {
        self.0
            .described
            .lock()
            .push((key.as_str().to_owned(), unit));
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(key, unit);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.series(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.series(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.series(key))
    }
}

const LEASE: Duration = Duration::from_millis(300);

#[test]
fn acquisitions_waits_holds_losses_and_renewals_are_recorded() {
    common::child::run_alone(module_path!(), "recorded_in_a_process_of_its_own");
}

#[tokio::test]
#[ignore = "run in a process of its own by acquisitions_waits_holds_losses_and_renewals_are_recorded"]
async fn recorded_in_a_process_of_its_own() {
    if !common::child::alone() {
        // Run by hand with `--ignored` among the other tests: their locks would be counted too.
        return;
    }
    let recorder = TestRecorder::default();
    metrics::set_global_recorder(recorder.clone()).expect("the only recorder of this process");
    let m = recorder;
    let server = server();
    let a = locker_with_lease(&server, LEASE).await;
    let b = locker_with_lease(&server, LEASE).await;

    // Every metric is described (with its unit where it has one) when a locker is built.
    let described = m.0.described.lock().clone();
    for name in [
        names::ACQUISITIONS,
        names::ACQUIRE_WAIT,
        names::ACQUIRE_CALL,
        names::BACKEND_ERRORS,
        names::WAITERS,
        names::HELD,
        names::HOLD,
        names::RELEASES,
        names::LOST,
        names::RENEWALS,
        names::RENEWAL_CALLS,
    ] {
        assert!(name.starts_with("lock_"), "{name}");
        assert!(
            described.iter().any(|(n, _)| n == name),
            "{name} not described"
        );
    }
    assert!(described.contains(&(names::HOLD.to_owned(), Some(Unit::Seconds))));

    // Acquired, then reentered by the same task; one lock held.
    let guard = a.lock("k").await.unwrap();
    let nested = a.lock("k").await.unwrap();
    assert_eq!(
        m.count("lock_acquisitions_total{kind=mutex,outcome=acquired}"),
        1
    );
    assert_eq!(
        m.count("lock_acquisitions_total{kind=mutex,outcome=reentered}"),
        1
    );
    assert_eq!(m.gauge("lock_held{kind=mutex}"), 1.0);
    // A reentry never waits, so it has no wait sample.
    assert_eq!(
        m.samples("lock_acquire_wait_seconds{kind=mutex,outcome=acquired}")
            .len(),
        1
    );
    assert!(m
        .samples("lock_acquire_wait_seconds{kind=mutex,outcome=reentered}")
        .is_empty());
    // The one Redis call of that acquire, timed on its own; the reentry made none.
    let calls = m.samples("lock_acquire_call_seconds{kind=mutex,outcome=acquired}");
    assert_eq!(calls.len(), 1);
    assert!(calls[0] > 0.0 && calls[0] < 1.0, "{calls:?}");
    nested.release().await.unwrap();
    assert_eq!(
        m.gauge("lock_held{kind=mutex}"),
        1.0,
        "a nested guard is no lock"
    );

    // Busy at once, and after waiting 200 ms; while waiting it is a waiter.
    assert!(b
        .lock("k")
        .wait(Duration::ZERO)
        .await
        .unwrap_err()
        .is_busy());
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.lock("k").wait(Duration::from_millis(200)).await }
    });
    assert!(
        eventually(Duration::from_secs(1), || m
            .gauge("lock_waiters{kind=mutex}")
            == 1.0)
        .await
    );
    assert!(waiting.await.unwrap().unwrap_err().is_busy());
    assert_eq!(m.gauge("lock_waiters{kind=mutex}"), 0.0);
    assert_eq!(
        m.count("lock_acquisitions_total{kind=mutex,outcome=busy}"),
        2
    );
    let busy = m.samples("lock_acquire_wait_seconds{kind=mutex,outcome=busy}");
    assert_eq!(busy.len(), 2);
    assert!(busy.iter().any(|s| *s >= 0.2), "{busy:?}");
    // Each try of those waits is a call that found the lock held: at least one per acquire.
    let busy_calls = m.samples("lock_acquire_call_seconds{kind=mutex,outcome=busy}");
    assert!(busy_calls.len() >= 2, "{busy_calls:?}");
    assert!(busy_calls.iter().all(|s| *s < 0.2), "{busy_calls:?}");

    // A skip is counted apart from contention: `skipped`, not `busy`.
    assert!(b.lock("k").skip_if_busy().await.unwrap().is_none());
    assert_eq!(
        m.count("lock_acquisitions_total{kind=mutex,outcome=skipped}"),
        1
    );
    assert_eq!(
        m.count("lock_acquisitions_total{kind=mutex,outcome=busy}"),
        2
    );

    // A wait given up by its caller (the future dropped) is cancelled, and no waiter stays.
    let gave_up = tokio::time::timeout(Duration::from_millis(50), b.lock("k")).await;
    assert!(gave_up.is_err());
    assert_eq!(
        m.count("lock_acquisitions_total{kind=mutex,outcome=cancelled}"),
        1
    );
    assert_eq!(m.gauge("lock_waiters{kind=mutex}"), 0.0);

    // Held past a renewal: the watchdog renewed it, in script calls, then it is released.
    tokio::time::sleep(LEASE / 2).await;
    assert!(m.count("lock_renewals_total{kind=mutex,outcome=renewed}") >= 1);
    assert!(m.count("lock_renewal_calls_total{}") >= 1);
    guard.release().await.unwrap();
    assert_eq!(
        m.count("lock_releases_total{kind=mutex,outcome=released}"),
        1
    );
    let held = m.samples("lock_hold_seconds{kind=mutex,outcome=released}");
    assert_eq!(held.len(), 1);
    assert!(held[0] >= (LEASE / 2).as_secs_f64(), "{held:?}");
    assert_eq!(m.gauge("lock_held{kind=mutex}"), 0.0);

    // Other kinds have their own label.
    a.read("r").await.unwrap().release().await.unwrap();
    a.semaphore("s", 2)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    a.fair_lock("f").await.unwrap().release().await.unwrap();
    for kind in ["read", "semaphore", "fair"] {
        assert_eq!(
            m.count(&format!(
                "lock_acquisitions_total{{kind={kind},outcome=acquired}}"
            )),
            1,
            "{kind}"
        );
        assert_eq!(
            m.count(&format!(
                "lock_releases_total{{kind={kind},outcome=released}}"
            )),
            1,
            "{kind}"
        );
    }

    // A lock whose key is deleted behind it: the renewal finds it gone, the loss is counted
    // once with its reason, and its release reports it.
    let doomed = a.lock("gone").await.unwrap();
    let _: () = server.cmd(&["DEL", &lock_key(&server, "gone")]);
    tokio::time::timeout(LEASE * 2, doomed.lost())
        .await
        .expect("the renewal notices");
    assert_eq!(m.count("lock_lost_total{kind=mutex,reason=deleted}"), 1);
    assert_eq!(m.count("lock_renewals_total{kind=mutex,outcome=lost}"), 1);
    let released = doomed.release().await.unwrap_err();
    assert!(matches!(released, LockError::Lost { .. }), "{released}");
    assert_eq!(m.count("lock_releases_total{kind=mutex,outcome=lost}"), 1);
    assert_eq!(m.count("lock_lost_total{kind=mutex,reason=deleted}"), 1);
    assert_eq!(m.gauge("lock_held{kind=mutex}"), 0.0);

    // An invalid key is an error outcome of its own.
    assert!(a.lock("").await.is_err());
    assert_eq!(
        m.count("lock_acquisitions_total{kind=mutex,outcome=invalid_key}"),
        1
    );

    // A Redis failure outside acquire, release and renewal: a fence key of another type.
    let fenced = a.lock("fenced").await.unwrap();
    let fence_key = lock_key(&server, "fenced").replace(":lock:", ":fence:");
    let _: () = server.cmd(&["HSET", &fence_key, "field", "1"]);
    assert!(fenced.fencing_token().await.is_err());
    assert_eq!(
        m.count("lock_backend_errors_total{operation=fence,outcome=wrong_type}"),
        1
    );
    fenced.release().await.unwrap();
    let _: () = server.cmd(&["DEL", &fence_key]);

    // No series is labelled by a key, and every one is a kit metric.
    let all = m.names("");
    assert!(all.iter().all(|n| n.starts_with("lock_")), "{all:?}");
    assert!(
        all.iter()
            .all(|n| !n.contains("gone") && !n.contains("=k,") && !n.contains("=k}")),
        "{all:?}"
    );
    common::assert_nothing_left(&server, &[&a, &b]).await;

    // With Redis gone, an operator's `is_locked` counts its failure too.
    let mut server = server;
    server.stop();
    assert!(a.is_locked("k").await.is_err());
    assert_eq!(
        m.count("lock_backend_errors_total{operation=is_locked,outcome=backend}")
            + m.count("lock_backend_errors_total{operation=is_locked,outcome=timeout}"),
        1,
        "{:?}",
        m.names("lock_backend_errors_total")
    );
}
