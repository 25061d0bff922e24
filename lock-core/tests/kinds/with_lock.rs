//! `Locker::with_lock`, `Acquire::with_lock` and `AcquireAll::with_lock`: the closure runs under
//! the lock, lock failures and loss become its error (or, with `OnLost::Continue`, a loss lets
//! the body finish), and the lock is released on every path, a panic included; with
//! `skip_if_busy`, a busy lock is `Ok(None)` and the body does not run.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{locker, server};
use lock_core::{LockError, OnLost};

#[tokio::test]
async fn the_body_runs_under_the_lock_and_the_lock_is_released_after() {
    let server = server();
    let locker = locker(&server).await;
    let probe = locker.clone();
    let (token, held_inside) = locker
        .with_lock("inventory:1", |fence| async move {
            assert_eq!(fence.key(), "inventory:1");
            let token = fence.token().await?;
            let held = probe.is_locked("inventory:1").await?;
            Ok::<_, LockError>((token, held))
        })
        .await
        .unwrap();
    assert!(held_inside && token > 0);
    assert!(!locker.is_locked("inventory:1").await.unwrap());
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn a_busy_lock_is_the_bodys_error_and_the_body_does_not_run() {
    let server = server();
    let locker = locker(&server).await;
    let other = common::locker(&server).await;
    let held = other.lock("inventory:2").await.unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    let result = locker
        .lock("inventory:2")
        .wait(Duration::from_millis(100))
        .with_lock(|_| async move {
            flag.store(true, Ordering::SeqCst);
            Ok::<_, LockError>(())
        })
        .await;
    assert!(matches!(result, Err(LockError::Busy { .. })), "{result:?}");
    assert!(!ran.load(Ordering::SeqCst));
    held.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}

/// The body's own error type, as a service would have.
#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

#[tokio::test]
async fn a_lost_lock_aborts_the_body_with_lost() {
    let server = server();
    let locker = locker(&server).await;
    let reached_the_end = Arc::new(AtomicBool::new(false));
    let flag = reached_the_end.clone();
    let started = Instant::now();
    // A fixed lease of 300 ms and a body that takes 5 s: the lock is lost under it.
    let result = locker
        .lock("inventory:3")
        .lease(Duration::from_millis(300))
        .with_lock(|_| async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            flag.store(true, Ordering::SeqCst);
            Ok::<_, AppError>(())
        })
        .await;
    assert!(
        matches!(result, Err(AppError::Lock(LockError::Lost { ref key, .. })) if key == "inventory:3"),
        "{result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "aborted at the loss"
    );
    assert!(!reached_the_end.load(Ordering::SeqCst));
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_body_still_releases_the_lock() {
    let server = server();
    let locker = locker(&server).await;
    let task = tokio::spawn({
        let locker = locker.clone();
        async move {
            locker
                .with_lock("inventory:4", |_| async {
                    if true {
                        panic!("the body fails");
                    }
                    Ok::<_, LockError>(())
                })
                .await
        }
    });
    assert!(task.await.unwrap_err().is_panic());
    let mut released = false;
    for _ in 0..100 {
        if !locker.is_locked("inventory:4").await.unwrap() {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        released,
        "released in the background, long before its 30 s lease"
    );
    // Another owner gets it at once.
    let again = locker
        .lock("inventory:4")
        .wait(Duration::ZERO)
        .await
        .unwrap();
    again.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn on_lost_continue_lets_the_body_finish_and_returns_its_result() {
    let server = server();
    let locker = locker(&server).await;
    // A fixed lease of 300 ms and a body that takes 1.5 s: the lock is lost under it.
    let result = locker
        .lock("inventory:5")
        .lease(Duration::from_millis(300))
        .on_lost(OnLost::Continue)
        .with_lock(|_| async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Ok::<_, AppError>("finished")
        })
        .await;
    assert!(matches!(result, Ok("finished")), "{result:?}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn several_keys_abort_on_a_loss_by_default_and_continue_when_asked() {
    let server = server();
    let locker = locker(&server).await;
    let slow_body = |fences: Vec<lock_core::Fence>| async move {
        let keys: Vec<_> = fences.iter().map(|f| f.key().to_owned()).collect();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok::<_, AppError>(keys)
    };
    let aborted = locker
        .lock_all(["account:2", "account:1"])
        .lease(Duration::from_millis(300))
        .with_lock(slow_body)
        .await;
    assert!(
        matches!(aborted, Err(AppError::Lock(LockError::Lost { .. }))),
        "{aborted:?}"
    );
    let finished = locker
        .lock_all(["account:2", "account:1"])
        .lease(Duration::from_millis(300))
        .on_lost(OnLost::Continue)
        .with_lock(slow_body)
        .await
        .unwrap();
    // The fences come in lock order.
    assert_eq!(finished, ["account:1", "account:2"]);
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A job every instance starts and one runs: `skip_if_busy` turns a busy lock into `Ok(None)`
/// without running the body, and runs it once the lock is free.
#[tokio::test]
async fn skip_if_busy_skips_the_body_while_another_holds_the_lock_and_runs_it_when_free() {
    let server = server();
    let locker = locker(&server).await;
    let other = common::locker(&server).await;
    let ran = Arc::new(AtomicBool::new(false));
    let job = |ran: Arc<AtomicBool>| {
        move |_| async move {
            ran.store(true, Ordering::SeqCst);
            Ok::<_, AppError>("ran")
        }
    };
    let held = other.lock("report:daily").await.unwrap();
    let skipped = locker
        .lock("report:daily")
        .skip_if_busy()
        .with_lock(job(ran.clone()))
        .await;
    assert!(matches!(skipped, Ok(None)), "{skipped:?}");
    assert!(!ran.load(Ordering::SeqCst), "a skipped body must not run");
    // The guard form says the same.
    let guard = locker.lock("report:daily").skip_if_busy().await;
    assert!(matches!(guard, Ok(None)), "{guard:?}");
    held.release().await.unwrap();
    let done = locker
        .lock("report:daily")
        .skip_if_busy()
        .with_lock(job(ran.clone()))
        .await;
    assert!(matches!(done, Ok(Some("ran"))), "{done:?}");
    assert!(ran.load(Ordering::SeqCst));
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}

/// Only `Busy` is a skip: any other lock failure is still an error.
#[tokio::test]
async fn skip_if_busy_still_reports_the_other_lock_errors() {
    let server = server();
    let locker = locker(&server).await;
    let invalid = locker
        .lock("")
        .skip_if_busy()
        .with_lock(|_| async { Ok::<_, LockError>(()) })
        .await;
    assert!(
        matches!(invalid, Err(LockError::InvalidKey { .. })),
        "{invalid:?}"
    );
    // A lock lost under the body is the body's error (`OnLost::Abort`), not a skip.
    let lost = locker
        .lock("report:lost")
        .lease(Duration::from_millis(200))
        .skip_if_busy()
        .with_lock(|_| async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Ok::<_, AppError>(())
        })
        .await;
    assert!(
        matches!(lost, Err(AppError::Lock(LockError::Lost { .. }))),
        "{lost:?}"
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// Without `wait` a skip tries once (the locker's default wait does not apply); with `wait`
/// it tries that long before skipping.
#[tokio::test]
async fn skip_if_busy_tries_once_unless_a_wait_is_given() {
    let server = server();
    let locker = common::locker(&server).await;
    let other = common::locker(&server).await;
    let held = other.lock("report:wait").await.unwrap();
    let started = Instant::now();
    let skipped = locker.lock("report:wait").skip_if_busy().await.unwrap();
    assert!(skipped.is_none());
    assert!(started.elapsed() < Duration::from_secs(1), "tried once");
    let release_soon = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        held.release().await.unwrap();
    });
    let taken = locker
        .lock("report:wait")
        .wait(Duration::from_secs(5))
        .skip_if_busy()
        .with_lock(|_| async { Ok::<_, LockError>(7) })
        .await;
    assert!(matches!(taken, Ok(Some(7))), "{taken:?}");
    release_soon.await.unwrap();
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}

#[tokio::test]
async fn skip_if_busy_of_several_keys_skips_when_any_is_busy() {
    let server = server();
    let locker = locker(&server).await;
    let other = common::locker(&server).await;
    let held = other.lock("account:2").await.unwrap();
    let skipped = locker
        .lock_all(["account:1", "account:2"])
        .skip_if_busy()
        .with_lock(|_| async { Ok::<_, LockError>(()) })
        .await;
    assert!(matches!(skipped, Ok(None)), "{skipped:?}");
    held.release().await.unwrap();
    let guard = locker
        .lock_all(["account:1", "account:2"])
        .skip_if_busy()
        .await
        .unwrap();
    let guard = guard.expect("free keys are taken");
    assert_eq!(guard.keys().collect::<Vec<_>>(), ["account:1", "account:2"]);
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}
