//! Lock, work, unlock: the smallest complete use of the kit.
//!
//! Run with `cargo run -p lock-core --example quickstart`. It uses `REDIS_URL` when set and
//! otherwise starts its own `redis-server` on a free port.

use std::time::Duration;

use lock_core::{LockError, Locker};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // Kept alive until the end of main: dropping it stops the server.
    let own_server = match std::env::var("REDIS_URL") {
        Ok(_) => None,
        Err(_) => match lock_testkit::RedisServer::start() {
            Ok(server) => Some(server),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        },
    };
    let url = own_server
        .as_ref()
        .map(|s| s.url())
        .or_else(|| std::env::var("REDIS_URL").ok())
        .unwrap_or_default();
    let locker = Locker::connect(&url).await?;

    let guard = locker
        .lock("inventory:42")
        .wait(Duration::from_secs(3))
        .await?;
    println!(
        "acquired {} with fencing token {}",
        guard.key(),
        guard.fencing_token().await.unwrap()
    );

    // Another task is another owner: it cannot get the lock while we hold it.
    let other = locker.clone();
    let attempt =
        tokio::spawn(async move { other.lock("inventory:42").wait(Duration::ZERO).await });
    match attempt.await {
        Ok(Err(e)) if e.is_busy() => println!("a second task was refused: {e}"),
        other => println!("unexpected: {other:?}"),
    }

    guard.release().await?;
    println!(
        "released; locked now: {}",
        locker.is_locked("inventory:42").await?
    );
    Ok(())
}
