//! Release notifications: one pub/sub connection per `Locker` serves every waiter of every key.
//!
//! A waiter subscribes to its key's release channel (reference-counted: the first waiter of a
//! channel sends SUBSCRIBE; the subscription lingers for [`LINGER`] after the last waiter left,
//! so a hot key does not pay SUBSCRIBE and UNSUBSCRIBE on every wait; a mutex waiter that won
//! after a release leaves at once instead, see [`Subscription::leave_now`]), then sleeps on a
//! [`Notify`] that the listener task wakes when a release message arrives. All SUBSCRIBE and
//! UNSUBSCRIBE commands go through the listener's queue, in order, so an unsubscribe can never
//! overtake a newer subscribe of the same channel. After a reconnect the listener subscribes
//! every live channel again and wakes every waiter, since messages may have been missed.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::backend_error::BackendError;
#[cfg(feature = "sentinel")]
use crate::connection::SentinelPrimary;
use crate::connection::Timeouts;

/// Where the subscriber connection goes.
#[derive(Debug)]
pub(crate) enum PubSubSource {
    /// Any of these nodes (tried in turn after failures): a single server, cluster nodes
    /// (PUBLISH reaches every node of a cluster), or RedLock nodes (a release publishes on
    /// every node).
    Nodes(Vec<redis::Client>),
    /// The current primary named by Sentinel.
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<SentinelPrimary>),
}

impl PubSubSource {
    /// Which primary the command side follows now (Sentinel); the subscriber reconnects when
    /// it changes, so that it follows a failover even when its own connection stays up (after
    /// a manual failover the old primary keeps answering as a replica).
    fn generation(&self) -> u64 {
        match self {
            Self::Nodes(_) => 0,
            #[cfg(feature = "sentinel")]
            Self::Sentinel(primary) => primary.generation(),
        }
    }

    async fn client(&self, attempt: usize) -> Result<redis::Client, BackendError> {
        match self {
            Self::Nodes(clients) => Ok(clients[attempt % clients.len()].clone()),
            #[cfg(feature = "sentinel")]
            Self::Sentinel(primary) => primary.client().await,
        }
    }
}

/// The longest release message kept. The kit's are `1`, empty, or a waiter's token (32 hex
/// digits, its holder name of at most 64 bytes, a fair mark or a permit count: at most 108
/// bytes, see `holder.rs`); anything much longer was not published by a locker.
pub(crate) const MAX_MESSAGE: usize = 256;

/// How long an unused subscription is kept before UNSUBSCRIBE.
pub(crate) const LINGER: Duration = Duration::from_millis(500);

#[derive(Debug)]
struct Channel {
    refs: usize,
    /// When the last waiter left, for a channel nobody waits on.
    idle_since: Option<tokio::time::Instant>,
    notify: Arc<Notify>,
    /// The recent release messages, read by the waiters they woke.
    messages: Arc<Mutex<Messages>>,
    /// `true` once the listener has handled the first SUBSCRIBE (successfully or not).
    settled: watch::Sender<bool>,
}

#[derive(Debug)]
enum Command {
    Subscribe(String),
    Unsubscribe(String),
}

#[derive(Debug)]
struct Shared {
    channels: Mutex<HashMap<String, Channel>>,
    /// The number of entries in `channels`, readable without its lock (an uncontended
    /// acquire asks whether any channel is subscribed at all, see `ReleaseMessages::any`).
    live: AtomicUsize,
    commands: mpsc::UnboundedSender<Command>,
}

impl Shared {
    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock()
    }
}

/// The release-notification hub of one `Locker`.
#[derive(Debug, Clone)]
pub(crate) struct ReleaseMessages {
    shared: Arc<Shared>,
}

/// One waiter's interest in a release channel; unsubscribes with the last holder.
#[derive(Debug)]
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    channel: String,
    pub(crate) notify: Arc<Notify>,
    messages: Arc<Mutex<Messages>>,
    /// Unsubscribe at once when the last waiter leaves, instead of lingering.
    leave_now: bool,
}

/// The last [`Messages::KEPT`] release messages of a channel, numbered: a message may name
/// the one waiter it is for (see `scripts/permit_release.lua`, `scripts/fair_release.lua`), and
/// messages following each other quickly must not hide that from the waiter named in an
/// earlier one.
#[derive(Debug, Default)]
struct Messages {
    /// The number the next message gets.
    next: u64,
    recent: VecDeque<String>,
}

impl Messages {
    const KEPT: usize = 32;

    fn push(&mut self, message: String) {
        if self.recent.len() == Self::KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(message);
        self.next += 1;
    }
}

impl Subscription {
    /// A mark of the messages received so far, for [`for_me_since`](Self::for_me_since).
    pub(crate) fn mark(&self) -> u64 {
        self.messages.lock().next
    }

    /// Whether a message received after `mark` may be for the waiter of `token` (see
    /// `is_for`), and the mark of now. Messages no longer kept count as for it.
    /// Drops this interest in the channel and, if it was the last, unsubscribes at once rather
    /// than lingering. Redis sends a channel's messages to its subscribers in the order they
    /// subscribed, and the first to hear of a release is the first to try: a waiter that just
    /// won the lock after a release leaves, so its process subscribes again at the end of that
    /// order for its next wait, and the waiters of every process take turns being first.
    pub(crate) fn leave_now(mut self) {
        self.leave_now = true;
    }

    pub(crate) fn for_me_since(&self, mark: u64, is_for: impl Fn(&str) -> bool) -> (bool, u64) {
        let messages = self.messages.lock();
        let new = usize::try_from(messages.next.saturating_sub(mark)).unwrap_or(usize::MAX);
        let for_me = new > messages.recent.len()
            || messages.recent.iter().rev().take(new).any(|m| is_for(m));
        (for_me, messages.next)
    }
}

impl ReleaseMessages {
    /// Starts the listener task; it stops when `shutdown` is cancelled.
    pub(crate) fn start(
        source: PubSubSource,
        timeouts: Timeouts,
        shutdown: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            channels: Mutex::new(HashMap::new()),
            live: AtomicUsize::new(0),
            commands: tx,
        });
        tokio::spawn(listen(source, timeouts, shared.clone(), rx, shutdown));
        Self { shared }
    }

    /// Subscribes to `channel` and waits (at most `limit`) until the subscription is in place, so
    /// that a release after this returns is not missed.
    pub(crate) async fn subscribe(&self, channel: &str, limit: Duration) -> Subscription {
        let (notify, messages, mut settled) = {
            let mut channels = self.shared.channels();
            let entry = channels.entry(channel.to_owned()).or_insert_with(|| {
                let _ = self
                    .shared
                    .commands
                    .send(Command::Subscribe(channel.to_owned()));
                Channel {
                    refs: 0,
                    idle_since: None,
                    notify: Arc::new(Notify::new()),
                    messages: Arc::default(),
                    settled: watch::Sender::new(false),
                }
            });
            entry.refs += 1;
            entry.idle_since = None;
            let taken = (
                entry.notify.clone(),
                entry.messages.clone(),
                entry.settled.subscribe(),
            );
            self.shared.live.store(channels.len(), Ordering::Relaxed);
            taken
        };
        let subscription = Subscription {
            shared: self.shared.clone(),
            channel: channel.to_owned(),
            notify,
            messages,
            leave_now: false,
        };
        let _ = tokio::time::timeout(limit, settled.wait_for(|s| *s)).await;
        subscription
    }

    /// The subscription to `channel` when one is in place already (another waiter's, or one
    /// lingering after its last waiter), without a round trip: taken before a first try, it
    /// catches every release after that try, so the try need not be repeated once subscribed.
    pub(crate) fn subscribed(&self, channel: &str) -> Option<Subscription> {
        let mut channels = self.shared.channels();
        let entry = channels.get_mut(channel)?;
        if !*entry.settled.borrow() {
            return None;
        }
        entry.refs += 1;
        entry.idle_since = None;
        Some(Subscription {
            shared: self.shared.clone(),
            channel: channel.to_owned(),
            notify: entry.notify.clone(),
            messages: entry.messages.clone(),
            leave_now: false,
        })
    }

    /// Whether any channel is subscribed (or being subscribed), without taking a lock: when
    /// none is, [`subscribed`](Self::subscribed) has nothing to find, and its caller need not
    /// even name the channel.
    pub(crate) fn any(&self) -> bool {
        self.shared.live.load(Ordering::Relaxed) > 0
    }

    /// Forgets every channel (the locker shut down, its listener stopped and its connection
    /// with it): later unsubscriptions find nothing to do.
    pub(crate) fn clear(&self) {
        let mut channels = self.shared.channels();
        channels.clear();
        self.shared.live.store(0, Ordering::Relaxed);
    }

    /// Number of channels this locker is subscribed to, lingering ones included.
    pub(crate) fn channel_count(&self) -> usize {
        self.shared.channels().len()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = self.shared.channels();
        if let Some(entry) = channels.get_mut(&self.channel) {
            entry.refs -= 1;
            if entry.refs == 0 {
                if self.leave_now {
                    // Sent under the map's lock: a SUBSCRIBE of a waiter that comes next is
                    // queued after this UNSUBSCRIBE, in the same order as the map changed.
                    channels.remove(&self.channel);
                    self.shared.live.store(channels.len(), Ordering::Relaxed);
                    let _ = self
                        .shared
                        .commands
                        .send(Command::Unsubscribe(std::mem::take(&mut self.channel)));
                } else {
                    entry.idle_since = Some(tokio::time::Instant::now());
                }
            }
        }
    }
}

async fn listen(
    source: PubSubSource,
    timeouts: Timeouts,
    shared: Arc<Shared>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    shutdown: CancellationToken,
) {
    let timeout = timeouts.command;
    let mut backoff = Duration::from_millis(20);
    let mut attempt = 0;
    loop {
        let generation = source.generation();
        let connect = async {
            let client = source.client(attempt).await?;
            client.get_async_pubsub().await.map_err(BackendError::redis)
        };
        let connected = tokio::select! {
            _ = shutdown.cancelled() => return,
            c = tokio::time::timeout(timeouts.connect, connect) => c,
        };
        attempt += 1;
        let (mut sink, mut stream) = match connected {
            Ok(Ok(pubsub)) => pubsub.split(),
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "connect timed out".to_owned(),
                };
                tracing::debug!(%error, "pub/sub connection failed; waiters fall back to polling");
                settle_all(&shared);
                expire_idle(&shared);
                // Drain queued commands: there is no connection to send them on, and the
                // resubscription after connecting covers every live channel.
                while commands.try_recv().is_ok() {}
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let connected_at = tokio::time::Instant::now();
        // Queued SUBSCRIBEs of channels that exist now are covered by the one below; those of
        // channels added after this snapshot stay queued and are sent (and settled) in turn.
        while commands.try_recv().is_ok() {}
        let live: Vec<String> = shared.channels().keys().cloned().collect();
        let subscribed = if live.is_empty() {
            true
        } else {
            match tokio::time::timeout(timeout, sink.subscribe(&live)).await {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot subscribe to release channels");
                    true
                }
                Err(_) => false,
            }
        };
        if subscribed {
            // Only the channels just subscribed are settled: a channel added meanwhile must
            // not be reported subscribed before its own SUBSCRIBE is sent, or its waiter could
            // miss the release that comes in between.
            settle(&shared, &live);
            wake_all(&shared);
            if let Session::Shutdown = serve(
                &source,
                generation,
                &shared,
                &mut commands,
                &shutdown,
                timeout,
                &mut sink,
                &mut stream,
            )
            .await
            {
                return;
            }
        }
        // A connection that broke soon after it was made (a server or proxy that drops it, a
        // kill in a loop) is made again after the same growing pause as a failed connect, not
        // at once: only one that lasted resets the pause.
        if connected_at.elapsed() >= STABLE {
            backoff = Duration::from_millis(20);
        } else {
            // As after a failed connect: nobody waits for a SUBSCRIBE meanwhile.
            settle_all(&shared);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
        tracing::debug!("pub/sub connection lost; reconnecting");
    }
}

/// How a subscriber connection's session ended.
enum Session {
    /// The locker is shutting down (or dropped its command queue): stop listening.
    Shutdown,
    /// The connection broke or must move (a new primary): connect again.
    Reconnect,
}

/// How long a subscriber connection must have lasted for the next one to be made at once.
const STABLE: Duration = Duration::from_secs(1);

/// Serves one subscriber connection: release messages, (un)subscribe commands, the sweep of
/// idle channels, and the check that the primary has not moved.
#[allow(clippy::too_many_arguments)]
async fn serve(
    source: &PubSubSource,
    generation: u64,
    shared: &Shared,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    shutdown: &CancellationToken,
    timeout: Duration,
    sink: &mut redis::aio::PubSubSink,
    stream: &mut redis::aio::PubSubStream,
) -> Session {
    let mut sweep = tokio::time::interval(LINGER / 2);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Session::Shutdown,
            _ = sweep.tick() => {
                if source.generation() != generation {
                    tracing::debug!("the primary changed; moving the subscriber connection");
                    return Session::Reconnect;
                }
                let idle = expire_idle(shared);
                if !idle.is_empty() {
                    let result = tokio::time::timeout(timeout, sink.unsubscribe(&idle)).await;
                    if let Link::Broken = check(result, "unsubscribe") {
                        return Session::Reconnect;
                    }
                }
            }
            message = stream.next() => match message {
                Some(message) => receive(shared, &message),
                None => return Session::Reconnect,
            },
            command = commands.recv() => {
                let Some(command) = command else { return Session::Shutdown };
                let link = match command {
                    Command::Subscribe(channel) => {
                        let wanted = shared.channels().contains_key(&channel);
                        let result = if wanted {
                            tokio::time::timeout(timeout, sink.subscribe(&channel)).await
                        } else {
                            Ok(Ok(()))
                        };
                        if let Some(entry) = shared.channels().get(&channel) {
                            entry.settled.send_replace(true);
                        }
                        check(result, "subscribe")
                    }
                    Command::Unsubscribe(channel) => {
                        let result = tokio::time::timeout(timeout, sink.unsubscribe(&channel)).await;
                        check(result, "unsubscribe")
                    }
                };
                if let Link::Broken = link {
                    return Session::Reconnect;
                }
            }
        }
    }
}

/// Keeps a release message for the waiters of its channel and wakes them. A message longer
/// than [`MAX_MESSAGE`] is no locker's: it is dropped unread, so that whoever may publish on
/// the channel cannot make the locker keep [`Messages::KEPT`] large ones per channel.
fn receive(shared: &Shared, message: &redis::Msg) {
    let payload = message.get_payload_bytes();
    if payload.len() > MAX_MESSAGE {
        tracing::debug!(
            len = payload.len(),
            "ignoring an oversized message on a release channel"
        );
        return;
    }
    if let Some(entry) = shared.channels().get(message.get_channel_name()) {
        // Not UTF-8: no locker's either; kept as a wake-up that names nobody.
        let payload = std::str::from_utf8(payload).unwrap_or_default().to_owned();
        entry.messages.lock().push(payload);
        entry.notify.notify_waiters();
    }
}

/// The state of the subscriber connection after a command.
enum Link {
    Usable,
    /// It must be replaced.
    Broken,
}

/// What an (un)subscribe's result says of the connection; a refusal is logged.
fn check(result: Result<redis::RedisResult<()>, tokio::time::error::Elapsed>, what: &str) -> Link {
    match result {
        Ok(Ok(())) => Link::Usable,
        Ok(Err(e)) if e.is_io_error() || e.is_connection_dropped() => Link::Broken,
        Ok(Err(e)) => {
            // NOPERM (ACL without channel rights) and the like: waiters poll instead.
            tracing::warn!(error = %e, "{what} of a release channel failed");
            Link::Usable
        }
        Err(_) => Link::Broken,
    }
}

/// Drops the channels nobody waited on for [`LINGER`]; returns their names.
fn expire_idle(shared: &Shared) -> Vec<String> {
    let now = tokio::time::Instant::now();
    let mut expired = Vec::new();
    let mut channels = shared.channels();
    channels.retain(|name, entry| {
        let idle = entry.refs == 0 && entry.idle_since.is_some_and(|t| now >= t + LINGER);
        if idle {
            expired.push(name.clone());
        }
        !idle
    });
    shared.live.store(channels.len(), Ordering::Relaxed);
    expired
}

fn settle(shared: &Shared, names: &[String]) {
    let channels = shared.channels();
    for name in names {
        if let Some(entry) = channels.get(name) {
            entry.settled.send_replace(true);
        }
    }
}

fn settle_all(shared: &Shared) {
    for entry in shared.channels().values() {
        entry.settled.send_replace(true);
    }
}

fn wake_all(shared: &Shared) {
    for entry in shared.channels().values() {
        // A wake-up for everyone: a message that names no waiter.
        entry.messages.lock().push(String::new());
        entry.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_testkit::{FaultProxy, ProxyMode, RedisServer};

    fn subscription(messages: Messages) -> Subscription {
        let (commands, _) = mpsc::unbounded_channel();
        Subscription {
            shared: Arc::new(Shared {
                channels: Mutex::default(),
                live: AtomicUsize::new(0),
                commands,
            }),
            channel: "c".to_owned(),
            notify: Arc::default(),
            messages: Arc::new(Mutex::new(messages)),
            leave_now: false,
        }
    }

    #[test]
    fn a_message_for_a_waiter_is_not_hidden_by_later_ones() {
        let is_for_a = |m: &str| m == "a" || m == "1";
        let sub = subscription(Messages::default());
        let mark = sub.mark();
        assert_eq!(sub.for_me_since(mark, is_for_a), (false, 0));
        sub.messages.lock().push("a".to_owned());
        sub.messages.lock().push("b".to_owned());
        // "b" came last, but "a" came after the mark.
        assert_eq!(sub.for_me_since(mark, is_for_a), (true, 2));
        // Seen up to now: "b" alone is not for "a"; "1" is for everyone.
        assert_eq!(sub.for_me_since(2, is_for_a), (false, 2));
        sub.messages.lock().push("1".to_owned());
        assert!(sub.for_me_since(2, is_for_a).0);
        // More messages than are kept since the mark: one of the lost ones may have been for
        // the waiter, so it tries.
        for _ in 0..Messages::KEPT + 1 {
            sub.messages.lock().push("b".to_owned());
        }
        assert!(sub.for_me_since(3, is_for_a).0);
        assert!(!sub.for_me_since(3 + 1, is_for_a).0);
    }

    const LIMIT: Duration = Duration::from_secs(5);

    /// A listener on `url` with generous timeouts, and its shutdown.
    fn start(url: &str) -> (ReleaseMessages, CancellationToken) {
        let client = redis::Client::open(url).unwrap();
        let shutdown = CancellationToken::new();
        let timeouts = Timeouts {
            connect: LIMIT,
            command: LIMIT,
            release_retry: LIMIT,
        };
        let waiters = ReleaseMessages::start(
            PubSubSource::Nodes(vec![client]),
            timeouts,
            shutdown.clone(),
        );
        (waiters, shutdown)
    }

    fn subscribers(server: &RedisServer, channel: &str) -> i64 {
        let (_, count): (String, i64) = server.cmd(&["PUBSUB", "NUMSUB", channel]);
        count
    }

    async fn until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
        let start = tokio::time::Instant::now();
        while start.elapsed() < limit {
            if cond() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        cond()
    }

    /// A waiter that leaves now unsubscribes at once (not after the linger), unless another
    /// waiter of the channel is still there; the next waiter subscribes again and hears releases.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leaving_now_unsubscribes_at_once_and_the_next_waiter_subscribes_again() {
        let server = RedisServer::start().unwrap();
        let (waiters, shutdown) = start(&server.url());
        let first = waiters.subscribe("p:c", LIMIT).await;
        let second = waiters.subscribed("p:c").unwrap();
        first.leave_now();
        tokio::time::sleep(LINGER / 5).await;
        assert_eq!(
            subscribers(&server, "p:c"),
            1,
            "left while another waiter was there"
        );

        let left = tokio::time::Instant::now();
        second.leave_now();
        assert!(until(LIMIT, || subscribers(&server, "p:c") == 0).await);
        assert!(
            left.elapsed() < LINGER,
            "unsubscribed after {:?}: it lingered",
            left.elapsed()
        );
        assert_eq!(waiters.channel_count(), 0);
        assert!(waiters.subscribed("p:c").is_none());

        let next = waiters.subscribe("p:c", LIMIT).await;
        assert_eq!(subscribers(&server, "p:c"), 1);
        let mark = next.mark();
        let woken = next.notify.notified();
        let _: i64 = server.cmd(&["PUBLISH", "p:c", "1"]);
        tokio::time::timeout(LIMIT, woken).await.unwrap();
        assert!(next.for_me_since(mark, |m| m == "1").0);
        drop(next);
        shutdown.cancel();
    }

    /// A channel added while the listener re-subscribes after a reconnect is reported
    /// subscribed only once its own SUBSCRIBE reached the server (before the fix, together
    /// with the channels being re-subscribed: its waiter could then miss a release).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_channel_added_during_resubscription_settles_only_once_subscribed() {
        let server = RedisServer::start().unwrap();
        let proxy = FaultProxy::start(server.port()).await.unwrap();
        let (waiters, shutdown) = start(&proxy.url());
        let a = waiters.subscribe("p:a", LIMIT).await;
        assert_eq!(subscribers(&server, "p:a"), 1);

        // Every chunk through the proxy now takes 300 ms each way; the subscriber reconnects.
        proxy
            .set_mode(ProxyMode::Delay(Duration::from_millis(300)))
            .await;
        let _: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        assert!(until(LIMIT, || subscribers(&server, "p:a") == 0).await);
        // The re-subscription of `p:a` reached the server; its reply is on its way back.
        assert!(until(LIMIT, || subscribers(&server, "p:a") == 1).await);
        let b = waiters.subscribe("p:b", LIMIT).await;
        assert_eq!(
            subscribers(&server, "p:b"),
            1,
            "p:b was reported subscribed before its SUBSCRIBE reached the server"
        );
        drop((a, b));
        shutdown.cancel();
    }

    /// Release messages are short (a token, or a token and a count): one far larger is no
    /// message of the kit's. Anybody who may publish on the channel could otherwise make every
    /// locker keep 32 of them per channel (32 MiB here, per subscribed key).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn oversized_release_messages_are_not_kept() {
        let server = RedisServer::start().unwrap();
        let (waiters, shutdown) = start(&server.url());
        let sub = waiters.subscribe("p:big", LIMIT).await;
        let big = "x".repeat(1 << 20);
        for _ in 0..Messages::KEPT {
            let _: i64 = server.cmd(&["PUBLISH", "p:big", &big]);
        }
        let _: i64 = server.cmd(&["PUBLISH", "p:big", "last"]);
        let arrived = until(LIMIT, || {
            sub.messages.lock().recent.back().map(String::as_str) == Some("last")
        })
        .await;
        assert!(arrived, "the last message never arrived");
        let kept: usize = sub.messages.lock().recent.iter().map(String::len).sum();
        assert!(
            kept <= Messages::KEPT * MAX_MESSAGE,
            "{kept} bytes of release messages kept for one channel"
        );
        let mark = sub.mark();
        let _: i64 = server.cmd(&["PUBLISH", "p:big", "for-me"]);
        assert!(until(LIMIT, || sub.for_me_since(mark, |m| m == "for-me").0).await);
        drop(sub);
        shutdown.cancel();
    }

    /// A subscriber connection that is made and breaks at once (here: killed by the server
    /// within 5 ms of every connect, as `CLIENT KILL TYPE pubsub` in a loop does) is made again
    /// after a growing pause, not in a tight loop.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subscriber_connection_that_breaks_at_once_is_retried_with_backoff() {
        let server = RedisServer::start().unwrap();
        let proxy = FaultProxy::start(server.port()).await.unwrap();
        let (waiters, shutdown) = start(&proxy.url());
        let sub = waiters.subscribe("p:c", LIMIT).await;
        let before = proxy.connections();
        let killer = {
            let mut conn = server.client();
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                while start.elapsed() < Duration::from_secs(2) {
                    let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                        .arg("KILL")
                        .arg("TYPE")
                        .arg("pubsub")
                        .query(&mut conn);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        tokio::task::spawn_blocking(move || killer.join())
            .await
            .unwrap()
            .unwrap();
        let made = proxy.connections() - before;
        // 20, 40, .. 640 ms, then 1 s: 7 connections in 2 s; 12 leaves room for slow starts.
        assert!(
            made <= 12,
            "{made} subscriber connections in 2 s while each broke at once"
        );
        // Once connections last, the listener is subscribed again.
        assert!(until(LIMIT, || subscribers(&server, "p:c") == 1).await);
        drop(sub);
        shutdown.cancel();
    }
}
