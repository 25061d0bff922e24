//! [`Token`]: what an acquirer stores under a lock key, and what proves the lock is its own.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::io;
use std::sync::Arc;

use crate::holder::{self, StoredKind};
use crate::kind::Kind;

/// The longest stored value of a holder name the kit accepts.
pub(crate) const MAX_STORED_LEN: usize =
    32 + 1 + holder::MAX_HOLDER_NAME_LEN + holder::MAX_SUFFIX_LEN;

/// The token of one try of an acquire: 128 random bits, the holder's name and what the
/// scripts count of its kind (see `holder.rs`). Only its issuer knows it, so every change to a
/// lock key compares it first. The acquire's and the release's calls take it as it is and
/// write its stored value into their commands in place (see `store/calls`); other calls take
/// the [`stored`](Self::stored) value as a string.
///
/// Kept as the bits, not the text: a held lock carries its token for as long as it is held,
/// and the stored value (`<32 hex digits>|<holder>...`) is written only where it is sent. The
/// holder name is the locker's, shared by all its tokens.
#[derive(Clone, Eq)]
pub(crate) struct Token {
    random: [u8; 16],
    holder: Arc<str>,
    kind: StoredKind,
}

impl Token {
    /// A fresh token of `holder` for a try of `kind` (of `permits` permits for a semaphore): a
    /// fair lock's is marked, a semaphore holder's names its permits.
    pub(crate) fn new(holder: &Arc<str>, kind: Kind, permits: u32) -> Self {
        let kind = match kind {
            Kind::Permits { .. } => StoredKind::Permits(permits),
            Kind::Fair => StoredKind::Fair,
            Kind::Exclusive | Kind::Shared => StoredKind::Plain,
        };
        Self {
            random: random_bits(),
            holder: holder.clone(),
            kind,
        }
    }

    /// The value stored in Redis: `<token>|<holder>`, with a fair lock's mark or a semaphore
    /// holder's permits, for the calls that need it as a string. The acquire's and the
    /// release's commands take the token itself, which writes this into them in place (see
    /// `store/calls`), and build no string.
    pub(crate) fn stored(&self) -> String {
        let mut value = Vec::with_capacity(self.stored_capacity());
        // Writing to a `Vec` cannot fail.
        let _ = self.write_stored(&mut value);
        String::from_utf8(value).unwrap_or_default()
    }

    /// At least the stored value's length (a semaphore's permits counted as ten digits).
    pub(crate) fn stored_capacity(&self) -> usize {
        32 + 1 + self.holder.len() + holder::MAX_SUFFIX_LEN
    }

    /// Writes the stored value into `out`: 32 hex digits, then the holder part.
    pub(crate) fn write_stored(&self, out: &mut impl io::Write) -> io::Result<()> {
        let mut hex = [0u8; 32];
        crate::hex::encode_into(&self.random, &mut hex);
        out.write_all(&hex)?;
        holder::write_holder(out, &self.holder, self.kind)
    }

    /// The permits a semaphore holder's token counts (`None` for a lock's).
    pub(crate) fn permits(&self) -> Option<u32> {
        match self.kind {
            StoredKind::Permits(permits) => Some(permits),
            StoredKind::Plain | StoredKind::Fair => None,
        }
    }
}

/// Field by field, the holder name by pointer first: a locker's tokens share one, and tokens
/// are compared on every acquire and release (the name's bytes only when the pointers differ).
impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        self.random == other.random
            && self.kind == other.kind
            && (Arc::ptr_eq(&self.holder, &other.holder) || self.holder == other.holder)
    }
}

/// By the random bits alone: equal tokens have equal bits, and the name is the same for
/// every token of a locker. As one integer: a hasher takes it in one step, not as a slice
/// with its length.
impl Hash for Token {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u128(u128::from_ne_bytes(self.random));
    }
}

/// As the stored value (what `Debug` of a grant or a held lock showed before tokens were
/// kept as bits).
impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.stored(), f)
    }
}

/// 128 random bits from the thread-local CSPRNG, as 32 hex digits.
#[cfg(test)]
pub(crate) fn random() -> String {
    let mut value = String::with_capacity(32);
    push_hex(&mut value, &random_bits());
    value
}

/// 128 bits from the thread-local CSPRNG, drawn as one integer: drawn as `[u8; 16]`, `rand`
/// takes each byte from a word of its own (sixteen draws).
fn random_bits() -> [u8; 16] {
    rand::random::<u128>().to_ne_bytes()
}

/// Appends `bits` as 32 lowercase hex digits (as [`Token::write_stored`] writes them).
#[cfg(test)]
fn push_hex(value: &mut String, bits: &[u8; 16]) {
    let mut hex = [0u8; 32];
    crate::hex::encode_into(bits, &mut hex);
    value.push_str(std::str::from_utf8(&hex).unwrap_or_default());
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
        // High nibble first, bytes in order.
        let mut value = String::from(">");
        let bits = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0, 0xff, 0, 0, 0, 0, 0, 0x10,
        ];
        push_hex(&mut value, &bits);
        assert_eq!(value, ">0123456789abcdef00ff000000000010");
    }

    #[test]
    fn a_token_carries_its_holder_and_kind() {
        let holder: Arc<str> = Arc::from("web-1:42");
        let fair = Token::new(&holder, Kind::Fair, 1);
        assert_eq!(holder::parse_lock(&fair.stored()).holder, Some("web-1:42"));
        assert!(holder::parse_lock(&fair.stored()).fair);
        assert_eq!(fair.permits(), None);
        let permits = Token::new(&holder, Kind::Permits { limit: 5 }, 3);
        assert_eq!(
            holder::parse_permit(&permits.stored()),
            (Some("web-1:42"), 3)
        );
        assert_eq!(permits.permits(), Some(3));
        let plain = Token::new(&holder, Kind::Exclusive, 1);
        assert_eq!(plain.stored().len(), 32 + 1 + holder.len());
        assert_eq!(plain.stored(), plain.clone().stored());
        assert_ne!(plain, Token::new(&holder, Kind::Exclusive, 1));
        assert_eq!(format!("{plain:?}"), format!("{:?}", plain.stored()));
    }
}
