//! Key validation and the layout of the Redis keys and channels the kit uses.
//!
//! For a user key `k` under prefix `p`, with `h` the first 16 hex digits of SHA-1(`k`):
//!
//! | what | Redis name | type |
//! |---|---|---|
//! | the lock | `p{h}:lock:k` | string: the holder's token, with the lease as TTL |
//! | the fence | `p{h}:fence:k` | string: the last fencing token issued, expiring after the retention |
//! | release channel | `p{h}:released:k` | pub/sub channel, one message per release that another locker waits for |
//! | waiting flag | `p{h}:waiting:k` | string, set with a TTL by an acquirer of another locker that waits |
//! | release latch | `p{h}:unlocked:<token>` | string, left for a few seconds by a release: proof for its retry |
//! | readers | `p{h}:readers:k` | sorted set: the read locks' tokens, scored by the end of their lease (ms); the lock key then holds the marker `readers` |
//!
//! The kit writes the `{h}` hash tag itself, so all of them share one cluster slot whatever
//! braces `k` contains, and the prefix may not contain braces. Nothing the user passes can
//! leave the prefix: every name starts with it.

use crate::error::{InvalidKeyReason, LockError};

/// The longest user key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// The longest key prefix accepted, in bytes.
pub(crate) const MAX_PREFIX_LEN: usize = 128;

/// The Redis names that belong to one user key. Only the lock key is kept: it is sent with every
/// acquire, renewal and release; the others are built from it when needed, so a held lock
/// carries one name, not five.
#[derive(Debug, Clone)]
pub(crate) struct RedisKeys {
    pub(crate) lock: String,
    /// Length of `p{h}` at the start of `lock` (at most 128 + 18 bytes).
    tagged: u16,
    /// Which lock of the key these names serve; the store picks its scripts by it.
    pub(crate) access: Access,
}

/// The two ways to hold a key: alone (a mutex, a write lock) or shared with other readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Exclusive,
    Shared,
}

impl RedisKeys {
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        let digest = sha1_smol::Sha1::from(key.as_bytes()).digest().to_string();
        let tag = &digest[..16];
        let tagged = prefix.len() + tag.len() + 2;
        Self {
            lock: format!("{prefix}{{{tag}}}:lock:{key}"),
            // The prefix is at most MAX_PREFIX_LEN bytes (checked when the locker is built).
            tagged: u16::try_from(tagged).unwrap_or(u16::MAX),
            access: Access::Exclusive,
        }
    }

    /// The same names, for a read lock.
    pub(crate) fn shared(mut self) -> Self {
        self.access = Access::Shared;
        self
    }

    fn tagged(&self) -> usize {
        usize::from(self.tagged)
    }

    /// `p{h}:<kind>:k`.
    fn sibling(&self, kind: &str) -> String {
        let (tagged, rest) = self.lock.split_at(self.tagged());
        format!("{tagged}:{kind}:{}", &rest[":lock:".len()..])
    }

    /// The fence key: the last fencing token issued (see `scripts/fence.lua`).
    pub(crate) fn fence(&self) -> String {
        self.sibling("fence")
    }

    /// The release channel.
    pub(crate) fn channel(&self) -> String {
        self.sibling("released")
    }

    /// The waiting flag of this key (see `scripts/acquire.lua`).
    pub(crate) fn waiting(&self) -> String {
        self.sibling("waiting")
    }

    /// The readers set of this key (see `scripts/read_acquire.lua`).
    pub(crate) fn readers(&self) -> String {
        self.sibling("readers")
    }

    /// The release latch of `token` (see `scripts/release.lua`).
    pub(crate) fn latch(&self, token: &str) -> String {
        format!("{}:unlocked:{token}", &self.lock[..self.tagged()])
    }
}

/// Checks a user key: non-empty and at most [`MAX_KEY_LEN`] bytes. Any other UTF-8 is accepted,
/// braces and control characters included (Redis names are binary-safe).
pub(crate) fn validate(key: &str) -> Result<(), LockError> {
    let reason = if key.is_empty() {
        InvalidKeyReason::Empty
    } else if key.len() > MAX_KEY_LEN {
        InvalidKeyReason::TooLong
    } else {
        return Ok(());
    };
    Err(LockError::InvalidKey {
        key: key.chars().take(64).collect(),
        reason,
    })
}

pub(crate) fn valid_prefix(prefix: &str) -> bool {
    prefix.len() <= MAX_PREFIX_LEN && !prefix.contains(['{', '}'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn companions_share_the_kit_hash_tag() {
        let keys = RedisKeys::new("lock:", "a}x{b");
        let tag = |name: &str| {
            let open = name.find('{').unwrap();
            let close = open + name[open..].find('}').unwrap();
            name[open + 1..close].to_owned()
        };
        assert_eq!(tag(&keys.lock), tag(&keys.fence()));
        assert_eq!(tag(&keys.lock), tag(&keys.channel()));
        assert_eq!(tag(&keys.lock), tag(&keys.waiting()));
        assert_eq!(tag(&keys.lock), tag(&keys.latch("t0k")));
        assert!(
            keys.latch("t0k").starts_with("lock:{")
                && keys.latch("t0k").ends_with("}:unlocked:t0k")
        );
        assert!(
            keys.waiting().starts_with("lock:{") && keys.waiting().ends_with("}:waiting:a}x{b")
        );
        assert_eq!(tag(&keys.lock).len(), 16);
        assert!(keys.lock.starts_with("lock:{"));
        assert!(keys.lock.ends_with(":lock:a}x{b"));
    }

    #[test]
    fn distinct_keys_get_distinct_names() {
        let a = RedisKeys::new("p:", "x:y");
        let b = RedisKeys::new("p:", "x");
        assert_ne!(a.lock, b.lock);
        assert_ne!(
            RedisKeys::new("p:", "k").lock,
            RedisKeys::new("p:", "k").fence()
        );
    }

    #[test]
    fn validation() {
        assert!(validate("inventory:42").is_ok());
        assert!(validate("{tag}\r\n\0").is_ok());
        assert!(matches!(
            validate(""),
            Err(LockError::InvalidKey {
                reason: InvalidKeyReason::Empty,
                ..
            })
        ));
        let long = "x".repeat(MAX_KEY_LEN + 1);
        assert!(matches!(
            validate(&long),
            Err(LockError::InvalidKey { reason: InvalidKeyReason::TooLong, ref key }) if key.len() == 64
        ));
        assert!(validate(&"x".repeat(MAX_KEY_LEN)).is_ok());
        assert!(valid_prefix("lock:"));
        assert!(valid_prefix(""));
        assert!(!valid_prefix("a{b"));
    }
}
