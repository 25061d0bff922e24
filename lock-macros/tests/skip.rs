//! `#[distributed_lock(.., on_busy = "skip")]` against a real `redis-server`: while another
//! holder (another locker, or another task through the same fn) has the lock, the fn returns
//! its "skipped" value without running its body; when the lock is free, it runs.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_core::{distributed_lock, LockError, Locker};
use lock_testkit::RedisServer;
use tokio::sync::Notify;

/// A generous bound for anything that should take milliseconds.
const LIMIT: Duration = Duration::from_secs(10);

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

/// A job that every instance starts: one runs it.
struct Jobs {
    locker: Locker,
    runs: AtomicUsize,
    /// Told when a run is inside the body.
    entered: Notify,
    /// How long a run stays inside.
    hold: Duration,
}

impl Jobs {
    fn new(locker: Locker, hold: Duration) -> Arc<Self> {
        Arc::new(Self {
            locker,
            runs: AtomicUsize::new(0),
            entered: Notify::new(),
            hold,
        })
    }

    async fn body(&self, day: u32) -> u32 {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.entered.notify_one();
        tokio::time::sleep(self.hold).await;
        day
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    #[distributed_lock(key = "report:<day>", on_busy = "skip", locker = self.locker)]
    async fn optional(&self, day: u32) -> Option<u32> {
        Some(self.body(day).await)
    }

    #[distributed_lock(key = "report:<day>", on_busy = "skip", locker = self.locker)]
    async fn fallible(&self, day: u32) -> Result<Option<u32>, AppError> {
        Ok(Some(self.body(day).await))
    }

    #[distributed_lock(key = "report:<day>", on_busy = "skip", locker = self.locker)]
    async fn unit(&self, day: u32) {
        self.body(day).await;
    }

    #[distributed_lock(key = "report:<day>", on_busy = "skip", locker = self.locker)]
    async fn fallible_unit(&self, day: u32) -> Result<(), AppError> {
        self.body(day).await;
        Ok(())
    }

    /// An empty `name` is an empty key, which lock-core refuses.
    #[distributed_lock(key = "<name>", on_busy = "skip", locker = self.locker)]
    async fn named(&self, name: &str) -> Result<Option<u32>, AppError> {
        Ok(Some(self.body(0).await))
    }

    #[distributed_lock(key = "<name>", on_busy = "skip", locker = self.locker)]
    async fn named_optional(&self, name: &str) -> Option<u32> {
        Some(self.body(0).await)
    }
}

async fn start() -> (RedisServer, Locker, Locker) {
    let server = RedisServer::start().expect("start redis-server");
    let connect = || Locker::builder().url(server.url()).build();
    let (one, other) = (
        connect().await.expect("connect"),
        connect().await.expect("connect"),
    );
    (server, one, other)
}

async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(LIMIT, future)
        .await
        .expect("timed out")
}

#[tokio::test]
async fn every_return_type_says_skipped_while_another_locker_holds_the_key() {
    let (server, locker, other) = start().await;
    let jobs = Jobs::new(locker.clone(), Duration::ZERO);
    let held = other.lock("report:1").await.unwrap();
    assert_eq!(within(jobs.optional(1)).await, None);
    assert!(matches!(within(jobs.fallible(1)).await, Ok(None)));
    within(jobs.unit(1)).await;
    assert!(within(jobs.fallible_unit(1)).await.is_ok());
    assert_eq!(jobs.runs(), 0, "no skipped body ran");
    held.release().await.unwrap();
    assert_eq!(within(jobs.optional(1)).await, Some(1));
    assert!(matches!(within(jobs.fallible(1)).await, Ok(Some(1))));
    within(jobs.unit(1)).await;
    assert!(within(jobs.fallible_unit(1)).await.is_ok());
    assert_eq!(jobs.runs(), 4, "each ran once the key was free");
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}

/// Two tasks of one process call the fn at once: the second is skipped while the first runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_task_is_skipped_while_the_first_runs_the_fn() {
    let (server, locker, other) = start().await;
    let jobs = Jobs::new(locker.clone(), Duration::from_millis(500));
    let entered = jobs.entered.notified();
    let first = tokio::spawn({
        let jobs = jobs.clone();
        async move { jobs.optional(7).await }
    });
    within(entered).await;
    let second = tokio::spawn({
        let jobs = jobs.clone();
        async move { jobs.optional(7).await }
    });
    assert_eq!(within(second).await.unwrap(), None, "skipped");
    assert_eq!(within(first).await.unwrap(), Some(7), "ran");
    assert_eq!(jobs.runs(), 1);
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}

/// Only a busy lock is a skip: an invalid key is still the fn's error (or, for a return type
/// without one, a logged failure whose body did not run either).
#[tokio::test]
async fn other_lock_errors_are_still_errors() {
    let (server, locker, other) = start().await;
    let jobs = Jobs::new(locker.clone(), Duration::ZERO);
    let result = within(jobs.named("")).await;
    assert!(
        matches!(result, Err(AppError::Lock(LockError::InvalidKey { .. }))),
        "{result:?}"
    );
    assert_eq!(within(jobs.named_optional("")).await, None);
    assert_eq!(jobs.runs(), 0);
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}
