//! [`LockWatch`]: whether a held lock is still held, for code that does not hold its guard.

use std::sync::Arc;

use crate::error::{LockError, LostReason};
use crate::held::Hold;

/// A handle that watches one acquisition: is it still held, and why was it lost. Made by
/// [`LockGuard::watch`](crate::LockGuard::watch); cheap to clone, `Send + Sync`, and it only
/// observes (no Redis round trip, and the lock is released by its guard as usual).
///
/// The hold ends when the lock is lost (a renewal found another owner or no key, the lease
/// ran out, `max_hold` passed) or when its guard is released or dropped: a watch that
/// outlives the guard then says the lock is no longer held, without calling it lost. It keeps
/// the acquisition's local record (a few hundred bytes, not the lock) while it lives, as a
/// [`Fence`](crate::Fence) does.
#[derive(Clone)]
pub struct LockWatch {
    held: Arc<Hold>,
}

impl std::fmt::Debug for LockWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockWatch")
            .field("key", &self.held.key())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl LockWatch {
    pub(crate) fn new(held: Arc<Hold>) -> Self {
        Self { held }
    }

    /// The user's key.
    pub fn key(&self) -> &str {
        self.held.key()
    }

    /// Whether the lock is still held as far as this process knows: not lost, its last
    /// confirmed lease not run out, and its guard not released. As
    /// [`LockGuard::is_held`](crate::LockGuard::is_held) while the guard lives.
    pub fn is_held(&self) -> bool {
        !self.held.is_ended() && !self.held.is_lost()
    }

    /// Resolves when the lock is lost, or when its guard is released or dropped: the hold is
    /// over either way ([`lost_reason`](Self::lost_reason) tells which). Resolves at once if
    /// it already is.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) {
        self.held.lost().await;
    }

    /// Why the lock was lost, once it is; `None` while it is held, and after a release of a
    /// lock that was not lost.
    pub fn lost_reason(&self) -> Option<LostReason> {
        if self.held.is_ended() {
            // The validity clock stops with the hold: only a loss marked before counts.
            return self.held.lost_reason();
        }
        if !self.held.is_lost() {
            return None;
        }
        // Marks it lost with the clock's reason if nothing marked it yet.
        match self.held.lost_error() {
            LockError::Lost { reason, .. } => Some(reason),
            _ => None,
        }
    }
}
