//! Review of the hold's end taking the extension turn (4ba920d, P1's fix) and the turn itself
//! (07fedbc). Each test names its finding and fails on the code it was written against.

use crate::common;

use std::time::Duration;

/// Finding Q1 (a hang): `LocalLocks::finish` waits, without a bound, for the hold's extension
/// turn once any extension took it. The turn is a `tokio::sync::Mutex` guard kept inside the
/// `extend` future for as long as that future lives; a future polled once (the turn taken,
/// the command sent) and then leaked (`mem::forget`, safe Rust; the borrow of the guard ends)
/// keeps the turn for ever. Before 4ba920d the release did not look at the turn and returned;
/// now `release()` never returns (and a dropped guard's background release never ends, so
/// `shutdown` times out too). The same bound is missing for a turn held by a wedged task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn q1_a_leaked_extend_future_does_not_hang_the_release() {
    let server = common::server();
    // The end of a hold waits for the turn up to twice the command timeout and a second.
    let locker = lock_core::Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let guard = locker.lock("q1").await.unwrap();
    {
        let mut ext = Box::pin(guard.extend(Duration::from_secs(20)));
        // One poll: the turn is free, so it is taken, and the extension is sent.
        tokio::select! {
            biased;
            _ = &mut ext => {}
            _ = std::future::ready(()) => {}
        }
        std::mem::forget(ext);
    }
    let released = tokio::time::timeout(Duration::from_secs(5), guard.release()).await;
    let shut = locker.shutdown(Duration::from_secs(2)).await;
    assert!(
        matches!(released, Ok(Ok(()))),
        "release() of a guard whose extend future was leaked after one poll did not return \
         within 5 s (finish waits for the extension turn for ever): {released:?}; shutdown: \
         {shut:?}"
    );
    assert!(shut.is_ok(), "shutdown: {shut:?}");
}
