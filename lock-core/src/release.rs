//! Releasing locks in Redis: the release of a held lock that [`LocalLocks::finish`] did not
//! hand over, the drop-guard that hands an interrupted release to the background, and the
//! background releaser that finishes guards dropped without
//! [`LockGuard::release`](crate::LockGuard::release) and acquire attempts abandoned
//! mid-flight.
//!
//! Drop cannot await, so it sends a job over an unbounded channel; sending needs no runtime
//! and never blocks or panics. If the runtime is gone, the job is dropped and the key expires
//! with its lease.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::Instrument;

use crate::error::{LockError, LostReason};
use crate::held::Hold;
use crate::in_flight::{InFlight, Working};
use crate::key::{RedisKeys, ShownKey};
use crate::local::LocalLocks;
use crate::metrics::{self, ReleaseOutcome};
use crate::store::Store;
use crate::token::Token;

/// Work for the background releaser.
#[derive(Debug)]
pub(crate) enum ReleaseJob {
    /// The outermost guard of a held lock was dropped, or its release was interrupted: finish
    /// it (see [`LocalLocks::finish`]).
    Finish {
        local: Arc<LocalLocks>,
        held: Arc<Hold>,
    },
    /// An acquire attempt with this token may have landed after its caller gave up (a timed
    /// out or cancelled command still runs on the server): delete the lock if it holds it,
    /// or take the attempt out of the line it stands in. `in_flight`: a try may still be on
    /// its way, so a release that finds nothing tries again a few times; otherwise the last
    /// try was answered, and one answer from Redis settles it.
    Abandoned {
        keys: RedisKeys,
        token: Token,
        in_flight: bool,
    },
    /// An exclusive acquire with this token joined the waiting writers and stopped waiting
    /// without the lock: take it out, so that readers need not let it go first.
    Withdraw { keys: RedisKeys, token: Token },
}

/// The sending side of the background releaser. Every job counts as work under way
/// ([`InFlight`]) from the moment it is sent until it has run.
#[derive(Debug, Clone)]
pub(crate) struct Releaser {
    jobs: mpsc::UnboundedSender<(ReleaseJob, Working)>,
    in_flight: InFlight,
}

impl Releaser {
    /// Queues `job`. Never blocks, never panics; a job sent after the releaser stopped (no
    /// runtime any more) is dropped, and its key expires with its lease.
    pub(crate) fn send(&self, job: ReleaseJob) {
        let _ = self.jobs.send((job, self.in_flight.enter()));
    }
}

/// Releases in Redis a lock whose outermost guard has left (the last step of
/// [`LocalLocks::finish`], which then settles it locally with `others_waiting`). `Ok` only
/// when this release deleted the key while it was still ours; `Lost` when it had been lost before (its
/// key, if it holds someone else's token, is left untouched). Runs in a `lock.release` span
/// (key, outcome) inside the lock's `lock.hold` span, and ends the latter with the outcome.
pub(crate) async fn release_held(store: &Store, held: &Hold) -> Released {
    let hold = held.take_hold_span();
    // Disabled spans cost no formatting: the key is only rendered for a subscriber that wants
    // the span.
    let span = match &hold {
        Some(hold) => {
            tracing::debug_span!(parent: hold, "lock.release", key = %ShownKey(held.key()), outcome = tracing::field::Empty)
        }
        None => {
            tracing::debug_span!("lock.release", key = %ShownKey(held.key()), outcome = tracing::field::Empty)
        }
    };
    // Not wrapped in `Instrumented` without a subscriber for the span: the wrapper cost a
    // copy of the release's future and a span entered and left at every poll.
    let released = if span.is_disabled() {
        release_in_redis(store, held).await
    } else {
        release_in_redis(store, held).instrument(span.clone()).await
    };
    let outcome = match &released.result {
        Ok(()) => ReleaseOutcome::Released,
        Err(LockError::Lost { .. }) => ReleaseOutcome::Lost,
        Err(_) => ReleaseOutcome::Failed,
    };
    span.record("outcome", outcome.as_str());
    end_hold(hold, outcome);
    metrics::released(held.kind(), outcome, held.held_since());
    released
}

/// Records how the hold ended on its `lock.hold` span, and closes it.
pub(crate) fn end_hold(hold: Option<tracing::Span>, outcome: ReleaseOutcome) {
    if let Some(hold) = hold {
        hold.record("outcome", outcome.as_str());
    }
}

/// What a release in Redis answered.
#[derive(Debug)]
pub(crate) struct Released {
    /// The answer for the holder.
    pub(crate) result: Result<(), LockError>,
    /// Whether other lockers waited (`None`: the release failed, so nobody was told).
    pub(crate) others_waiting: Option<bool>,
    /// The Redis call failed in a way that may pass: the key may still hold the token (also
    /// for a lock already lost by its clock, whose key a late renewal or extension may have
    /// kept), so the release is worth trying again in the background.
    pub(crate) retry: bool,
}

/// The release in Redis and its logs.
async fn release_in_redis(store: &Store, held: &Hold) -> Released {
    // Includes the confirmed lease having run out. A lock the shutdown marked lost (to stop
    // its holder before the key goes) is still ours until Redis says otherwise.
    let was_lost = held.is_lost() && held.lost_reason() != Some(LostReason::Shutdown);
    // Lost by the local clock alone (not by what Redis said): a key that still holds the
    // token proves the lock was ours up to this release.
    let by_clock_only = matches!(
        held.lost_reason(),
        None | Some(LostReason::Expired | LostReason::MaxHold)
    );
    let keys = held.redis_keys();
    // An earlier release of this lock may have run without its answer reaching us (its future
    // was dropped): what this one finds then cannot tell our delete from a loss.
    let again = held.release_sent();
    let result = store.release(&keys, held.token()).await;
    let others_waiting = result.as_ref().ok().map(|r| r.others_waiting);
    let retry = matches!(&result, Err(error) if error.is_transient());
    let released = match result {
        Ok(reply) if reply.ours && !was_lost => Ok(()),
        // Lost by the local clock alone, yet the key still held the token, which this release
        // deleted: no other holder was inside since the grant. `Lost`, as documented, but
        // marked, so that `with_lock` keeps a body's result (T21 assumes another holder may
        // have been inside; here Redis proved otherwise).
        Ok(reply) if reply.ours && by_clock_only => {
            held.mark_released_ours();
            Err(held.lost_error())
        }
        // Already lost before the release: that is the answer, whatever the clean-up met.
        Ok(_) | Err(_) if was_lost => Err(held.lost_error()),
        Ok(reply) => {
            held.mark_lost(match reply.gone {
                Some(gone) if !again => held.reason_for(gone),
                _ => LostReason::Unknown,
            });
            Err(held.lost_error())
        }
        Err(error) => Err(LockError::backend_on(&keys, held.key(), error)),
    };
    // The clock is read only for a subscriber that may log the release.
    if released.is_ok() && tracing::level_enabled!(tracing::Level::INFO) {
        let held_for = held.held_for();
        // A hold longer than a whole lease is worth an operator's eye (a long critical
        // section, or one that hung); ordinary ones are debug chatter.
        if held_for >= held.mode().lease() {
            tracing::info!(key = %ShownKey(held.key()), ?held_for, "lock released after a long hold");
        } else {
            tracing::debug!(key = %ShownKey(held.key()), ?held_for, "lock released");
        }
    }
    Released {
        result: released,
        others_waiting,
        retry,
    }
}

/// What a [`ReleaseOnDrop`] hands to the background releaser.
pub(crate) trait Pending {
    fn job(&mut self) -> ReleaseJob;
}

/// A held lock whose outermost guard is being finished. Borrowed, and cloned only for the
/// background releaser: the locker's `Arc` is shared by all its tasks, and counting it up and
/// down on every release made the cores pass its count between them.
impl Pending for (&Arc<LocalLocks>, &Arc<Hold>) {
    fn job(&mut self) -> ReleaseJob {
        ReleaseJob::Finish {
            local: self.0.clone(),
            held: self.1.clone(),
        }
    }
}

/// An acquire attempt whose command may still run on the server.
#[derive(Debug)]
pub(crate) struct Attempt<'a> {
    pub(crate) keys: &'a RedisKeys,
    pub(crate) token: Token,
    /// A try with `token` went out (it may have landed, whatever its reply said).
    pub(crate) sent: bool,
    /// A try with `token` may still be on its way or running: sent and not answered (or
    /// nothing is known). False only between the tries of a waiter that stands in a line.
    pub(crate) in_flight: bool,
}

impl<'a> Attempt<'a> {
    pub(crate) fn new(keys: &'a RedisKeys, token: Token) -> Self {
        Self {
            keys,
            token,
            sent: false,
            in_flight: true,
        }
    }

    /// Continues under a fresh token (RedLock: the undo of a failed try runs in the background
    /// under the old one).
    pub(crate) fn renew_token(&mut self, token: Token) {
        self.token = token;
        self.sent = false;
        self.in_flight = true;
    }
}

impl Pending for Attempt<'_> {
    fn job(&mut self) -> ReleaseJob {
        ReleaseJob::Abandoned {
            keys: self.keys.clone(),
            token: self.token.clone(),
            in_flight: self.in_flight,
        }
    }
}

/// An exclusive acquire that joined the waiting writers of its lock (see
/// `scripts/acquire.lua`) under `token`.
#[derive(Debug)]
pub(crate) struct Waiting<'a> {
    pub(crate) keys: &'a RedisKeys,
    pub(crate) token: Token,
}

impl Pending for Waiting<'_> {
    fn job(&mut self) -> ReleaseJob {
        ReleaseJob::Withdraw {
            keys: self.keys.clone(),
            token: self.token.clone(),
        }
    }
}

/// Hands a release to the background releaser when dropped while armed: the future doing it
/// was dropped mid-call, or an acquire's outcome is unknown.
pub(crate) struct ReleaseOnDrop<'a, P: Pending> {
    releaser: &'a Releaser,
    pub(crate) target: P,
    armed: bool,
}

impl<'a, P: Pending> ReleaseOnDrop<'a, P> {
    /// Disarmed until [`arm`](Self::arm).
    pub(crate) fn new(releaser: &'a Releaser, target: P) -> Self {
        Self {
            releaser,
            target,
            armed: false,
        }
    }

    pub(crate) fn arm(&mut self) {
        self.armed = true;
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl<P: Pending> Drop for ReleaseOnDrop<'_, P> {
    fn drop(&mut self) {
        if self.armed {
            self.releaser.send(self.target.job());
        }
    }
}

/// Starts the releaser task; it ends when every sender is gone (the locker was dropped).
/// Its jobs count in `in_flight` until they have run.
pub(crate) fn start(store: Arc<Store>, in_flight: InFlight) -> Releaser {
    let (tx, mut rx) = mpsc::unbounded_channel::<(ReleaseJob, Working)>();
    tokio::spawn(async move {
        while let Some((job, working)) = rx.recv().await {
            let store = store.clone();
            // Each release runs on its own so one slow call does not delay the others.
            tokio::spawn(async move {
                let _working = working;
                match job {
                    ReleaseJob::Finish { local, held } => match local.finish(&held).await {
                        Ok(()) => {}
                        // Logged when it was marked lost.
                        Err(LockError::Lost { .. }) => {}
                        Err(error) => {
                            tracing::warn!(key = %ShownKey(held.key()), %error, "background release failed; the lock expires with its lease")
                        }
                    },
                    ReleaseJob::Withdraw { keys, token } => {
                        store.withdraw(&keys, &token.stored()).await
                    }
                    ReleaseJob::Abandoned {
                        keys,
                        token,
                        in_flight,
                    } => {
                        // The attempt's command may still be on its way: try a few times.
                        // Answered (a waiter between the tries of a line), one answer is
                        // enough; a failed call is tried again all the same.
                        for delay in [0, 100, 500, 2000] {
                            tokio::time::sleep(Duration::from_millis(delay)).await;
                            match store.release(&keys, &token).await {
                                Ok(r) if r.ours => {
                                    tracing::debug!(lock = %ShownKey(&keys.lock), "removed a lock taken by an abandoned acquire");
                                    break;
                                }
                                Ok(_) if !in_flight || delay >= 500 => break,
                                Err(error) if delay == 2000 => {
                                    tracing::warn!(lock = %ShownKey(&keys.lock), %error, "release of an unused lock failed; it expires with its lease");
                                }
                                _ => {}
                            }
                        }
                    }
                }
            });
        }
    });
    Releaser {
        jobs: tx,
        in_flight,
    }
}
