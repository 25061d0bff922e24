//! `inspect.lua`, who holds a key (the lock or the semaphore of one user key), and its reply.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use super::ScriptCall;
use crate::key::RedisKeys;
use crate::scripts;

/// The most holders' names an inspection reads (a semaphore's or a read lock's holders may be
/// many).
pub(crate) const MAX_HOLDERS_SHOWN: u32 = 32;

/// `scripts/inspect.lua`: KEYS the lock, its waiting writers, its readers, its line and the
/// line's liveness, then the semaphore's set, its line and the line's liveness; ARGV the most
/// holders to name.
pub(crate) fn inspect(lock: &RedisKeys, semaphore: &RedisKeys) -> ScriptCall<InspectReply> {
    let mut call = ScriptCall::new(&scripts::INSPECT, 8);
    call.key(&lock.lock)
        .key(lock.waiting())
        .key(lock.readers())
        .key(lock.line())
        .key(lock.line_alive())
        .key(&semaphore.lock)
        .key(semaphore.line())
        .key(semaphore.line_alive());
    call.arg(MAX_HOLDERS_SHOWN);
    call
}

/// `scripts/inspect.lua`'s reply: `None` when nothing holds the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InspectReply(pub(crate) Option<Inspected>);

/// A held key, as `scripts/inspect.lua` found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inspected {
    pub(crate) what: HeldAs,
    /// The remaining lease; `None` when the key has no expiry.
    pub(crate) remaining: Option<Duration>,
    /// Entries in the lock key's waiting writers.
    pub(crate) waiting_writers: u32,
    /// Live waiters in the line (a fair lock's, or the semaphore's).
    pub(crate) in_line: u32,
    /// 1 for a lock key holding a value, the live readers, or the permits held.
    pub(crate) count: u32,
    /// The holders' stored values, the lease that ends last first.
    pub(crate) values: Vec<String>,
}

/// What holds a key, as `scripts/inspect.lua` tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeldAs {
    /// The lock key holds a holder's value (a mutex, write or fair lock).
    Lock,
    Readers,
    Semaphore,
}

impl FromRedisValue for InspectReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let items: Vec<Value> = FromRedisValue::from_redis_value(value)?;
        let mut items = items.into_iter();
        let mut int = |what: &str| -> Result<i64, ParsingError> {
            let item = items
                .next()
                .ok_or_else(|| format!("inspect script answered no {what}"))?;
            FromRedisValue::from_redis_value(item)
        };
        let what = match int("kind")? {
            0 => return Ok(Self(None)),
            1 => HeldAs::Lock,
            2 => HeldAs::Readers,
            3 => HeldAs::Semaphore,
            other => {
                return Err(format!("inspect script answered kind {other}, expected 0 to 3").into())
            }
        };
        let remaining = u64::try_from(int("remaining lease")?)
            .ok()
            .map(Duration::from_millis);
        let count = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
        let waiting_writers = count(int("waiting writers")?);
        let in_line = count(int("line")?);
        let held = count(int("count")?);
        let values = items
            .map(FromRedisValue::from_redis_value)
            .collect::<Result<Vec<String>, _>>()?;
        Ok(Self(Some(Inspected {
            what,
            remaining,
            waiting_writers,
            in_line,
            count: held,
            values,
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::calls::tests::sent;

    #[test]
    fn inspect_lays_out_its_script_as_its_header_says() {
        let (lock, semaphore) = (RedisKeys::new("p", "k"), RedisKeys::semaphore("p", "k", 3));
        assert_eq!(
            sent(inspect(&lock, &semaphore)),
            [
                "8",
                &lock.lock,
                &lock.waiting().to_string(),
                &lock.readers().to_string(),
                &lock.line().to_string(),
                &lock.line_alive().to_string(),
                &semaphore.lock,
                &semaphore.line().to_string(),
                &semaphore.line_alive().to_string(),
                "32"
            ]
        );
    }
}
