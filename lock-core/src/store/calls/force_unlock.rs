//! `force_unlock.lua`: an operator deletes a lock whoever holds it.

use super::ScriptCall;
use crate::key::RedisKeys;
use crate::scripts;

/// `scripts/force_unlock.lua`: KEYS the lock, its readers; ARGV the release channel. Answers
/// 1 when there was a lock.
pub(crate) fn force_unlock(keys: &RedisKeys) -> ScriptCall<i64> {
    let mut call = ScriptCall::new(&scripts::FORCE_UNLOCK, 2);
    call.key(&keys.lock).key(keys.readers());
    call.arg(keys.channel());
    call
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::calls::tests::sent;

    #[test]
    fn force_unlock_lays_out_its_script_as_its_header_says() {
        let k = RedisKeys::new("p", "k");
        assert_eq!(
            sent(force_unlock(&k)),
            [
                "2",
                &k.lock,
                &k.readers().to_string(),
                &k.channel().to_string()
            ]
        );
    }
}
