//! `#[distributed_lock]` against a real `redis-server` (one per test, started by the test).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{distributed_lock, LockError, Locker};
use lock_testkit::RedisServer;
use tokio::sync::{oneshot, Barrier};

/// A generous bound for anything that should take milliseconds.
const LIMIT: Duration = Duration::from_secs(10);

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Failed(&'static str),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

impl AppError {
    fn is_busy(&self) -> bool {
        matches!(self, Self::Lock(e) if e.is_busy())
    }
}

async fn start() -> (RedisServer, Locker) {
    start_with(Locker::builder()).await
}

async fn start_with(builder: lock_core::LockerBuilder) -> (RedisServer, Locker) {
    let server = RedisServer::start().expect("start redis-server");
    let locker = builder.url(server.url()).build().await.expect("connect");
    (server, locker)
}

async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(LIMIT, future)
        .await
        .expect("timed out")
}

/// Counts how many callers are inside a section at once.
#[derive(Default)]
struct OverlapChecker {
    inside: AtomicUsize,
    max_inside: AtomicUsize,
    entries: AtomicUsize,
}

impl OverlapChecker {
    async fn section(&self, hold: Duration) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_inside.fetch_max(now, Ordering::SeqCst);
        self.entries.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(hold).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn max_inside(&self) -> usize {
        self.max_inside.load(Ordering::SeqCst)
    }
}

struct Stock {
    locker: Locker,
    checker: OverlapChecker,
}

impl Stock {
    #[distributed_lock(key = "stock:<sku>", wait = "20s", locker = self.locker)]
    async fn locked(&self, sku: u32) -> Result<u32, AppError> {
        self.checker.section(Duration::from_millis(20)).await;
        Ok(sku)
    }

    /// The same body without the macro: the control for the overlap checker.
    async fn unlocked(&self, sku: u32) -> Result<u32, AppError> {
        self.checker.section(Duration::from_millis(20)).await;
        Ok(sku)
    }

    #[distributed_lock(key = "stock:<sku>", locker = self.locker)]
    async fn outer(&self, sku: u32) -> Result<bool, AppError> {
        // Same key, same task: reentrant.
        self.inner(sku).await
    }

    #[distributed_lock(key = "stock:<sku>", locker = self.locker)]
    async fn inner(&self, sku: u32) -> Result<bool, AppError> {
        Ok(self.locker.is_locked(&format!("stock:{sku}")).await?)
    }

    #[distributed_lock(key = "stock:<sku>", locker = self.locker)]
    async fn outer_other_key(&self, sku: u32) -> Result<bool, AppError> {
        self.inner(sku + 1).await
    }

    #[distributed_lock(key = "stock:<sku>", locker = self.locker)]
    async fn single(&self, sku: u32) -> Result<bool, AppError> {
        Ok(self.locker.is_locked(&format!("stock:{sku}")).await?)
    }

    /// A key without placeholders: `<<` is a literal `<` there too.
    #[distributed_lock(key = "all<<stock", locker = self.locker)]
    async fn escaped_literal(&self) -> Result<(bool, bool), AppError> {
        Ok((
            self.locker.is_locked("all<stock").await?,
            self.locker.is_locked("all<<stock").await?,
        ))
    }
}

#[tokio::test]
async fn an_escaped_angle_bracket_in_a_key_without_placeholders_is_one_bracket() {
    let (_server, locker) = start().await;
    let stock = Stock {
        locker: locker.clone(),
        checker: OverlapChecker::default(),
    };
    assert_eq!(stock.escaped_literal().await.unwrap(), (true, false));
}

async fn run_concurrently(stock: &Arc<Stock>, locked: bool, tasks: u32) {
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let stock = stock.clone();
            tokio::spawn(async move {
                if locked {
                    stock.locked(7).await
                } else {
                    stock.unlocked(7).await
                }
            })
        })
        .collect();
    for handle in handles {
        assert_eq!(within(handle).await.unwrap().unwrap(), 7);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_calls_run_one_after_the_other() {
    let (server, locker) = start().await;
    let stock = Arc::new(Stock {
        locker: locker.clone(),
        checker: OverlapChecker::default(),
    });
    run_concurrently(&stock, true, 8).await;
    assert_eq!(stock.checker.entries.load(Ordering::SeqCst), 8);
    assert_eq!(stock.checker.max_inside(), 1, "two holders overlapped");
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_the_macro_the_checker_sees_overlap() {
    let (server, locker) = start().await;
    let stock = Arc::new(Stock {
        locker: locker.clone(),
        checker: OverlapChecker::default(),
    });
    run_concurrently(&stock, false, 8).await;
    assert!(
        stock.checker.max_inside() > 1,
        "the checker must catch overlapping callers"
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[distributed_lock(key = "gate:<sku>", wait = "0s", locker = locker)]
async fn hold_until(
    locker: Locker,
    sku: u32,
    entered: oneshot::Sender<()>,
    leave: oneshot::Receiver<()>,
) -> Result<u32, AppError> {
    let _ = entered.send(());
    let _ = leave.await;
    Ok(sku)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_caller_gets_busy_with_zero_wait() {
    let (server, locker) = start().await;
    let (entered_tx, entered) = oneshot::channel();
    let (leave, leave_rx) = oneshot::channel();
    let first = tokio::spawn(hold_until(locker.clone(), 1, entered_tx, leave_rx));
    within(entered).await.unwrap();

    // Another task, the same key: busy at once, and its body never runs.
    let (tx, second_entered) = oneshot::channel();
    let (_keep, rx) = oneshot::channel();
    let started = Instant::now();
    let second = within(tokio::spawn(hold_until(locker.clone(), 1, tx, rx)))
        .await
        .unwrap();
    let error = second.unwrap_err();
    assert!(error.is_busy(), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(second_entered.await.is_err(), "the busy body ran");

    leave.send(()).unwrap();
    assert_eq!(within(first).await.unwrap().unwrap(), 1);

    // Free again.
    let (tx, _entered) = oneshot::channel();
    let (leave, rx) = oneshot::channel();
    leave.send(()).unwrap();
    assert_eq!(
        within(hold_until(locker.clone(), 1, tx, rx)).await.unwrap(),
        1
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[distributed_lock(key = "parallel:<sku>", wait = "0s", locker = locker)]
async fn meet(locker: Locker, sku: u32, barrier: Arc<Barrier>) -> Result<u32, AppError> {
    // Returns only when the other call is inside its body too.
    barrier.wait().await;
    Ok(sku)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_keys_run_in_parallel() {
    let (server, locker) = start().await;
    let barrier = Arc::new(Barrier::new(2));
    let a = tokio::spawn(meet(locker.clone(), 1, barrier.clone()));
    let b = tokio::spawn(meet(locker.clone(), 2, barrier.clone()));
    assert_eq!(within(a).await.unwrap().unwrap(), 1);
    assert_eq!(within(b).await.unwrap().unwrap(), 2);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_calls_reenter_without_redis_round_trips() {
    let (server, locker) = start().await;
    let stock = Stock {
        locker,
        checker: OverlapChecker::default(),
    };
    // Warm up: scripts loaded, connections open.
    assert!(within(stock.single(1)).await.unwrap());

    // An uncontended acquire is a `SET`, a release a script. The fewest of three runs: a
    // command the kit retried on a loaded machine (a timed-out reply) adds one to a run,
    // while a nested call that took the lock again would add two to every run.
    let lock_calls = || server.command_calls("set") + server.command_calls("evalsha");
    let mut single = u64::MAX;
    let mut nested = u64::MAX;
    for _ in 0..3 {
        server.reset_stats();
        assert!(within(stock.single(1)).await.unwrap());
        single = single.min(lock_calls());
        server.reset_stats();
        assert!(
            within(stock.outer(1)).await.unwrap(),
            "the inner call ran under the lock"
        );
        nested = nested.min(lock_calls());
    }
    assert!(single >= 2, "an acquire and a release: {single}");
    assert_eq!(
        nested, single,
        "the nested call took the lock in Redis again"
    );

    // The measurement sees an inner call on another key.
    server.reset_stats();
    assert!(within(stock.outer_other_key(1)).await.unwrap());
    assert!(lock_calls() > single);
    assert!(!stock.locker.is_locked("stock:1").await.unwrap());
    common::assert_nothing_left(&server, &[&stock.locker]).await;
}

struct Paths {
    locker: Locker,
    /// Whether the body saw its lock held.
    saw_lock: AtomicBool,
}

impl Paths {
    async fn check_held(&self, key: &str) {
        let held = self.locker.is_locked(key).await.unwrap();
        self.saw_lock.store(held, Ordering::SeqCst);
    }

    #[distributed_lock(key = "paths:<name>", wait = "0s", locker = self.locker)]
    async fn fails(&self, name: &str) -> Result<(), AppError> {
        self.check_held(&format!("paths:{name}")).await;
        Err(AppError::Failed("body error"))
    }

    #[distributed_lock(key = "paths:<name>", wait = "0s", locker = self.locker)]
    async fn returns_early(&self, name: &str, early: bool) -> Result<u32, AppError> {
        self.check_held(&format!("paths:{name}")).await;
        if early {
            return Ok(1);
        }
        Ok(2)
    }

    #[distributed_lock(key = "paths:<name>", wait = "0s", locker = self.locker)]
    async fn question_mark(&self, name: &str) -> Result<u32, AppError> {
        self.check_held(&format!("paths:{name}")).await;
        let parsed: Result<u32, AppError> = Err(AppError::Failed("parse"));
        let value = parsed?;
        Ok(value)
    }
}

#[distributed_lock(key = "paths:<name>", wait = "0s", locker = locker)]
async fn panics(
    locker: Locker,
    name: String,
    entered: oneshot::Sender<()>,
) -> Result<(), AppError> {
    let _ = entered.send(());
    tokio::task::yield_now().await;
    panic!("the body panics while holding {name}");
}

#[distributed_lock(key = "paths:<name>", wait = "0s", locker = locker)]
async fn forever(
    locker: Locker,
    name: String,
    entered: oneshot::Sender<()>,
) -> Result<(), AppError> {
    let _ = entered.send(());
    std::future::pending::<()>().await;
    Ok(())
}

/// Waits until the background release finished: the key is gone in Redis, and the locker has
/// given up its local place (it does so once Redis answered the release, a moment after the
/// key disappears), so that a zero-wait acquire of this process can take it.
async fn wait_released(locker: &Locker, key: &str) {
    let deadline = Instant::now() + LIMIT;
    while locker.is_locked(key).await.unwrap() || locker.stats().local_keys > 0 {
        assert!(Instant::now() < deadline, "{key} still locked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_is_released_on_every_path() {
    let (server, locker) = start().await;
    let paths = Paths {
        locker: locker.clone(),
        saw_lock: AtomicBool::new(false),
    };

    let error = within(paths.fails("err")).await.unwrap_err();
    assert!(matches!(error, AppError::Failed("body error")), "{error:?}");
    assert!(paths.saw_lock.swap(false, Ordering::SeqCst));
    assert!(!locker.is_locked("paths:err").await.unwrap());

    assert_eq!(within(paths.returns_early("early", true)).await.unwrap(), 1);
    assert!(paths.saw_lock.swap(false, Ordering::SeqCst));
    assert!(!locker.is_locked("paths:early").await.unwrap());
    assert_eq!(
        within(paths.returns_early("early", false)).await.unwrap(),
        2
    );

    let error = within(paths.question_mark("try")).await.unwrap_err();
    assert!(matches!(error, AppError::Failed("parse")), "{error:?}");
    assert!(paths.saw_lock.swap(false, Ordering::SeqCst));
    assert!(!locker.is_locked("paths:try").await.unwrap());

    // A panic inside a spawned task: the guard is dropped while unwinding and the lock is
    // released in the background.
    let (tx, entered) = oneshot::channel();
    let task = tokio::spawn(panics(locker.clone(), "panic".to_owned(), tx));
    within(entered).await.unwrap();
    let joined = within(task).await;
    assert!(joined.unwrap_err().is_panic());
    wait_released(&locker, "paths:panic").await;
    assert_eq!(
        within(paths.returns_early("panic", false)).await.unwrap(),
        2
    );

    // A dropped (cancelled) call: released in the background too.
    let (tx, entered) = oneshot::channel();
    let task = tokio::spawn(forever(locker.clone(), "cancel".to_owned(), tx));
    within(entered).await.unwrap();
    assert!(locker.is_locked("paths:cancel").await.unwrap());
    task.abort();
    assert!(within(task).await.unwrap_err().is_cancelled());
    wait_released(&locker, "paths:cancel").await;
    common::assert_nothing_left(&server, &[&locker]).await;
}

struct Worker {
    locker: Locker,
    finished: AtomicBool,
}

impl Worker {
    #[distributed_lock(key = "lost:<job>", locker = self.locker)]
    async fn abort_on_loss(&self, job: u32, entered: oneshot::Sender<()>) -> Result<u32, AppError> {
        let _ = entered.send(());
        tokio::time::sleep(Duration::from_secs(5)).await;
        self.finished.store(true, Ordering::SeqCst);
        Ok(job)
    }

    #[distributed_lock(key = "lost:<job>", locker = self.locker, on_lost = "continue")]
    async fn continue_on_loss(
        &self,
        job: u32,
        entered: oneshot::Sender<()>,
    ) -> Result<u32, AppError> {
        let _ = entered.send(());
        tokio::time::sleep(Duration::from_millis(800)).await;
        // The key is gone (the loss was noticed long ago), and the body still runs.
        let held = self.locker.is_locked(&format!("lost:{job}")).await?;
        self.finished.store(!held, Ordering::SeqCst);
        Ok(job)
    }
}

/// Deletes the Redis key of user key `key` behind the holder's back.
fn delete_lock_key(server: &RedisServer, key: &str) {
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    let suffix = format!(":lock:{key}");
    let redis_key = keys
        .iter()
        .find(|k| k.ends_with(&suffix))
        .unwrap_or_else(|| panic!("no lock key for {key} in {keys:?}"));
    let deleted: i64 = server.cmd(&["DEL", redis_key]);
    assert_eq!(deleted, 1);
}

async fn worker_with_short_lease() -> (RedisServer, Worker) {
    // Renewed every 100 ms: a stolen lock is noticed within about that.
    let (server, locker) =
        start_with(Locker::builder().watchdog_lease(Duration::from_millis(300))).await;
    let worker = Worker {
        locker,
        finished: AtomicBool::new(false),
    };
    (server, worker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_abort_stops_the_body() {
    let (server, worker) = worker_with_short_lease().await;
    let worker = Arc::new(worker);
    let (tx, entered) = oneshot::channel();
    let task = tokio::spawn({
        let worker = worker.clone();
        async move { worker.abort_on_loss(1, tx).await }
    });
    within(entered).await.unwrap();
    let deleted_at = Instant::now();
    delete_lock_key(&server, "lost:1");

    let result = within(task).await.unwrap();
    match result {
        Err(AppError::Lock(LockError::Lost { key, .. })) => assert_eq!(key, "lost:1"),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(
        deleted_at.elapsed() < Duration::from_secs(2),
        "the loss was noticed late: {:?}",
        deleted_at.elapsed()
    );
    assert!(
        !worker.finished.load(Ordering::SeqCst),
        "the body kept running"
    );
    common::assert_nothing_left(&server, &[&worker.locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_continue_lets_the_body_finish() {
    let (server, worker) = worker_with_short_lease().await;
    let worker = Arc::new(worker);
    let (tx, entered) = oneshot::channel();
    let task = tokio::spawn({
        let worker = worker.clone();
        async move { worker.continue_on_loss(2, tx).await }
    });
    within(entered).await.unwrap();
    delete_lock_key(&server, "lost:2");

    assert_eq!(within(task).await.unwrap().unwrap(), 2);
    assert!(worker.finished.load(Ordering::SeqCst));
    common::assert_nothing_left(&server, &[&worker.locker]).await;
}

struct Pairs {
    locker: Locker,
}

impl Pairs {
    /// Holds the pair's lock until `release` fires; tells `held` once it holds it.
    #[distributed_lock(key = "pair:<a>:<b>", wait = "0s", locker = self.locker)]
    async fn hold(
        &self,
        a: &str,
        b: &str,
        held: oneshot::Sender<()>,
        release: oneshot::Receiver<()>,
    ) -> Result<(), AppError> {
        let _ = (a, b);
        let _ = held.send(());
        let _ = release.await;
        Ok(())
    }
}

/// B12: values that contain the template's separator cannot make two different calls share
/// a lock: ("x:y", "z") and ("x", "y:z") are two locks, held at once; the same pair twice is
/// one lock (the second call is busy).
#[tokio::test]
async fn separator_in_values_does_not_merge_two_keys() {
    let (server, locker) = start().await;
    let pairs = Arc::new(Pairs { locker });
    let mut releases = Vec::new();
    let mut calls = Vec::new();
    for (a, b) in [("x:y", "z"), ("x", "y:z")] {
        let (held_tx, held_rx) = oneshot::channel();
        let (release_tx, release_rx) = oneshot::channel();
        let pairs = pairs.clone();
        calls.push(tokio::spawn(async move {
            pairs.hold(a, b, held_tx, release_rx).await
        }));
        within(held_rx)
            .await
            .expect("both pairs get their lock at once");
        releases.push(release_tx);
    }
    let keys: Vec<String> = server.cmd(&["KEYS", "lock:*:lock:pair:*"]);
    let mut keys: Vec<&str> = keys
        .iter()
        .map(|k| &k[k.find(":lock:").unwrap_or(0) + 6..])
        .collect();
    keys.sort_unstable();
    // Only the value before a separator needs escaping.
    assert_eq!(keys, ["pair:x:y:z", "pair:x\\:y:z"]);
    // The same pair again is the same lock.
    let (held_tx, _held_rx) = oneshot::channel();
    let (_release_tx, release_rx) = oneshot::channel();
    let again = pairs.hold("x:y", "z", held_tx, release_rx).await;
    assert!(matches!(&again, Err(e) if e.is_busy()), "{again:?}");
    for release in releases {
        let _ = release.send(());
    }
    for call in calls {
        within(call).await.unwrap().unwrap();
    }
    common::assert_nothing_left(&server, &[&pairs.locker]).await;
}

struct Foreign {
    locker: Locker,
}

impl Foreign {
    #[distributed_lock(key = "k", wait = "1s", locker = self.locker)]
    async fn run(&self) -> Result<(), AppError> {
        Ok(())
    }
}

/// A foreign value on the lock key: the error names the full Redis key to inspect (the
/// generated code has the locker, so it knows the prefix).
#[tokio::test]
async fn a_foreign_value_on_the_lock_key_is_named_in_the_error() {
    let (server, locker) = start().await;
    let guard = locker.lock("k").await.unwrap();
    let names: Vec<String> = server.cmd(&["KEYS", "lock:*:lock:k"]);
    guard.release().await.unwrap();
    let [name] = names.as_slice() else {
        panic!("one lock key expected: {names:?}");
    };
    let _: () = server.cmd(&["HSET", name, "field", "1"]);
    let error = match (Foreign { locker }).run().await {
        Err(AppError::Lock(error)) => error,
        other => panic!("{other:?}"),
    };
    assert!(
        matches!(&error, LockError::WrongType { redis_key: Some(key), .. } if key == name),
        "{error:?}"
    );
    assert!(
        error.to_string().contains(&format!("redis key `{name}`")),
        "{error}"
    );
}
