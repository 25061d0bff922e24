//! The referee client: records the critical sections of one process on the referee server.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult, Script};

use super::check::{check_with_wipes, Report};
use super::clock::monotonic_ns;
use super::record::{
    decode, encode, Entered, FencedWrite, Interval, Kind, OpenSection, Outcome, Release, Wipe,
    WriteRequest,
};

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

    /// How the section was entered.
    pub fn access(&self) -> Kind {
        self.interval.access
    }

    /// The fencing token registered on enter (0 for a shared or permit section).
    pub fn fence(&self) -> u64 {
        self.interval.fence
    }

    /// What the occupancy counter returned on enter (1 = nobody else was inside): every
    /// section of the key inside at that moment, this one included, whatever their access.
    pub fn occupancy(&self) -> u64 {
        self.interval.occupancy
    }

    /// The sections that were inside on enter against the rules of the entry's access (see
    /// [`Interval::collided_with`]); empty when the enter was allowed.
    pub fn collided_with(&self) -> &[String] {
        &self.interval.collided_with
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

    /// Records what the release answered (after [`Oracle::leave`], before
    /// [`Oracle::finish`]): the checker holds an `Ok` against the section when the lock was
    /// not its own to the end.
    pub fn record_release(&mut self, answer: Release) {
        self.interval.release = Some(answer);
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
    fn left(&self, worker: &str) -> String {
        format!("{}left:{worker}", self.ns)
    }
    fn closed(&self, worker: &str) -> String {
        format!("{}closed:{worker}", self.ns)
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
    fn wipes(&self) -> String {
        format!("{}wipes", self.ns)
    }
}

// The scripts, one file each; every file starts with its KEYS, ARGV and reply.
static ENTER: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/enter.lua")));
static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/leave.lua")));
static FINISH: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/finish.lua")));
static WRITE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/write.lua")));

/// A connection to the referee for one run, used by one process (clone it freely between
/// its tasks).
///
/// # Examples
///
/// One critical section, as a holder of a lock-core lock would log it (`held` stands for
/// `guard.is_held()`, `fence` for `guard.fencing_token().await?`):
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

    /// Enters the exclusive critical section of `key` (a mutex, a write lock) with the
    /// acquisition's fencing token: [`enter_as`](Self::enter_as) with [`Kind::Exclusive`].
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
        self.enter_as(key, Kind::Exclusive, fence, held).await
    }

    /// Enters the critical section of `key` as a reader: [`enter_as`](Self::enter_as) with
    /// [`Kind::Shared`] and no fencing token (readers get none).
    ///
    /// # Errors
    ///
    /// When the referee fails.
    ///
    /// # Panics
    ///
    /// When `key` contains a tab or a newline.
    pub async fn enter_shared(&self, key: &str, held: impl FnOnce() -> bool) -> RedisResult<Entry> {
        self.enter_as(key, Kind::Shared, 0, held).await
    }

    /// Enters the critical section of `key` with `access`: stamps the enter time, checks the
    /// lock once (`held`, e.g. `|| guard.is_held()`, recorded as by [`Entry::observe`]),
    /// increments the occupancy counter and records who was inside against the rules of
    /// `access` (see [`Interval::collided_with`]), registers an exclusive section's `fence`
    /// with the fenced resource (shared and permit sections claim nothing; pass 0) and leaves
    /// an open record (closed by [`finish`](Self::finish), or by
    /// [`close_worker`](Self::close_worker) if this process dies).
    ///
    /// # Errors
    ///
    /// When the referee fails.
    ///
    /// # Panics
    ///
    /// When `key` contains a tab or a newline.
    pub async fn enter_as(
        &self,
        key: &str,
        access: Kind,
        fence: u64,
        held: impl FnOnce() -> bool,
    ) -> RedisResult<Entry> {
        self.open_section(key, access, fence, None, held).await
    }

    /// [`enter_as`](Self::enter_as) with the time the acquire returned (`granted_at`,
    /// [`monotonic_ns`](super::monotonic_ns) read right after it, before a fencing token is
    /// asked for), recorded as [`Interval::t_granted`]. A holder that does more than a clock
    /// read between its acquire and its enter records it: the checker then knows the lock was
    /// its own before a wipe that lands in between, and orders holders without tokens by when
    /// they got the lock rather than by when they entered.
    ///
    /// # Errors
    ///
    /// When the referee fails.
    ///
    /// # Panics
    ///
    /// When `key` contains a tab or a newline.
    pub async fn enter_granted(
        &self,
        key: &str,
        access: Kind,
        fence: u64,
        granted_at: u64,
        held: impl FnOnce() -> bool,
    ) -> RedisResult<Entry> {
        self.open_section(key, access, fence, Some(granted_at), held)
            .await
    }

    async fn open_section(
        &self,
        key: &str,
        access: Kind,
        fence: u64,
        granted_at: Option<u64>,
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
        let entered = Entered {
            key: key.to_owned(),
            access,
            fence,
            t_enter,
            t_granted: granted_at,
            last_held,
            lost_at,
        };
        let (code, permits) = access.code();
        let n = &self.names;
        let section: String = ENTER
            .key(n.occ(key))
            .key(n.occupants(key))
            .key(n.fence(key))
            .key(n.open(&self.worker))
            .key(n.seq())
            .key(n.stats())
            .arg(&id)
            .arg(fence)
            .arg(encode(&entered)?)
            .arg(code)
            .arg(permits)
            .invoke_async(&mut self.conn.clone())
            .await?;
        let section: OpenSection = decode("malformed open oracle record", &section)?;
        Ok(Entry {
            fence_regression: section.below_high_water,
            interval: Interval::open(id, section),
            left: false,
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

    /// One critical section of a reader that keeps its lock throughout (tests without
    /// faults): [`enter_shared`](Self::enter_shared), `work`, [`leave`](Self::leave), and
    /// [`finish`](Self::finish) as [`Outcome::Completed`]; no write (readers have no token).
    /// Returns the entry's occupancy on enter and `work`'s output.
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn section_shared<T>(
        &self,
        key: &str,
        held: impl Fn() -> bool,
        work: impl std::future::Future<Output = T>,
    ) -> RedisResult<(T, u64)> {
        let mut entry = self.enter_shared(key, &held).await?;
        let occupancy = entry.occupancy();
        let output = work.await;
        entry.observe(&held);
        self.leave(&mut entry).await?;
        self.finish(entry, Outcome::Completed).await?;
        Ok((output, occupancy))
    }

    /// A write to the fenced resource with the entry's token; `true` when it was accepted.
    ///
    /// # Errors
    ///
    /// When the referee fails, or for the entry of a shared or permit section or of an
    /// exclusive one entered without a token (they hold none, so the fenced resource is not
    /// theirs to write).
    pub async fn write(&self, entry: &Entry) -> RedisResult<bool> {
        if entry.interval.access != Kind::Exclusive || entry.interval.fence == 0 {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "fenced writes are for exclusive sections",
                entry.interval.id.clone(),
            )));
        }
        let n = &self.names;
        let key = &entry.interval.key;
        let ok: i64 = WRITE
            .key(n.fence(key))
            .key(n.seq())
            .key(n.writes())
            .key(n.stats())
            .arg(entry.interval.fence)
            .arg(encode(&WriteRequest {
                key,
                fence: entry.interval.fence,
                id: &entry.interval.id,
            })?)
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
            .key(n.left(worker))
            .arg(&interval.id)
            .arg(encode(&interval.left())?)
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
        self.log(&self.worker, &interval, false).await?;
        Ok(interval)
    }

    /// Logs `interval` and removes its open record; returns whether it logged it. The
    /// holder's own record (`killed` false) replaces a copy `close_worker` logged (`killed`
    /// true) before it arrived; `close_worker` logs nothing for a section already finished.
    async fn log(&self, worker: &str, interval: &Interval, killed: bool) -> RedisResult<bool> {
        let n = &self.names;
        let logged: i64 = FINISH
            .key(n.open(worker))
            .key(n.left(worker))
            .key(n.log())
            .key(n.closed(worker))
            .arg(&interval.id)
            .arg(encode(interval)?)
            .arg(if killed { "killed" } else { "own" })
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(logged == 1)
    }

    /// Closes every section that `worker` (a SIGKILLed process) left open: occupancy is
    /// decremented if it had not left yet, and the interval is logged as [`Outcome::Killed`]
    /// ending at `dead_at` (`CLOCK_MONOTONIC` ns, taken after the process was reaped) or at
    /// its own exit stamp, with the last observations it recorded on the referee (on enter,
    /// or on leave). Returns how many were closed. A section whose own finish reaches the
    /// referee meanwhile or later (sent just before the process died) is logged once, as its
    /// holder finished it: its record replaces the killed copy.
    ///
    /// # Errors
    ///
    /// When the referee fails or holds a malformed record.
    pub async fn close_worker(&self, worker: &str, dead_at: u64) -> RedisResult<usize> {
        // One snapshot of both hashes: a section and its exit are written by different scripts.
        let (open, left): (HashMap<String, String>, HashMap<String, String>) = redis::pipe()
            .atomic()
            .hgetall(self.names.open(worker))
            .hgetall(self.names.left(worker))
            .query_async(&mut self.conn.clone())
            .await?;
        let mut closed = 0;
        for (id, section) in &open {
            let section: OpenSection = decode("malformed open oracle record", section)?;
            let mut interval = Interval::open(id.clone(), section);
            interval.outcome = Outcome::Killed;
            interval.t_exit = dead_at;
            match left.get(id) {
                Some(exit) => interval.set_left(decode("malformed oracle exit record", exit)?),
                None => self.leave_on_referee(worker, &interval).await?,
            }
            if self.log(worker, &interval, true).await? {
                closed += 1;
            }
        }
        Ok(closed)
    }

    /// Every logged interval of the run.
    ///
    /// # Errors
    ///
    /// When the referee fails or holds a malformed record.
    pub async fn intervals(&self) -> RedisResult<Vec<Interval>> {
        let records = self.read_list(&self.names.log()).await?;
        records
            .iter()
            .map(|r| decode("malformed oracle log record", r))
            .collect()
    }

    /// Records a wipe: lock keys taken from their holders by the test (see [`Wipe`]).
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn wipe(&self, wipe: &Wipe) -> RedisResult<()> {
        let _: i64 = redis::cmd("RPUSH")
            .arg(self.names.wipes())
            .arg(encode(wipe)?)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Every wipe recorded in the run, in the order recorded.
    ///
    /// # Errors
    ///
    /// When the referee fails or holds a malformed record.
    pub async fn wipes(&self) -> RedisResult<Vec<Wipe>> {
        let records = self.read_list(&self.names.wipes()).await?;
        records
            .iter()
            .map(|r| decode("malformed oracle wipe record", r))
            .collect()
    }

    /// Every fenced write of the run, in sequence order.
    ///
    /// # Errors
    ///
    /// When the referee fails or holds a malformed record.
    pub async fn writes(&self) -> RedisResult<Vec<FencedWrite>> {
        let records = self.read_list(&self.names.writes()).await?;
        records
            .iter()
            .map(|r| decode("malformed oracle write record", r))
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

    /// The referee's own counters: `enters`, `occupancy_collisions`, `max_occupancy` (the most
    /// sections of one key inside at once), `claims_below_high_water`, `writes_accepted`,
    /// `writes_rejected` (missing ones are 0).
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
        // Every exit in `left` belongs to a section in `open` (finish.lua removes both).
        let (open, left): (usize, usize) = redis::pipe()
            .atomic()
            .hlen(self.names.open(worker))
            .hlen(self.names.left(worker))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(open.saturating_sub(left))
    }

    /// How many sections are inside the critical section of `key` right now (entered, not yet
    /// left), over all workers: a fault injector can wait for a holder before it strikes.
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn occupants(&self, key: &str) -> RedisResult<usize> {
        redis::cmd("HLEN")
            .arg(self.names.occupants(key))
            .query_async(&mut self.conn.clone())
            .await
    }

    /// The sections of `worker` inside their critical section right now: key and enter time
    /// (`CLOCK_MONOTONIC` ns) of each, so a fault injector can aim at a section of a kind and
    /// age.
    ///
    /// # Errors
    ///
    /// When the referee fails or holds a malformed record.
    pub async fn inside_sections(&self, worker: &str) -> RedisResult<Vec<(String, u64)>> {
        let (open, left): (HashMap<String, String>, HashMap<String, String>) = redis::pipe()
            .atomic()
            .hgetall(self.names.open(worker))
            .hgetall(self.names.left(worker))
            .query_async(&mut self.conn.clone())
            .await?;
        let mut inside = Vec::new();
        for (id, section) in &open {
            if left.contains_key(id) {
                continue;
            }
            let section: OpenSection = decode("malformed open oracle record", section)?;
            inside.push((section.entered.key, section.entered.t_enter));
        }
        Ok(inside)
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

    /// Reads the whole run back, its wipes included, and checks it (see
    /// [`check_with_wipes`](super::check_with_wipes)); also fills in [`Report::enters`] from
    /// the referee's counter and [`Report::unfinished`].
    ///
    /// # Errors
    ///
    /// When the referee fails.
    pub async fn report(&self) -> RedisResult<Report> {
        let intervals = self.intervals().await?;
        let writes = self.writes().await?;
        let wipes = self.wipes().await?;
        let mut report = check_with_wipes(&intervals, &writes, &wipes);
        let counters = self.counters().await?;
        report.enters = counters.get("enters").copied().unwrap_or(0);
        report.unfinished = self.unfinished().await?;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    async fn the_referee_counts_readers_writers_and_permits_by_their_access() {
        let referee = crate::RedisServer::start().expect("redis-server");
        let a = Oracle::connect(&referee.url(), "t", "a").await.unwrap();
        // Two readers together: no collision, occupancy 2.
        let mut r1 = a.enter_shared("k", || true).await.unwrap();
        let mut r2 = a.enter_shared("k", || true).await.unwrap();
        assert_eq!((r2.occupancy(), r2.collided_with().len()), (2, 0));
        assert_eq!(r2.access(), Kind::Shared);
        assert!(
            a.write(&r2).await.is_err(),
            "a reader has no token to write with"
        );
        // A writer entering now collides with both readers.
        let w = a.enter("k", 7, || true).await.unwrap();
        assert_eq!(w.occupancy(), 3);
        assert_eq!(w.collided_with().len(), 2);
        // A reader entering while the writer is inside collides with the writer only.
        let r3 = a.enter_shared("k", || true).await.unwrap();
        assert_eq!(r3.collided_with(), [w.id().to_owned()]);
        for entry in [&mut r1, &mut r2] {
            a.leave(entry).await.unwrap();
        }
        a.finish(r1, Outcome::Completed).await.unwrap();
        a.finish(r2, Outcome::Completed).await.unwrap();
        a.finish(w, Outcome::Completed).await.unwrap();
        a.finish(r3, Outcome::Completed).await.unwrap();
        // Two permits of "s": the third holder collides with the two inside.
        let p1 = a.enter_as("s", Kind::Permits(2), 0, || true).await.unwrap();
        let p2 = a.enter_as("s", Kind::Permits(2), 0, || true).await.unwrap();
        assert!(p2.collided_with().is_empty());
        let p3 = a.enter_as("s", Kind::Permits(2), 0, || true).await.unwrap();
        assert_eq!(p3.collided_with().len(), 2);
        for p in [p1, p2, p3] {
            a.finish(p, Outcome::Completed).await.unwrap();
        }
        let occ: i64 = referee.cmd(&["GET", "oracle:t:occ:k"]);
        assert_eq!(occ, 0);
        let counters = a.counters().await.unwrap();
        assert_eq!(counters["occupancy_collisions"], 3);
        assert_eq!(counters["max_occupancy"], 4);
        assert_eq!(
            counters.get("claims_below_high_water"),
            None,
            "readers claim no token"
        );

        let r = a.report().await.unwrap();
        assert_eq!(r.cycles, 7);
        assert_eq!(r.occupancy_violations, 3, "{r}");
        assert_eq!(r.over_limit, 1, "{r}");
        assert!(r.unsignalled_overlaps >= 3, "{r}");
        assert!(r.shared_overlaps >= 2 && r.max_inside >= 3, "{r}");
        assert_eq!(r.fence_regressions, 0, "{r}");
        assert!(!r.is_clean());
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

    /// A SIGKILLed holder's last `finish` can reach the referee just before or just after
    /// `close_worker` read its section as open: either way the section is logged once (a
    /// second copy would read as two holders with one token, and an `Ok` release as false),
    /// as its holder finished it.
    #[tokio::test]
    async fn a_section_finished_and_closed_as_killed_is_logged_once_whichever_comes_first() {
        let referee = crate::RedisServer::start().expect("redis-server");
        let parent = Oracle::connect(&referee.url(), "t", "parent")
            .await
            .unwrap();
        let w = Oracle::connect(&referee.url(), "t", "w").await.unwrap();

        // The finish first: close_worker finds nothing left to close.
        let mut e = w.enter("k", 7, || true).await.unwrap();
        e.observe(|| true);
        w.leave(&mut e).await.unwrap();
        e.record_release(Release::Ok);
        w.finish(e, Outcome::Completed).await.unwrap();
        assert_eq!(parent.close_worker("w", monotonic_ns()).await.unwrap(), 0);

        // close_worker first, with the section as it read it (open, not left), then the
        // holder's own finish, sent before it died: it replaces the killed copy.
        let mut e = w.enter("k", 8, || true).await.unwrap();
        assert_eq!(w.unfinished().await.unwrap(), 1);
        assert_eq!(parent.close_worker("w", monotonic_ns()).await.unwrap(), 1);
        e.observe(|| true);
        w.leave(&mut e).await.unwrap();
        e.record_release(Release::Ok);
        w.finish(e, Outcome::Completed).await.unwrap();

        let intervals = parent.intervals().await.unwrap();
        let outcomes: Vec<(u64, Outcome)> =
            intervals.iter().map(|iv| (iv.fence, iv.outcome)).collect();
        assert_eq!(
            outcomes,
            [(7, Outcome::Completed), (8, Outcome::Completed)],
            "{intervals:#?}"
        );
        let occ: i64 = referee.cmd(&["GET", "oracle:t:occ:k"]);
        assert_eq!(occ, 0, "decremented once per section");
        let r = parent.report().await.unwrap();
        assert!(r.is_clean() && r.unfinished == 0, "{r}");
    }

    /// A holder's `finish` that reaches the referee after `close_worker` logged its section
    /// as killed is judged by what it says: a `Killed` copy has no release answer and gets the
    /// `Killed` excuse, so a release that said `Ok` across a wipe of its key, or a holder
    /// inside, never told, while another entered, would pass as clean if the copy stood in
    /// for the holder's own record (as it did when the first record to arrive was kept). The
    /// control: the same records in the other order (key `k1`, worker `w1`).
    #[tokio::test]
    async fn a_finish_that_reaches_the_referee_after_close_worker_is_still_judged() {
        let referee = crate::RedisServer::start().expect("redis-server");
        let parent = Oracle::connect(&referee.url(), "t", "parent")
            .await
            .unwrap();
        let w1 = Oracle::connect(&referee.url(), "t", "w1").await.unwrap();
        let w2 = Oracle::connect(&referee.url(), "t", "w2").await.unwrap();
        let w3 = Oracle::connect(&referee.url(), "t", "w3").await.unwrap();
        let x = Oracle::connect(&referee.url(), "t", "x").await.unwrap();

        // A false Ok: granted, then a DEL of the key while inside, then the release says Ok.
        for (key, w, close_first) in [("k1", &w1, false), ("k2", &w2, true)] {
            let granted = monotonic_ns();
            let mut e = w
                .enter_granted(key, Kind::Exclusive, 8, granted, || true)
                .await
                .unwrap();
            let begin = monotonic_ns();
            let end = monotonic_ns();
            parent
                .wipe(&Wipe {
                    key: Some(key.to_owned()),
                    kind: "del".to_owned(),
                    begin,
                    end,
                    notice: 1_000_000_000,
                })
                .await
                .unwrap();
            e.observe(|| true);
            w.leave(&mut e).await.unwrap();
            e.record_release(Release::Ok);
            if close_first {
                // The worker is SIGKILLed with its finish on the wire; the parent closes it
                // first.
                let worker = w.worker().to_owned();
                assert_eq!(
                    parent.close_worker(&worker, monotonic_ns()).await.unwrap(),
                    1
                );
            }
            w.finish(e, Outcome::Completed).await.unwrap();
        }

        // An unsignalled overlap: w3 inside (token 20), never told, when x enters (token 21).
        let mut e3 = w3.enter("j", 20, || true).await.unwrap();
        let ex = x.enter("j", 21, || true).await.unwrap();
        assert_eq!(ex.occupancy(), 2);
        w3.leave(&mut e3).await.unwrap();
        assert_eq!(parent.close_worker("w3", monotonic_ns()).await.unwrap(), 1);
        w3.finish(e3, Outcome::Completed).await.unwrap();
        x.finish(ex, Outcome::Completed).await.unwrap();

        let r = parent.report().await.unwrap();
        let by_key = |map: &std::collections::BTreeMap<String, u64>, key: &str| {
            map.get(key).copied().unwrap_or(0)
        };
        let got = (
            by_key(&r.false_ok_by_key, "k1"),
            by_key(&r.false_ok_by_key, "k2"),
            by_key(&r.unsignalled_by_key, "j"),
        );
        assert_eq!(
            got,
            (1, 1, 1),
            "(false Ok on k1 (finish first), false Ok on k2 (close_worker first), unsignalled \
             overlaps on j (close_worker first)): {r}"
        );
    }

    #[tokio::test]
    async fn tokens_and_times_beyond_double_precision_pass_through_the_scripts_exactly() {
        // 2^53 + 1 and + 2 are one double apart in Lua: the scripts compare them as decimal
        // strings and store them inside JSON they do not decode.
        const BIG: u64 = (1 << 53) + 1;
        let referee = crate::RedisServer::start().expect("redis-server");
        let a = Oracle::connect(&referee.url(), "t", "a").await.unwrap();
        let mut ea = a.enter("k", BIG, || true).await.unwrap();
        ea.interval.t_enter = u64::MAX - 1;
        let eb = a.enter("k", BIG + 1, || true).await.unwrap();
        assert!(!eb.claim_below_high_water());
        assert!(!a.write(&ea).await.unwrap(), "stale by one");
        assert!(a.write(&eb).await.unwrap());
        a.finish(eb, Outcome::Completed).await.unwrap();
        a.finish(ea, Outcome::Lost).await.unwrap();
        let writes = a.writes().await.unwrap();
        let fences: Vec<(u64, bool)> = writes.iter().map(|w| (w.fence, w.accepted)).collect();
        assert_eq!(fences, [(BIG, false), (BIG + 1, true)]);
        let intervals = a.intervals().await.unwrap();
        assert_eq!(intervals[0].fence, BIG + 1);
        assert_eq!(
            (intervals[1].fence, intervals[1].t_enter),
            (BIG, u64::MAX - 1)
        );
    }

    #[tokio::test]
    async fn violations_stored_on_the_referee_fail_the_report() {
        // A log written by hand in the stored form: b entered at 5 ms while a, never told it
        // lost the lock, was inside until 8 ms (with the collision counted on enter); c
        // entered with a token below b's; a then wrote with its token after b had entered,
        // and the resource accepted it.
        let referee = crate::RedisServer::start().expect("redis-server");
        let oracle = Oracle::connect(&referee.url(), "t", "main").await.unwrap();
        let log = [
            r#"{"id":"a#1","key":"k","fence":10,"enter_seq":1,"t_enter":0,"t_exit":8000000,"last_held":0,"lost_at":null,"occupancy":1,"collided_with":[],"outcome":"completed"}"#,
            r#"{"id":"b#1","key":"k","fence":11,"enter_seq":2,"t_enter":5000000,"t_exit":9000000,"last_held":5000000,"lost_at":null,"occupancy":2,"collided_with":["a#1"],"outcome":"completed"}"#,
            r#"{"id":"c#1","key":"k","fence":9,"enter_seq":4,"t_enter":10000000,"t_exit":11000000,"last_held":10000000,"lost_at":null,"occupancy":1,"collided_with":[],"outcome":"completed"}"#,
        ];
        let writes = [r#"{"key":"k","fence":10,"id":"a#1","seq":3,"accepted":true}"#];
        for record in log {
            let _: i64 = referee.cmd(&["RPUSH", "oracle:t:log", record]);
        }
        for record in writes {
            let _: i64 = referee.cmd(&["RPUSH", "oracle:t:writes", record]);
        }
        let r = oracle.report().await.unwrap();
        assert_eq!(r.cycles, 3);
        assert_eq!((r.overlaps, r.unsignalled_overlaps), (1, 1), "{r}");
        assert_eq!((r.occupancy_collisions, r.occupancy_violations), (1, 1));
        assert_eq!(r.fence_regressions, 1);
        assert_eq!((r.stale_attempted, r.stale_accepted), (1, 1));
        assert!(!r.is_clean());
        assert_eq!(r.violations.len(), 4, "{:?}", r.violations);

        // A record the checker cannot read is an error, not a clean run.
        let _: i64 = referee.cmd(&["RPUSH", "oracle:t:log", "a#2\tk\t12"]);
        assert!(oracle.report().await.is_err());
    }

    #[tokio::test]
    async fn release_answers_wipes_and_untokened_sections_reach_the_report() {
        let referee = crate::RedisServer::start().expect("redis-server");
        let a = Oracle::connect(&referee.url(), "t", "a").await.unwrap();
        let mut e = a.enter("k", 10, || true).await.unwrap();
        assert_eq!(a.occupants("k").await.unwrap(), 1);
        let inside = a.inside_sections("a").await.unwrap();
        assert_eq!(inside, [("k".to_owned(), e.t_enter())]);
        // The key is deleted behind the holder, whose release then says Ok.
        let begin = monotonic_ns();
        let end = monotonic_ns();
        let wipe = Wipe {
            key: Some("k".to_owned()),
            kind: "del".to_owned(),
            begin,
            end,
            notice: 1,
        };
        a.wipe(&wipe).await.unwrap();
        a.leave(&mut e).await.unwrap();
        assert_eq!(a.occupants("k").await.unwrap(), 0);
        assert!(a.inside_sections("a").await.unwrap().is_empty());
        e.record_release(Release::Ok);
        a.finish(e, Outcome::Completed).await.unwrap();
        // A section without a token claims nothing and has nothing to write with.
        let t = a.enter("k", 0, || true).await.unwrap();
        assert!(!t.claim_below_high_water());
        assert!(a.write(&t).await.is_err());
        a.finish(t, Outcome::Completed).await.unwrap();

        assert_eq!(a.wipes().await.unwrap(), [wipe]);
        let intervals = a.intervals().await.unwrap();
        assert_eq!(intervals[0].release, Some(Release::Ok));
        assert_eq!(intervals[1].release, None);
        let r = a.report().await.unwrap();
        assert_eq!(
            (r.cycles, r.false_ok_releases, r.fence_regressions),
            (2, 1, 0)
        );
        assert!(!r.is_clean());
        assert!(r.violations[0].contains("del took the key"), "{r:?}");
    }
}
