//! The fencing scripts: `fence.lua` issues a token to the lock's holder, `raise_fence.lua`
//! writes a RedLock majority's largest token back; and the reply of the first.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use super::ScriptCall;
use crate::key::RedisKeys;
use crate::limits::lease_ms;
use crate::scripts;

/// `scripts/fence.lua`: KEYS the lock, its fence key; ARGV the holder's token, the fence
/// window.
pub(crate) fn fence(keys: &RedisKeys, token: &str, window: Duration) -> ScriptCall<FenceReply> {
    let mut call = ScriptCall::new(&scripts::FENCE, 2);
    call.key(&keys.lock).key(keys.fence());
    call.arg(token).arg(lease_ms(window));
    call
}

/// `scripts/raise_fence.lua`: KEYS the lock, its fence key; ARGV the token to raise the
/// counter to, the fence window. Answers 1.
pub(crate) fn raise_fence(keys: &RedisKeys, fence: u64, window: Duration) -> ScriptCall<i64> {
    let mut call = ScriptCall::new(&scripts::RAISE_FENCE, 2);
    call.key(&keys.lock).key(keys.fence());
    call.arg(fence).arg(lease_ms(window));
    call
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::calls::tests::{int, sent};

    #[test]
    fn fence_calls_lay_out_their_scripts_as_their_headers_say() {
        let k = RedisKeys::new("p", "k");
        let window = Duration::from_secs(60);
        assert_eq!(
            sent(fence(&k, "t", window)),
            ["2", &k.lock, &k.fence().to_string(), "t", "60000"]
        );
        assert_eq!(
            sent(raise_fence(&k, 17, window)),
            ["2", &k.lock, &k.fence().to_string(), "17", "60000"]
        );
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
}
