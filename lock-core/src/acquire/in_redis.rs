//! The acquire in Redis: tries, and sleeps between them (see [`Wait`]) until the lock is won
//! or the wait runs out.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::FutureExt as _;

use tokio::time::Instant;

use super::local_order::Handoff;
use super::wait::{Alarms, Wait};
use super::{Acquire, Seen, When};
use crate::backend_error::BackendError;
use crate::error::LockError;
use crate::held::Grant;
use crate::holder;
use crate::in_box::in_box;
use crate::key::RedisKeys;
use crate::kind::Kind;
use crate::limits;
use crate::release::Attempt;
use crate::store::{AcquireArgs, Outcome};
use crate::token::Token;

/// The outcome of one acquire try in Redis (after its retries).
enum Try {
    Won,
    /// Held by another; `split`: a RedLock node granted this try (see `Outcome::Busy`).
    Busy {
        seen: Seen,
        split: bool,
    },
}

/// The first pause after a split RedLock try; it doubles while tries keep splitting.
const FIRST_SPLIT_PAUSE: Duration = Duration::from_millis(1);

impl Acquire {
    /// Tries, and waits for release notifications or the holder's expiry between tries, until
    /// the deadline (its Redis calls until a bound derived from it). With a `handoff` (the
    /// semaphore's first local waiter), a permit a local holder hands over meanwhile is taken
    /// instead, and the acquire leaves the line in Redis in the background. `others_wait`:
    /// this process's last release of the lock told waiters of other lockers, so one of them
    /// most likely holds it now.
    // Not `async fn`: see the module's documentation of `acquire`.
    #[allow(clippy::manual_async_fn)]
    pub(super) fn acquire_in_redis<'a>(
        &'a self,
        keys: RedisKeys,
        lease: Duration,
        when: When,
        handoff: Option<&'a Handoff<'a>>,
        others_wait: bool,
    ) -> impl Future<Output = Result<Grant, LockError>> + 'a {
        async move {
            let inner = &self.inner();
            // Redis calls (retries included) end by then.
            let bound = when.bound(inner.one_try());
            let mut wait = Wait::new(inner, &keys, self.new_token(), when.try_once);
            let mut split_pause = FIRST_SPLIT_PAUSE;
            let likely_busy = others_wait && !when.try_once;
            if likely_busy && !wait.is_subscribed() {
                // Subscribed before the first try, a try that finds the lock taken is enough (a
                // release after it reaches us) instead of a try, the subscription and a try again.
                let remaining = when
                    .deadline
                    .map(|d| d.saturating_duration_since(Instant::now()));
                Box::pin(wait.subscribe(inner, remaining)).await;
            }
            loop {
                if let Some(seen) = wait.ran_out(when.deadline) {
                    return Err(self.busy(when.started, seen));
                }
                let notify = wait.notify();
                let alarms = Alarms::set(notify.as_deref(), handoff);
                if let Some(handoff) = handoff {
                    if let Some(grant) = self.take_handed_over(handoff, when).await {
                        // Armed after a try, the attempt takes our place in line out in the
                        // background when dropped here.
                        return Ok(grant);
                    }
                }
                let sent_at = wait.send();
                let flag = self.flag(when, sent_at);
                let (attempt, waiter) = wait.attempt();
                let tried = self
                    .try_once(attempt, waiter, lease, flag, bound, likely_busy)
                    .await;
                let (seen, split) = match self.deadline_seen_busy(tried, &mut wait, when)? {
                    Try::Busy { seen, split } => (seen, split),
                    Try::Won => {
                        let token = wait.won(self.kind);
                        return Ok(granted(keys, token, sent_at));
                    }
                };
                wait.found_busy(self.kind, when.try_once, !flag.is_zero());
                let ttl = seen.ttl;
                let remaining = when
                    .deadline
                    .map(|d| d.saturating_duration_since(Instant::now()));
                if when.try_once || remaining.is_some_and(|r| r.is_zero()) {
                    return Err(self.busy(when.started, seen));
                }
                wait.keep_seen(seen);
                if inner.capabilities().fresh_token_per_try() {
                    // A failed quorum try is undone in the background under its token.
                    wait.renew_token(self.new_token());
                }
                if !wait.is_subscribed() {
                    Box::pin(wait.subscribe(inner, remaining)).await;
                    // Try again at once: the holder may have released before we subscribed.
                    continue;
                }
                let mut sleep = self.pause(ttl, remaining);
                if split {
                    // The release's message may have gone only to nodes this locker does not
                    // listen on (it listens on one): try again soon instead of at the fallback
                    // retry, backing off while tries keep splitting (a node that forgot the lock
                    // splits every try while it is held).
                    sleep = sleep.min(jitter(split_pause));
                    // At most the fallback retry, which `pause` jitters already.
                    split_pause = (split_pause * 2).min(inner.settings.fallback_retry);
                } else {
                    split_pause = FIRST_SPLIT_PAUSE;
                }
                tracing::trace!(?ttl, ?sleep, split, "waiting for release");
                // Boxed, as the subscription: only a contended acquire takes these steps.
                Box::pin(wait.sleep(alarms, Instant::now() + sleep)).await;
            }
        }
    }

    /// A try's answer, `tried`, as the wait's: a try cut at the deadline after the lock was
    /// found held is the wait running out while asking again, contention, not a Redis failure.
    fn deadline_seen_busy(
        &self,
        tried: Result<Try, LockError>,
        wait: &mut Wait<'_>,
        when: When,
    ) -> Result<Try, LockError> {
        match tried {
            Err(LockError::Backend { source, .. }) if source.is_deadline() => {
                Err(match wait.seen_busy() {
                    Some(seen) => self.busy(when.started, seen),
                    None => LockError::backend(Some(&self.key), source),
                })
            }
            tried => tried,
        }
    }

    /// How long another locker's release holds back its own next acquirer for us, from
    /// `sent_at`: as long as we may wait, or until our next try renews it; none for one try.
    fn flag(&self, when: When, sent_at: Instant) -> Duration {
        if when.try_once {
            return Duration::ZERO;
        }
        let retry = self.inner().settings.fallback_retry * 3;
        when.deadline
            .map_or(retry, |d| d.saturating_duration_since(sent_at).min(retry))
    }

    /// The sleep before the next try: the fallback retry (jittered), cut to the holder's
    /// `ttl` and the `remaining` wait.
    fn pause(&self, ttl: Option<Duration>, remaining: Option<Duration>) -> Duration {
        let mut sleep = jitter(self.inner().settings.fallback_retry);
        if let Some(ttl) = ttl {
            sleep = sleep.min(ttl + Duration::from_millis(1));
        }
        if let Some(remaining) = remaining {
            sleep = sleep.min(remaining);
        }
        sleep
    }

    /// One acquire call, retried on connection errors and transient server states while
    /// `bound` allows: with the same token (the acquire script is idempotent per token) on one
    /// Redis; with a fresh token on a RedLock quorum, whose undo of a failed try runs in the
    /// background and must not hit the next try. Every call ends by `bound`: one still running
    /// then is abandoned (the background releaser removes what it may still take).
    // Not `async fn`: see the module's documentation of `acquire`.
    #[allow(clippy::manual_async_fn)]
    fn try_once<'a, 'b, 'c, 't>(
        &'a self,
        attempt: &'b mut Attempt<'c>,
        waiter: &'t Token,
        lease: Duration,
        flag: Duration,
        bound: Option<Instant>,
        likely_busy: bool,
    ) -> impl Future<Output = Result<Try, LockError>> + use<'a, 'b, 'c, 't> {
        async move {
            let inner = &self.inner();
            let fresh_token_per_try = inner.capabilities().fresh_token_per_try();
            let mut backoff = Duration::from_millis(20);
            let mut tries = 0;
            loop {
                tries += 1;
                if tries > 1 && fresh_token_per_try {
                    attempt.renew_token(self.new_token());
                }
                let args = AcquireArgs {
                    lease,
                    flag,
                    fresh_token: !attempt.sent,
                    likely_busy,
                };
                attempt.sent = true;
                // Boxed: the call's state (some 900 bytes) would otherwise be part of every
                // future above it, up to the acquire's own, and copied with each as it starts;
                // one allocation costs less than those copies.
                // Only waiting for Redis's answer meanwhile (see `shut_down.rs`).
                self.in_call.store(true, Ordering::Release);
                let reply = by(
                    bound,
                    in_box(|| {
                        inner
                            .store
                            .acquire(attempt.keys, &attempt.token, waiter, args)
                    }),
                )
                .await;
                self.in_call.store(false, Ordering::Release);
                let error = match reply {
                    Ok(outcome) => {
                        inner.answered();
                        return self.answer(outcome);
                    }
                    Err(error) => error,
                };
                let retry_at = Instant::now() + backoff;
                let in_time = bound.is_none_or(|b| retry_at < b);
                if !(error.is_transient() && in_time) {
                    return Err(LockError::backend_on(attempt.keys, &self.key, error));
                }
                tracing::debug!(%error, "acquire failed; retrying");
                // Boxed: a retry is off the usual path, and its timer would otherwise be part of
                // every try's state.
                Box::pin(tokio::time::sleep_until(retry_at)).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }

    /// What a try's answer means for this acquire.
    fn answer(&self, outcome: Outcome) -> Result<Try, LockError> {
        match outcome {
            Outcome::Acquired => Ok(Try::Won),
            Outcome::Busy { ttl, holder, split } => {
                let holder = holder.and_then(|value| holder_in(self.kind, &value));
                Ok(Try::Busy {
                    seen: Seen { ttl, holder },
                    split,
                })
            }
            Outcome::NotReplicated { acked } => Err(LockError::NotReplicated {
                key: self.key.clone(),
                acked,
                wanted: self
                    .locker
                    .inner
                    .store
                    .min_replicas()
                    .map_or(0, |m| m.replicas),
            }),
        }
    }
}

/// What Redis granted to a try sent at `sent_at` under `token`.
fn granted(keys: RedisKeys, token: Token, sent_at: Instant) -> Grant {
    Grant {
        keys,
        token,
        sent_at,
        handed_over: None,
    }
}

/// `call`, cut at `bound` if there is one (a deadline error then).
///
/// One future for both cases, the call inside a timeout that never fires without a bound: an
/// `async fn` awaiting either the call or its timeout laid the call's state out twice, and
/// every acquire carried (and copied) both.
pub(super) fn by<T>(
    bound: Option<Instant>,
    call: impl Future<Output = Result<T, BackendError>>,
) -> impl Future<Output = Result<T, BackendError>> {
    let bound = bound.unwrap_or_else(|| Instant::now() + limits::WAIT_FOREVER);
    tokio::time::timeout_at(bound, call)
        .map(|answer| answer.unwrap_or_else(|_| Err(BackendError::deadline())))
}

/// The holder name in a stored value an acquire of `kind` found (see `holder.rs`): a
/// semaphore's holders name their permits, a lock's may be a fair one's.
fn holder_in(kind: Kind, value: &str) -> Option<String> {
    let name = match kind {
        Kind::Permits { .. } => holder::parse_permit(value).0,
        Kind::Exclusive | Kind::Fair | Kind::Shared => holder::parse_lock(value).holder,
    };
    name.map(str::to_owned)
}

/// `base` scaled by a random factor in [0.75, 1.25].
fn jitter(base: Duration) -> Duration {
    base.mul_f64(0.75 + rand::random::<f64>() * 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..1000 {
            let j = jitter(Duration::from_millis(1000));
            assert!(j >= Duration::from_millis(750) && j <= Duration::from_millis(1250));
        }
    }
}
