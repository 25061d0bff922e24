//! The Redis scripts, one `.lua` file each; `redis::Script` sends them by SHA (EVALSHA) and
//! reloads them transparently when the server answers NOSCRIPT (after `SCRIPT FLUSH` or a
//! restart).

use std::sync::LazyLock;

use redis::Script;

/// `scripts/acquire.lua`: take the lock and issue a fencing token.
pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));

/// `scripts/release.lua`: compare the token, delete, publish.
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));

/// `scripts/renew.lua`: compare the token and set a new lease, for a batch of keys.
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/renew.lua")));

/// `scripts/force_unlock.lua`: delete whoever holds the lock, publish.
pub(crate) static FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/force_unlock.lua")));

/// `scripts/raise_fence.lua`: raise a fence counter to a token (RedLock write-back).
pub(crate) static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/raise_fence.lua")));
