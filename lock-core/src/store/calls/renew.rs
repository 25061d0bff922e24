//! The renewal scripts, one per kind (`renew.lua`, also the fair lock's, `read_renew.lua`,
//! `permit_renew.lua`), each renewing a batch of locks of its kind, and their reply.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use super::release::Gone;
use super::ScriptCall;
use crate::key::RedisKeys;
use crate::kind::Kind;
use crate::limits::lease_ms;
use crate::scripts;
use crate::store::NewLease;

/// The renewal script of a kind of lock: one call renews a batch of locks of one script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewScript {
    /// `scripts/renew.lua`: exclusive locks (mutexes, fair locks), fence keys carried along.
    Exclusive,
    /// `scripts/read_renew.lua`: read locks.
    Shared,
    /// `scripts/permit_renew.lua`: semaphore permits.
    Permits,
}

impl RenewScript {
    pub(crate) const ALL: [Self; 3] = [Self::Exclusive, Self::Shared, Self::Permits];

    /// The script that renews a lock held as `kind`.
    pub(crate) fn of(kind: Kind) -> Self {
        match kind {
            Kind::Exclusive | Kind::Fair => Self::Exclusive,
            Kind::Shared => Self::Shared,
            Kind::Permits { .. } => Self::Permits,
        }
    }

    /// The call that renews `locks` (their keys, token), all of this script's kind, with
    /// `lease`; `fence_window` is how long a fence key outlives its lock.
    pub(crate) fn call(
        self,
        locks: &[(&RedisKeys, &str)],
        lease: NewLease,
        fence_window: Duration,
    ) -> ScriptCall<RenewReply> {
        match self {
            Self::Exclusive => renew(locks, lease, fence_window),
            Self::Shared => read_renew(locks, lease),
            Self::Permits => permit_renew(locks, lease),
        }
    }
}

/// The first two of every renewal's ARGV: the lease, and `1` to set it exactly.
fn lease_args(call: &mut ScriptCall<RenewReply>, lease: NewLease) {
    call.arg(lease_ms(lease.lease()))
        .arg(u8::from(matches!(lease, NewLease::Exactly(_))));
}

/// `scripts/renew.lua`: KEYS each lock and its fence key; ARGV the lease, exactly, the fence
/// window, then each lock's token.
fn renew(
    locks: &[(&RedisKeys, &str)],
    lease: NewLease,
    fence_window: Duration,
) -> ScriptCall<RenewReply> {
    let mut call = ScriptCall::new(&scripts::RENEW, 2 * locks.len());
    for (keys, _) in locks {
        call.key(&keys.lock).key(keys.fence());
    }
    lease_args(&mut call, lease);
    call.arg(lease_ms(fence_window));
    for (_, token) in locks {
        call.arg(*token);
    }
    call
}

/// `scripts/read_renew.lua`: KEYS each lock and its readers (declared, as every name a script
/// touches); ARGV the lease, exactly, then each reader's token.
fn read_renew(locks: &[(&RedisKeys, &str)], lease: NewLease) -> ScriptCall<RenewReply> {
    let mut call = ScriptCall::new(&scripts::READ_RENEW, 2 * locks.len());
    for (keys, _) in locks {
        call.key(&keys.lock).key(keys.readers());
    }
    lease_args(&mut call, lease);
    for (_, token) in locks {
        call.arg(*token);
    }
    call
}

/// `scripts/permit_renew.lua`: KEYS each semaphore's set; ARGV the lease, exactly, then each
/// holder.
fn permit_renew(locks: &[(&RedisKeys, &str)], lease: NewLease) -> ScriptCall<RenewReply> {
    let mut call = ScriptCall::new(&scripts::PERMIT_RENEW, locks.len());
    for (keys, _) in locks {
        call.key(&keys.lock);
    }
    lease_args(&mut call, lease);
    for (_, holder) in locks {
        call.arg(*holder);
    }
    call
}

/// What one renewal learned about one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The lease was extended.
    Renewed,
    /// The lock is lost; what was found instead.
    NotOurs(Gone),
    /// No answer that decides it, and why.
    Undecided(Undecided),
}

/// Why a renewal decides nothing; what matters is whether the call may still run in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undecided {
    /// No answer (Redis unreachable, a timeout, no quorum either way): the call may still
    /// run in Redis later.
    Unknown,
    /// Renewed on a server that fewer replicas than required acknowledged: the call ran there
    /// before its answer, so no copy of it is still on its way to Redis.
    Unreplicated,
    /// Never sent: no connection could be had for it. It cannot run in Redis later.
    Unsent,
}

impl Undecided {
    /// Whether nothing of the call can still run in Redis: it ran before its answer, or it
    /// never left this process.
    pub(crate) fn settled(self) -> bool {
        !matches!(self, Self::Unknown)
    }
}

impl Renewal {
    /// No answer that decides it, and the call may still run in Redis.
    pub(crate) const UNKNOWN: Self = Self::Undecided(Undecided::Unknown);

    /// This answer from a server fewer replicas than required acknowledged: a renewal there
    /// proves nothing (the server may be a primary a failover left behind), so `Renewed`
    /// becomes undecided ([`Undecided::Unreplicated`]); a loss stays a loss.
    pub(crate) fn unreplicated(self) -> Self {
        match self {
            Self::Renewed => Self::Undecided(Undecided::Unreplicated),
            other => other,
        }
    }

    /// The metric label of this answer.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Renewed => "renewed",
            Self::NotOurs(_) => "lost",
            Self::Undecided(_) => "failed",
        }
    }

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
    use crate::store::calls::tests::{int, sent};

    /// Each script's KEYS and ARGV in the order of its `.lua` header: the keys of each lock,
    /// then the common arguments, then each lock's token.
    #[test]
    fn each_kind_lays_out_its_batch_as_its_header_says() {
        let (a, b) = (RedisKeys::new("p", "a"), RedisKeys::new("p", "b"));
        let window = Duration::from_secs(60);
        let lease = NewLease::AtLeast(Duration::from_secs(30));
        let batch = [(&a, "ta"), (&b, "tb")];
        assert_eq!(
            sent(RenewScript::Exclusive.call(&batch, lease, window)),
            [
                "4",
                &a.lock,
                &a.fence().to_string(),
                &b.lock,
                &b.fence().to_string(),
                "30000",
                "0",
                "60000",
                "ta",
                "tb"
            ]
        );
        let (ra, rb) = (
            a.clone().held_as(Kind::Shared),
            b.clone().held_as(Kind::Shared),
        );
        let exactly = NewLease::Exactly(Duration::from_secs(5));
        assert_eq!(
            sent(RenewScript::Shared.call(&[(&ra, "ta"), (&rb, "tb")], exactly, window)),
            [
                "4",
                &ra.lock,
                &ra.readers().to_string(),
                &rb.lock,
                &rb.readers().to_string(),
                "5000",
                "1",
                "ta",
                "tb"
            ]
        );
        let (sa, sb) = (
            RedisKeys::semaphore("p", "a", 2),
            RedisKeys::semaphore("p", "b", 2),
        );
        assert_eq!(
            sent(RenewScript::Permits.call(&[(&sa, "ta:1"), (&sb, "tb:1")], lease, window)),
            ["2", &sa.lock, &sb.lock, "30000", "0", "ta:1", "tb:1"]
        );
        assert_eq!(
            RenewScript::of(Kind::Fair),
            RenewScript::of(Kind::Exclusive)
        );
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
