//! The Redis scripts, one `.lua` file each; `redis::Script` sends them by SHA (EVALSHA) and
//! reloads them transparently when the server answers NOSCRIPT (after `SCRIPT FLUSH` or a
//! restart).

use std::sync::LazyLock;

use redis::Script;

/// `scripts/acquire.lua` (after `scripts/guard.lua`): take the lock, or learn how long it
/// stays taken and flag the wait.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/guard.lua"),
        include_str!("scripts/acquire.lua")
    ))
});

/// `scripts/read_acquire.lua` (after `scripts/guard.lua`): take a read lock, or learn how long
/// to wait for the writer.
pub(crate) static READ_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/guard.lua"),
        include_str!("scripts/read_acquire.lua")
    ))
});

/// `scripts/fair_acquire.lua` (after `scripts/guard.lua` and `scripts/line.lua`): take a fair
/// lock in arrival order, or wait in line.
pub(crate) static FAIR_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/guard.lua"),
        include_str!("scripts/line.lua"),
        include_str!("scripts/fair_acquire.lua")
    ))
});

/// `scripts/withdraw.lua`: a waiting writer that stopped waiting leaves the waiting writers.
pub(crate) static WITHDRAW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/withdraw.lua")));

/// `scripts/read_release.lua`: drop a read lock; the last reader out tells a waiting writer.
pub(crate) static READ_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/read_release.lua")));

/// `scripts/read_renew.lua`: extend readers' leases, for a batch of read locks.
pub(crate) static READ_RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/read_renew.lua")));

/// `scripts/permit_acquire.lua` (after `scripts/guard.lua` and `scripts/line.lua`): take
/// semaphore permits, or wait in line.
pub(crate) static PERMIT_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/guard.lua"),
        include_str!("scripts/line.lua"),
        include_str!("scripts/permit_acquire.lua")
    ))
});

/// `scripts/permit_release.lua` (after `scripts/line.lua`): give semaphore permits back and
/// tell the first waiter in line.
pub(crate) static PERMIT_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/line.lua"),
        include_str!("scripts/permit_release.lua")
    ))
});

/// `scripts/permit_renew.lua`: extend semaphore holders' leases, for a batch of them.
pub(crate) static PERMIT_RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/permit_renew.lua")));

/// `scripts/fence.lua`: issue the next fencing token to the lock's holder.
pub(crate) static FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/fence.lua")));

/// `scripts/release.lua` (after `scripts/line.lua`, for the fair lock's line): compare the
/// token, delete, publish.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/line.lua"),
        include_str!("scripts/release.lua")
    ))
});

/// `scripts/undo.lua`: compare the token and delete, nothing else (a RedLock node's grant to
/// a try that did not win a majority).
pub(crate) static UNDO: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/undo.lua")));

/// `scripts/renew.lua`: compare the token and set a new lease, for a batch of exclusive locks.
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/renew.lua")));

/// `scripts/force_unlock.lua`: delete whoever holds the lock, publish.
pub(crate) static FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/force_unlock.lua")));

/// `scripts/inspect.lua`: read who holds a key (a lock or a semaphore of that name), for how
/// long, and how many wait; writes nothing.
pub(crate) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect.lua")));

/// `scripts/raise_fence.lua`: raise a fence counter to a token (RedLock write-back).
pub(crate) static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/raise_fence.lua")));

/// One call of a script as a plain `EVALSHA` command, for where the call must be a command of
/// its own (in a pipeline with `WAIT`); `redis::ScriptInvocation` does not hand out its command.
pub(crate) struct ScriptCall {
    script: &'static Script,
    keys: Args,
    args: Args,
}

/// Arguments in one buffer (a call has up to a dozen, built on every acquire and release; a
/// `Vec<Vec<u8>>` would allocate each).
#[derive(Default)]
struct Args {
    bytes: Vec<u8>,
    /// Where each argument starts in `bytes`; it ends where the next starts.
    starts: Vec<usize>,
}

impl Args {
    fn len(&self) -> usize {
        self.starts.len()
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let ends = self.starts.iter().skip(1).copied();
        self.starts
            .iter()
            .zip(ends.chain(std::iter::once(self.bytes.len())))
            .map(|(&start, end)| &self.bytes[start..end])
    }
}

impl redis::RedisWrite for Args {
    fn write_arg(&mut self, arg: &[u8]) {
        self.starts.push(self.bytes.len());
        self.bytes.extend_from_slice(arg);
    }

    fn writer_for_next_arg(&mut self) -> impl std::io::Write + '_ {
        self.starts.push(self.bytes.len());
        &mut self.bytes
    }
}

impl ScriptCall {
    pub(crate) fn new(script: &'static Script) -> Self {
        Self {
            script,
            keys: Args::default(),
            args: Args {
                bytes: Vec::with_capacity(256),
                starts: Vec::with_capacity(8),
            },
        }
    }

    /// Adds `KEYS[n]`.
    pub(crate) fn key(&mut self, key: impl redis::ToRedisArgs) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds `ARGV[n]`.
    pub(crate) fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The `EVALSHA` command.
    pub(crate) fn command(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash()).arg(self.keys.len());
        for arg in self.keys.iter().chain(self.args.iter()) {
            cmd.arg(arg);
        }
        cmd
    }

    /// Loads the script into the server's cache (after `NOSCRIPT`).
    pub(crate) async fn load(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<()> {
        self.script.load_async(conn).await.map(drop)
    }

    /// Runs the call alone; loads the script and sends the call again when the server answers
    /// NOSCRIPT (its script cache was flushed, or it is a promoted replica). The command is
    /// built once (a `redis::ScriptInvocation` would copy every argument once more).
    pub(crate) async fn invoke<T: redis::FromRedisValue>(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<T> {
        let cmd = self.command();
        match cmd.query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.load(conn).await?;
                cmd.query_async(conn).await
            }
            result => result,
        }
    }
}
