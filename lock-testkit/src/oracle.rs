//! A double-holder oracle (RELIABILITY.md C.1): three independent checks that a lock never had
//! two holders at once, usable by the tasks of one process and by several processes on one
//! host at the same time.
//!
//! Every check lives on a separate, never-faulted **referee** `redis-server`, so faults injected
//! into the lock server (or a holder's network) cannot hide a violation:
//!
//! 1. **Occupancy counter.** [`Oracle::enter`] runs `INCR occ:<key>` (it must return 1) and
//!    [`Oracle::leave`] runs `DECR` before the lock is released. A value above 1 is a
//!    *collision*; the ids of the holders already inside are recorded with it.
//! 2. **Interval log.** Each critical section becomes an [`Interval`]: key, fencing token,
//!    `CLOCK_MONOTONIC` enter and exit times (one clock for every process on the host, see
//!    [`monotonic_ns`]), the last time the holder checked that it still held the lock, and
//!    when it learned that it had lost it. [`check`] sorts them per key and classifies every
//!    overlap (see below).
//! 3. **Fenced resource.** A Lua script stands for a storage system that takes fencing tokens:
//!    a holder's token is registered when it enters (a claim that raises the key's high-water
//!    mark; a token not above it is a *fence regression*), and [`Oracle::write`] is accepted
//!    only with a token at least as high as the highest one seen, i.e. only from the newest
//!    holder. Every write is logged with a global sequence number shared with the enters, and
//!    [`check`] recounts stale writes from that log, independently of the script's verdict.
//!
//! # The verdict on an overlap
//!
//! Two intervals of one key overlap when one enters before the other exits. Of the two, the
//! *older* holder is the one with the lower fencing token (it acquired first), the other is the
//! *younger*. The overlap is
//!
//! - **signalled** when the older holder had learned that its lock was lost no later than the
//!   younger one entered (`lost_at <= younger.t_enter`): the kit said so in time;
//! - **late-signalled** when the older holder did learn it, but later, and never confirmed
//!   holding the lock (`is_held()` true) at or after the younger one entered: it was not
//!   running in between (SIGSTOP, a long scheduling stall) - the window that only fencing
//!   tokens close (Kleppmann), so it is reported but not a violation;
//! - **killed** when the older holder was SIGKILLed before it could learn anything and had
//!   not confirmed holding the lock at or after the younger one entered (its last check is
//!   recorded on the referee on enter and on leave): a dead process is never signalled, and
//!   one that was stalled when its lease ran out and then killed did nothing meanwhile;
//! - **unsignalled** otherwise: the older holder never learned it lost the lock, or believed
//!   it still held it after the younger one had entered. That is a violation.
//!
//! An occupancy collision is a violation under the same idea: unless the older of the two
//! holders was marked lost, or was SIGKILLed without a confirmation after the younger one
//! entered (or before the younger one entered, and only its clean-up was late).
//!
//! # Across processes
//!
//! Each process connects its own [`Oracle`] with the same `run` name and a distinct `worker`
//! name. A worker that is SIGKILLed mid-section leaves its enter behind; the parent closes it
//! with [`Oracle::close_worker`] (decrementing the occupancy and logging the interval as
//! [`Outcome::Killed`]). [`Oracle::report`] reads everything back and runs [`check`].
//!
//! # Limits
//!
//! Times are stamped by the holder around its own calls: `t_enter` after the acquire returned,
//! `t_exit` before the release is sent, `last_held` *before* a positive `is_held()`, `lost_at`
//! *after* the loss was observed. Pauses between a stamp and the action it describes can only
//! shrink an interval or delay a loss, so they never make a correct lock look wrong; they can
//! hide a violation in a window of a few instructions. A holder paused after stamping its
//! enter but before the enter reached the referee overlaps without an occupancy collision.
//! What a SIGKILLed holder checked is known only as of its enter or its leave.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use nix::time::{clock_gettime, ClockId};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult, Script};

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on this host (unlike
/// `std::time::Instant`, which cannot be sent to another process), so intervals logged by
/// different processes can be compared.
///
/// # Panics
///
/// Never on Linux (`CLOCK_MONOTONIC` always exists).
pub fn monotonic_ns() -> u64 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is available");
    let secs = u64::try_from(now.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec()).unwrap_or(0);
    secs * 1_000_000_000 + nanos
}

/// How a critical section ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The holder finished and released the lock while still holding it.
    Completed,
    /// The holder learned that it had lost the lock (the lost signal, `is_held()` false, or a
    /// release answering "lost").
    Lost,
    /// The section ran to its end but the release failed with a backend error (the key then
    /// expires with its lease).
    ReleaseFailed,
    /// The holder's process was SIGKILLed; the interval was closed by [`Oracle::close_worker`].
    Killed,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Lost => "lost",
            Self::ReleaseFailed => "release-failed",
            Self::Killed => "killed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "completed" => Self::Completed,
            "lost" => Self::Lost,
            "release-failed" => Self::ReleaseFailed,
            "killed" => Self::Killed,
            _ => return None,
        })
    }
}

/// One critical section, as logged on the referee.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    /// Unique id: `<worker>#<n>`.
    pub id: String,
    /// The user's lock key.
    pub key: String,
    /// The fencing token of the acquisition.
    pub fence: u64,
    /// Position of the enter in the referee's global sequence (shared with fenced writes).
    pub enter_seq: u64,
    /// `CLOCK_MONOTONIC` ns, stamped after the acquire returned.
    pub t_enter: u64,
    /// `CLOCK_MONOTONIC` ns, stamped before leaving (before the release was sent).
    pub t_exit: u64,
    /// Stamped before the last `is_held()` that answered true, if any.
    pub last_held: Option<u64>,
    /// Stamped after the holder first observed that the lock was lost, if it did.
    pub lost_at: Option<u64>,
    /// What `INCR occ:<key>` returned on enter (1 unless someone else was inside).
    pub occupancy: u64,
    /// Ids of the holders that were inside when this one entered.
    pub collided_with: Vec<String>,
    /// How the section ended.
    pub outcome: Outcome,
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn parse_opt(s: &str) -> Option<Option<u64>> {
    if s == "-" {
        Some(None)
    } else {
        s.parse().ok().map(Some)
    }
}

fn parse_list(s: &str) -> Vec<String> {
    if s.is_empty() || s == "-" {
        Vec::new()
    } else {
        s.split(',').map(str::to_owned).collect()
    }
}

impl Interval {
    /// The tab-separated line stored in the referee's log.
    pub fn to_line(&self) -> String {
        let collided = if self.collided_with.is_empty() {
            "-".to_owned()
        } else {
            self.collided_with.join(",")
        };
        [
            "v1",
            &self.id,
            &self.key,
            &self.fence.to_string(),
            &self.enter_seq.to_string(),
            &self.t_enter.to_string(),
            &self.t_exit.to_string(),
            &opt(self.last_held),
            &opt(self.lost_at),
            &self.occupancy.to_string(),
            &collided,
            self.outcome.as_str(),
        ]
        .join("\t")
    }

    /// Parses a line written by [`to_line`](Self::to_line).
    pub fn from_line(line: &str) -> Option<Self> {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 12 || f[0] != "v1" {
            return None;
        }
        Some(Self {
            id: f[1].to_owned(),
            key: f[2].to_owned(),
            fence: f[3].parse().ok()?,
            enter_seq: f[4].parse().ok()?,
            t_enter: f[5].parse().ok()?,
            t_exit: f[6].parse().ok()?,
            last_held: parse_opt(f[7])?,
            lost_at: parse_opt(f[8])?,
            occupancy: f[9].parse().ok()?,
            collided_with: parse_list(f[10]),
            outcome: Outcome::parse(f[11])?,
        })
    }
}

/// One write to the fenced resource, as logged by the script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedWrite {
    /// Position in the referee's global sequence (shared with enters).
    pub seq: u64,
    /// The user's lock key.
    pub key: String,
    /// The fencing token the write carried.
    pub fence: u64,
    /// Whether the resource accepted it.
    pub accepted: bool,
    /// The writer's interval id.
    pub id: String,
}

impl FencedWrite {
    fn from_line(line: &str) -> Option<Self> {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() != 5 {
            return None;
        }
        Some(Self {
            seq: f[0].parse().ok()?,
            key: f[1].to_owned(),
            fence: f[2].parse().ok()?,
            accepted: f[3] == "1",
            id: f[4].to_owned(),
        })
    }
}

/// A critical section in progress: returned by [`Oracle::enter`], given back to
/// [`Oracle::leave`] and [`Oracle::finish`].
#[derive(Debug, Clone)]
pub struct Entry {
    interval: Interval,
    left: bool,
    fence_regression: bool,
}

impl Entry {
    /// The interval id.
    pub fn id(&self) -> &str {
        &self.interval.id
    }

    /// The fencing token registered on enter.
    pub fn fence(&self) -> u64 {
        self.interval.fence
    }

    /// What the occupancy counter returned on enter (1 = nobody else was inside).
    pub fn occupancy(&self) -> u64 {
        self.interval.occupancy
    }

    /// Whether the fenced resource had already seen a token at least as high on enter: a
    /// fence regression, or a holder entering after its lock had passed to a newer one.
    pub fn claim_below_high_water(&self) -> bool {
        self.fence_regression
    }

    /// When the loss was first observed, if it was.
    pub fn lost_at(&self) -> Option<u64> {
        self.interval.lost_at
    }

    /// The enter time (`CLOCK_MONOTONIC` ns).
    pub fn t_enter(&self) -> u64 {
        self.interval.t_enter
    }

    /// Records a check of the lock, e.g. `entry.observe(|| guard.is_held())`: a `true` answer
    /// is a confirmation (stamped before the call), a `false` one the observation of a loss
    /// (stamped after it). Returns the answer.
    pub fn observe(&mut self, held: impl FnOnce() -> bool) -> bool {
        let before = monotonic_ns();
        if held() {
            self.interval.last_held = Some(before);
            true
        } else {
            self.mark_lost();
            false
        }
    }

    /// Records that the holder learned now that the lock was lost (the first call counts).
    pub fn mark_lost(&mut self) {
        if self.interval.lost_at.is_none() {
            self.interval.lost_at = Some(monotonic_ns());
        }
    }
}

/// Takes a lock-scoped view of the referee's keys for one run.
#[derive(Debug, Clone)]
struct Names {
    ns: String,
}

impl Names {
    fn occ(&self, key: &str) -> String {
        format!("{}occ:{key}", self.ns)
    }
    fn occupants(&self, key: &str) -> String {
        format!("{}occupants:{key}", self.ns)
    }
    fn fence(&self, key: &str) -> String {
        format!("{}fence:{key}", self.ns)
    }
    fn open(&self, worker: &str) -> String {
        format!("{}open:{worker}", self.ns)
    }
    fn seq(&self) -> String {
        format!("{}seq", self.ns)
    }
    fn stats(&self) -> String {
        format!("{}stats", self.ns)
    }
    fn log(&self) -> String {
        format!("{}log", self.ns)
    }
    fn writes(&self) -> String {
        format!("{}writes", self.ns)
    }
}

/// Compares two decimal strings without leading zeros as numbers (exact for any length).
const GT: &str = "local function gt(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
";

/// KEYS: occ, occupants, fence, open, seq, stats. ARGV: id, fence, t_enter, key, last_held,
/// lost_at. The open record: key, fence, t_enter, seq, occupancy, others, last_held, lost_at.
static ENTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{GT}
local others = table.concat(redis.call('SMEMBERS', KEYS[2]), ',')
redis.call('SADD', KEYS[2], ARGV[1])
local occ = redis.call('INCR', KEYS[1])
local seq = redis.call('INCR', KEYS[5])
redis.call('HINCRBY', KEYS[6], 'enters', 1)
if occ > 1 then redis.call('HINCRBY', KEYS[6], 'occupancy_collisions', 1) end
local hw = redis.call('GET', KEYS[3]) or '0'
local regression = 0
if gt(ARGV[2], hw) then
  redis.call('SET', KEYS[3], ARGV[2])
else
  regression = 1
  redis.call('HINCRBY', KEYS[6], 'claims_below_high_water', 1)
end
redis.call('HSET', KEYS[4], ARGV[1], table.concat(
  {{ARGV[4], ARGV[2], ARGV[3], tostring(seq), tostring(occ), others, ARGV[5], ARGV[6]}}, '\\t'))
return {{occ, seq, regression, others}}"
    ))
});

/// KEYS: occ, occupants, open. ARGV: id, t_exit, last_held, lost_at; appended to the open
/// record once. Idempotent.
static LEAVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('SREM', KEYS[2], ARGV[1]) == 1 then redis.call('DECR', KEYS[1]) end
local v = redis.call('HGET', KEYS[3], ARGV[1])
if v then
  local _, tabs = string.gsub(v, '\\t', '')
  if tabs == 7 then
    redis.call('HSET', KEYS[3], ARGV[1], table.concat({v, ARGV[2], ARGV[3], ARGV[4]}, '\\t'))
  end
end
return 1",
    )
});

/// KEYS: open, log. ARGV: id, line.
static FINISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1",
    )
});

/// KEYS: fence, seq, writes, stats. ARGV: token, id, key.
static WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{GT}
local hw = redis.call('GET', KEYS[1]) or '0'
local seq = redis.call('INCR', KEYS[2])
local ok = 0
if gt(hw, ARGV[1]) then
  redis.call('HINCRBY', KEYS[4], 'writes_rejected', 1)
else
  ok = 1
  if gt(ARGV[1], hw) then redis.call('SET', KEYS[1], ARGV[1]) end
  redis.call('HINCRBY', KEYS[4], 'writes_accepted', 1)
end
redis.call('RPUSH', KEYS[3], table.concat({{tostring(seq), ARGV[3], ARGV[1], tostring(ok), ARGV[2]}}, '\\t'))
return ok"
    ))
});

/// A connection to the referee for one run, used by one process (clone it freely between
/// its tasks).
///
/// # Examples
///
/// One critical section, as a holder of a lock-core lock would log it (`held` stands for
/// `guard.is_held()`, `fence` for `guard.fencing_token()`):
///
/// ```no_run
/// # async fn demo(fence: u64, held: impl Fn() -> bool) -> redis::RedisResult<()> {
/// use lock_testkit::oracle::{Oracle, Outcome};
/// use lock_testkit::RedisServer;
///
/// let referee = RedisServer::start().expect("redis-server");
/// let oracle = Oracle::connect(&referee.url(), "run1", "worker-a").await?;
/// // ... after the acquire returned:
/// let mut entry = oracle.enter("inventory:42", fence, &held).await?;
/// assert_eq!(entry.occupancy(), 1, "someone else is inside");
/// let accepted = oracle.write(&entry).await?; // through the fence
/// entry.observe(&held); // confirms (or records the loss) just before leaving
/// oracle.leave(&mut entry).await?;
/// // ... release the lock, then log how it went:
/// oracle.finish(entry, Outcome::Completed).await?;
/// let report = oracle.report().await?;
/// assert!(report.is_clean(), "{report}");
/// # let _ = accepted;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Oracle {
    conn: MultiplexedConnection,
    names: Names,
    worker: String,
    next: Arc<AtomicU64>,
}

impl fmt::Debug for Oracle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Oracle")
            .field("ns", &self.names.ns)
            .field("worker", &self.worker)
            .finish_non_exhaustive()
    }
}

fn plain(what: &str, s: &str) {
    assert!(
        !s.is_empty() && !s.contains(['\t', '\n', ',', '#']),
        "oracle {what} {s:?} must be non-empty without tabs, newlines, commas or '#'"
    );
}

impl Oracle {
    /// Connects to the referee at `referee_url`. Every process of one check uses the same
    /// `run` (a namespace on the referee) and its own `worker` name.
    ///
    /// # Errors
    ///
    /// When the referee cannot be reached.
    ///
    /// # Panics
    ///
    /// When `run` or `worker` is empty or contains a tab, newline, comma or `#`.
    pub async fn connect(referee_url: &str, run: &str, worker: &str) -> RedisResult<Self> {
        plain("run", run);
        plain("worker", worker);
        // TCP_NODELAY: the tasks of a process share the connection, and with Nagle a command
        // written while another is unacknowledged waits for the delayed ACK (~40 ms).
        let info = redis::IntoConnectionInfo::into_connection_info(referee_url)?
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(info)?;
        // The referee is never faulted, but the machine may be loaded: no short timeouts.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(10)))
            .set_response_timeout(Some(Duration::from_secs(30)));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(Self {
            conn,
            names: Names {
                ns: format!("oracle:{run}:"),
            },
            worker: worker.to_owned(),
            next: Arc::new(AtomicU64::new(1)),
        })
    }

    /// This process's worker name.
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// Enters the critical section of `key` with the acquisition's fencing token: stamps the
    /// enter time, checks the lock once (`held`, e.g. `|| guard.is_held()`, recorded as by
    /// [`Entry::observe`]), increments the occupancy counter, registers the token with the
    /// fenced resource and leaves an open record (closed by [`finish`](Self::finish), or by
    /// [`close_worker`](Self::close_worker) if this process dies).
    ///
    /// # Errors
    ///
    /// When the referee fails.
    ///
    /// # Panics
    ///
    /// When `key` contains a tab or a newline.
    pub async fn enter(
        &self,
        key: &str,
        fence: u64,
        held: impl FnOnce() -> bool,
    ) -> RedisResult<Entry> {
        assert!(
            !key.is_empty() && !key.contains(['\t', '\n']),
            "oracle keys must be non-empty without tabs or newlines: {key:?}"
        );
        let t_enter = monotonic_ns();
        let (last_held, lost_at) = if held() {
            (Some(t_enter), None)
        } else {
            (None, Some(monotonic_ns()))
        };
        let id = format!(
            "{}#{}",
            self.worker,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let n = &self.names;
        let (occupancy, enter_seq, regression, others): (u64, u64, u8, String) = ENTER
            .key(n.occ(key))
            .key(n.occupants(key))
            .key(n.fence(key))
            .key(n.open(&self.worker))
            .key(n.seq())
            .key(n.stats())
            .arg(&id)
            .arg(fence)
            .arg(t_enter)
            .arg(key)
            .arg(opt(last_held))
            .arg(opt(lost_at))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(Entry {
            interval: Interval {
                id,
                key: key.to_owned(),
                fence,
                enter_seq,
                t_enter,
                t_exit: t_enter,
                last_held,
                lost_at,
                occupancy,
                collided_with: parse_list(&others),
                outcome: Outcome::Completed,
            },
            left: false,
            fence_regression: regression == 1,
        })
    }

    /// One critical section of a holder that keeps its lock throughout (tests without
    /// faults): [`enter`](Self::enter), `work`, a fenced [`write`](Self::write),
    /// [`leave`](Self::leave), and [`finish`](Self::finish) as [`Outcome::Completed`]. Returns
    /// `work`'s output and whether the write was accepted. Release the lock after it returns.
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn section<T>(
        &self,
        key: &str,
        fence: u64,
        held: impl Fn() -> bool,
        work: impl std::future::Future<Output = T>,
    ) -> RedisResult<(T, bool)> {
        let mut entry = self.enter(key, fence, &held).await?;
        let output = work.await;
        entry.observe(&held);
        let accepted = self.write(&entry).await?;
        self.leave(&mut entry).await?;
        self.finish(entry, Outcome::Completed).await?;
        Ok((output, accepted))
    }

    /// A write to the fenced resource with the entry's token; `true` when it was accepted.
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn write(&self, entry: &Entry) -> RedisResult<bool> {
        let n = &self.names;
        let key = &entry.interval.key;
        let ok: i64 = WRITE
            .key(n.fence(key))
            .key(n.seq())
            .key(n.writes())
            .key(n.stats())
            .arg(entry.interval.fence)
            .arg(&entry.interval.id)
            .arg(key)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(ok == 1)
    }

    /// Leaves the critical section (call it before releasing the lock): stamps the exit time
    /// and decrements the occupancy counter. Idempotent.
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn leave(&self, entry: &mut Entry) -> RedisResult<()> {
        if entry.left {
            return Ok(());
        }
        entry.interval.t_exit = monotonic_ns();
        self.leave_on_referee(&self.worker, &entry.interval).await?;
        entry.left = true;
        Ok(())
    }

    /// Decrements the occupancy and records the exit time and the last observations in the
    /// open record (for [`close_worker`](Self::close_worker), should the process die now).
    async fn leave_on_referee(&self, worker: &str, interval: &Interval) -> RedisResult<()> {
        let n = &self.names;
        let _: i64 = LEAVE
            .key(n.occ(&interval.key))
            .key(n.occupants(&interval.key))
            .key(n.open(worker))
            .arg(&interval.id)
            .arg(interval.t_exit)
            .arg(opt(interval.last_held))
            .arg(opt(interval.lost_at))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Logs the finished interval (after the release) and removes its open record. Leaves
    /// first if [`leave`](Self::leave) was not called. [`Outcome::Lost`] marks the loss now
    /// if it was not observed before.
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn finish(&self, mut entry: Entry, outcome: Outcome) -> RedisResult<Interval> {
        self.leave(&mut entry).await?;
        if outcome == Outcome::Lost {
            entry.mark_lost();
        }
        let mut interval = entry.interval;
        interval.outcome = outcome;
        self.log(&self.worker, &interval).await?;
        Ok(interval)
    }

    async fn log(&self, worker: &str, interval: &Interval) -> RedisResult<()> {
        let n = &self.names;
        let _: i64 = FINISH
            .key(n.open(worker))
            .key(n.log())
            .arg(&interval.id)
            .arg(interval.to_line())
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Closes every section that `worker` (a SIGKILLed process) left open: occupancy is
    /// decremented if it had not left yet, and the interval is logged as [`Outcome::Killed`]
    /// ending at `dead_at` (`CLOCK_MONOTONIC` ns, taken after the process was reaped) or at
    /// its own exit stamp, with the last observations it recorded on the referee (on enter,
    /// or on leave). Returns how many were closed.
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn close_worker(&self, worker: &str, dead_at: u64) -> RedisResult<usize> {
        let open: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.names.open(worker))
            .query_async(&mut self.conn.clone())
            .await?;
        for (id, value) in &open {
            let malformed = || {
                redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "malformed open oracle record",
                    value.clone(),
                ))
            };
            // key, fence, t_enter, seq, occupancy, others, last_held, lost_at, and after a
            // leave: t_exit, last_held, lost_at.
            let f: Vec<&str> = value.split('\t').collect();
            if f.len() != 8 && f.len() != 11 {
                return Err(malformed());
            }
            let num = |i: usize| f[i].parse::<u64>().map_err(|_| malformed());
            let observed = |i: usize| parse_opt(f[i]).ok_or_else(malformed);
            let mut interval = Interval {
                id: id.clone(),
                key: f[0].to_owned(),
                fence: num(1)?,
                enter_seq: num(3)?,
                t_enter: num(2)?,
                t_exit: dead_at,
                last_held: observed(6)?,
                lost_at: observed(7)?,
                occupancy: num(4)?,
                collided_with: parse_list(f[5]),
                outcome: Outcome::Killed,
            };
            if f.len() == 11 {
                interval.t_exit = num(8)?;
                interval.last_held = observed(9)?;
                interval.lost_at = observed(10)?;
            } else {
                self.leave_on_referee(worker, &interval).await?;
            }
            self.log(worker, &interval).await?;
        }
        Ok(open.len())
    }

    /// Every logged interval of the run.
    ///
    /// # Errors
    ///
    /// When the referee fails or holds a malformed line.
    pub async fn intervals(&self) -> RedisResult<Vec<Interval>> {
        let lines = self.read_list(&self.names.log()).await?;
        lines
            .iter()
            .map(|l| Interval::from_line(l).ok_or_else(|| malformed(l)))
            .collect()
    }

    /// Every fenced write of the run, in sequence order.
    ///
    /// # Errors
    ///
    /// When the referee fails or holds a malformed line.
    pub async fn writes(&self) -> RedisResult<Vec<FencedWrite>> {
        let lines = self.read_list(&self.names.writes()).await?;
        lines
            .iter()
            .map(|l| FencedWrite::from_line(l).ok_or_else(|| malformed(l)))
            .collect()
    }

    async fn read_list(&self, list: &str) -> RedisResult<Vec<String>> {
        const PAGE: isize = 20_000;
        let mut all = Vec::new();
        let mut start = 0isize;
        loop {
            let page: Vec<String> = redis::cmd("LRANGE")
                .arg(list)
                .arg(start)
                .arg(start + PAGE - 1)
                .query_async(&mut self.conn.clone())
                .await?;
            let n = page.len();
            all.extend(page);
            if n < PAGE as usize {
                return Ok(all);
            }
            start += PAGE;
        }
    }

    /// The referee's own counters: `enters`, `occupancy_collisions`, `claims_below_high_water`,
    /// `writes_accepted`, `writes_rejected` (missing ones are 0).
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn counters(&self) -> RedisResult<HashMap<String, u64>> {
        redis::cmd("HGETALL")
            .arg(self.names.stats())
            .query_async(&mut self.conn.clone())
            .await
    }

    /// Sections of `worker` that are inside their critical section right now (entered, not
    /// yet left): a fault injector can wait for one before it pauses the worker.
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn inside(&self, worker: &str) -> RedisResult<usize> {
        let open: Vec<String> = redis::cmd("HVALS")
            .arg(self.names.open(worker))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(open.iter().filter(|v| v.split('\t').count() == 8).count())
    }

    /// Sections entered but not yet finished, over all workers of the run.
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn unfinished(&self) -> RedisResult<u64> {
        let pattern = format!("{}open:*", self.names.ns);
        let mut cursor = 0u64;
        let mut total = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut self.conn.clone())
                .await?;
            for key in keys {
                let n: u64 = redis::cmd("HLEN")
                    .arg(key)
                    .query_async(&mut self.conn.clone())
                    .await?;
                total += n;
            }
            if next == 0 {
                return Ok(total);
            }
            cursor = next;
        }
    }

    /// Reads the whole run back and checks it (see [`check`]); also fills in
    /// [`Report::enters`] from the referee's counter and [`Report::unfinished`].
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn report(&self) -> RedisResult<Report> {
        let intervals = self.intervals().await?;
        let writes = self.writes().await?;
        let mut report = check(&intervals, &writes);
        let counters = self.counters().await?;
        report.enters = counters.get("enters").copied().unwrap_or(0);
        report.unfinished = self.unfinished().await?;
        Ok(report)
    }
}

fn malformed(line: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "malformed oracle log line",
        line.to_owned(),
    ))
}

/// The result of [`check`]. [`is_clean`](Self::is_clean) is the verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Intervals checked.
    pub cycles: u64,
    /// Enters counted by the referee (filled by [`Oracle::report`]; [`check`] sets `cycles`).
    pub enters: u64,
    /// Sections entered but never finished (filled by [`Oracle::report`]).
    pub unfinished: u64,
    /// Intervals per outcome.
    pub completed: u64,
    /// See [`Outcome::Lost`].
    pub lost: u64,
    /// See [`Outcome::ReleaseFailed`].
    pub release_failed: u64,
    /// See [`Outcome::Killed`].
    pub killed: u64,
    /// Pairs of intervals of one key that overlap in time.
    pub overlaps: u64,
    /// Overlaps where the older holder had been told it lost the lock before the younger one
    /// entered.
    pub signalled_overlaps: u64,
    /// Overlaps where the older holder learned the loss later but never confirmed holding
    /// while the younger one held (it was paused): reported, not a violation.
    pub late_signalled_overlaps: u64,
    /// Overlaps whose older holder was SIGKILLed without having confirmed the lock after the
    /// younger one entered: reported, not a violation.
    pub killed_overlaps: u64,
    /// Violations: overlaps the older holder was not told about in time.
    pub unsignalled_overlaps: u64,
    /// Longest overlap of any kind.
    pub max_overlap: Duration,
    /// Longest late-signalled overlap: from the younger holder's enter to the older one's
    /// loss signal.
    pub max_late_signal: Duration,
    /// Enters that found the occupancy counter above 0 (raw).
    pub occupancy_collisions: u64,
    /// Collisions not explained by the older holder having been marked lost (violations).
    pub occupancy_violations: u64,
    /// Acquisitions whose fencing token was not above every token entered before it, by a
    /// holder that was never marked lost (violations).
    pub fence_regressions: u64,
    /// Holders that entered with a token below one entered before them and were marked lost:
    /// they acquired first but were paused before entering (reported, not a violation).
    pub late_claims: u64,
    /// Writes to the fenced resource.
    pub writes: u64,
    /// Writes accepted.
    pub writes_accepted: u64,
    /// Writes carrying a token below one a newer holder had already registered.
    pub stale_attempted: u64,
    /// Stale writes the resource rejected.
    pub stale_rejected: u64,
    /// Stale writes the resource accepted (violations).
    pub stale_accepted: u64,
    /// Writes of the newest holder that the resource rejected (only after a fence
    /// regression).
    pub fresh_rejected: u64,
    /// The first violations, described.
    pub violations: Vec<String>,
}

impl Report {
    /// No unsignalled overlap, no unexplained occupancy collision, no fence regression, no
    /// stale write accepted.
    pub fn is_clean(&self) -> bool {
        self.unsignalled_overlaps == 0
            && self.occupancy_violations == 0
            && self.fence_regressions == 0
            && self.stale_accepted == 0
    }

    fn violation(&mut self, what: String) {
        if self.violations.len() < 20 {
            self.violations.push(what);
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cycles={} completed={} lost={} release_failed={} killed={} overlaps={} \
             signalled={} late_signalled={} killed_overlaps={} unsignalled={} max_overlap={:?} \
             max_late_signal={:?} occupancy_collisions={} occupancy_violations={} \
             fence_regressions={} late_claims={} writes={} accepted={} stale_attempted={} stale_rejected={} \
             stale_accepted={}",
            self.cycles,
            self.completed,
            self.lost,
            self.release_failed,
            self.killed,
            self.overlaps,
            self.signalled_overlaps,
            self.late_signalled_overlaps,
            self.killed_overlaps,
            self.unsignalled_overlaps,
            self.max_overlap,
            self.max_late_signal,
            self.occupancy_collisions,
            self.occupancy_violations,
            self.fence_regressions,
            self.late_claims,
            self.writes,
            self.writes_accepted,
            self.stale_attempted,
            self.stale_rejected,
            self.stale_accepted,
        )
    }
}

/// The older (earlier acquired) of two holders of one key: the lower fencing token; on a tie
/// (itself a regression) the earlier enter.
fn older_younger<'a>(a: &'a Interval, b: &'a Interval) -> (&'a Interval, &'a Interval) {
    if (a.fence, a.t_enter) <= (b.fence, b.t_enter) {
        (a, b)
    } else {
        (b, a)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Signalled,
    Late,
    Killed,
    Unsignalled,
}

fn verdict(older: &Interval, younger: &Interval) -> Verdict {
    let confirmed_after = older.last_held.is_some_and(|h| h >= younger.t_enter);
    match older.lost_at {
        Some(lost) if lost <= younger.t_enter => Verdict::Signalled,
        Some(_) if !confirmed_after => Verdict::Late,
        None if older.outcome == Outcome::Killed && !confirmed_after => Verdict::Killed,
        _ => Verdict::Unsignalled,
    }
}

fn ns(d: u64) -> Duration {
    Duration::from_nanos(d)
}

/// Checks a run offline: interval overlaps, occupancy collisions, fence monotonicity and stale
/// writes (see the module docs for the verdicts).
pub fn check(intervals: &[Interval], writes: &[FencedWrite]) -> Report {
    let mut report = Report {
        cycles: intervals.len() as u64,
        enters: intervals.len() as u64,
        ..Report::default()
    };
    let mut by_key: HashMap<&str, Vec<&Interval>> = HashMap::new();
    let mut by_id: HashMap<&str, &Interval> = HashMap::new();
    for iv in intervals {
        match iv.outcome {
            Outcome::Completed => report.completed += 1,
            Outcome::Lost => report.lost += 1,
            Outcome::ReleaseFailed => report.release_failed += 1,
            Outcome::Killed => report.killed += 1,
        }
        by_key.entry(&iv.key).or_default().push(iv);
        by_id.insert(&iv.id, iv);
    }

    // 1. Overlaps, per key, by a sweep over the enter times.
    for list in by_key.values_mut() {
        list.sort_by_key(|iv| (iv.t_enter, iv.enter_seq));
        let mut active: Vec<&Interval> = Vec::new();
        for &cur in list.iter() {
            active.retain(|a| a.t_exit.max(a.t_enter) > cur.t_enter);
            for &a in &active {
                report.overlaps += 1;
                let overlap = a.t_exit.min(cur.t_exit).saturating_sub(cur.t_enter);
                report.max_overlap = report.max_overlap.max(ns(overlap));
                let (older, younger) = older_younger(a, cur);
                match verdict(older, younger) {
                    Verdict::Signalled => report.signalled_overlaps += 1,
                    Verdict::Late => {
                        report.late_signalled_overlaps += 1;
                        let late = older.lost_at.unwrap_or(0).saturating_sub(younger.t_enter);
                        report.max_late_signal = report.max_late_signal.max(ns(late));
                    }
                    Verdict::Killed => report.killed_overlaps += 1,
                    Verdict::Unsignalled => {
                        report.unsignalled_overlaps += 1;
                        report.violation(format!(
                            "unsignalled overlap on {:?}: {} (fence {}, lost_at {:?}, last_held {:?}, {:?}) still held when {} (fence {}) entered at {}; overlap {:?}",
                            older.key, older.id, older.fence, older.lost_at, older.last_held,
                            older.outcome, younger.id, younger.fence, younger.t_enter, ns(overlap)
                        ));
                    }
                }
            }
            active.push(cur);
        }
    }

    // 2. Occupancy collisions, attributed to the older holder of each colliding pair.
    for iv in intervals {
        if iv.occupancy <= 1 && iv.collided_with.is_empty() {
            continue;
        }
        report.occupancy_collisions += 1;
        let explained = !iv.collided_with.is_empty()
            && iv.collided_with.iter().all(|other| {
                let Some(other) = by_id.get(other.as_str()) else {
                    return false;
                };
                let (older, younger) = older_younger(iv, other);
                older.lost_at.is_some()
                    || (older.outcome == Outcome::Killed
                        && (older.t_exit <= younger.t_enter
                            || older.last_held.is_none_or(|h| h < younger.t_enter)))
            });
        if !explained {
            report.occupancy_violations += 1;
            report.violation(format!(
                "occupancy {} when {} (fence {}) entered {:?}; inside: {:?}",
                iv.occupancy, iv.id, iv.fence, iv.key, iv.collided_with
            ));
        }
    }

    // 3. Fencing tokens strictly increase in acquisition order, per key. The referee sees the
    //    enters, not the acquisitions: a token at or below an earlier-entered one is a
    //    regression unless its holder was marked lost (it acquired first, was paused before
    //    it entered, and its lock passed on meanwhile: a late claim).
    let mut enters_by_key: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for (key, list) in &by_key {
        let mut enters: Vec<&Interval> = list.clone();
        enters.sort_unstable_by_key(|iv| iv.enter_seq);
        let mut max: Option<&Interval> = None;
        let mut running = Vec::with_capacity(enters.len());
        for iv in enters {
            match max {
                Some(m) if iv.fence <= m.fence => {
                    if iv.lost_at.is_some() {
                        report.late_claims += 1;
                    } else {
                        report.fence_regressions += 1;
                        report.violation(format!(
                            "fence regression on {key:?}: {} entered with token {} after {} had entered with token {}",
                            iv.id, iv.fence, m.id, m.fence
                        ));
                    }
                }
                _ => max = Some(iv),
            }
            running.push((iv.enter_seq, max.map_or(0, |m| m.fence)));
        }
        enters_by_key.insert(key, running);
    }

    // 4. Stale writes: a token below the highest registered before the write, recounted from
    //    the log (independently of the script's decision).
    for w in writes {
        report.writes += 1;
        if w.accepted {
            report.writes_accepted += 1;
        }
        let newest = enters_by_key
            .get(w.key.as_str())
            .map(|enters| {
                let i = enters.partition_point(|(seq, _)| *seq < w.seq);
                if i == 0 {
                    0
                } else {
                    enters[i - 1].1
                }
            })
            .unwrap_or(0);
        if w.fence < newest {
            report.stale_attempted += 1;
            if w.accepted {
                report.stale_accepted += 1;
                report.violation(format!(
                    "stale write accepted on {:?}: token {} by {} after token {} had entered",
                    w.key, w.fence, w.id, newest
                ));
            } else {
                report.stale_rejected += 1;
            }
        } else if !w.accepted {
            report.fresh_rejected += 1;
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn iv(id: &str, fence: u64, seq: u64, enter_ms: u64, exit_ms: u64) -> Interval {
        Interval {
            id: id.to_owned(),
            key: "k".to_owned(),
            fence,
            enter_seq: seq,
            t_enter: enter_ms * MS,
            t_exit: exit_ms * MS,
            last_held: Some(enter_ms * MS),
            lost_at: None,
            occupancy: 1,
            collided_with: Vec::new(),
            outcome: Outcome::Completed,
        }
    }

    fn write(seq: u64, fence: u64, accepted: bool) -> FencedWrite {
        FencedWrite {
            seq,
            key: "k".to_owned(),
            fence,
            accepted,
            id: format!("w{seq}"),
        }
    }

    #[test]
    fn disjoint_intervals_are_clean() {
        let log = [
            iv("a", 10, 1, 0, 5),
            iv("b", 11, 2, 5, 9),
            iv("c", 12, 3, 10, 12),
        ];
        let r = check(&log, &[]);
        assert!(r.is_clean(), "{r:?}");
        assert_eq!((r.cycles, r.completed, r.overlaps), (3, 3, 0));
    }

    #[test]
    fn an_unsignalled_overlap_is_a_violation() {
        // b entered at 5 while a, never told it lost the lock, was inside until 8.
        let log = [iv("a", 10, 1, 0, 8), iv("b", 11, 2, 5, 9)];
        let r = check(&log, &[]);
        assert_eq!(r.overlaps, 1);
        assert_eq!(r.unsignalled_overlaps, 1);
        assert_eq!(r.max_overlap, Duration::from_millis(3));
        assert!(!r.is_clean());
        assert!(r.violations[0].contains("unsignalled overlap"), "{r:?}");
    }

    #[test]
    fn an_overlap_after_the_loss_signal_is_not_a_violation() {
        // a was told at 4 that its lock was lost, then took until 8 to leave; b entered at 5.
        let mut a = iv("a", 10, 1, 0, 8);
        a.lost_at = Some(4 * MS);
        a.outcome = Outcome::Lost;
        let log = [a, iv("b", 11, 2, 5, 9)];
        let r = check(&log, &[]);
        assert_eq!(
            (r.overlaps, r.signalled_overlaps, r.unsignalled_overlaps),
            (1, 1, 0)
        );
        assert!(r.is_clean(), "{r:?}");
        assert_eq!(r.lost, 1);
    }

    #[test]
    fn a_late_signal_counts_only_if_the_holder_never_confirmed_after_the_takeover() {
        // a was paused from 1 to 7: b entered at 5, a learned the loss at 7.
        let mut a = iv("a", 10, 1, 0, 8);
        a.last_held = Some(MS);
        a.lost_at = Some(7 * MS);
        a.outcome = Outcome::Lost;
        let b = iv("b", 11, 2, 5, 9);
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!((r.late_signalled_overlaps, r.unsignalled_overlaps), (1, 0));
        assert_eq!(r.max_late_signal, Duration::from_millis(2));
        assert!(r.is_clean());
        // The same, but a confirmed holding the lock at 6, after b entered: a violation.
        a.last_held = Some(6 * MS);
        let r = check(&[a, b], &[]);
        assert_eq!(r.unsignalled_overlaps, 1);
        assert!(!r.is_clean());
    }

    #[test]
    fn the_older_holder_is_the_lower_fence_even_if_it_stamped_its_enter_later() {
        // a acquired first (fence 10) but was paused before stamping its enter (at 6); b
        // acquired after a's lease ran out and entered at 5. a never confirmed holding.
        let mut a = iv("a", 10, 2, 6, 8);
        a.last_held = None;
        a.lost_at = Some(7 * MS);
        a.outcome = Outcome::Lost;
        let b = iv("b", 11, 1, 5, 9);
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!((r.overlaps, r.late_signalled_overlaps), (1, 1));
        // Its enter came after b's with a lower token: a late claim, as it was marked lost.
        assert_eq!((r.late_claims, r.fence_regressions), (1, 0));
        assert!(r.is_clean(), "{r:?}");
        // Not marked lost, it would be a fence regression (and an unsignalled overlap).
        a.lost_at = None;
        a.outcome = Outcome::Completed;
        let r = check(&[a, b], &[]);
        assert_eq!((r.late_claims, r.fence_regressions), (0, 1));
    }

    #[test]
    fn occupancy_collisions_are_attributed_to_the_older_holder() {
        let mut a = iv("a", 10, 1, 0, 8);
        let mut b = iv("b", 11, 2, 5, 9);
        b.occupancy = 2;
        b.collided_with = vec!["a".to_owned()];
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!((r.occupancy_collisions, r.occupancy_violations), (1, 1));
        // Later marked lost: a raw collision, not a violation.
        a.lost_at = Some(8 * MS);
        a.outcome = Outcome::Lost;
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!((r.occupancy_collisions, r.occupancy_violations), (1, 0));
        // A killed holder whose clean-up was late (b entered after a's death): not a violation.
        a.lost_at = None;
        a.outcome = Outcome::Killed;
        a.t_exit = 4 * MS;
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!(r.occupancy_violations, 0);
        // An unknown co-occupant is a violation.
        b.collided_with = vec!["ghost".to_owned()];
        let r = check(&[a, b], &[]);
        assert_eq!(r.occupancy_violations, 1);
    }

    #[test]
    fn a_killed_holder_is_excused_only_without_a_confirmation_after_the_takeover() {
        // a was stalled from 1 (its last check) and SIGKILLed at 8; b entered at 5.
        let mut a = iv("a", 10, 1, 0, 8);
        a.last_held = Some(MS);
        a.outcome = Outcome::Killed;
        let mut b = iv("b", 11, 2, 5, 9);
        b.occupancy = 2;
        b.collided_with = vec!["a".to_owned()];
        let r = check(&[a.clone(), b.clone()], &[]);
        assert_eq!((r.killed_overlaps, r.unsignalled_overlaps), (1, 0));
        assert_eq!((r.occupancy_collisions, r.occupancy_violations), (1, 0));
        assert!(r.is_clean(), "{r:?}");
        assert_eq!(r.killed, 1);
        // a confirmed holding at 6, after b entered, and was killed later: a violation.
        a.last_held = Some(6 * MS);
        let r = check(&[a, b], &[]);
        assert_eq!((r.killed_overlaps, r.unsignalled_overlaps), (0, 1));
        assert_eq!(r.occupancy_violations, 1);
    }

    #[test]
    fn stale_writes_are_recounted_from_the_log() {
        let log = [iv("a", 10, 1, 0, 4), iv("b", 11, 3, 5, 9)];
        let writes = [
            write(2, 10, true),  // a, before b entered: fresh
            write(4, 11, true),  // b: fresh
            write(5, 10, false), // a again, after b entered: stale, rejected
        ];
        let r = check(&log, &writes);
        assert_eq!((r.writes, r.writes_accepted), (3, 2));
        assert_eq!(
            (r.stale_attempted, r.stale_rejected, r.stale_accepted),
            (1, 1, 0)
        );
        assert!(r.is_clean());
        let writes = [write(5, 10, true)];
        let r = check(&log, &writes);
        assert_eq!(r.stale_accepted, 1);
        assert!(!r.is_clean());
    }

    #[test]
    fn fence_regressions_are_found_in_acquisition_order() {
        let log = [iv("a", 10, 1, 0, 4), iv("b", 9, 2, 5, 9)];
        let r = check(&log, &[]);
        assert_eq!(r.fence_regressions, 1);
        assert!(!r.is_clean());
    }

    #[test]
    fn lines_round_trip() {
        let mut a = iv("w1#7", 1_700_000_000_123_456, 42, 3, 4);
        a.lost_at = Some(5);
        a.collided_with = vec!["w2#1".to_owned(), "w3#9".to_owned()];
        a.outcome = Outcome::ReleaseFailed;
        assert_eq!(Interval::from_line(&a.to_line()), Some(a.clone()));
        a.last_held = None;
        a.collided_with.clear();
        assert_eq!(Interval::from_line(&a.to_line()), Some(a));
        assert_eq!(Interval::from_line("garbage"), None);
    }

    #[test]
    fn the_monotonic_clock_is_monotonic_and_in_nanoseconds() {
        let a = monotonic_ns();
        std::thread::sleep(Duration::from_millis(5));
        let b = monotonic_ns();
        assert!(b - a >= 5 * MS && b - a < 5_000 * MS, "{a} {b}");
    }

    #[tokio::test]
    async fn the_referee_scripts_count_occupancy_fences_and_dead_workers() {
        let referee = crate::RedisServer::start().expect("redis-server");
        let a = Oracle::connect(&referee.url(), "t", "a").await.unwrap();
        let b = Oracle::connect(&referee.url(), "t", "b").await.unwrap();
        let mut ea = a.enter("k", 100, || true).await.unwrap();
        assert_eq!(ea.occupancy(), 1);
        assert!(ea.observe(|| true));
        assert!(a.write(&ea).await.unwrap());
        // b enters while a is inside (a double holder) with a higher token.
        let eb = b.enter("k", 101, || true).await.unwrap();
        assert_eq!(eb.occupancy(), 2);
        assert!(!eb.claim_below_high_water());
        assert!(!a.write(&ea).await.unwrap(), "stale write rejected");
        assert!(b.write(&eb).await.unwrap());
        a.leave(&mut ea).await.unwrap();
        a.leave(&mut ea).await.unwrap(); // idempotent
        a.finish(ea, Outcome::Completed).await.unwrap();
        // b dies inside; its section is closed by the parent.
        assert_eq!(b.unfinished().await.unwrap(), 1);
        assert_eq!(
            (a.inside("a").await.unwrap(), a.inside("b").await.unwrap()),
            (0, 1)
        );
        assert_eq!(a.close_worker("b", monotonic_ns()).await.unwrap(), 1);
        assert_eq!(a.unfinished().await.unwrap(), 0);
        let occ: i64 = referee.cmd(&["GET", "oracle:t:occ:k"]);
        assert_eq!(occ, 0);
        // A regression: a token below the high-water mark.
        let ec = a.enter("k", 50, || true).await.unwrap();
        assert!(ec.claim_below_high_water());
        a.finish(ec, Outcome::Completed).await.unwrap();

        let r = a.report().await.unwrap();
        assert_eq!((r.cycles, r.enters, r.unfinished), (3, 3, 0));
        assert_eq!((r.completed, r.killed), (2, 1));
        assert_eq!(r.unsignalled_overlaps, 1, "{r}");
        assert_eq!((r.occupancy_collisions, r.occupancy_violations), (1, 1));
        assert_eq!(
            (r.stale_attempted, r.stale_rejected, r.stale_accepted),
            (1, 1, 0)
        );
        assert_eq!(r.fence_regressions, 1);
        let counters = a.counters().await.unwrap();
        assert_eq!(counters["claims_below_high_water"], 1);
        assert_eq!(counters["writes_accepted"], 2);
        assert!(!r.is_clean());
        // The killed section kept the check b made on enter.
        let intervals = a.intervals().await.unwrap();
        let killed = intervals.iter().find(|i| i.id.starts_with("b#")).unwrap();
        assert_eq!(killed.outcome, Outcome::Killed);
        assert!(killed.last_held.is_some() && killed.lost_at.is_none());
    }

    #[tokio::test]
    async fn a_worker_killed_after_leaving_keeps_its_exit_and_observations() {
        let referee = crate::RedisServer::start().expect("redis-server");
        let parent = Oracle::connect(&referee.url(), "t", "parent")
            .await
            .unwrap();
        let w = Oracle::connect(&referee.url(), "t", "w").await.unwrap();
        let mut e = w.enter("k", 7, || true).await.unwrap();
        e.observe(|| false); // lost before leaving
        w.leave(&mut e).await.unwrap();
        let (t_exit, lost_at) = (e.interval.t_exit, e.lost_at());
        assert_eq!(w.inside("w").await.unwrap(), 0);
        assert_eq!(w.unfinished().await.unwrap(), 1);
        // The process dies before `finish`.
        assert_eq!(parent.close_worker("w", monotonic_ns()).await.unwrap(), 1);
        let intervals = parent.intervals().await.unwrap();
        assert_eq!(intervals.len(), 1);
        let killed = &intervals[0];
        assert_eq!(killed.outcome, Outcome::Killed);
        assert_eq!((killed.t_exit, killed.lost_at), (t_exit, lost_at));
        assert!(killed.last_held.is_some());
        let occ: i64 = referee.cmd(&["GET", "oracle:t:occ:k"]);
        assert_eq!(occ, 0, "decremented once, by the leave");
    }
}
