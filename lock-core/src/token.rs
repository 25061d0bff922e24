//! [`Token`]: what an acquirer stores under a lock key, and what proves the lock is its own.

use std::fmt;

use crate::holder::{self, StoredKind};
use crate::kind::Kind;

/// The stored value of one try of an acquire: 128 random bits, the holder's name and what the
/// scripts count of its kind (see `holder.rs`). Only its issuer knows it, so every change to a
/// lock key compares it first; it crosses into `store/` as [`as_str`](Self::as_str).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Token(String);

impl Token {
    /// A fresh token of `holder` for a try of `kind` (of `permits` permits for a semaphore): a
    /// fair lock's is marked, a semaphore holder's names its permits.
    pub(crate) fn new(holder: &str, kind: Kind, permits: u32) -> Self {
        let stored = match kind {
            Kind::Permits { .. } => StoredKind::Permits(permits),
            Kind::Fair => StoredKind::Fair,
            Kind::Exclusive | Kind::Shared => StoredKind::Plain,
        };
        // One allocation, sized for the whole value: this runs on every acquire.
        let mut value = String::with_capacity(32 + 1 + holder.len() + 12);
        push_random(&mut value);
        holder::push_holder(&mut value, holder, stored);
        Self(value)
    }

    /// A token this process issued, kept as text meanwhile (a lock handed over locally).
    pub(crate) fn issued(value: String) -> Self {
        Self(value)
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// Takes the token out, leaving an empty one: for a release-on-drop being disarmed and
    /// dropped, whose token lives on in a grant.
    pub(crate) fn take(&mut self) -> Self {
        Self(std::mem::take(&mut self.0))
    }
}

/// As the text (what `Debug` of a grant or a held lock showed before tokens had a type).
impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
impl From<&str> for Token {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

/// 128 random bits from the thread-local CSPRNG, as 32 hex digits.
#[cfg(test)]
pub(crate) fn random() -> String {
    let mut value = String::with_capacity(32);
    push_random(&mut value);
    value
}

/// Appends 128 random bits from the thread-local CSPRNG as 32 lowercase hex digits.
fn push_random(value: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = rand::random::<u128>();
    value.extend((0..32).rev().map(|digit| {
        let nibble = (bits >> (4 * digit)) & 0xf;
        // A nibble is below 16: the index cannot be out of range.
        char::from(HEX[usize::try_from(nibble).unwrap_or(0)])
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_and_unique() {
        let tokens: std::collections::HashSet<String> = (0..100_000).map(|_| random()).collect();
        assert_eq!(tokens.len(), 100_000);
        assert!(tokens.iter().all(|t| t.len() == 32));
        assert!(tokens.iter().all(|t| t
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))));
        // Every digit position takes every value: no nibble is lost or stuck.
        for position in 0..32 {
            let seen: std::collections::HashSet<u8> =
                tokens.iter().map(|t| t.as_bytes()[position]).collect();
            assert_eq!(seen.len(), 16, "digit {position}");
        }
    }

    #[test]
    fn a_token_carries_its_holder_and_kind() {
        let fair = Token::new("web-1:42", Kind::Fair, 1);
        assert_eq!(holder::parse_lock(fair.as_str()).holder, Some("web-1:42"));
        assert!(holder::parse_lock(fair.as_str()).fair);
        let permits = Token::new("web-1:42", Kind::Permits { limit: 5 }, 3);
        assert_eq!(
            holder::parse_permit(permits.as_str()),
            (Some("web-1:42"), 3)
        );
        assert_ne!(
            Token::new("a", Kind::Exclusive, 1),
            Token::new("a", Kind::Exclusive, 1)
        );
    }
}
