//! Key validation and the layout of the Redis keys and channels the kit uses.
//!
//! For a user key `k` under prefix `p`, with `h` the first 16 hex digits of SHA-1(`k`):
//!
//! | what | Redis name | type |
//! |---|---|---|
//! | the lock | `p{h}:lock:k` | string: the holder's token and name (`<token>\|<holder>`, a fair lock's `<token>\|<holder>\|fair`, see `holder.rs`), with the lease as TTL |
//! | the fence | `p{h}:fence:k` | string: the last fencing token issued, expiring with the lock plus the fence window (and not before the server's clock passed the token plus the window) |
//! | release channel | `p{h}:released:k` | pub/sub channel, one message per release that another locker waits for |
//! | waiting marks | `p{h}:waiters:k` | sorted set: the tokens of exclusive acquirers of other lockers that wait (score 0; read locks let them go first) and the member `readers` (score -1) when readers of other lockers wait for a writer, with a TTL (as long as the last to join may wait) |
//! | release latch | `p{h}:unlocked:<token>` | string, left by a release for the release retry window when one is set (none by default): proof for its retry |
//! | readers | `p{h}:readers:k` | sorted set: the read locks' tokens, scored by the end of their lease (ms); the lock key then holds the marker `readers` |
//! | fair lock's line | `p{h}:line:k`, `p{h}:line-alive:k` | sorted sets: waiting tokens by arrival (us), and by when each stops counting as alive (ms) |
//! | semaphore | `p{h}:semaphore:k` | sorted set: the permit holders (`<token>\|<holder>:<permits>`), scored by the end of their lease (ms) |
//! | its line | `p{h}:semaphore-line:k`, `p{h}:semaphore-line-alive:k` | sorted sets: waiting holders (`<token>\|<holder>:<permits>`) by arrival (us), and by when each stops counting as alive (ms) |
//! | its channel, latch | `p{h}:semaphore-released:k`, `p{h}:unlocked:<token>` | as the lock's; a release message names the first waiter in line |
//!
//! The kit writes the `{h}` hash tag itself, so all of them share one cluster slot whatever
//! braces `k` contains, and the prefix may not contain braces. Nothing the user passes can
//! leave the prefix: every name starts with it. A script is given every one of these names it
//! touches in its KEYS, the channels (not keys) excepted (see `scripts/acquire.lua`).

use std::fmt::{self, Write as _};

use crate::error::{InvalidKeyReason, LockError};
use crate::kind::Kind;

/// The longest user key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// The longest key prefix accepted, in bytes.
pub(crate) const MAX_PREFIX_LEN: usize = 128;

/// The Redis names that belong to one user key. Only the lock key is kept: it is sent with every
/// acquire, renewal and release; the others are built from it when needed. A held lock keeps
/// none: only the hash tag ([`Tag`]), from which it builds these for a command.
#[derive(Debug, Clone)]
pub(crate) struct RedisKeys {
    pub(crate) lock: String,
    /// Length of `p{h}` at the start of `lock` (at most 128 + 18 bytes).
    tagged: u16,
    /// Which lock of the key these names serve; the store picks its scripts by it.
    kind: Kind,
}

/// The word naming the main Redis key of a kind of lock.
const fn word(kind: Kind) -> &'static str {
    match kind {
        Kind::Exclusive | Kind::Fair | Kind::Shared => "lock",
        Kind::Permits { .. } => "semaphore",
    }
}

impl RedisKeys {
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        Self::of(prefix, key, Kind::Exclusive)
    }

    /// The names of the semaphore `key` of `limit` permits.
    pub(crate) fn semaphore(prefix: &str, key: &str, limit: u32) -> Self {
        Self::of(prefix, key, Kind::Permits { limit })
    }

    /// The names of `key` held as `kind`.
    pub(crate) fn of(prefix: &str, key: &str, kind: Kind) -> Self {
        Self::with_tag(prefix, &tag_of(key), key, kind)
    }

    /// The names of `key` held as `kind`, whose hash tag is known already: a held lock keeps
    /// its tag, not its names, and builds them when a command needs them.
    pub(crate) fn with_tag(prefix: &str, tag: &Tag, key: &str, kind: Kind) -> Self {
        let tag = std::str::from_utf8(tag).unwrap_or_default();
        let tagged = prefix.len() + tag.len() + 2;
        Self {
            lock: joined(&[prefix, "{", tag, "}:", word(kind), ":", key]),
            // The prefix is at most MAX_PREFIX_LEN bytes (checked when the locker is built).
            tagged: u16::try_from(tagged).unwrap_or(u16::MAX),
            kind,
        }
    }

    /// The hash tag of these names.
    pub(crate) fn tag(&self) -> Tag {
        let mut tag = [0u8; 16];
        let end = self.tagged() - 1;
        if let Some(read) = self.lock.as_bytes().get(end - tag.len()..end) {
            tag.copy_from_slice(read);
        }
        tag
    }

    /// The user's key these names belong to, read back from `p{h}:<word>:k` (the tests check
    /// the layout with it; a held lock reads its key from its local key).
    #[cfg(test)]
    pub(crate) fn user_key(&self) -> &str {
        let start = self.tagged() + 1 + word(self.kind).len() + 1;
        self.lock.get(start..).unwrap_or_default()
    }

    /// Which lock of the key these names serve.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// The same names, held as another kind (a read lock, a fair lock).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn held_as(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    fn tagged(&self) -> usize {
        usize::from(self.tagged)
    }

    /// `p{h}:<name>:k` for a lock, `p{h}:semaphore-<name>:k` for a semaphore (whose main key is
    /// `p{h}:semaphore:k`), so a lock and a semaphore of one name never share a channel.
    fn sibling(&self, name: &'static str) -> Name<'_> {
        let word = word(self.kind);
        let (tagged, rest) = self.lock.split_at(self.tagged());
        let key = &rest[word.len() + 2..];
        match self.kind {
            Kind::Permits { .. } => Name::of([tagged, ":", word, "-", name, ":", key]),
            Kind::Exclusive | Kind::Fair | Kind::Shared => Name::of([tagged, ":", name, ":", key]),
        }
    }

    /// The fence key: the last fencing token issued (see `scripts/fence.lua`).
    pub(crate) fn fence(&self) -> Name<'_> {
        self.sibling("fence")
    }

    /// The release channel.
    pub(crate) fn channel(&self) -> Name<'_> {
        self.sibling("released")
    }

    /// The waiting marks of this key: the waiting writers and the readers' mark (see
    /// `scripts/acquire.lua`, `scripts/read_acquire.lua`). Named `waiters`: the
    /// string flag that came before it was `waiting`, and a kit of the older version on the
    /// same Redis must not meet a sorted set there.
    pub(crate) fn waiting(&self) -> Name<'_> {
        self.sibling("waiters")
    }

    /// The readers set of this key (see `scripts/read_acquire.lua`).
    pub(crate) fn readers(&self) -> Name<'_> {
        self.sibling("readers")
    }

    /// The line of waiters of a fair lock or a semaphore (see `scripts/fair_acquire.lua`,
    /// `scripts/permit_acquire.lua`).
    pub(crate) fn line(&self) -> Name<'_> {
        self.sibling("line")
    }

    /// The liveness of the waiters in the line of a fair lock or a semaphore.
    pub(crate) fn line_alive(&self) -> Name<'_> {
        self.sibling("line-alive")
    }

    /// The release latch of `token` (see `scripts/release.lua`).
    pub(crate) fn latch<'a>(&'a self, token: &'a str) -> Name<'a> {
        Name::of([&self.lock[..self.tagged()], ":unlocked:", token])
    }

    /// The other names this kind of hold's acquire and release scripts read with a type (the
    /// sorted sets), so a foreign value at one of them is a WRONGTYPE too. Redis does not say
    /// which key a script's WRONGTYPE came from: an error names the lock key and these. The
    /// flags and the latch are written with `SET` or `DEL`, which never fail on a type.
    pub(crate) fn typed_companions(&self) -> Vec<String> {
        match self.kind {
            Kind::Exclusive => Vec::new(),
            Kind::Shared => vec![self.readers().to_string()],
            Kind::Fair | Kind::Permits { .. } => {
                vec![self.line().to_string(), self.line_alive().to_string()]
            }
        }
    }
}

/// A Redis name other than the lock key, as the parts it is made of: the store writes them
/// straight into the command that sends the name (no string of its own per name, on every
/// release); `to_string` joins them where a name is kept (as a channel).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Name<'a> {
    parts: [&'a str; 7],
    len: usize,
}

impl<'a> Name<'a> {
    fn of<const N: usize>(parts: [&'a str; N]) -> Self {
        let mut all = [""; 7];
        all[..N].copy_from_slice(&parts);
        Self { parts: all, len: N }
    }

    /// The parts, in order.
    pub(crate) fn parts(&self) -> &[&'a str] {
        &self.parts[..self.len]
    }
}

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.parts().iter().try_for_each(|part| f.write_str(part))
    }
}

/// The hash tag of a key's Redis names: the first 8 bytes of the key's SHA-1, in hex.
pub(crate) type Tag = [u8; 16];

/// The hash tag of `key`'s Redis names.
fn tag_of(key: &str) -> Tag {
    let digest = <sha1::Sha1 as sha1::Digest>::digest(key.as_bytes());
    let mut tag = [0u8; 16];
    crate::hex::encode_into(&digest[..8], &mut tag);
    tag
}

/// `parts` in one string, allocated once (names are built on every acquire and release;
/// `format!` grows its buffer as it goes).
fn joined(parts: &[&str]) -> String {
    let mut name = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        name.push_str(part);
    }
    name
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

/// The most characters of a user key that logs and error messages show.
pub(crate) const SHOWN_KEY_CHARS: usize = 128;

/// A user key as the kit's logs and error messages show it. Keys are user input (a request
/// path, an order id, personal data): control characters (`\n`, `\r`, an escape sequence) and
/// invisible formatting ones (bidirectional overrides, zero-width characters, line
/// separators) are written escaped (`\n`, `\u{1b}`), `\` doubled so that an escape cannot be
/// faked, and the key is cut after [`SHOWN_KEY_CHARS`] characters with the number of bytes
/// left out. So a key cannot forge a log line, hide text, or flood a log.
pub(crate) struct ShownKey<'a>(pub(crate) &'a str);

impl fmt::Display for ShownKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shown, (at, c)) in self.0.char_indices().enumerate() {
            if shown == SHOWN_KEY_CHARS {
                return write!(f, "...(+{} bytes)", self.0.len() - at);
            }
            match c {
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if c.is_control() || is_invisible(c) => write!(f, "\\u{{{:x}}}", u32::from(c))?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

impl fmt::Debug for ShownKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Characters that change how the text around them looks without being seen: bidirectional
/// marks and overrides, zero-width characters, line and paragraph separators.
pub(crate) fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}'
            | '\u{feff}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_key_is_read_back_from_the_lock_name() {
        for key in ["7", "a}x{b", "inventory:42", "p{h}:lock:k", "é:ü", ""] {
            assert_eq!(RedisKeys::new("lock:", key).user_key(), key);
            assert_eq!(RedisKeys::new("", key).user_key(), key);
            assert_eq!(RedisKeys::semaphore("app:", key, 3).user_key(), key);
            assert_eq!(
                RedisKeys::new("lock:", key).held_as(Kind::Fair).user_key(),
                key
            );
        }
        let long = "k".repeat(MAX_KEY_LEN);
        let prefix = "p".repeat(MAX_PREFIX_LEN);
        assert_eq!(RedisKeys::semaphore(&prefix, &long, 1).user_key(), long);
    }

    /// The tag is a wire format: kits of every version on one Redis must name a key alike. It
    /// is checked against a second SHA-1 implementation, over lengths around SHA-1's 64-byte
    /// blocks and its padding (55, 56 bytes), and the longest key.
    #[test]
    fn the_tag_is_the_first_16_hex_digits_of_the_keys_sha1() {
        for len in [1, 2, 55, 56, 63, 64, 65, 119, 120, 128, 1000, MAX_KEY_LEN] {
            let key: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            let expected = sha1_smol::Sha1::from(key.as_bytes()).digest().to_string();
            let keys = RedisKeys::new("p:", &key);
            assert_eq!(
                keys.lock,
                format!("p:{{{}}}:lock:{key}", &expected[..16]),
                "{len}"
            );
        }
        // `printf inventory:7 | sha1sum` prints ea0ed9a8cea337c6…
        let keys = RedisKeys::new("", "inventory:7");
        assert_eq!(keys.lock, "{ea0ed9a8cea337c6}:lock:inventory:7");
    }

    #[test]
    fn names_rebuilt_from_the_tag_are_the_same() {
        for kind in [
            Kind::Exclusive,
            Kind::Fair,
            Kind::Shared,
            Kind::Permits { limit: 3 },
        ] {
            let keys = RedisKeys::of("lock:", "a}x{b", kind);
            let rebuilt = RedisKeys::with_tag("lock:", &keys.tag(), "a}x{b", kind);
            assert_eq!(rebuilt.lock, keys.lock);
            assert_eq!(rebuilt.user_key(), "a}x{b");
            assert_eq!(rebuilt.kind(), kind);
        }
        assert_eq!(&RedisKeys::new("", "k").tag(), &tag_of("k"));
    }

    #[test]
    fn companions_share_the_kit_hash_tag() {
        let keys = RedisKeys::new("lock:", "a}x{b");
        let tag = |name: &str| {
            let open = name.find('{').unwrap();
            let close = open + name[open..].find('}').unwrap();
            name[open + 1..close].to_owned()
        };
        assert_eq!(tag(&keys.lock), tag(&keys.fence().to_string()));
        assert_eq!(tag(&keys.lock), tag(&keys.channel().to_string()));
        assert_eq!(tag(&keys.lock), tag(&keys.waiting().to_string()));
        assert_eq!(tag(&keys.lock), tag(&keys.latch("t0k").to_string()));
        assert!(
            keys.latch("t0k").to_string().starts_with("lock:{")
                && keys.latch("t0k").to_string().ends_with("}:unlocked:t0k")
        );
        assert!(
            keys.waiting().to_string().starts_with("lock:{")
                && keys.waiting().to_string().ends_with("}:waiters:a}x{b")
        );
        assert_eq!(tag(&keys.lock).len(), 16);
        assert!(keys.lock.starts_with("lock:{"));
        assert!(keys.lock.ends_with(":lock:a}x{b"));
    }

    #[test]
    fn a_semaphore_and_a_lock_of_one_name_share_no_redis_name() {
        let lock = RedisKeys::new("p:", "exports");
        let sem = RedisKeys::semaphore("p:", "exports", 3);
        assert!(sem.lock.ends_with("}:semaphore:exports"), "{}", sem.lock);
        assert!(sem
            .channel()
            .to_string()
            .ends_with("}:semaphore-released:exports"));
        assert!(sem.line().to_string().ends_with("}:semaphore-line:exports"));
        for (a, b) in [
            (&lock.lock, &sem.lock),
            (&lock.channel().to_string(), &sem.channel().to_string()),
            (&lock.line().to_string(), &sem.line().to_string()),
        ] {
            assert_ne!(a, b);
        }
        assert_eq!(lock.lock[..lock.tagged()], sem.lock[..sem.tagged()]);
    }

    #[test]
    fn distinct_keys_get_distinct_names() {
        let a = RedisKeys::new("p:", "x:y");
        let b = RedisKeys::new("p:", "x");
        assert_ne!(a.lock, b.lock);
        assert_ne!(
            RedisKeys::new("p:", "k").lock,
            RedisKeys::new("p:", "k").fence().to_string()
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

    #[test]
    fn shown_keys_escape_control_and_invisible_characters_and_are_cut() {
        let shown = |key: &str| ShownKey(key).to_string();
        assert_eq!(shown("inventory:42"), "inventory:42");
        assert_eq!(shown("é{ü}:ключ"), "é{ü}:ключ");
        assert_eq!(shown("a\nINFO forged"), "a\\nINFO forged");
        assert_eq!(shown("a\r\tb\u{0}"), "a\\r\\tb\\u{0}");
        assert_eq!(shown("\u{1b}[31m"), "\\u{1b}[31m");
        assert_eq!(
            shown("x\u{202e}y\u{2028}z\u{200b}"),
            "x\\u{202e}y\\u{2028}z\\u{200b}"
        );
        // A literal backslash-n is not a newline: it shows doubled.
        assert_eq!(shown("a\\nb"), "a\\\\nb");
        let long = "k".repeat(1024);
        assert_eq!(
            shown(&long),
            format!(
                "{}...(+{} bytes)",
                "k".repeat(SHOWN_KEY_CHARS),
                1024 - SHOWN_KEY_CHARS
            )
        );
        let exact = "k".repeat(SHOWN_KEY_CHARS);
        assert_eq!(shown(&exact), exact);
        // Cut by characters, never inside one.
        let wide = "ü".repeat(SHOWN_KEY_CHARS + 1);
        assert_eq!(
            shown(&wide),
            format!("{}...(+2 bytes)", "ü".repeat(SHOWN_KEY_CHARS))
        );
    }
}
