//! [`Wait`]: what one acquire's wait in Redis holds between its tries, and [`Alarms`], what
//! may end its sleep.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::{Notified, OwnedNotified};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::local_order::Handoff;
use super::Seen;
use crate::key::RedisKeys;
use crate::kind::Kind;
use crate::locker::Inner;
use crate::release::{Attempt, ReleaseOnDrop, Waiting};
use crate::release_messages::Subscription;
use crate::token::Token;

/// The state of one acquire's wait in Redis. Whatever ends the acquire without the lock (its
/// wait ran out, an error, the future dropped) drops it, and what is armed then is taken out
/// in Redis in the background. The fields drop in this order.
pub(super) struct Wait<'a> {
    /// The holder at the last try that found the lock held, once one did.
    seen_busy: Option<Seen>,
    /// The release channel, once subscribed.
    subscription: Option<Subscription>,
    /// The release messages from here on are the ones the last try may not have seen.
    mark: u64,
    /// The acquire's entry in the waiting writers: its first token, kept for the whole wait
    /// although a RedLock try runs under a fresh token each time (the first try's token is
    /// also what a release of an abandoned first try takes out). Armed once an exclusive try
    /// joined them, so readers do not let a writer that left go first.
    writer: ReleaseOnDrop<'a, Waiting<'a>>,
    /// The try under way or last sent: armed while it may have landed unseen, and between
    /// tries for a kind that stands in a line in Redis.
    attempt: ReleaseOnDrop<'a, Attempt<'a>>,
}

impl<'a> Wait<'a> {
    /// A wait for `keys` whose first try runs under `token`. A waiting acquire that finds the
    /// release channel subscribed already takes that subscription before its first try, so a
    /// first try that finds the lock taken is not repeated once subscribed. Without any
    /// subscription in the locker (the uncontended case), the channel is not even named.
    pub(super) fn new(inner: &'a Inner, keys: &'a RedisKeys, token: Token, try_once: bool) -> Self {
        let subscription = if try_once || !inner.release_messages.any() {
            None
        } else {
            inner
                .release_messages
                .subscribed(&keys.channel().to_string())
        };
        let writer = Waiting {
            keys,
            token: token.clone(),
        };
        Self {
            seen_busy: None,
            subscription,
            mark: 0,
            writer: ReleaseOnDrop::new(inner.releaser(), writer),
            attempt: ReleaseOnDrop::new(inner.releaser(), Attempt::new(keys, token)),
        }
    }

    /// What the last try found, if the wait found the lock held and ran out at `deadline`:
    /// the last sleep ended there, and a try now would have no time left.
    pub(super) fn ran_out(&self, deadline: Option<Instant>) -> Option<Seen> {
        let seen = self.seen_busy.as_ref()?;
        deadline
            .is_some_and(|d| Instant::now() >= d)
            .then(|| seen.clone())
    }

    /// What the last busy try found, if one did (taken: the wait ends).
    pub(super) fn seen_busy(&mut self) -> Option<Seen> {
        self.seen_busy.take()
    }

    /// The release channel's wake-ups, once subscribed.
    pub(super) fn notify(&self) -> Option<Arc<Notify>> {
        self.subscription.as_ref().map(|s| s.notify.clone())
    }

    pub(super) fn is_subscribed(&self) -> bool {
        self.subscription.is_some()
    }

    /// Subscribes to the release channel, within a command timeout and the `remaining` wait.
    pub(super) async fn subscribe(&mut self, inner: &Inner, remaining: Option<Duration>) {
        let limit = inner
            .settings
            .command_timeout
            .min(remaining.unwrap_or(Duration::MAX));
        let channel = self.attempt.target.keys.channel().to_string();
        let subscription = inner.release_messages.subscribe(&channel, limit).await;
        self.subscription = Some(subscription);
    }

    /// Arms the attempt for a try about to be sent, and returns when it is sent.
    pub(super) fn send(&mut self) -> Instant {
        self.mark = self.subscription.as_ref().map_or(0, Subscription::mark);
        let sent_at = Instant::now();
        self.attempt.target.in_flight = true;
        self.attempt.arm();
        sent_at
    }

    /// The attempt to send, and the token of the acquire's entry in the waiting writers.
    pub(super) fn attempt(&mut self) -> (&mut Attempt<'a>, &Token) {
        (&mut self.attempt.target, &self.writer.target.token)
    }

    /// A try of `kind` found the lock held. It stays armed between tries only where it holds
    /// a place in a line (and not for a single try); one that left a waiting flag (`flagged`)
    /// joined the waiting writers if its kind does.
    pub(super) fn found_busy(&mut self, kind: Kind, try_once: bool, flagged: bool) {
        if !kind.stands_in_line() || try_once {
            self.attempt.disarm();
        }
        // Answered: until the next try, nothing of this attempt is on its way to Redis.
        self.attempt.target.in_flight = false;
        if flagged && kind.joins_waiting_writers() {
            self.writer.arm();
        }
    }

    /// Keeps what a busy try found of the holder, for the answer when the wait runs out.
    pub(super) fn keep_seen(&mut self, seen: Seen) {
        self.seen_busy = Some(seen);
    }

    /// The last try won: its token, for the grant.
    pub(super) fn won(mut self, kind: Kind) -> Token {
        self.attempt.disarm();
        if self.attempt.target.token == self.writer.target.token {
            // The winning try took its entry out (see `scripts/acquire.lua`).
            self.writer.disarm();
        }
        // Otherwise (a RedLock try under a later token) a node may have granted by `SET NX`,
        // and the nodes that refused kept the entry: the armed withdrawal takes it out
        // everywhere, in the background.
        let Self {
            seen_busy,
            subscription,
            writer,
            attempt,
            ..
        } = self;
        drop(writer);
        let token = attempt.target.token.clone();
        drop(attempt);
        if let (Some(subscription), Some(_), true) =
            (subscription, seen_busy, kind.leaves_channel_after_waiting())
        {
            // Won after waiting: the next wait of this process subscribes again, behind the
            // waiters of other processes (see `leave_now`).
            subscription.leave_now();
        }
        token
    }

    /// The next try runs under `token` (a failed quorum try is undone in the background under
    /// the old one).
    pub(super) fn renew_token(&mut self, token: Token) {
        self.attempt.target.renew_token(token);
    }

    /// Sleeps until `wake_at`, a release message that may be for this waiter, or a local
    /// handoff, whichever comes first.
    pub(super) async fn sleep(&self, alarms: Alarms<'_>, wake_at: Instant) {
        let Alarms {
            notify,
            released,
            mut handed,
        } = alarms;
        // Ends the sleep when a local holder handed a lock over (never without a handoff).
        let mut handed_over = std::pin::pin!(async {
            match handed.as_mut() {
                Some(h) => h.await,
                None => std::future::pending().await,
            }
        });
        let (Some(mut n), Some(notify), Some(subscription)) =
            (released, notify, self.subscription.as_ref())
        else {
            tokio::select! {
                _ = tokio::time::sleep_until(wake_at) => {}
                _ = &mut handed_over => {}
            }
            return;
        };
        let mut mark = self.mark;
        loop {
            tokio::select! {
                _ = &mut n => {}
                _ = tokio::time::sleep_until(wake_at) => break,
                _ = &mut handed_over => break,
            }
            // Registered before the messages are read, so a later one still wakes us.
            n = Box::pin(notify.notified());
            n.as_mut().enable();
            let token = self.attempt.target.token.stored();
            let (for_me, now) = subscription.for_me_since(mark, |m| !turn_of_another(m, &token));
            if for_me {
                break;
            }
            mark = now;
        }
    }
}

/// What may end the sleep after a try: a release message, a local handoff. Set before the
/// try, so one that comes between the try and the sleep still wakes it.
pub(super) struct Alarms<'n> {
    notify: Option<&'n Notify>,
    released: Option<Pin<Box<Notified<'n>>>>,
    handed: Option<Pin<Box<OwnedNotified>>>,
}

impl<'n> Alarms<'n> {
    /// Alarms on the release channel's `notify`, once subscribed, and on the local key of a
    /// `handoff`, for an acquire that may take one over.
    pub(super) fn set(notify: Option<&'n Notify>, handoff: Option<&'n Handoff<'_>>) -> Self {
        let mut released = notify.map(|n| Box::pin(n.notified()));
        if let Some(n) = released.as_mut() {
            n.as_mut().enable();
        }
        // Likewise for a local handoff, registered before the local key is looked at.
        let mut handed = handoff.map(|h| Box::pin(h.local_key.handed()));
        if let Some(h) = handed.as_mut() {
            h.as_mut().enable();
        }
        Self {
            notify,
            released,
            handed,
        }
    }
}

/// Whether a release message names a waiter other than `token`: the release of a semaphore
/// or a fair lock names the first waiter in line (`scripts/permit_release.lua`,
/// `scripts/fair_release.lua`), and the others would only find the lock or permits kept for it.
/// `1` (and the empty message of a wake-up after a reconnection) is for every waiter.
fn turn_of_another(message: &str, token: &str) -> bool {
    !message.is_empty() && message != "1" && message != token
}
