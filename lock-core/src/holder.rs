//! Holder names: who holds a lock, carried in the value the lock stores in Redis.
//!
//! A holder's stored value (the string a lock key holds, a reader's or a permit holder's
//! member) is its token followed by the locker's holder name:
//!
//! | kind | stored value |
//! |---|---|
//! | mutex, write lock, read lock | `<token>\|<holder>` |
//! | fair lock | `<token>\|<holder>\|fair` |
//! | semaphore | `<token>\|<holder>:<permits>` |
//!
//! `<token>` is 32 hex digits (128 random bits). The scripts compare the whole value, as they
//! always did: the name changes no comparison, it only travels along, so naming the holder
//! costs no Redis command, only its bytes. Holder names contain no `|`, so the value splits
//! unambiguously; a semaphore's permits are the digits after its last `:` (a name may contain
//! `:`, as the default `host:pid` does).

use std::fmt;
use std::io;

use crate::error::ConfigError;
use crate::key::ShownKey;

/// The longest holder name accepted, in bytes.
pub const MAX_HOLDER_NAME_LEN: usize = 64;

/// What marks a fair lock's stored value (see the module docs).
const FAIR_MARK: &str = "|fair";

/// The longest part after the holder name: a semaphore holder's `:` and permits (ten digits
/// at most), longer than the fair lock's mark.
pub(crate) const MAX_SUFFIX_LEN: usize = 1 + 10;

/// Checks a holder name: 1 to [`MAX_HOLDER_NAME_LEN`] bytes, no `|` (the separator of the
/// stored value), no control or invisible characters (it is shown in error messages and logs).
pub(crate) fn validate(name: &str) -> Result<(), ConfigError> {
    let reason = if name.is_empty() {
        HolderNameReason::Empty
    } else if name.len() > MAX_HOLDER_NAME_LEN {
        HolderNameReason::TooLong
    } else if let Some(c) = name.chars().find(|&c| !allowed(c)) {
        HolderNameReason::Character(c)
    } else {
        return Ok(());
    };
    Err(ConfigError::HolderName {
        name: ShownKey(name).to_string(),
        reason,
    })
}

fn allowed(c: char) -> bool {
    c != '|' && !c.is_control() && !crate::key::is_invisible(c)
}

/// The default holder name: `<host name>:<process id>`, the host name cut and cleaned so that
/// the name always passes [`validate`].
pub(crate) fn default_name() -> String {
    let pid = std::process::id();
    let host = host_name();
    let mut name: String = host
        .chars()
        .map(|c| if allowed(c) { c } else { '_' })
        .collect();
    let room = MAX_HOLDER_NAME_LEN - format!(":{pid}").len();
    if name.len() > room {
        let mut cut = room;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    if name.is_empty() {
        name.push_str("localhost");
    }
    format!("{name}:{pid}")
}

/// The machine's host name, as far as the standard library lets us learn it without a system
/// call of our own: the kernel's on Linux, else the usual environment variables.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// The stored value of a new hold: `token` with the holder name (and a fair lock's mark, or a
/// semaphore holder's permits) appended (tokens write theirs with [`write_holder`]).
#[cfg(test)]
pub(crate) fn stored_value(token: &str, holder: &str, kind: StoredKind) -> String {
    let mut value = token.as_bytes().to_vec();
    // Writing to a `Vec` cannot fail.
    let _ = write_holder(&mut value, holder, kind);
    String::from_utf8(value).unwrap_or_default()
}

/// Writes what follows the token in a stored value: `|`, the holder name, and a fair lock's
/// mark or a semaphore holder's `:<permits>`.
pub(crate) fn write_holder(
    out: &mut impl io::Write,
    holder: &str,
    kind: StoredKind,
) -> io::Result<()> {
    out.write_all(b"|")?;
    out.write_all(holder.as_bytes())?;
    match kind {
        StoredKind::Plain => Ok(()),
        StoredKind::Fair => out.write_all(FAIR_MARK.as_bytes()),
        StoredKind::Permits(permits) => write!(out, ":{permits}"),
    }
}

/// Which suffix a stored value carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoredKind {
    /// A mutex, write or read lock.
    Plain,
    Fair,
    /// A semaphore holder of this many permits.
    Permits(u32),
}

/// What a stored value says of its holder. Values written by an older version of the kit (a
/// bare token) or by someone else have no holder name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored<'a> {
    pub(crate) holder: Option<&'a str>,
    pub(crate) fair: bool,
}

/// Reads a lock's (or reader's) stored value.
pub(crate) fn parse_lock(value: &str) -> Stored<'_> {
    let Some((_, rest)) = value.split_once('|') else {
        return Stored {
            holder: None,
            fair: false,
        };
    };
    match rest.strip_suffix(FAIR_MARK) {
        Some(holder) => Stored {
            holder: Some(holder),
            fair: true,
        },
        None => Stored {
            holder: Some(rest),
            fair: false,
        },
    }
}

/// Reads a semaphore holder's stored value: its holder name and permits.
pub(crate) fn parse_permit(value: &str) -> (Option<&str>, u32) {
    let (rest, permits) = match value.rsplit_once(':') {
        Some((rest, count)) => (rest, count.parse().unwrap_or(1)),
        None => (value, 1),
    };
    (rest.split_once('|').map(|(_, holder)| holder), permits)
}

/// Why a holder name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HolderNameReason {
    /// The name is empty.
    #[error("it is empty")]
    Empty,
    /// The name is longer than [`MAX_HOLDER_NAME_LEN`] bytes.
    #[error("it is longer than {MAX_HOLDER_NAME_LEN} bytes")]
    TooLong,
    /// The name contains `|` (the separator of the stored value) or a control or invisible
    /// character.
    #[error("it contains {}, which holder names may not", ShownChar(*.0))]
    Character(char),
}

/// A refused character, escaped as keys are.
struct ShownChar(char);

impl fmt::Display for ShownChar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 4];
        write!(f, "`{}`", ShownKey(self.0.encode_utf8(&mut buf)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_name_is_host_and_pid_and_valid() {
        let name = default_name();
        assert!(
            name.ends_with(&format!(":{}", std::process::id())),
            "{name}"
        );
        assert!(name.len() > format!(":{}", std::process::id()).len());
        validate(&name).unwrap();
    }

    #[test]
    fn stored_values_carry_the_holder_and_parse_back() {
        let token = "0123456789abcdef0123456789abcdef";
        let plain = stored_value(token, "web-1:42", StoredKind::Plain);
        assert_eq!(plain, format!("{token}|web-1:42"));
        assert_eq!(
            parse_lock(&plain),
            Stored {
                holder: Some("web-1:42"),
                fair: false
            }
        );
        let fair = stored_value(token, "web-1:42", StoredKind::Fair);
        assert_eq!(
            parse_lock(&fair),
            Stored {
                holder: Some("web-1:42"),
                fair: true
            }
        );
        let permits = stored_value(token, "web-1:42", StoredKind::Permits(3));
        assert_eq!(permits, format!("{token}|web-1:42:3"));
        assert_eq!(parse_permit(&permits), (Some("web-1:42"), 3));
        // A bare token (an older kit) names nobody.
        assert_eq!(parse_lock(token).holder, None);
        assert_eq!(parse_permit(&format!("{token}:2")), (None, 2));
    }

    /// A release message names the first waiter in line by its stored value: the longest
    /// must pass the listener's size limit, or that waiter would sleep until its fallback
    /// retry.
    #[test]
    fn the_longest_stored_value_fits_in_a_release_message() {
        let token = crate::token::random();
        let name = "x".repeat(MAX_HOLDER_NAME_LEN);
        for kind in [
            StoredKind::Plain,
            StoredKind::Fair,
            StoredKind::Permits(u32::MAX),
        ] {
            let value = stored_value(&token, &name, kind);
            assert!(
                value.len() <= crate::token::MAX_STORED_LEN,
                "{}",
                value.len()
            );
            assert!(
                value.len() <= crate::release_messages::MAX_MESSAGE,
                "{}",
                value.len()
            );
        }
    }

    #[test]
    fn names_are_refused_with_a_reason() {
        let reason = |name: &str| match validate(name) {
            Err(ConfigError::HolderName { reason, .. }) => Some(reason),
            Err(other) => panic!("{other}"),
            Ok(()) => None,
        };
        assert_eq!(reason(""), Some(HolderNameReason::Empty));
        assert_eq!(reason(&"x".repeat(65)), Some(HolderNameReason::TooLong));
        assert_eq!(reason(&"x".repeat(64)), None);
        assert_eq!(reason("a|b"), Some(HolderNameReason::Character('|')));
        assert_eq!(reason("a\nb"), Some(HolderNameReason::Character('\n')));
        assert_eq!(
            reason("a\u{202e}b"),
            Some(HolderNameReason::Character('\u{202e}'))
        );
        assert_eq!(reason("крон-задача {7}: ✓"), None);
        let message = validate("evil\n\u{1b}[31m").unwrap_err().to_string();
        assert_eq!(
            message,
            "invalid holder name `evil\\n\\u{1b}[31m`: it contains `\\n`, which holder names may not"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        })]

        /// Any string: accepted exactly when it is a valid name, and then it round-trips
        /// through every stored value; refused with a message free of raw control characters.
        #[test]
        fn any_name_is_accepted_or_refused_cleanly(name in proptest::prelude::any::<String>()) {
            let token = "0123456789abcdef0123456789abcdef";
            match validate(&name) {
                Ok(()) => {
                    proptest::prop_assert!(!name.is_empty() && name.len() <= MAX_HOLDER_NAME_LEN);
                    let plain = stored_value(token, &name, StoredKind::Plain);
                    proptest::prop_assert_eq!(parse_lock(&plain).holder, Some(name.as_str()));
                    let fair = stored_value(token, &name, StoredKind::Fair);
                    proptest::prop_assert_eq!(parse_lock(&fair), Stored { holder: Some(name.as_str()), fair: true });
                    let permits = stored_value(token, &name, StoredKind::Permits(7));
                    proptest::prop_assert_eq!(parse_permit(&permits), (Some(name.as_str()), 7));
                }
                Err(error) => {
                    let message = error.to_string();
                    proptest::prop_assert!(!message.chars().any(char::is_control), "{message:?}");
                }
            }
        }
    }
}
