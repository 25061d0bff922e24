//! Releasing locks in Redis: the compare-and-delete call, and the background releaser that
//! serves guards dropped without [`LockGuard::release`](crate::LockGuard::release) and
//! acquire attempts abandoned mid-flight.
//!
//! Drop cannot await, so it sends a job over an unbounded channel; sending needs no runtime
//! and never blocks or panics. If the runtime is gone, the job is dropped and the key expires
//! with its lease.

use std::sync::Arc;

use redis::aio::ConnectionManager;
use tokio::sync::mpsc;

use crate::held::Held;
use crate::key::RedisKeys;
use crate::scripts;

/// Work for the background releaser.
#[derive(Debug)]
pub(crate) enum ReleaseJob {
    /// The outermost guard of a held lock was dropped.
    Held(Arc<Held>),
    /// An acquire attempt with this token may have landed after its caller gave up (a timed
    /// out or cancelled command still runs on the server): delete the lock if it holds it.
    Ghost { keys: RedisKeys, token: String },
}

/// Runs `release.lua` for a token; `true` when the key was ours and is now deleted.
pub(crate) async fn release_token(
    conn: &mut ConnectionManager,
    keys: &RedisKeys,
    token: &str,
) -> redis::RedisResult<bool> {
    let released: i64 = scripts::RELEASE
        .key(&keys.lock)
        .arg(token)
        .arg(&keys.channel)
        .invoke_async(conn)
        .await?;
    Ok(released == 1)
}

/// Starts the releaser task; it ends when every sender is gone (the locker was dropped).
pub(crate) fn start(conn: ConnectionManager) -> mpsc::UnboundedSender<ReleaseJob> {
    let (tx, mut rx) = mpsc::unbounded_channel::<ReleaseJob>();
    tokio::spawn(async move {
        while let Some(job) = rx.recv().await {
            let mut conn = conn.clone();
            // Each release runs on its own so one slow call does not delay the others.
            tokio::spawn(async move {
                match job {
                    ReleaseJob::Held(held) => {
                        match release_token(&mut conn, &held.keys, &held.token).await {
                            Ok(true) => {
                                tracing::debug!(key = %held.key, "lock released (dropped guard)")
                            }
                            Ok(false) => held.mark_lost("released after it had expired"),
                            Err(error) => {
                                tracing::warn!(key = %held.key, %error, "background release failed; the lock expires with its lease")
                            }
                        }
                        drop(held.take_permit());
                    }
                    ReleaseJob::Ghost { keys, token } => {
                        if let Ok(true) = release_token(&mut conn, &keys, &token).await {
                            tracing::debug!(lock = %keys.lock, "removed a lock taken by an abandoned acquire");
                        }
                    }
                }
            });
        }
    });
    tx
}
