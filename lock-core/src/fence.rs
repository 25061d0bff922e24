//! [`Fence`]: the fencing token of a held lock, issued on first use.
//!
//! An acquire is a bare `SET NX PX` in Redis; only a caller that asks for the token pays one
//! more round trip (`fence.lua`), once per acquisition. The token is issued only while the
//! lock is still held by this acquisition, so tokens increase in the order of the holders.

use std::sync::Arc;

use crate::error::{LockError, LostReason};
use crate::held::Hold;
use crate::local::LocalLocks;
use crate::metrics::{self, Operation};

/// A handle to the fencing token of one acquisition, for code that does not hold the guard
/// (a handler behind the tower layer, a task the work is handed to). Cheap to clone.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locker: lock_core::Locker) -> Result<(), lock_core::LockError> {
/// let guard = locker.lock("inventory:42").await?;
/// let fence = guard.fence();
/// let token = fence.token().await?; // the same token as `guard.fencing_token().await?`
/// # let _ = token;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
pub struct Fence {
    local: Arc<LocalLocks>,
    held: Arc<Hold>,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("key", &self.held.key())
            .field("token", &self.held.fence())
            .finish_non_exhaustive()
    }
}

impl Clone for Fence {
    fn clone(&self) -> Self {
        Self::new(self.local.clone(), self.held.clone())
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        self.held.count_fence(false);
    }
}

impl Fence {
    pub(crate) fn new(local: Arc<LocalLocks>, held: Arc<Hold>) -> Self {
        held.count_fence(true);
        Self { local, held }
    }

    /// The user's key.
    pub fn key(&self) -> &str {
        self.held.key()
    }

    /// The fencing token of this acquisition: strictly greater than every token issued before
    /// for the same key. Issued by Redis on the first call (one round trip, only while the lock
    /// is still ours); every later call, and every nested guard of the acquisition, gets the
    /// same token without a round trip.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the lock as it was. Redis may still have issued a token
    /// that nobody receives: the next call asks again and gets a larger one (tokens only need
    /// to increase).
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] when the lock is no longer ours before the token was issued (a holder
    /// that lost its lock gets no token); [`LockError::Backend`] when Redis fails (ask again);
    /// [`LockError::NotExclusive`] for a read lock or a semaphore permit.
    pub async fn token(&self) -> Result<u64, LockError> {
        if !self.held.kind().is_exclusive() {
            return Err(LockError::NotExclusive {
                key: self.held.key().to_owned(),
            });
        }
        if let Some(fence) = self.held.fence() {
            return Ok(fence);
        }
        let fence = self.issue().await?;
        Ok(self.held.keep_fence(fence))
    }

    async fn issue(&self) -> Result<u64, LockError> {
        let held = &self.held;
        if held.is_lost() {
            return Err(held.lost_error());
        }
        let keys = held.redis_keys();
        match self
            .local
            .store
            .issue_fence(&keys, &held.token().stored())
            .await
        {
            // Still valid once issued: with RedLock the token is written back to a majority
            // after the nodes issued it, and must be in place before any later holder's.
            Ok(Some(fence)) if !held.is_lost() => Ok(fence),
            Ok(Some(_)) => Err(held.lost_error()),
            Ok(None) => {
                // fence.lua does not tell an absent key from another token.
                held.mark_lost(LostReason::Unknown);
                Err(held.lost_error())
            }
            // fence.lua reads the lock key in a pcall: only the fence key can have another type.
            Err(error) => {
                metrics::backend_error(Operation::Fence, &error);
                Err(LockError::backend_at(
                    keys.fence().to_string(),
                    held.key(),
                    error,
                ))
            }
        }
    }
}
