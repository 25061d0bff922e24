//! Without `locker = ..` the macro uses `Locker::global()`. A test binary of its own, because
//! the global locker is process-wide and can be set only once.

use lock_core::{distributed_lock, LockError, Locker};
use lock_testkit::RedisServer;

#[distributed_lock(key = "global:<id>", wait = "1s")]
async fn work(id: u32) -> Result<bool, LockError> {
    // The lock is taken on the global locker.
    Locker::global()?.is_locked(&format!("global:{id}")).await
}

#[tokio::test]
async fn falls_back_to_the_global_locker() {
    // No locker named, none set: NotConfigured, and the body does not run.
    match work(1).await {
        Err(LockError::NotConfigured) => {}
        other => panic!("expected NotConfigured, got {other:?}"),
    }

    let server = RedisServer::start().expect("start redis-server");
    let locker = Locker::builder()
        .url(server.url())
        .build()
        .await
        .expect("connect");
    Locker::set_global(locker.clone()).expect("first set_global");

    assert!(work(1).await.expect("locked on the global locker"));
    assert!(!locker.is_locked("global:1").await.unwrap());
}
