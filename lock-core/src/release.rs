//! Releasing locks in Redis: the compare-and-delete call, and the background releaser that
//! serves guards dropped without [`LockGuard::release`](crate::LockGuard::release) and
//! acquire attempts abandoned mid-flight.
//!
//! Drop cannot await, so it sends a job over an unbounded channel; sending needs no runtime
//! and never blocks or panics. If the runtime is gone, the job is dropped and the key expires
//! with its lease.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::held::Held;
use crate::key::RedisKeys;
use crate::store::Store;

/// Work for the background releaser.
#[derive(Debug)]
pub(crate) enum ReleaseJob {
    /// The outermost guard of a held lock was dropped.
    Held(Arc<Held>),
    /// An acquire attempt with this token may have landed after its caller gave up (a timed
    /// out or cancelled command still runs on the server): delete the lock if it holds it.
    Ghost { keys: RedisKeys, token: String },
}

/// Starts the releaser task; it ends when every sender is gone (the locker was dropped).
pub(crate) fn start(store: Arc<Store>) -> mpsc::UnboundedSender<ReleaseJob> {
    let (tx, mut rx) = mpsc::unbounded_channel::<ReleaseJob>();
    tokio::spawn(async move {
        while let Some(job) = rx.recv().await {
            let store = store.clone();
            // Each release runs on its own so one slow call does not delay the others.
            tokio::spawn(async move {
                match job {
                    ReleaseJob::Held(held) => {
                        match store.release(&held.keys, &held.token).await {
                            Ok(r) if r.ours => {
                                held.slot.released(r.others_waiting);
                                tracing::debug!(key = %held.key, "lock released (dropped guard)")
                            }
                            Ok(_) => held.mark_lost("released after it had expired"),
                            Err(error) => {
                                tracing::warn!(key = %held.key, %error, "background release failed; the lock expires with its lease")
                            }
                        }
                        drop(held.take_permit());
                    }
                    ReleaseJob::Ghost { keys, token } => {
                        // The attempt's command may still be on its way: try a few times.
                        for delay in [0, 100, 500, 2000] {
                            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                            match store.release(&keys, &token).await {
                                Ok(r) if r.ours => {
                                    tracing::debug!(lock = %keys.lock, "removed a lock taken by an abandoned acquire");
                                    break;
                                }
                                Ok(_) if delay >= 500 => break,
                                _ => {}
                            }
                        }
                    }
                }
            });
        }
    });
    tx
}
