//! How the fixtures probe their servers: bounded queries, `INFO` parsing and polling.

use std::collections::BTreeMap;
use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a freshly spawned process may take to answer `PING`.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Reply timeout of the fixtures' own queries (a paused server must not hang them).
pub(crate) const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// Reply timeout while polling (a paused or dying node is skipped quickly).
pub(crate) const POLL_TIMEOUT: Duration = Duration::from_millis(500);

/// The `default` user's password of the servers (and sentinels) started with one, by port: the
/// fixtures' own probes authenticate with it. Ports are never handed out twice in a process.
static PASSWORDS: Mutex<BTreeMap<u16, String>> = Mutex::new(BTreeMap::new());

/// Records that the process on `port` requires `password` (`requirepass`).
pub(crate) fn set_password(port: u16, password: &str) {
    PASSWORDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(port, password.to_owned());
}

/// The password the process on `port` requires, if any.
pub(crate) fn password(port: u16) -> Option<String> {
    PASSWORDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&port)
        .cloned()
}

/// `redis://127.0.0.1:<port>/`, with the `default` user's password (`redis://:<password>@..`)
/// for a process that requires one.
pub(crate) fn url(port: u16) -> String {
    url_with("redis", port, password(port).as_deref())
}

/// `<scheme>://127.0.0.1:<port>/`, with `password` for the `default` user when given.
pub(crate) fn url_with(scheme: &str, port: u16, password: Option<&str>) -> String {
    match password {
        Some(password) => format!("{scheme}://:{password}@127.0.0.1:{port}/"),
        None => format!("{scheme}://127.0.0.1:{port}/"),
    }
}

/// Runs one command on a fresh connection to `127.0.0.1:port`, bounded by `timeout` for the
/// connect and for the reply.
pub(crate) fn query<T: redis::FromRedisValue>(
    port: u16,
    args: &[&str],
    timeout: Duration,
) -> redis::RedisResult<T> {
    let client = redis::Client::open(url(port))?;
    let mut con = client.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    command(args).query(&mut con)
}

/// The command `args` spell: its name, then its arguments.
pub(crate) fn command(args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd
}

/// The value of `field` in an `INFO`-style `field:value` text.
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// Polls `check` every 50 ms until it returns `Ok(())`, or fails with `TimedOut` after
/// `timeout`, quoting the last state `check` reported.
pub(crate) fn wait_until(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<(), String>,
) -> io::Result<()> {
    let start = Instant::now();
    loop {
        let state = match check() {
            Ok(()) => return Ok(()),
            Err(state) => state,
        };
        if start.elapsed() >= timeout {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("timed out after {timeout:?} waiting for {what}; last state: {state}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The first element of `ROLE` (`master`, `slave` or `sentinel`), if the node answers.
pub(crate) fn role(port: u16) -> Option<String> {
    let reply: Vec<redis::Value> = query(port, &["ROLE"], POLL_TIMEOUT).ok()?;
    let first = reply.into_iter().next()?;
    redis::from_redis_value::<String>(first).ok()
}

/// All keys of database 0 on `port` matching `pattern`, sorted.
pub(crate) fn scan_keys(port: u16, pattern: &str) -> redis::RedisResult<Vec<String>> {
    let client = redis::Client::open(url(port))?;
    let mut con = client.get_connection_with_timeout(QUERY_TIMEOUT)?;
    con.set_read_timeout(Some(QUERY_TIMEOUT))?;
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(&mut con)?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// Turns a Redis error into an `io::Error` with some context.
pub(crate) fn io_err(context: impl std::fmt::Display, e: redis::RedisError) -> io::Error {
    io::Error::other(format!("{context}: {e}"))
}
