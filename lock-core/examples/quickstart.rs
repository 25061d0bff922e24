//! The smallest complete use of `lock-core`: connect, lock a key, take the fencing token,
//! release. Needs only `lock-core`, `tokio` and a running Redis:
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p lock-core --example quickstart
//! ```
//!
//! `REDIS_URL` defaults to `redis://127.0.0.1:6379`. No Redis at hand? `redis-server --port 6390
//! --save ''` in another terminal, then `REDIS_URL=redis://127.0.0.1:6390`.

use std::time::Duration;

use lock_core::{LockError, Locker};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("REDIS_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    run(&url).await
}

/// The quickstart against the Redis at `url` (lock-core's `tests/quickstart.rs` runs it against
/// a server of its own, so this example cannot rot).
pub(crate) async fn run(url: &str) -> Result<(), LockError> {
    // One Locker per process: it owns the connections and the watchdog task. Cloning it is cheap.
    let locker = Locker::connect(url).await?;

    // Wait up to 3 s for the lock; the watchdog renews its 30 s lease while the guard lives.
    let guard = locker
        .lock("inventory:42")
        .wait(Duration::from_secs(3))
        .await?;
    // Only one task in all processes sharing this Redis runs here for "inventory:42".
    // Hand the fencing token to the store you write to, so a holder that lost its lock
    // without noticing (a long pause) cannot overwrite a later holder's work.
    let token = guard.fencing_token().await?;
    println!("holding {} with fencing token {token}", guard.key());

    // A second acquire that does not wait finds the key taken (spawned: a lock is reentrant
    // for the task that holds it).
    let other = locker.clone();
    let contender =
        tokio::spawn(async move { other.lock("inventory:42").wait(Duration::ZERO).await });
    match contender.await {
        Ok(Err(error)) if error.is_busy() => println!("another task: {error}"),
        Ok(Err(error)) => return Err(error),
        other => println!("another task, unexpectedly: {other:?}"),
    }

    // Release explicitly to learn whether the lock was still ours (`LockError::Lost` if not);
    // dropping the guard also releases it, in the background.
    guard.release().await?;
    println!(
        "released; locked now: {}",
        locker.is_locked("inventory:42").await?
    );
    Ok(())
}
