//! The release scripts, one per kind (`release.lua`, also the fair lock's, `read_release.lua`,
//! `permit_release.lua`), their reply, and `undo.lua`, a RedLock node's grant taken back.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use super::ScriptCall;
use crate::key::{Name, RedisKeys};
use crate::kind::Kind;
use crate::limits::lease_ms;
use crate::scripts;
use crate::token::Token;

/// The release script of the kind `keys` are held as, for `token`; `latch` is how long the
/// release latch lives (zero: none, and its name is not sent). Every name a script touches is
/// one of its KEYS (see `scripts/release.lua`), in its header's order:
///
/// - `release.lua`: the lock, the waiting marks [, the latch];
/// - `fair_release.lua`: the lock, the waiting marks, the line and its liveness [, the latch];
/// - `read_release.lua`: the lock, the waiting marks, the readers [, the latch];
/// - `permit_release.lua`: the semaphore's set, the line, its liveness [, the latch];
///
/// and ARGV the token (a semaphore's: its holder, and the semaphore's count) [, the latch's
/// life in milliseconds].
pub(crate) fn of_kind(
    keys: &RedisKeys,
    token: &Token,
    latch: Duration,
) -> ScriptCall<ReleaseReply> {
    let (script, names, limit): (_, &[Name<'_>], _) = match keys.kind() {
        Kind::Exclusive => (&scripts::RELEASE, &[keys.waiting()], None),
        Kind::Fair => (
            &scripts::FAIR_RELEASE,
            &[keys.waiting(), keys.line(), keys.line_alive()],
            None,
        ),
        Kind::Shared => (
            &scripts::READ_RELEASE,
            &[keys.waiting(), keys.readers()],
            None,
        ),
        Kind::Permits { limit } => (
            &scripts::PERMIT_RELEASE,
            &[keys.line(), keys.line_alive()],
            Some(limit),
        ),
    };
    // The latch is named by the stored value, built as a string only for it.
    let latched = (!latch.is_zero()).then(|| token.stored());
    let latch = latched
        .as_deref()
        .map(|stored| (keys.latch(stored), lease_ms(latch)));
    let mut call = ScriptCall::new(script, 1 + names.len() + usize::from(latch.is_some()));
    call.key(&keys.lock);
    for name in names {
        call.key(name);
    }
    // The latch's name and life only with a window: every name or argument sent costs Redis
    // a string on every release, the hot path's.
    if let Some((name, _)) = &latch {
        call.key(name);
    }
    call.arg(token);
    if let Some(limit) = limit {
        call.arg(limit);
    }
    if let Some((_, ms)) = latch {
        call.arg(ms);
    }
    call
}

/// `scripts/undo.lua`: KEYS the lock; ARGV the try's token. Answers 1 when it deleted the key.
pub(crate) fn undo(keys: &RedisKeys, token: &Token) -> ScriptCall<i64> {
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
    use std::sync::Arc;

    use super::*;
    use crate::store::calls::tests::{int, sent};

    /// Each script's KEYS and ARGV in the order of its `.lua` header; the latch's name only
    /// with a window.
    #[test]
    fn each_kind_lays_out_its_script_as_its_header_says() {
        let latch = Duration::from_millis(1_500);
        let k = RedisKeys::new("p", "k");
        let t = Token::new(&Arc::from("h"), Kind::Exclusive, 1);
        let ts = t.stored();
        let ts = ts.as_str();
        let names = |k: &RedisKeys, names: &[Name<'_>]| -> Vec<String> {
            std::iter::once(k.lock.clone())
                .chain(names.iter().map(Name::to_string))
                .collect()
        };
        let with = |count: &str, keys: Vec<String>, args: &[&str]| -> Vec<String> {
            std::iter::once(count.to_string())
                .chain(keys)
                .chain(args.iter().map(|arg| arg.to_string()))
                .collect()
        };

        // No window: no latch's name, no latch's life.
        let mutex = names(&k, &[k.waiting()]);
        assert_eq!(
            sent(of_kind(&k, &t, Duration::ZERO)),
            with("2", mutex.clone(), &[ts])
        );
        let mut latched = mutex;
        latched.push(k.latch(ts).to_string());
        assert_eq!(
            sent(of_kind(&k, &t, latch)),
            with("3", latched, &[ts, "1500"])
        );

        let fair = k.clone().held_as(Kind::Fair);
        let line = [fair.waiting(), fair.line(), fair.line_alive()];
        assert_eq!(
            sent(of_kind(&fair, &t, Duration::ZERO)),
            with("4", names(&fair, &line), &[ts])
        );
        let mut latched = names(&fair, &line);
        latched.push(fair.latch(ts).to_string());
        assert_eq!(
            sent(of_kind(&fair, &t, latch)),
            with("5", latched, &[ts, "1500"])
        );

        // A window under a millisecond is rounded up, not down to "no latch".
        let read = k.clone().held_as(Kind::Shared);
        let mut latched = names(&read, &[read.waiting(), read.readers()]);
        latched.push(read.latch(ts).to_string());
        assert_eq!(
            sent(of_kind(&read, &t, Duration::from_micros(10))),
            with("4", latched, &[ts, "1"])
        );
        assert_eq!(
            sent(of_kind(&read, &t, Duration::ZERO)),
            with("3", names(&read, &[read.waiting(), read.readers()]), &[ts])
        );

        let permits = RedisKeys::semaphore("p", "k", 3);
        let mut latched = names(&permits, &[permits.line(), permits.line_alive()]);
        latched.push(permits.latch(ts).to_string());
        assert_eq!(
            sent(of_kind(&permits, &t, latch)),
            with("4", latched, &[ts, "3", "1500"])
        );
        assert_eq!(
            sent(of_kind(&permits, &t, Duration::ZERO)),
            with(
                "3",
                names(&permits, &[permits.line(), permits.line_alive()]),
                &[ts, "3"]
            )
        );
        assert_eq!(sent(undo(&k, &t)), ["1", &k.lock, ts]);
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
