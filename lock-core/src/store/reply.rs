//! The scripts' replies as types: each decoded in one place, from the shape its `.lua` file
//! documents.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

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

/// `scripts/fence.lua`'s reply: the token, or `None` when the lock is not the caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FenceReply(pub(crate) Option<u64>);

impl FromRedisValue for FenceReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let reply: i64 = FromRedisValue::from_redis_value(value)?;
        match reply {
            -1 => Ok(Self(None)),
            fence if fence > 0 => Ok(Self(u64::try_from(fence).ok())),
            other => Err(format!("fence script answered {other}, expected -1 or a token").into()),
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

/// What one renewal learned about one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The lease was extended.
    Renewed,
    /// The lock is lost; what was found instead.
    NotOurs(Gone),
    /// No answer that decides it (Redis unreachable, no quorum either way).
    Unknown,
}

impl Renewal {
    pub(crate) fn is_not_ours(self) -> bool {
        matches!(self, Self::NotOurs(_))
    }
}

/// The renewal scripts' reply (`renew.lua`, `read_renew.lua`, `permit_renew.lua`): one code
/// per lock of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RenewReply(pub(crate) Vec<Renewal>);

impl FromRedisValue for RenewReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let codes: Vec<i64> = FromRedisValue::from_redis_value(value)?;
        let renewals = codes.into_iter().map(|code| match code {
            1 => Ok(Renewal::Renewed),
            0 => Ok(Renewal::NotOurs(Gone::Absent { uptime: None })),
            -1 => Ok(Renewal::NotOurs(Gone::Replaced)),
            -2 => Ok(Renewal::NotOurs(Gone::Expired)),
            other => Err(ParsingError::from(format!(
                "renew script answered {other} for a lock, expected 1, 0, -1 or -2"
            ))),
        });
        renewals.collect::<Result<_, _>>().map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(i: i64) -> Value {
        Value::Int(i)
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

    #[test]
    fn fence_replies_decode() {
        let decode = |i| FenceReply::from_redis_value(int(i));
        assert_eq!(
            decode(1_700_000_000_000_000).unwrap(),
            FenceReply(Some(1_700_000_000_000_000))
        );
        assert_eq!(decode(-1).unwrap(), FenceReply(None));
        assert!(decode(0).is_err());
    }

    #[test]
    fn renew_replies_decode() {
        let codes = [1, 0, -1, -2].map(int).to_vec();
        let reply = RenewReply::from_redis_value(Value::Array(codes)).unwrap();
        assert_eq!(
            reply.0,
            vec![
                Renewal::Renewed,
                Renewal::NotOurs(Gone::Absent { uptime: None }),
                Renewal::NotOurs(Gone::Replaced),
                Renewal::NotOurs(Gone::Expired),
            ]
        );
        assert!(RenewReply::from_redis_value(Value::Array(vec![int(3)])).is_err());
        assert!(RenewReply::from_redis_value(Value::Array(vec![int(-3)])).is_err());
    }
}
