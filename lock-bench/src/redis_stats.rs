//! Server-side command counts from `INFO commandstats`.
//!
//! Redis counts a command run inside a Lua script like one sent by a client: an `EVALSHA` of
//! the kit's acquire script shows up as `evalsha` plus its inner `set`, `time`, `get`, `set`.
//! [`CommandStats::all`] is that literal total; [`CommandStats::client_sent`] subtracts the
//! commands that only run inside the scripts of the side being measured, which leaves at most
//! what the client sent (its round trips, pipelined or not): a command both the client and a
//! script send (the kit's `GET`, `SET`, `PUBLISH`, `EXISTS`) is counted whole, so the count is
//! never below the truth.

use std::collections::BTreeMap;

use redis::aio::MultiplexedConnection;
use redis::InfoDict;

use crate::Side;

/// Connection housekeeping and the benchmark's own monitoring, never lock work.
const IGNORED: &[&str] = &[
    "info",
    "config|resetstat",
    "config|get",
    "client|setinfo",
    "hello",
    "select",
];

/// Commands the kit runs only inside its scripts (acquire, release, renew). Not `set` (a
/// first try is a plain `SET NX PX`), `get` (a local handoff's confirmation), `publish` (a
/// RedLock release tells every node), `exists`: the kit sends those itself too.
const KIT_SCRIPT_ONLY: &[&str] = &["time", "del", "pttl", "pexpire", "type", "zadd", "zrem"];

/// Commands the floor runs only inside its scripts (compare-and-delete, compare-and-pexpire).
const FLOOR_SCRIPT_ONLY: &[&str] = &["get", "del", "pexpire"];

/// CPU time of the Redis server process so far (user + system, all threads), in seconds,
/// from `INFO cpu`; works for a server started by the benchmark and for `REDIS_URL` alike.
pub(crate) async fn server_cpu(conn: &mut MultiplexedConnection) -> redis::RedisResult<f64> {
    let info: InfoDict = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let field = |name: &str| info.get::<f64>(name).unwrap_or(0.0);
    Ok(field("used_cpu_user") + field("used_cpu_sys"))
}

/// Calls and server time per command.
#[derive(Debug, Clone, Default)]
pub(crate) struct CommandStats {
    calls: BTreeMap<String, (u64, u64)>,
}

impl CommandStats {
    /// Reads `INFO commandstats`.
    pub(crate) async fn read(conn: &mut MultiplexedConnection) -> redis::RedisResult<Self> {
        let info: InfoDict = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await?;
        Ok(Self::parse(&info))
    }

    /// `cmdstat_<name>:calls=<n>,usec=<n>,..` fields.
    fn parse(info: &InfoDict) -> Self {
        let mut calls = BTreeMap::new();
        for (key, value) in info.iter() {
            let Some(name) = key.strip_prefix("cmdstat_") else {
                continue;
            };
            let Ok(fields) = redis::from_redis_value_ref::<String>(value) else {
                continue;
            };
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            calls.insert(name.to_owned(), (field("calls="), field("usec=")));
        }
        Self { calls }
    }

    /// What happened between `before` and `self`.
    pub(crate) fn since(&self, before: &Self) -> Self {
        let calls = self
            .calls
            .iter()
            .map(|(name, (c, u))| {
                let (c0, u0) = before.calls.get(name).copied().unwrap_or((0, 0));
                (name.clone(), (c.saturating_sub(c0), u.saturating_sub(u0)))
            })
            .filter(|(_, (c, _))| *c > 0)
            .collect();
        Self { calls }
    }

    /// Calls of one command (lowercase, e.g. `"evalsha"`).
    pub(crate) fn calls(&self, name: &str) -> u64 {
        self.calls.get(name).map_or(0, |(c, _)| *c)
    }

    /// Server time spent in one command, in microseconds (a script's time includes its inner
    /// commands).
    pub(crate) fn usec(&self, name: &str) -> u64 {
        self.calls.get(name).map_or(0, |(_, u)| *u)
    }

    /// Every command counted by Redis, script-inner ones included, minus housekeeping.
    pub(crate) fn all(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(name, _)| !IGNORED.contains(&name.as_str()))
            .map(|(_, (c, _))| c)
            .sum()
    }

    /// The commands the client of `side` sent (script-inner commands removed).
    pub(crate) fn client_sent(&self, side: Side) -> u64 {
        let inner = match side {
            Side::Kit => KIT_SCRIPT_ONLY,
            // rslock's release script is the floor's (`GET`, `DEL`).
            Side::Floor | Side::Rslock | Side::Guarded => FLOOR_SCRIPT_ONLY,
        };
        self.calls
            .iter()
            .filter(|(name, _)| {
                !IGNORED.contains(&name.as_str()) && !inner.contains(&name.as_str())
            })
            .map(|(_, (c, _))| c)
            .sum()
    }

    /// `name=calls` pairs, for the JSON output.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        self.calls
            .iter()
            .filter(|(name, _)| !IGNORED.contains(&name.as_str()))
            .map(|(name, (c, _))| (name.clone(), serde_json::Value::from(*c)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_subtracts() {
        let before = CommandStats::parse(&InfoDict::new(
            "# Commandstats\r\ncmdstat_evalsha:calls=2,usec=10,usec_per_call=5.00\r\ncmdstat_info:calls=1,usec=3\r\n",
        ));
        let after = CommandStats::parse(&InfoDict::new(
            "cmdstat_evalsha:calls=5,usec=40,usec_per_call=8.00\r\ncmdstat_set:calls=3,usec=3\r\ncmdstat_get:calls=3,usec=1\r\ncmdstat_info:calls=4,usec=9\r\n",
        ));
        let delta = after.since(&before);
        assert_eq!(delta.calls("evalsha"), 3);
        assert_eq!(delta.usec("evalsha"), 30);
        assert_eq!(delta.all(), 9);
        // The kit sends `SET` and `GET` itself too: counted whole, never below the truth.
        assert_eq!(delta.client_sent(Side::Kit), 9);
        assert_eq!(delta.client_sent(Side::Floor), 6);
    }
}
