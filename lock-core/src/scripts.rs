//! The Redis scripts, one `.lua` file each, and the one place where each is composed with the
//! preambles it calls (shared Lua functions, each written once in its own file). A script is
//! sent by SHA (EVALSHA) and loaded again when the server answers NOSCRIPT (after
//! `SCRIPT FLUSH` or a restart); its typed call, with its KEYS and ARGV in the order its
//! header documents, is in `store/calls/`.

use std::sync::OnceLock;

use redis::Script;

/// Lua functions that several scripts call, written once and prepended to each of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Preamble {
    /// `scripts/guard.lua`: `restart_guard`, the node's age against the restart guard.
    Guard,
    /// `scripts/clock.lua`: `server_ms`, the server's clock in milliseconds.
    Clock,
    /// `scripts/line.lua` (after `Clock`): `first_in_line` and `join_line`, the line of a
    /// fair lock or a semaphore.
    Line,
    /// `scripts/latch.lua`: `leave_latch` and `latched`, a release's latch.
    Latch,
    /// `scripts/fence_expiry.lua`: `fence_expiry`, how long a fence key lives.
    FenceExpiry,
    /// `scripts/channel.lua`: `release_channel`, the release channel of a lock's main key.
    Channel,
    /// `scripts/waiting.lua`: `writer_waits`, whether a lock key's waiting marks hold a
    /// writer's entry (not only the readers' mark).
    Waiting,
}

impl Preamble {
    #[cfg(test)]
    const ALL: [Self; 7] = [
        Self::Guard,
        Self::Clock,
        Self::Line,
        Self::Latch,
        Self::FenceExpiry,
        Self::Channel,
        Self::Waiting,
    ];

    fn text(self) -> &'static str {
        match self {
            Self::Guard => include_str!("scripts/guard.lua"),
            Self::Clock => include_str!("scripts/clock.lua"),
            Self::Line => include_str!("scripts/line.lua"),
            Self::Latch => include_str!("scripts/latch.lua"),
            Self::FenceExpiry => include_str!("scripts/fence_expiry.lua"),
            Self::Channel => include_str!("scripts/channel.lua"),
            Self::Waiting => include_str!("scripts/waiting.lua"),
        }
    }

    /// The functions it defines, by which a script shows it calls them.
    #[cfg(test)]
    fn functions(self) -> &'static [&'static str] {
        match self {
            Self::Guard => &["restart_guard("],
            Self::Clock => &["server_ms("],
            Self::Line => &["first_in_line(", "join_line("],
            Self::Latch => &["leave_latch(", "latched("],
            Self::FenceExpiry => &["fence_expiry("],
            Self::Channel => &["release_channel("],
            Self::Waiting => &["writer_waits("],
        }
    }
}

/// The line of a script's file where its preambles go (at the top when it has none): what
/// comes before it must call none of their functions. Redis builds a script's functions anew
/// on every call, so a script whose usual path needs none returns before they are built.
const PREAMBLES_HERE: &str = "-- @preambles\n";

/// One script: its file, the preambles it calls, and the `redis::Script` of both, composed at
/// its first use.
pub(crate) struct Lua {
    /// Its file under `scripts/`, which names it in messages.
    pub(crate) name: &'static str,
    preambles: &'static [Preamble],
    body: &'static str,
    script: OnceLock<Script>,
}

impl Lua {
    const fn new(name: &'static str, preambles: &'static [Preamble], body: &'static str) -> Self {
        Self {
            name,
            preambles,
            body,
            script: OnceLock::new(),
        }
    }

    /// The script as sent: its own file with its preambles at its [`PREAMBLES_HERE`] line, or
    /// before it.
    pub(crate) fn script(&self) -> &Script {
        self.script.get_or_init(|| Script::new(&self.text()))
    }

    /// The script's text as sent (see [`script`](Self::script)).
    pub(crate) fn text(&self) -> String {
        let (before, after) = self.split();
        let mut text = String::from(before);
        for preamble in self.preambles {
            text.push_str(preamble.text());
        }
        text.push_str(after);
        text
    }

    /// Its file before and after its [`PREAMBLES_HERE`] line (all after, without one).
    fn split(&self) -> (&'static str, &'static str) {
        self.body
            .split_once(PREAMBLES_HERE)
            .unwrap_or(("", self.body))
    }
}

impl std::fmt::Debug for Lua {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Declares the static of each script: its name, its file and the preambles it calls.
macro_rules! scripts {
    ($($(#[$doc:meta])* $name:ident = $file:literal $(after $($preamble:ident),+)?;)*) => {
        $(
            $(#[$doc])*
            pub(crate) static $name: Lua = Lua::new(
                $file,
                &[$($(Preamble::$preamble),+)?],
                include_str!(concat!("scripts/", $file)),
            );
        )*

        /// Every script, for the tests that check them all.
        #[cfg(test)]
        pub(crate) static ALL: &[&Lua] = &[$(&$name),*];
    };
}

scripts! {
    /// Take the lock, or learn how long it stays taken and flag the wait.
    ACQUIRE = "acquire.lua" after Guard;
    /// Take a read lock, or learn how long to wait for the writer.
    READ_ACQUIRE = "read_acquire.lua" after Guard, Clock, Waiting;
    /// Take a fair lock in arrival order, or wait in line.
    FAIR_ACQUIRE = "fair_acquire.lua" after Guard, Clock, Line;
    /// Take semaphore permits, or wait in line.
    PERMIT_ACQUIRE = "permit_acquire.lua" after Guard, Clock, Line;
    /// A waiting writer that stopped waiting leaves the waiting writers.
    WITHDRAW = "withdraw.lua" after Waiting;
    /// Compare the token, delete, leave the latch, publish.
    RELEASE = "release.lua" after Latch, Channel, Waiting;
    /// As `RELEASE`, and tell the first waiter in the fair lock's line.
    FAIR_RELEASE = "fair_release.lua" after Clock, Line, Latch, Channel, Waiting;
    /// Drop a read lock; the last reader out tells a waiting writer.
    READ_RELEASE = "read_release.lua" after Clock, Latch, Channel, Waiting;
    /// Give semaphore permits back and tell the first waiter in line.
    PERMIT_RELEASE = "permit_release.lua" after Clock, Line, Latch, Channel;
    /// Compare the token and delete, nothing else (a RedLock node's grant to a try that did
    /// not win a majority).
    UNDO = "undo.lua";
    /// Compare the token and set a new lease, for a batch of exclusive locks.
    RENEW = "renew.lua";
    /// Extend readers' leases, for a batch of read locks.
    READ_RENEW = "read_renew.lua" after Clock;
    /// Extend semaphore holders' leases, for a batch of them.
    PERMIT_RENEW = "permit_renew.lua" after Clock;
    /// Issue the next fencing token to the lock's holder.
    FENCE = "fence.lua" after FenceExpiry;
    /// Raise a fence counter to a token (RedLock write-back).
    RAISE_FENCE = "raise_fence.lua" after FenceExpiry;
    /// Delete whoever holds the lock, publish.
    FORCE_UNLOCK = "force_unlock.lua";
    /// Read who holds a key (a lock or a semaphore of that name), for how long, and how many
    /// wait; writes nothing.
    INSPECT = "inspect.lua" after Clock;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The preambles whose functions `lua` (a script's or a preamble's code, comments left
    /// out) calls.
    fn called_by(lua: &str) -> Vec<Preamble> {
        let code: String = lua
            .lines()
            .map(|line| line.split("--").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        Preamble::ALL
            .into_iter()
            .filter(|p| {
                let called = |f: &&str| {
                    [" ", "("]
                        .iter()
                        .any(|at| code.contains(&format!("{at}{f}")))
                };
                p.functions().iter().any(called)
            })
            .collect()
    }

    /// A script is composed with exactly the preambles whose functions it calls, directly or
    /// through another preamble, each after those it calls: one missing fails only at run
    /// time, one too many costs every call its text.
    #[test]
    fn each_script_has_the_preambles_it_calls() {
        for lua in ALL {
            let mut needed = called_by(lua.body);
            let mut i = 0;
            while let Some(&preamble) = needed.get(i) {
                for more in called_by(preamble.text()) {
                    if more != preamble && !needed.contains(&more) {
                        needed.push(more);
                    }
                }
                i += 1;
            }
            let listed = lua.preambles;
            for preamble in Preamble::ALL {
                assert_eq!(
                    needed.contains(&preamble),
                    listed.contains(&preamble),
                    "{}: {preamble:?}",
                    lua.name
                );
            }
            for (i, preamble) in listed.iter().enumerate() {
                for used in called_by(preamble.text()) {
                    assert!(
                        used == *preamble || listed[..i].contains(&used),
                        "{}: {used:?} must come before {preamble:?}",
                        lua.name
                    );
                }
            }
            assert_eq!(lua.script().get_hash().len(), 40, "{}", lua.name);
        }
    }

    /// Code before a script's [`PREAMBLES_HERE`] line calls none of the preambles' functions:
    /// they are not built yet there, and such a call fails only when that path runs.
    #[test]
    fn nothing_calls_a_preamble_before_it_is_built() {
        let mut split = 0;
        for lua in ALL {
            let (before, after) = lua.split();
            assert_eq!(called_by(before), Vec::new(), "{}", lua.name);
            // The script as sent: the first part, each preamble once, the rest.
            let text = lua.text();
            assert!(
                text.starts_with(before) && text.ends_with(after),
                "{}",
                lua.name
            );
            for preamble in lua.preambles {
                assert_eq!(text.matches(preamble.text()).count(), 1, "{}", lua.name);
            }
            if !before.is_empty() {
                split += 1;
            }
        }
        assert!(split > 0, "no script builds its preambles late");
    }

    /// The channel a release script names (channel.lua) is the one waiters subscribe to
    /// (`RedisKeys::channel`), for every kind's main key and for user keys and prefixes that
    /// look like parts of a name.
    #[test]
    fn the_release_channel_a_script_names_is_the_one_waiters_listen_on() {
        use crate::key::{RedisKeys, MAX_KEY_LEN, MAX_PREFIX_LEN};
        let server = lock_testkit::RedisServer::start().expect("redis-server");
        let lua = format!(
            "{}return release_channel(KEYS[1])",
            Preamble::Channel.text()
        );
        let long_key = "k:".repeat(MAX_KEY_LEN / 2);
        let long_prefix = ":".repeat(MAX_PREFIX_LEN);
        let keys = [
            "7",
            "",
            "a}x{b",
            "p{h}:lock:k",
            "}:",
            ":",
            "x:lock:y",
            "é:ü",
            &long_key,
        ];
        for prefix in ["", "p:", "lock:", "semaphore:", &long_prefix] {
            for key in keys {
                for names in [
                    RedisKeys::new(prefix, key),
                    RedisKeys::semaphore(prefix, key, 3),
                ] {
                    let named: String = server.cmd(&["EVAL", &lua, "1", &names.lock]);
                    assert_eq!(named, names.channel().to_string(), "{}", names.lock);
                }
            }
        }
    }
}
