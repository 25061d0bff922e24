//! [`Capabilities`]: what a store's topology can serve, asked by the acquire instead of
//! asking which topology it is.

use crate::error::ConfigError;
use crate::kind::Kind;
use crate::store::Store;

/// What a store can serve and how its tries behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// A RedLock quorum of independent nodes rather than one logical Redis.
    quorum: bool,
}

impl Capabilities {
    pub(crate) fn of(store: &Store) -> Self {
        Self {
            quorum: store.is_redlock(),
        }
    }

    /// Whether the store can serve `kind`: a quorum cannot count a semaphore's holders or keep
    /// a fair line (see [`ConfigError::SemaphoreWithRedLock`] and
    /// [`ConfigError::FairLockWithRedLock`]).
    pub(crate) fn serves(self, kind: Kind) -> Result<(), ConfigError> {
        if !self.quorum || !kind.needs_one_redis() {
            return Ok(());
        }
        Err(match kind {
            Kind::Fair => ConfigError::FairLockWithRedLock,
            _ => ConfigError::SemaphoreWithRedLock,
        })
    }

    /// Whether each try runs under a fresh token: a failed quorum try is undone in the
    /// background under its own token, which must not hit the next try. On one Redis the
    /// acquire scripts are idempotent per token, so a retry keeps it.
    pub(crate) fn fresh_token_per_try(self) -> bool {
        self.quorum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_serves_what_needs_no_single_count() {
        let one = Capabilities { quorum: false };
        let quorum = Capabilities { quorum: true };
        for kind in [
            Kind::Exclusive,
            Kind::Shared,
            Kind::Fair,
            Kind::Permits { limit: 2 },
        ] {
            assert!(one.serves(kind).is_ok());
        }
        assert!(quorum.serves(Kind::Exclusive).is_ok());
        assert!(quorum.serves(Kind::Shared).is_ok());
        assert!(matches!(
            quorum.serves(Kind::Fair),
            Err(ConfigError::FairLockWithRedLock)
        ));
        assert!(matches!(
            quorum.serves(Kind::Permits { limit: 2 }),
            Err(ConfigError::SemaphoreWithRedLock)
        ));
        assert!(quorum.fresh_token_per_try() && !one.fresh_token_per_try());
    }
}
