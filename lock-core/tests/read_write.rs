//! Read-write locks against a real redis-server: readers share, a writer excludes everyone, a
//! waiting writer is not starved, reentrancy rules, per-reader leases.

mod common;

use std::time::Duration;

use common::{locker, server};
use lock_core::LockError;

#[tokio::test]
async fn readers_share_and_a_writer_waits_for_all_of_them() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let c = locker(&server).await;
    let r1 = a.read("cat").wait(Duration::ZERO).await.unwrap();
    let r2 = b.read("cat").wait(Duration::ZERO).await.unwrap();
    assert!(r1.is_shared() && r2.is_shared());
    let busy = c.write("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    let busy = c.lock("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    r1.release().await.unwrap();
    let busy = c.write("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    let writer = tokio::spawn({
        let c = c.clone();
        async move { c.write("cat").wait(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A writer waits: a new reader must not overtake it.
    let busy = a.read("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    r2.release().await.unwrap();
    let w = writer.await.unwrap().unwrap();
    assert!(!w.is_shared());
    assert!(w.fencing_token().await.unwrap() > 0);
    let busy = b.read("cat").wait(Duration::ZERO).await.unwrap_err();
    assert!(matches!(busy, LockError::Busy { .. }), "{busy}");
    let reader = tokio::spawn({
        let b = b.clone();
        async move { b.read("cat").wait(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    w.release().await.unwrap();
    let r = reader.await.unwrap().unwrap();
    assert!(matches!(
        r.fencing_token().await,
        Err(LockError::NotExclusive { .. })
    ));
    r.release().await.unwrap();
    assert!(
        server
            .keys("lock:*")
            .iter()
            .all(|k| !k.contains(":lock:") && !k.contains(":readers:")),
        "{:?}",
        server.keys("lock:*")
    );
}

#[tokio::test]
async fn reentrancy_read_in_write_is_nested_write_in_read_is_refused() {
    let server = server();
    let a = locker(&server).await;
    let w = a.write("k").await.unwrap();
    let r = a.read("k").wait(Duration::ZERO).await.unwrap();
    assert!(
        !r.is_shared(),
        "a read inside a write shares the write lock"
    );
    r.release().await.unwrap();
    w.release().await.unwrap();
    let r = a.read("k").await.unwrap();
    let again = a.read("k").wait(Duration::ZERO).await.unwrap();
    let err = a.write("k").wait(Duration::from_secs(1)).await.unwrap_err();
    assert!(matches!(err, LockError::WriteInsideRead { .. }), "{err}");
    again.release().await.unwrap();
    r.release().await.unwrap();
    a.write("k")
        .wait(Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn lock_all_takes_every_key_or_none() {
    let server = server();
    let a = locker(&server).await;
    let b = locker(&server).await;
    let both = a
        .lock_all(["y", "x", "y"])
        .wait(Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(both.keys().collect::<Vec<_>>(), ["x", "y"]);
    assert!(b.is_locked("x").await.unwrap() && b.is_locked("y").await.unwrap());
    both.release().await.unwrap();
    let held = b.lock("y").await.unwrap();
    let err = a
        .lock_all(["x", "y"])
        .wait(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Busy { ref key, .. } if key == "y"),
        "{err}"
    );
    assert!(!b.is_locked("x").await.unwrap(), "x was rolled back");
    held.release().await.unwrap();
    assert!(matches!(
        a.lock_all(Vec::<String>::new()).await,
        Err(LockError::NoKeys)
    ));
}

/// A renewal tells why a read lock is gone: the reader's own lease ended (its entry is still
/// there), or the lock key now holds something else than the readers' marker.
#[tokio::test]
async fn a_lost_read_lock_says_why() {
    let server = server();
    let locker = common::locker_with_lease(&server, Duration::from_millis(300)).await;
    let reader = locker.read("cat").await.unwrap();
    let readers = server
        .keys("lock:*")
        .into_iter()
        .find(|k| k.contains(":readers:"))
        .unwrap();
    let tokens: Vec<String> = server.cmd(&["ZRANGE", &readers, "0", "-1"]);
    // The reader's lease ended as far as Redis knows (its score is in the past).
    let _: i64 = server.cmd(&["ZADD", &readers, "XX", "1", &tokens[0]]);
    tokio::time::timeout(Duration::from_secs(2), reader.lost())
        .await
        .expect("the renewal notices");
    let lost = reader.release().await.unwrap_err();
    assert_eq!(common::lost_reason(lost), lock_core::LostReason::Expired);

    let reader = locker.read("cat").await.unwrap();
    let lock = common::lock_key(&server, "cat");
    let _: () = server.cmd(&["SET", &lock, "a-writer", "PX", "60000"]);
    tokio::time::timeout(Duration::from_secs(2), reader.lost())
        .await
        .expect("the renewal notices");
    let lost = reader.release().await.unwrap_err();
    assert_eq!(common::lost_reason(lost), lock_core::LostReason::TakenOver);
    let _: () = server.cmd(&["DEL", &lock]);
    common::assert_nothing_left(&server, &[&locker]).await;
}
