//! The release scripts, one per kind (`release.lua`, also the fair lock's, `read_release.lua`,
//! `permit_release.lua`), their reply, and `undo.lua`, a RedLock node's grant taken back.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use super::ScriptCall;
use crate::key::{Name, RedisKeys};
use crate::kind::Kind;
use crate::limits::lease_ms;
use crate::scripts;

/// The release script of the kind `keys` are held as, for `token`; `latch` is how long the
/// release latch lives (zero: none). Every name a script touches is one of its KEYS (see
/// `scripts/release.lua`).
pub(crate) fn of_kind(keys: &RedisKeys, token: &str, latch: Duration) -> ScriptCall<ReleaseReply> {
    match keys.kind() {
        Kind::Exclusive => release(keys, token, latch, None),
        Kind::Fair => release(keys, token, latch, Some((keys.line(), keys.line_alive()))),
        Kind::Shared => read_release(keys, token, latch),
        Kind::Permits { .. } => permit_release(keys, token, latch),
    }
}

/// `scripts/release.lua`: KEYS the lock, the latch, the waiting writers, the readers' waiting
/// flag [, the line, its liveness: a fair lock's]; ARGV the token, the release channel, the
/// latch's life.
fn release(
    keys: &RedisKeys,
    token: &str,
    latch: Duration,
    line: Option<(Name<'_>, Name<'_>)>,
) -> ScriptCall<ReleaseReply> {
    let mut call = ScriptCall::new(&scripts::RELEASE, if line.is_some() { 6 } else { 4 });
    call.key(&keys.lock)
        .key(keys.latch(token))
        .key(keys.waiting())
        .key(keys.readers_waiting());
    if let Some((line, alive)) = line {
        call.key(line).key(alive);
    }
    call.arg(token).arg(keys.channel()).arg(latch_ms(latch));
    call
}

/// `scripts/read_release.lua`: KEYS the lock, the latch, the waiting writers, the readers;
/// ARGV the token, the release channel, the latch's life.
fn read_release(keys: &RedisKeys, token: &str, latch: Duration) -> ScriptCall<ReleaseReply> {
    let mut call = ScriptCall::new(&scripts::READ_RELEASE, 4);
    call.key(&keys.lock)
        .key(keys.latch(token))
        .key(keys.waiting())
        .key(keys.readers());
    call.arg(token).arg(keys.channel()).arg(latch_ms(latch));
    call
}

/// `scripts/permit_release.lua`: KEYS the semaphore's set, the latch, the line, its liveness;
/// ARGV the holder, the release channel, the latch's life.
fn permit_release(keys: &RedisKeys, holder: &str, latch: Duration) -> ScriptCall<ReleaseReply> {
    let mut call = ScriptCall::new(&scripts::PERMIT_RELEASE, 4);
    call.key(&keys.lock)
        .key(keys.latch(holder))
        .key(keys.line())
        .key(keys.line_alive());
    call.arg(holder).arg(keys.channel()).arg(latch_ms(latch));
    call
}

/// The latch's life in milliseconds; a zero window writes no latch (`lease_ms` would round it
/// up to 1 ms).
fn latch_ms(latch: Duration) -> u64 {
    if latch.is_zero() {
        0
    } else {
        lease_ms(latch)
    }
}

/// `scripts/undo.lua`: KEYS the lock; ARGV the try's token. Answers 1 when it deleted the key.
pub(crate) fn undo(keys: &RedisKeys, token: &str) -> ScriptCall<i64> {
    let mut call = ScriptCall::new(&scripts::UNDO, 1);
    call.key(&keys.lock);
    call.arg(token);
    call
}

/// `scripts/release.lua`'s reply (or, for RedLock, the majority's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReleaseReply {
    /// This release deleted the lock while it held our token (on a majority, for RedLock):
    /// now, or in an earlier try whose reply was lost, as the try's latch proves. `false` means
    /// the lock had been lost before any try of this release ran.
    pub(crate) ours: bool,
    /// When not `ours`: what the release found instead.
    pub(crate) gone: Option<Gone>,
    /// Another locker flagged that it waits for this lock (and was told on the release
    /// channel). This locker's own waiters queue locally and never flag.
    pub(crate) others_waiting: bool,
}

impl FromRedisValue for ReleaseReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        // 1/2 deleted now, 3/4 deleted by an earlier try (the latch says so); 2 and 4 when
        // another locker flagged it waits; -1 no key, 0 another token, -2 (readers, permit
        // holders) the entry's lease had ended.
        let reply: i64 = FromRedisValue::from_redis_value(value)?;
        let gone = match reply {
            -2 => Some(Gone::Expired),
            -1 => Some(Gone::Absent { uptime: None }),
            0 => Some(Gone::Replaced),
            _ => None,
        };
        match reply {
            -2..=4 => Ok(Self {
                ours: reply >= 1,
                gone,
                others_waiting: reply == 2 || reply == 4,
            }),
            other => Err(format!("release script answered {other}, expected -2 to 4").into()),
        }
    }
}

/// What a node found where a lock should be, when it is not the caller's any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gone {
    /// No key (or, for a reader or a permit holder, no entry of its token): it expired or was
    /// deleted. `uptime`: the server's, when it was asked (after a renewal found this), to
    /// tell a restart from a deletion.
    Absent { uptime: Option<Duration> },
    /// Another holder's token, or a value of another type.
    Replaced,
    /// The holder's entry is still there, but its lease had ended (readers, permit holders).
    Expired,
    /// Not ours, for reasons the nodes disagree on (RedLock).
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::calls::tests::{int, sent};

    /// Each script's KEYS and ARGV in the order of its `.lua` header.
    #[test]
    fn each_kind_lays_out_its_script_as_its_header_says() {
        let latch = Duration::from_millis(1_500);
        let k = RedisKeys::new("p", "k");
        let common = |k: &RedisKeys| {
            [
                k.lock.clone(),
                k.latch("t").to_string(),
                k.waiting().to_string(),
            ]
        };
        let mut expected: Vec<String> = vec!["4".into()];
        expected.extend(common(&k));
        expected.extend([
            k.readers_waiting().to_string(),
            "t".into(),
            k.channel().to_string(),
            "1500".into(),
        ]);
        assert_eq!(sent(of_kind(&k, "t", latch)), expected);

        let fair = k.clone().held_as(Kind::Fair);
        let mut expected: Vec<String> = vec!["6".into()];
        expected.extend(common(&fair));
        expected.extend([
            fair.readers_waiting().to_string(),
            fair.line().to_string(),
            fair.line_alive().to_string(),
        ]);
        expected.extend(["t".into(), fair.channel().to_string(), "0".into()]);
        assert_eq!(sent(of_kind(&fair, "t", Duration::ZERO)), expected);

        let read = k.clone().held_as(Kind::Shared);
        let mut expected: Vec<String> = vec!["4".into()];
        expected.extend(common(&read));
        expected.extend([
            read.readers().to_string(),
            "t".into(),
            read.channel().to_string(),
            "1".into(),
        ]);
        assert_eq!(
            sent(of_kind(&read, "t", Duration::from_micros(10))),
            expected
        );

        let permits = RedisKeys::semaphore("p", "k", 3);
        assert_eq!(
            sent(of_kind(&permits, "t", latch)),
            [
                "4",
                &permits.lock,
                &permits.latch("t").to_string(),
                &permits.line().to_string(),
                &permits.line_alive().to_string(),
                "t",
                &permits.channel().to_string(),
                "1500"
            ]
        );
        assert_eq!(sent(undo(&k, "t")), ["1", &k.lock, "t"]);
    }

    #[test]
    fn release_replies_decode() {
        let decode = |i| ReleaseReply::from_redis_value(int(i));
        let reply = |ours, gone, others_waiting| ReleaseReply {
            ours,
            gone,
            others_waiting,
        };
        assert_eq!(decode(1).unwrap(), reply(true, None, false));
        assert_eq!(decode(2).unwrap(), reply(true, None, true));
        assert_eq!(decode(3).unwrap(), reply(true, None, false));
        assert_eq!(decode(4).unwrap(), reply(true, None, true));
        assert_eq!(
            decode(0).unwrap(),
            reply(false, Some(Gone::Replaced), false)
        );
        assert_eq!(
            decode(-1).unwrap(),
            reply(false, Some(Gone::Absent { uptime: None }), false)
        );
        assert_eq!(
            decode(-2).unwrap(),
            reply(false, Some(Gone::Expired), false)
        );
        assert!(decode(5).is_err());
        assert!(decode(-3).is_err());
    }
}
