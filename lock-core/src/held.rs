//! [`Hold`]: the shared state of one held lock: what Redis granted (the token), its fencing
//! token once issued, the nesting depth, the validity clock, the lost signal and the local queue
//! place. Every
//! nested [`LockGuard`](crate::LockGuard) of one acquisition points at the same `Hold`.
//! Registering and unregistering it is [`LocalLocks`](crate::local::LocalLocks)'s job.

use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{LockError, LostReason};
use crate::key::{RedisKeys, ShownKey, Tag};
use crate::kind::Kind;
use crate::limits::MIN_LEASE;
use crate::local_key::LocalKeyRef;
use crate::owner::Owner;
use crate::store::Gone;
use crate::token::Token;

/// How a held lock's lease is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseMode {
    /// Renewed by the watchdog with this lease until released (or until `max_hold`).
    Watchdog(Duration),
    /// A fixed lease, never renewed.
    Fixed(Duration),
}

impl LeaseMode {
    pub(crate) fn lease(self) -> Duration {
        match self {
            Self::Watchdog(lease) | Self::Fixed(lease) => lease,
        }
    }
}

/// What Redis granted.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) keys: RedisKeys,
    pub(crate) token: Token,
    /// When the winning command was sent (the lease counts from there), or when the lock was
    /// handed over locally.
    pub(crate) sent_at: Instant,
    /// For a lock handed over locally: what is known of its validity, and the local handoffs
    /// in a row that led to it.
    pub(crate) handed_over: Option<(Instant, u32)>,
}

/// What the acquirer asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    pub(crate) owner: Owner,
    pub(crate) mode: LeaseMode,
    pub(crate) max_hold: Option<Duration>,
}

/// One held lock. Kept small: a locker may hold thousands, each filed for the watchdog. What
/// the grant brought is kept flat (no `Grant` inside: a handoff's known validity only seeds the
/// clock), the counters are 32-bit, the yes/no marks share one byte, and what changes after
/// the grant shares one lock ([`HoldState`]).
#[derive(Debug)]
pub(crate) struct Hold {
    /// The hash tag of its Redis names: they are built from it, the key and the prefix (read
    /// from its local key) when a command needs them, so a held lock keeps no string.
    tag: Tag,
    kind: Kind,
    token: Token,
    /// When the winning command was sent (the lease counts from there), or when the lock was
    /// handed over locally.
    sent_at: Instant,
    /// The task it is reentrant for.
    owner: Owner,
    /// The lease in nanoseconds (8 bytes, not a `Duration`'s 16; leases are at most a year);
    /// renewed by the watchdog unless [`FIXED`] is marked.
    lease_nanos: u64,
    max_hold: Option<Duration>,
    /// The fencing token once issued (see `fence.rs`); 0 until then (tokens are the server's
    /// clock in microseconds, never 0).
    fence: AtomicU64,
    /// Nested guards alive (1 for a plain acquisition).
    depth: AtomicU32,
    /// [`Fence`](crate::Fence) handles alive: one could still ask for a token under this
    /// Redis token, so the lock is not handed over locally while any lives. (Counted apart
    /// from the `Arc`: the watchdog's renewal in flight holds one too, and does no harm.)
    fences: AtomicU32,
    /// Guards alive that were used by a task other than the owner: while any lives, the lock
    /// is not reentrant for the owner (that task may still be inside).
    escaped: AtomicU32,
    /// [`FIXED`], [`ESCAPED`], [`FINISHING`] and [`ENDED`].
    marks: AtomicU8,
    /// Marked lost: the [`LostReason`]'s code, 0 while not marked; the state's lost signal
    /// wakes the tasks waiting in [`lost`](Self::lost).
    lost: AtomicU8,
    /// Local handoffs in a row that led to this holder (0: taken in Redis; at most
    /// `MAX_STREAK`).
    streak: u8,
    /// The places of the local queue it holds (a semaphore holder's: its permits), given back
    /// after the Redis release completed or when lost; 0 once given back.
    places: AtomicU32,
    state: Mutex<HoldState>,
    /// Keeps its local key registered while the lock lives.
    local_key: LocalKeyRef<Self>,
}

/// A fixed lease, never renewed (else the watchdog renews it).
const FIXED: u8 = 8;

/// A guard of this lock was used by a task other than its owner (warned once; the lock is not
/// reentrant while such a guard lives, see `escaped`).
const ESCAPED: u8 = 1;
/// Someone took on finishing the lock (its outermost guard leaving, or the locker's shutdown):
/// whoever sets it releases the lock, nobody else.
const FINISHING: u8 = 2;
/// The outermost guard has left: the hold is over (released, dropped or handed over). Wakes
/// [`lost`](Hold::lost) too, for a [`LockWatch`](crate::LockWatch) that outlives the guard;
/// the validity clock says nothing after this.
const ENDED: u8 = 4;
/// A release of this lock was sent to Redis (it may have run even if its answer never came).
const RELEASE_SENT: u8 = 16;
/// The release found the key still holding the token (and deleted it) after the local clock
/// had given the lock up: nobody else held it meanwhile.
const RELEASED_OURS: u8 = 32;
/// An explicit extension took the hold's extension turn (made it), or was recorded: the hold's
/// end waits for that turn (see [`Hold::extension_turn`]) and asks whether one is unanswered
/// (see [`Hold::extension_may_still_run`]).
const EXTENDED: u8 = 64;

/// What changes in a held lock after its grant, under one lock: the validity clock, and the
/// two things most locks never need, made or stored only when they are.
#[derive(Debug)]
struct HoldState {
    /// Until when the lock is certainly ours, on the monotonic clock, with a safety margin: as
    /// nanoseconds after the grant's `sent_at` (8 bytes, not an `Instant`'s 16).
    until: u64,
    /// What the hold's explicit extensions left to order against its renewals; made by the
    /// first extension (most locks are never extended, and keep 8 bytes for it).
    extended: Option<Box<Extended>>,
    /// Lets one explicit extension of this hold at a time reach Redis (see
    /// [`Hold::extension_turn`]); made by the first extension.
    extending: Option<Arc<tokio::sync::Mutex<()>>>,
    /// Wakes the tasks waiting in [`Hold::lost`]; made by the first of them.
    lost_signal: Option<Arc<Notify>>,
    /// The `lock.hold` span, from the grant until the release takes it; `None` when no
    /// subscriber wants it (nothing is stored then).
    hold_span: Option<Box<tracing::Span>>,
}

/// The last explicit extension of a hold, and what the hold still does not know of its
/// extensions' order in Redis.
///
/// On the shared connection, a renewal sent after an extension runs after it in Redis. An
/// extension sent on a connection of its own (a pooled one, with `min_replicas`) has no such
/// order: a renewal sent meanwhile on the shared connection may run before it and be cut back
/// by it. Such an extension orders only the renewals sent after its answer (any answer that
/// shows it ran); until then renewals count up to the least it leaves the key, whichever ran
/// first. One that never answers (cancelled, timed out) may still run at any time, so that
/// bound stays for good.
#[derive(Debug)]
struct Extended {
    /// When the last extension was sent, as [`Hold::since_grant`]: the extensions' own order
    /// (they take turns, see [`Hold::extension_turn`]).
    sent: NonZeroU64,
    /// Where the last extension ends in Redis (its `sent_at` plus its lease, without the safety
    /// margin), as [`Hold::after_grant`]: what a renewal that ran after it would undo.
    to: u64,
    /// Renewals sent before this, as [`Hold::since_grant`], may have run before the last
    /// extension in Redis and been overwritten by it: its sending on the shared connection,
    /// its answer on a connection of its own.
    ordered_from: NonZeroU64,
    /// A pooled extension sent and not answered yet: where it leaves the key at least (its
    /// `sent_at` plus its lease, with the safety margin), as [`Hold::after_grant`]. Renewals
    /// count up to it meanwhile.
    unanswered: Option<u64>,
    /// The least of where the pooled extensions that never answered leave the key (as
    /// `unanswered`): each may still run in Redis after any later command, so the validity
    /// stays at or below it. `u64::MAX` while none.
    cap: u64,
}

impl Extended {
    /// What the validity may not exceed now: the cap, and this extension's least while it has
    /// no answer (which joins the cap when a later extension is sent).
    fn lasting_cap(&self) -> u64 {
        self.cap.min(self.unanswered.unwrap_or(u64::MAX))
    }
}

/// How an explicit extension is sent, which decides what orders it against renewals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExtensionPath {
    /// On the connection the watchdog's rounds use: a round sent after it runs after it.
    Shared,
    /// On a connection of its own: a round runs after it only if sent after its answer.
    OwnConnection,
}

/// Part of a lease treated as unsafe: clock drift between client and server, plus scheduling.
fn safety_margin(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(1)
}

/// Nanoseconds from `from` to `to`, 0 if `to` is earlier (saturated at about 584 years).
fn nanos_between(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_nanos()).unwrap_or(u64::MAX)
}

/// The end of a lease confirmed for a command sent at `sent_at`, with the safety margin.
fn confirmed_until(sent_at: Instant, lease: Duration) -> Instant {
    sent_at + lease.saturating_sub(safety_margin(lease))
}

impl Hold {
    pub(crate) fn new(
        terms: Terms,
        grant: Grant,
        local_key: LocalKeyRef<Self>,
        places: u32,
    ) -> Self {
        let until = match grant.handed_over {
            Some((until, _)) => until,
            None => confirmed_until(grant.sent_at, terms.mode.lease()),
        };
        let streak = grant.handed_over.map_or(0, |(_, streak)| streak);
        Self {
            tag: grant.keys.tag(),
            kind: grant.keys.kind(),
            token: grant.token,
            sent_at: grant.sent_at,
            owner: terms.owner,
            lease_nanos: u64::try_from(terms.mode.lease().as_nanos()).unwrap_or(u64::MAX),
            max_hold: terms.max_hold,
            fence: AtomicU64::new(0),
            depth: AtomicU32::new(1),
            fences: AtomicU32::new(0),
            marks: AtomicU8::new(match terms.mode {
                LeaseMode::Fixed(_) => FIXED,
                LeaseMode::Watchdog(_) => 0,
            }),
            lost: AtomicU8::new(0),
            escaped: AtomicU32::new(0),
            // A streak never passes `MAX_STREAK` (a handful).
            streak: u8::try_from(streak).unwrap_or(u8::MAX),
            places: AtomicU32::new(places),
            state: Mutex::new(HoldState {
                // Never before `sent_at`; one that were would count as `sent_at`, the safe side.
                until: nanos_between(grant.sent_at, until),
                extended: None,
                extending: None,
                lost_signal: None,
                hold_span: None,
            }),
            local_key,
        }
    }

    /// Sets `mark`; whether it was set already.
    fn mark(&self, mark: u8) -> bool {
        self.marks.fetch_or(mark, Ordering::AcqRel) & mark != 0
    }

    fn is_marked(&self, mark: u8) -> bool {
        self.marks.load(Ordering::Acquire) & mark != 0
    }

    /// Keeps `span` as this lock's `lock.hold` span until the release; a disabled one is not
    /// stored.
    pub(crate) fn set_hold_span(&self, span: tracing::Span) {
        if !span.is_disabled() {
            self.state.lock().hold_span = Some(Box::new(span));
        }
    }

    /// The `lock.hold` span, taken by the release that ends it (closed when dropped).
    pub(crate) fn take_hold_span(&self) -> Option<tracing::Span> {
        self.state.lock().hold_span.take().map(|span| *span)
    }

    /// The user's key.
    pub(crate) fn key(&self) -> &str {
        self.local_key.user_key()
    }

    /// Which lock of the key it is.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// Its Redis names, built (one allocation) for a command.
    pub(crate) fn redis_keys(&self) -> RedisKeys {
        RedisKeys::with_tag(self.local_key.prefix(), &self.tag, self.key(), self.kind)
    }

    pub(crate) fn token(&self) -> &Token {
        &self.token
    }

    /// The fencing token, if one was issued.
    pub(crate) fn fence(&self) -> Option<u64> {
        match self.fence.load(Ordering::Acquire) {
            0 => None,
            fence => Some(fence),
        }
    }

    /// Keeps `fence` as this acquisition's token unless another was kept first (two callers
    /// asked at once); returns the token kept. Both were issued while the lock was held, so
    /// either is valid, and the one not kept is used by nobody.
    pub(crate) fn keep_fence(&self, fence: u64) -> u64 {
        match self
            .fence
            .compare_exchange(0, fence, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => fence,
            Err(kept) => kept,
        }
    }

    /// Local handoffs in a row that led to this holder (0: taken in Redis).
    pub(crate) fn streak(&self) -> u32 {
        u32::from(self.streak)
    }

    pub(crate) fn mode(&self) -> LeaseMode {
        let lease = Duration::from_nanos(self.lease_nanos);
        if self.is_marked(FIXED) {
            LeaseMode::Fixed(lease)
        } else {
            LeaseMode::Watchdog(lease)
        }
    }

    pub(crate) fn local_key(&self) -> &LocalKeyRef<Self> {
        &self.local_key
    }

    pub(crate) fn depth(&self) -> u32 {
        self.depth.load(Ordering::Acquire)
    }

    /// One more nested guard (under the local key's holder lock).
    pub(crate) fn nest(&self) {
        self.depth.fetch_add(1, Ordering::AcqRel);
    }

    /// One guard fewer (under the local key's holder lock); `true` when it was the outermost.
    pub(crate) fn unnest(&self) -> bool {
        self.depth.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// How long the lock has been held.
    pub(crate) fn held_for(&self) -> Duration {
        self.sent_at.elapsed()
    }

    /// When the hold started (what [`held_for`](Self::held_for) counts from).
    pub(crate) fn held_since(&self) -> Instant {
        self.sent_at
    }

    /// The error that reports this lock's loss. A lock found lost by its clock alone (a fixed
    /// lease that ended, renewals that failed) is marked lost here if nothing marked it yet,
    /// so the loss is logged and counted once whoever notices it first.
    pub(crate) fn lost_error(&self) -> LockError {
        if !self.marked_lost() && self.is_lost() {
            self.mark_lost(self.clock_reason());
        }
        LockError::Lost {
            key: self.key().to_owned(),
            reason: self.lost_reason().unwrap_or(LostReason::Unknown),
        }
    }

    /// Why the lock was marked lost, if it was.
    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        LostReason::from_code(self.lost.load(Ordering::Acquire))
    }

    /// Why a lock whose validity ran out is lost: it reached its `max_hold` (the renewals end
    /// the lease there, less the safety margin that every validity keeps), or its lease ended
    /// before a renewal confirmed it.
    fn clock_reason(&self) -> LostReason {
        match (self.mode(), self.hold_ends()) {
            (LeaseMode::Watchdog(lease), Some(end))
                if Instant::now() + safety_margin(lease) >= end =>
            {
                LostReason::MaxHold
            }
            _ => LostReason::Expired,
        }
    }

    /// Why the lock is lost, given what Redis said about its key: another value is a takeover;
    /// an ended lease an expiry; a key gone while the local clock still counts it valid was
    /// deleted, unless the server started after the lock was taken (it restarted without it).
    pub(crate) fn reason_for(&self, gone: Gone) -> LostReason {
        match gone {
            Gone::Replaced => LostReason::TakenOver,
            Gone::Expired => self.clock_reason(),
            // The reported uptime (whole seconds of the server's clock) is within a second
            // of the real one: one that short of the hold is a start after the grant.
            Gone::Absent { uptime }
                if uptime.is_some_and(|up| up + Duration::from_secs(1) < self.held_for()) =>
            {
                LostReason::ServerRestarted
            }
            Gone::Absent { .. } if Instant::now() < self.valid_until() => LostReason::Deleted,
            Gone::Absent { .. } => self.clock_reason(),
            Gone::Unknown => LostReason::Unknown,
        }
    }

    /// `at` as nanoseconds after the grant's `sent_at`, plus one (so the grant's own instant
    /// is not `None`); an earlier `at` counts as the grant's instant (see
    /// [`before_extension`](Self::before_extension)).
    fn since_grant(&self, at: Instant) -> NonZeroU64 {
        NonZeroU64::new(nanos_between(self.sent_at, at).saturating_add(1))
            .unwrap_or(NonZeroU64::MAX)
    }

    /// `at` as [`HoldState::until`] keeps it; an `at` before the grant counts as the grant's
    /// instant (an earlier end, the safe side).
    fn after_grant(&self, at: Instant) -> u64 {
        nanos_between(self.sent_at, at)
    }

    /// Whether an extension sent at `sent_at` went out before the last explicit extension
    /// (its answer is older news). One sent before the grant (a renewal of the previous local
    /// holder, answered after a handoff) went out before any extension of this hold.
    fn before_extension(&self, state: &HoldState, sent_at: Instant) -> bool {
        state
            .extended
            .as_ref()
            .is_some_and(|last| sent_at < self.sent_at || self.since_grant(sent_at) < last.sent)
    }

    /// Whether a renewal sent at `sent_at` may have run before the last explicit extension in
    /// Redis and been overwritten by it: sent before the extension, or, for one sent on a
    /// connection of its own, before its answer.
    fn renewal_before_extension(&self, state: &HoldState, sent_at: Instant) -> bool {
        state.extended.as_ref().is_some_and(|last| {
            sent_at < self.sent_at || self.since_grant(sent_at) < last.ordered_from
        })
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.sent_at + Duration::from_nanos(self.state.lock().until)
    }

    /// Records a renewal: Redis accepted `lease` for a command sent at `sent_at`. Validity only
    /// grows here (an older renewal answering late must not shorten it), never past what a
    /// pooled extension without an answer leaves the key (it may run after this renewal), and
    /// a renewal that may have run before the last extension is ignored: that extension
    /// overwrote it.
    pub(crate) fn confirm(&self, sent_at: Instant, lease: Duration) {
        let mut state = self.state.lock();
        if self.renewal_before_extension(&state, sent_at) {
            return;
        }
        let cap = state
            .extended
            .as_deref()
            .map_or(u64::MAX, Extended::lasting_cap);
        let renewed = self.after_grant(confirmed_until(sent_at, lease)).min(cap);
        state.until = state.until.max(renewed);
    }

    /// The turn an explicit extension of this hold takes before it is sent, and keeps until
    /// it is answered: two extensions in flight at once could run in Redis in either order (a
    /// retry on a new connection), and the one this hold counts last would not be the one
    /// Redis applied last (a key cut back under a hold that counts a longer lease).
    pub(crate) fn extension_turn(&self) -> Arc<tokio::sync::Mutex<()>> {
        let turn = self
            .state
            .lock()
            .extending
            .get_or_insert_with(Default::default)
            .clone();
        self.mark(EXTENDED);
        turn
    }

    /// The extension turn, if an extension ever took it: the end of the hold (its release or
    /// local handoff) takes it too, so that an extension still on its way (a retry on a new
    /// connection) runs in Redis before the key is deleted or passed on under the same token.
    /// One atomic load for a hold never extended.
    pub(crate) fn extension_turn_if_extended(&self) -> Option<Arc<tokio::sync::Mutex<()>>> {
        if !self.is_marked(EXTENDED) {
            return None;
        }
        self.state.lock().extending.clone()
    }

    /// Whether an extension sent on a connection of its own never answered (or has not yet):
    /// it may still run in Redis at any time, so the hold is not handed over under its token
    /// (it would cut the next holder's lease), but released.
    pub(crate) fn extension_may_still_run(&self) -> bool {
        if !self.is_marked(EXTENDED) {
            return false;
        }
        let state = self.state.lock();
        state
            .extended
            .as_deref()
            .is_some_and(|last| last.lasting_cap() != u64::MAX)
    }

    /// Whether an explicit extension was sent at `at` or later.
    pub(crate) fn extended_since(&self, at: Instant) -> bool {
        let state = self.state.lock();
        state
            .extended
            .as_ref()
            .is_some_and(|last| last.sent >= self.since_grant(at))
    }

    /// Whether a renewal of `lease` sent at `sent_at` may have run before an explicit
    /// extension that ends the lock earlier than this renewal would: run in Redis after that
    /// extension instead (a retry on a new connection, or the extension on a connection of its
    /// own), it gave the key more than the extension left, and the key may outlive the lease
    /// this hold keeps. (An extension that lengthened the lock is not undone: a renewal never
    /// shortens a key.)
    pub(crate) fn renewal_undoes_extension(&self, sent_at: Instant, lease: Duration) -> bool {
        let state = self.state.lock();
        let before = self.renewal_before_extension(&state, sent_at);
        state.extended.as_ref().is_some_and(|last| {
            (before || last.unanswered.is_some()) && last.to < self.after_grant(sent_at + lease)
        })
    }

    /// Before an explicit extension is sent on `path`: Redis may apply it without this process
    /// hearing back (the call is cancelled, the reply is lost), so a validity it would shorten
    /// is shortened now, and renewals sent before it no longer count (they may run before it
    /// in Redis and be overwritten). A longer extension changes nothing until it is confirmed.
    /// On a connection of its own, renewals count only up to where it leaves the key until its
    /// answer; an earlier one there that never answered caps the validity for good.
    pub(crate) fn expect_extension(&self, sent_at: Instant, by: Duration, path: ExtensionPath) {
        let mut state = self.state.lock();
        if self.before_extension(&state, sent_at) {
            return;
        }
        self.mark(EXTENDED);
        let sent = self.since_grant(sent_at);
        let least = self.after_grant(confirmed_until(sent_at, by));
        let cap = state
            .extended
            .as_deref()
            .map_or(u64::MAX, Extended::lasting_cap);
        state.extended = Some(Box::new(Extended {
            sent,
            to: self.after_grant(sent_at + by),
            ordered_from: sent,
            unanswered: (path == ExtensionPath::OwnConnection).then_some(least),
            cap,
        }));
        let until = state.until.min(least).min(cap);
        self.set_until(state, until);
    }

    /// Records that nothing of the pooled extension sent at `sent_at` is still on its way to
    /// Redis at `answered_at`, though its answer decides nothing: it ran (fewer replicas
    /// acknowledged it than required), or it never left this process (no connection could be
    /// had). The validity stays, and renewals sent from then on ran after it, if it ran.
    pub(crate) fn extension_ran(&self, sent_at: Instant, answered_at: Instant) {
        let mut state = self.state.lock();
        let sent = self.since_grant(sent_at);
        let ordered_from = self.since_grant(answered_at);
        if let Some(last) = state.extended.as_mut().filter(|last| last.sent == sent) {
            if last.unanswered.take().is_some() {
                last.ordered_from = ordered_from;
            }
        }
    }

    /// Records an explicit extension sent at `sent_at` and answered at `answered_at`: the
    /// validity becomes `sent_at + by`, shorter or longer (never past what an extension that
    /// never answered leaves the key), unless a later extension was recorded already.
    pub(crate) fn confirm_extension(&self, sent_at: Instant, by: Duration, answered_at: Instant) {
        let mut state = self.state.lock();
        if self.before_extension(&state, sent_at) {
            return;
        }
        let sent = self.since_grant(sent_at);
        let cap = match state.extended.as_mut() {
            // The extension `expect_extension` recorded: answered now.
            Some(last) if last.sent == sent => {
                if last.unanswered.take().is_some() {
                    last.ordered_from = self.since_grant(answered_at);
                }
                last.to = self.after_grant(sent_at + by);
                last.cap
            }
            // Not expected (only unit tests confirm without expecting): recorded as sent on the
            // shared connection.
            last => {
                let cap = last.map_or(u64::MAX, |last| last.lasting_cap());
                state.extended = Some(Box::new(Extended {
                    sent,
                    to: self.after_grant(sent_at + by),
                    ordered_from: sent,
                    unanswered: None,
                    cap,
                }));
                cap
            }
        };
        let until = self.after_grant(confirmed_until(sent_at, by)).min(cap);
        self.set_until(state, until);
    }

    /// Sets the validity to `until`; a shorter one wakes the tasks waiting in
    /// [`lost`](Self::lost), which sleep until the validity they read before (a shortening
    /// `extend` would otherwise leave them asleep past the lease Redis keeps).
    fn set_until(&self, mut state: MutexGuard<'_, HoldState>, until: u64) {
        let shortened = until < state.until;
        state.until = until;
        let signal = shortened.then(|| state.lost_signal.clone()).flatten();
        drop(state);
        if let Some(signal) = signal {
            signal.notify_waiters();
        }
    }

    /// Notes that a guard of this lock is used in the current task; when that is not the
    /// owner, the guard counts as escaped (`guard_escaped`, once per guard) until it leaves
    /// ([`escaped_guard_left`](Self::escaped_guard_left)), and the lock is not reentrant for
    /// the owner meanwhile (warned once per lock).
    pub(crate) fn touched(&self, guard_escaped: &AtomicBool) {
        if guard_escaped.load(Ordering::Acquire) || Owner::current() == self.owner {
            return;
        }
        if guard_escaped.swap(true, Ordering::AcqRel) {
            return;
        }
        self.escaped.fetch_add(1, Ordering::AcqRel);
        if !self.mark(ESCAPED) {
            tracing::warn!(
                key = %ShownKey(self.key()),
                "lock guard used by a task other than the one that acquired it; the lock is not \
                 reentrant for the acquiring task while this guard lives (it waits for it like \
                 any task)"
            );
        }
    }

    /// An escaped guard (see [`touched`](Self::touched)) left: once none is left, the owner may
    /// nest again (a nested guard dropped in another task no longer deadlocks it).
    /// The owner's acquires waiting for that (see [`changed`](Self::changed)) are woken.
    pub(crate) fn escaped_guard_left(&self) {
        if self.escaped.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.wake_watchers();
        }
    }

    /// Whether `owner` is the task it is reentrant for (while no guard escaped).
    pub(crate) fn is_owned_by(&self, owner: Owner) -> bool {
        self.owner == owner
    }

    /// Whether a nested acquire by `owner` may share this lock.
    pub(crate) fn reentrant_for(&self, owner: Owner) -> bool {
        self.owner == owner && self.escaped.load(Ordering::Acquire) == 0
    }

    /// The signal of a change a waiter of this lock looks for: the last escaped guard left, a
    /// loss, the end of the hold, a shorter validity. Made before the waiter looks at the lock
    /// (a change after the look wakes it; one before it is seen), and woken spuriously too.
    pub(crate) fn changed(&self) -> Arc<Notify> {
        self.state
            .lock()
            .lost_signal
            .get_or_insert_with(Arc::default)
            .clone()
    }

    /// Notes that a release is about to be sent; whether one was sent before (an interrupted
    /// release finished again in the background).
    pub(crate) fn release_sent(&self) -> bool {
        self.mark(RELEASE_SENT)
    }

    /// Notes that the release found the key still ours after the clock gave the lock up.
    pub(crate) fn mark_released_ours(&self) {
        self.mark(RELEASED_OURS);
    }

    /// Whether the release found the key still ours (see [`RELEASED_OURS`]).
    pub(crate) fn was_released_ours(&self) -> bool {
        self.is_marked(RELEASED_OURS)
    }

    /// Whether a release of this lock was sent already.
    pub(crate) fn was_release_sent(&self) -> bool {
        self.is_marked(RELEASE_SENT)
    }

    /// Takes on finishing the lock (releasing it in Redis); `false` when someone already
    /// did: the outermost guard left, or the shutdown released it.
    pub(crate) fn claim_finish(&self) -> bool {
        !self.mark(FINISHING)
    }

    fn marked_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire) != 0
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.marked_lost() || Instant::now() >= self.valid_until()
    }

    /// Marks the lock lost (once: the first reason stays) and logs why. The local queue place
    /// is given back at once: Redis no longer holds the lock for us, so other tasks of this
    /// process may contend for it there while this guard lives on (a hung holder past
    /// `max_hold`, a holder that has not noticed yet).
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        let marked =
            self.lost
                .compare_exchange(0, reason.code(), Ordering::AcqRel, Ordering::Acquire);
        if marked.is_ok() {
            if reason == LostReason::Shutdown {
                // Asked for: the shutdown logs once for all of them.
                tracing::debug!(key = %ShownKey(self.key()), held_for = ?self.held_for(), "lock given back by the shutdown");
            } else {
                tracing::warn!(
                    key = %ShownKey(self.key()),
                    fence = self.fence(),
                    reason = reason.as_str(),
                    held_for = ?self.held_for(),
                    "lock lost: {reason}"
                );
            }
            crate::metrics::lost(self.kind, reason);
            self.wake_watchers();
            self.give_back_place();
        }
    }

    /// Marks the hold over (the outermost guard left) and wakes the tasks waiting in
    /// [`lost`](Self::lost).
    pub(crate) fn end(&self) {
        if !self.mark(ENDED) {
            self.wake_watchers();
        }
    }

    /// Wakes the tasks waiting in [`lost`](Self::lost), after a mark they look for was set.
    /// The signal is read under the state's lock, where `lost` registers before it looks at
    /// the marks and the validity: a watcher either registered in time to be woken, or sees
    /// the mark.
    fn wake_watchers(&self) {
        let signal = self.state.lock().lost_signal.clone();
        if let Some(signal) = signal {
            signal.notify_waiters();
        }
    }

    /// Whether the outermost guard has left.
    pub(crate) fn is_ended(&self) -> bool {
        self.is_marked(ENDED)
    }

    /// Resolves when the lock is lost (marked so, or its confirmed validity ran out), or when
    /// the hold ended (only a [`LockWatch`](crate::LockWatch) sees that: no guard is left).
    pub(crate) async fn lost(&self) {
        loop {
            // Registered under the state's lock before the check, so a mark in between still
            // wakes this task (see `wake_watchers`); a `Notified` made before a
            // `notify_waiters` is woken by it.
            let signal;
            let marked = {
                let mut state = self.state.lock();
                signal = state.lost_signal.get_or_insert_with(Arc::default).clone();
                signal.notified()
            };
            let mut marked = std::pin::pin!(marked);
            marked.as_mut().enable();
            if self.marked_lost() || self.is_ended() {
                return;
            }
            let until = self.valid_until();
            tokio::select! {
                // A mark (seen at the top of the loop), or a shorter validity.
                _ = marked => {}
                _ = tokio::time::sleep_until(until) => {
                    // After the hold ended the clock is stale: no loss to report.
                    if self.is_ended() {
                        return;
                    }
                    if Instant::now() >= self.valid_until() {
                        self.mark_lost(self.clock_reason());
                        return;
                    }
                }
            }
        }
    }

    /// The lease the watchdog should renew it with now, if any: the lock's lease, cut to what
    /// is left of its `max_hold`, so that the key ends in Redis when the hold does (renewals
    /// never shorten a lease, so the last full one already ends before that).
    pub(crate) fn wants_renewal(&self, now: Instant) -> Option<Duration> {
        match self.mode() {
            LeaseMode::Watchdog(lease) if !self.marked_lost() => match self.hold_ends() {
                Some(end) => {
                    let left = end.saturating_duration_since(now);
                    (left >= MIN_LEASE).then(|| lease.min(left))
                }
                None => Some(lease),
            },
            _ => None,
        }
    }

    /// When this lock's validity ends by design unless it is extended: a fixed lease's, or a
    /// watchdog lock's with a `max_hold` (renewed up to it, no further), or one whose lease an
    /// explicit extension set (it may end before the watchdog's next renewal: an `extend`
    /// that shortened it); `None` for a watchdog lock renewed for as long as it is held.
    pub(crate) fn planned_end(&self) -> Option<Instant> {
        match self.mode() {
            LeaseMode::Watchdog(_) if self.max_hold.is_none() => {
                let state = self.state.lock();
                state
                    .extended
                    .as_ref()
                    .map(|_| self.sent_at + Duration::from_nanos(state.until))
            }
            _ => self.planned_end_of_grant(),
        }
    }

    /// [`planned_end`](Self::planned_end) of a hold just granted (never extended yet): the
    /// grant's path reads no state for a watchdog lock without a `max_hold`.
    pub(crate) fn planned_end_of_grant(&self) -> Option<Instant> {
        match self.mode() {
            LeaseMode::Fixed(_) => Some(self.valid_until()),
            LeaseMode::Watchdog(_) => self.max_hold.map(|_| self.valid_until()),
        }
    }

    /// When the `max_hold` of this lock ends, if it has one (a `max_hold` beyond the clock's
    /// range never ends).
    pub(crate) fn hold_ends(&self) -> Option<Instant> {
        self.max_hold.and_then(|max| self.sent_at.checked_add(max))
    }

    /// Gives the local queue place back (once).
    pub(crate) fn give_back_place(&self) {
        let places = self.places.swap(0, Ordering::AcqRel);
        if places > 0 {
            self.local_key.give_back(places);
        }
    }

    /// Counts a [`Fence`](crate::Fence) handle made (`true`) or dropped (`false`).
    pub(crate) fn count_fence(&self, made: bool) {
        if made {
            self.fences.fetch_add(1, Ordering::AcqRel);
        } else {
            self.fences.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether a [`Fence`](crate::Fence) handle of this acquisition is alive.
    pub(crate) fn has_fences(&self) -> bool {
        self.fences.load(Ordering::Acquire) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_key::LocalKeys;

    fn held(local_keys: &LocalKeys<Hold>, lease: Duration, sent_at: Instant) -> Hold {
        held_at_most(local_keys, lease, sent_at, None)
    }

    fn held_at_most(
        local_keys: &LocalKeys<Hold>,
        lease: Duration,
        sent_at: Instant,
        max_hold: Option<Duration>,
    ) -> Hold {
        let local_key = local_keys.get("k");
        let places = local_key.try_place(1).unwrap().keep();
        let terms = Terms {
            owner: Owner::current(),
            mode: LeaseMode::Watchdog(lease),
            max_hold,
        };
        let grant = Grant {
            keys: RedisKeys::new("p:", "k"),
            token: Token::new(&std::sync::Arc::from("t"), Kind::Exclusive, 1),
            sent_at,
            handed_over: None,
        };
        Hold::new(terms, grant, local_key, places)
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_sent_before_a_shortening_extension_does_not_undo_it() {
        let local_keys = LocalKeys::new("p:", false);
        let lease = Duration::from_secs(30);
        let t0 = Instant::now();
        let held = held(&local_keys, lease, t0);
        // The watchdog sends a renewal at t0 + 1 s; the user shortens the lease to 2 s at
        // t0 + 2 s; the extension's answer arrives first, the renewal's answer after it.
        let renewal_sent = t0 + Duration::from_secs(1);
        let extension_sent = t0 + Duration::from_secs(2);
        held.confirm_extension(extension_sent, Duration::from_secs(2), extension_sent);
        held.confirm(renewal_sent, lease);
        let until = held.valid_until();
        assert!(
            until <= extension_sent + Duration::from_secs(2),
            "{until:?}"
        );
        // A renewal sent after the extension counts again.
        held.confirm(extension_sent + Duration::from_millis(1), lease);
        assert!(held.valid_until() > extension_sent + Duration::from_secs(20));
        // An older extension answering late does not undo a newer one.
        held.confirm_extension(renewal_sent, Duration::from_millis(10), extension_sent);
        assert!(held.valid_until() > extension_sent + Duration::from_secs(20));
    }

    /// A hold of `lease` granted at `t0`, and an extension by `by` sent on a connection of its
    /// own one second later: `(the local keys the hold needs, the hold, t0, that sending)`.
    fn with_pooled_extension(
        lease: Duration,
        by: Duration,
    ) -> (LocalKeys<Hold>, Hold, Instant, Instant) {
        let local_keys = LocalKeys::new("p:", false);
        let t0 = Instant::now();
        let held = held(&local_keys, lease, t0);
        let sent = t0 + Duration::from_secs(1);
        held.expect_extension(sent, by, ExtensionPath::OwnConnection);
        (local_keys, held, t0, sent)
    }

    /// An extension on a connection of its own orders only the renewals sent after its
    /// answer: one sent while it waited (for a connection, for replicas) may have run first
    /// in Redis and been cut back by it (RELIABILITY.md, E1, E2).
    #[tokio::test(start_paused = true)]
    async fn a_pooled_extension_orders_only_renewals_sent_after_its_answer() {
        let (lease, by) = (Duration::from_secs(30), Duration::from_secs(2));
        let (_keys, held, _, sent) = with_pooled_extension(lease, by);
        // A round sent after the extension, answered before it: counted only up to where the
        // extension leaves the key, and it may have undone the shortening if it ran after it.
        let round = sent + Duration::from_millis(100);
        held.confirm(round, lease);
        assert!(held.valid_until() <= sent + by, "{:?}", held.valid_until());
        assert!(held.renewal_undoes_extension(round, lease));
        let answered = sent + Duration::from_millis(500);
        held.confirm_extension(sent, by, answered);
        // Sent before the answer, answered after it: still not counted.
        held.confirm(answered - Duration::from_millis(1), lease);
        assert!(held.valid_until() <= sent + by);
        assert!(!held.extension_may_still_run());
        // Sent after the answer: counted.
        held.confirm(answered, lease);
        assert!(held.valid_until() > answered + Duration::from_secs(20));
        assert!(!held.renewal_undoes_extension(answered, lease));
    }

    /// A pooled extension that never answered may still run in Redis after any later command:
    /// renewals and later extensions never take the validity past what it leaves the key, and
    /// the hold is not handed over under its token.
    #[tokio::test(start_paused = true)]
    async fn a_pooled_extension_without_an_answer_caps_the_validity_for_good() {
        let (lease, by) = (Duration::from_secs(30), Duration::from_secs(2));
        let (_keys, held, t0, sent) = with_pooled_extension(lease, by);
        assert!(held.extension_may_still_run());
        // No answer (cancelled, timed out): renewals count up to where it leaves the key.
        held.confirm(sent + Duration::from_millis(100), lease);
        let until = held.valid_until();
        assert!(until <= sent + by && until > sent + by / 2, "{until:?}");
        // A later extension, answered, then renewals after it: never past the first one's end.
        let again = sent + Duration::from_millis(1500);
        held.expect_extension(again, lease, ExtensionPath::OwnConnection);
        held.confirm_extension(again, lease, again + Duration::from_millis(5));
        held.confirm(again + Duration::from_millis(10), lease);
        let until = held.valid_until();
        assert!(until <= sent + by, "{until:?}");
        assert!(held.extension_may_still_run());
        // On the shared connection, an extension without an answer is ordered with the rounds
        // sent after it (one connection), and caps nothing.
        let other_keys = LocalKeys::new("p:", false);
        let other = self::held(&other_keys, lease, t0);
        other.expect_extension(sent, by, ExtensionPath::Shared);
        assert!(!other.extension_may_still_run());
        other.confirm(sent + Duration::from_secs(1), lease);
        assert!(other.valid_until() > sent + Duration::from_secs(20));
    }

    /// A pooled extension answered without enough replicas ran in Redis before its answer:
    /// nothing of it is still on its way, so it caps nothing later (RELIABILITY.md, G1, G2).
    #[tokio::test(start_paused = true)]
    async fn a_pooled_extension_that_ran_unreplicated_caps_nothing() {
        let lease = Duration::from_secs(3);
        let (_keys, held, _, sent) = with_pooled_extension(lease, Duration::from_secs(20));
        let answered = sent + Duration::from_millis(500);
        held.extension_ran(sent, answered);
        assert!(!held.extension_may_still_run());
        // The watchdog's rounds after the answer keep the lock past the extension's end.
        let late = sent + Duration::from_secs(30);
        held.confirm(late, lease);
        assert!(held.valid_until() > late + Duration::from_secs(2));
        // A later extension, answered, is not capped by the first.
        let again = late + Duration::from_millis(10);
        held.expect_extension(again, Duration::from_secs(60), ExtensionPath::OwnConnection);
        held.confirm_extension(
            again,
            Duration::from_secs(60),
            again + Duration::from_millis(5),
        );
        assert!(held.valid_until() > again + Duration::from_secs(50));
    }

    fn reason(error: LockError) -> LostReason {
        match error {
            LockError::Lost { reason, .. } => reason,
            other => panic!("expected Lost, got {other}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_is_explained_by_what_redis_found_and_by_the_clock() {
        let local_keys = LocalKeys::new("p:", false);
        let lease = Duration::from_secs(30);
        let held = held(&local_keys, lease, Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        let absent = |uptime: Option<u64>| Gone::Absent {
            uptime: uptime.map(Duration::from_secs),
        };
        assert_eq!(held.reason_for(Gone::Replaced), LostReason::TakenOver);
        assert_eq!(held.reason_for(Gone::Unknown), LostReason::Unknown);
        // Gone while the lease still runs: deleted, unless the server is younger than the hold.
        assert_eq!(held.reason_for(absent(None)), LostReason::Deleted);
        assert_eq!(held.reason_for(absent(Some(6))), LostReason::Deleted);
        assert_eq!(held.reason_for(absent(Some(4))), LostReason::Deleted);
        assert_eq!(
            held.reason_for(absent(Some(3))),
            LostReason::ServerRestarted
        );
        // Past the confirmed lease, an absent key has expired.
        tokio::time::advance(lease).await;
        assert_eq!(held.reason_for(absent(None)), LostReason::Expired);
        assert_eq!(held.reason_for(Gone::Expired), LostReason::Expired);
        // Nothing marked it yet: the error marks it, with the clock's reason.
        assert_eq!(held.lost_reason(), None);
        assert_eq!(reason(held.lost_error()), LostReason::Expired);
        assert_eq!(held.lost_reason(), Some(LostReason::Expired));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_past_its_max_hold_is_lost_for_that_reason() {
        let local_keys = LocalKeys::new("p:", false);
        let lease = Duration::from_secs(3);
        let max = Duration::from_secs(10);
        let held = held_at_most(&local_keys, lease, Instant::now(), Some(max));
        tokio::time::advance(Duration::from_secs(2)).await;
        held.confirm(Instant::now(), lease);
        assert!(held.wants_renewal(Instant::now()).is_some());
        tokio::time::advance(max).await;
        assert_eq!(held.wants_renewal(Instant::now()), None);
        assert!(held.is_lost());
        held.lost().await;
        assert_eq!(reason(held.lost_error()), LostReason::MaxHold);
    }

    #[tokio::test]
    async fn a_lost_lock_gives_back_its_local_place() {
        let local_keys = LocalKeys::new("p:", false);
        let held = held(&local_keys, Duration::from_secs(30), Instant::now());
        assert_eq!(held.local_key().free_places(), 0);
        held.mark_lost(LostReason::Deleted);
        assert_eq!(held.local_key().free_places(), 1);
        // The first reason stays.
        held.mark_lost(LostReason::Expired);
        assert_eq!(held.lost_reason(), Some(LostReason::Deleted));
        held.give_back_place();
        assert_eq!(held.local_key().free_places(), 1);
    }
}
