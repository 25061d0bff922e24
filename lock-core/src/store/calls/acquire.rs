//! The acquire scripts, one per kind (`acquire.lua`, `fair_acquire.lua`, `read_acquire.lua`,
//! `permit_acquire.lua`), their reply, and `withdraw.lua`, by which a waiting writer that
//! stopped waiting leaves.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use super::ScriptCall;
use crate::key::RedisKeys;
use crate::kind::Kind;
use crate::limits::lease_ms;
use crate::scripts;
use crate::store::{AcquireArgs, RestartGuard};
use crate::token::Token;

/// The acquire script of the kind `keys` are held as, for `token`; `waiter` is the acquire's
/// entry in the waiting writers (an exclusive lock's, see `scripts/acquire.lua`).
pub(crate) fn of_kind(
    keys: &RedisKeys,
    token: &Token,
    waiter: &Token,
    args: AcquireArgs,
    guard: Option<&RestartGuard>,
) -> ScriptCall<AcquireReply> {
    match keys.kind() {
        Kind::Exclusive => acquire(keys, token, waiter, args, guard),
        Kind::Fair => fair_acquire(keys, token, args, guard),
        Kind::Shared => read_acquire(keys, token, args, guard),
        Kind::Permits { limit } => permit_acquire(keys, token, limit, args, guard),
    }
}

// Every name a script touches is one of its KEYS, so a migrating Cluster slot refuses the call
// before it runs (see `scripts/acquire.lua`); the restart guard's epoch key comes last, its
// guard last of ARGV (see `scripts/guard.lua`).

/// `scripts/acquire.lua`: KEYS the lock, the waiting writers [, the epoch key]; ARGV the
/// token, the lease, the wait, the waiter [, the guard].
fn acquire(
    keys: &RedisKeys,
    token: &Token,
    waiter: &Token,
    args: AcquireArgs,
    guard: Option<&RestartGuard>,
) -> ScriptCall<AcquireReply> {
    let mut call = ScriptCall::guarded(&scripts::ACQUIRE, 2, guard);
    call.key(&keys.lock).key(keys.waiting()).guard_key(guard);
    call.arg(token)
        .arg(lease_ms(args.lease))
        .arg(wait_ms(args.flag))
        .arg(waiter)
        .guard_arg(guard);
    call
}

/// `scripts/fair_acquire.lua`: KEYS the lock, the waiting writers, the line, its liveness
/// [, the epoch key]; ARGV the token, the lease, the stay in line [, the guard].
fn fair_acquire(
    keys: &RedisKeys,
    token: &Token,
    args: AcquireArgs,
    guard: Option<&RestartGuard>,
) -> ScriptCall<AcquireReply> {
    let mut call = ScriptCall::guarded(&scripts::FAIR_ACQUIRE, 4, guard);
    call.key(&keys.lock)
        .key(keys.waiting())
        .key(keys.line())
        .key(keys.line_alive())
        .guard_key(guard);
    call.arg(token)
        .arg(lease_ms(args.lease))
        .arg(wait_ms(args.flag))
        .guard_arg(guard);
    call
}

/// `scripts/read_acquire.lua`: KEYS the lock, the waiting marks, the readers [, the epoch
/// key]; ARGV the token, the lease, the wait [, the guard].
fn read_acquire(
    keys: &RedisKeys,
    token: &Token,
    args: AcquireArgs,
    guard: Option<&RestartGuard>,
) -> ScriptCall<AcquireReply> {
    let mut call = ScriptCall::guarded(&scripts::READ_ACQUIRE, 3, guard);
    call.key(&keys.lock)
        .key(keys.waiting())
        .key(keys.readers())
        .guard_key(guard);
    call.arg(token)
        .arg(lease_ms(args.lease))
        .arg(wait_ms(args.flag))
        .guard_arg(guard);
    call
}

/// `scripts/permit_acquire.lua`: KEYS the semaphore's set, its line, the line's liveness
/// [, the epoch key]; ARGV the holder, the lease, the stay in line, the permits, the release
/// channel [, the guard]. A semaphore's line says who waits: it has no waiting writers.
fn permit_acquire(
    keys: &RedisKeys,
    holder: &Token,
    limit: u32,
    args: AcquireArgs,
    guard: Option<&RestartGuard>,
) -> ScriptCall<AcquireReply> {
    let mut call = ScriptCall::guarded(&scripts::PERMIT_ACQUIRE, 3, guard);
    call.key(&keys.lock)
        .key(keys.line())
        .key(keys.line_alive())
        .guard_key(guard);
    call.arg(holder)
        .arg(lease_ms(args.lease))
        .arg(wait_ms(args.flag))
        .arg(limit)
        .arg(keys.channel())
        .guard_arg(guard);
    call
}

/// How long an acquire waits, in whole milliseconds; zero (it will not wait) stays zero.
fn wait_ms(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
}

/// `scripts/withdraw.lua`: KEYS the lock, the waiting writers; ARGV the waiter's token, the
/// release channel. Answers 0 when the entry was not there, 1 when it was, 2 when it was and
/// the channel was told.
pub(crate) fn withdraw(keys: &RedisKeys, token: &str) -> ScriptCall<i64> {
    let mut call = ScriptCall::new(&scripts::WITHDRAW, 2);
    call.key(&keys.lock).key(keys.waiting());
    call.arg(token).arg(keys.channel());
    call
}

/// `scripts/acquire.lua`'s reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    /// `{1, 0}`: the lock is held by the caller's token.
    Acquired,
    /// `{0, pttl}` or `{0, pttl, value}`: another token holds it; its remaining lease (none
    /// when the key has no expiry), and the holder's stored value when the script read it.
    Busy {
        ttl: Option<Duration>,
        holder: Option<String>,
    },
    /// `{2, ms}`: the node's data set is younger than the restart guard; it grants nothing for
    /// another `ms`.
    Guarded { for_ms: Duration },
}

impl FromRedisValue for AcquireReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut items: Vec<Value> = FromRedisValue::from_redis_value(value)?;
        let holder: Option<String> = match items.len() {
            2 => None,
            3 => items
                .pop()
                .map(FromRedisValue::from_redis_value)
                .transpose()?,
            n => return Err(format!("acquire script answered {n} values, expected 2 or 3").into()),
        };
        let (answer, value): (i64, i64) = FromRedisValue::from_redis_value(Value::Array(items))?;
        let duration = || u64::try_from(value).ok().map(Duration::from_millis);
        Ok(match answer {
            1 => Self::Acquired,
            2 => Self::Guarded {
                for_ms: duration().unwrap_or_default(),
            },
            0 => Self::Busy {
                ttl: duration(),
                holder,
            },
            other => {
                return Err(format!("acquire script answered {other}, expected 0, 1 or 2").into())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::calls::tests::{int, sent};

    fn args(fresh_token: bool) -> AcquireArgs {
        AcquireArgs {
            lease: Duration::from_millis(30_000),
            flag: Duration::from_millis(2_500),
            fresh_token,
            likely_busy: false,
        }
    }

    /// Each script's KEYS and ARGV in the order of its `.lua` header, the restart guard last.
    #[test]
    fn each_kind_lays_out_its_script_as_its_header_says() {
        let guard = RestartGuard {
            epoch_key: "p:epoch".to_owned(),
            guard: Duration::from_secs(40),
        };
        let k = RedisKeys::new("p", "k");
        let holder: Arc<str> = Arc::from("h");
        let (t, w) = (
            Token::new(&holder, Kind::Exclusive, 1),
            Token::new(&holder, Kind::Exclusive, 1),
        );
        let permit = Token::new(&holder, Kind::Permits { limit: 3 }, 1);
        let (ts, ws, ps) = (t.stored(), w.stored(), permit.stored());
        let (ts, ws, ps) = (ts.as_str(), ws.as_str(), ps.as_str());
        assert_eq!(
            sent(of_kind(&k, &t, &w, args(false), None)),
            [
                "2",
                &k.lock,
                &k.waiting().to_string(),
                ts,
                "30000",
                "2500",
                ws
            ]
        );
        assert_eq!(
            sent(of_kind(&k, &t, &w, args(false), Some(&guard))),
            [
                "3",
                &k.lock,
                &k.waiting().to_string(),
                "p:epoch",
                ts,
                "30000",
                "2500",
                ws,
                "40000"
            ]
        );
        let fair = k.clone().held_as(Kind::Fair);
        assert_eq!(
            sent(of_kind(&fair, &t, &w, args(true), Some(&guard))),
            [
                "5",
                &fair.lock,
                &fair.waiting().to_string(),
                &fair.line().to_string(),
                &fair.line_alive().to_string(),
                "p:epoch",
                ts,
                "30000",
                "2500",
                "40000"
            ]
        );
        let read = k.clone().held_as(Kind::Shared);
        assert_eq!(
            sent(of_kind(&read, &t, &w, args(true), None)),
            [
                "3",
                &read.lock,
                &read.waiting().to_string(),
                &read.readers().to_string(),
                ts,
                "30000",
                "2500"
            ]
        );
        let permits = RedisKeys::semaphore("p", "k", 3);
        assert_eq!(
            sent(of_kind(&permits, &permit, &w, args(true), Some(&guard))),
            [
                "4",
                &permits.lock,
                &permits.line().to_string(),
                &permits.line_alive().to_string(),
                "p:epoch",
                ps,
                "30000",
                "2500",
                "3",
                &permits.channel().to_string(),
                "40000"
            ]
        );
        assert_eq!(
            sent(withdraw(&k, ws)),
            [
                "2",
                &k.lock,
                &k.waiting().to_string(),
                ws,
                &k.channel().to_string()
            ]
        );
    }

    #[test]
    fn acquire_replies_decode() {
        let decode = |a, b| AcquireReply::from_redis_value(Value::Array(vec![int(a), int(b)]));
        assert_eq!(decode(1, 0).unwrap(), AcquireReply::Acquired);
        assert_eq!(
            decode(0, 250).unwrap(),
            AcquireReply::Busy {
                ttl: Some(Duration::from_millis(250)),
                holder: None
            }
        );
        assert_eq!(
            decode(0, -1).unwrap(),
            AcquireReply::Busy {
                ttl: None,
                holder: None
            }
        );
        let named = AcquireReply::from_redis_value(Value::Array(vec![
            int(0),
            int(90),
            Value::BulkString(b"t0k|web-1".to_vec()),
        ]));
        assert_eq!(
            named.unwrap(),
            AcquireReply::Busy {
                ttl: Some(Duration::from_millis(90)),
                holder: Some("t0k|web-1".to_owned())
            }
        );
        assert_eq!(
            decode(2, 900).unwrap(),
            AcquireReply::Guarded {
                for_ms: Duration::from_millis(900)
            }
        );
        assert!(decode(5, 0).is_err());
        assert!(AcquireReply::from_redis_value(int(1)).is_err());
    }
}
