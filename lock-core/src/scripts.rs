//! The Redis scripts, one `.lua` file each, and the one place where each is composed with the
//! preambles it calls (shared Lua functions, each written once in its own file). A script is
//! sent by SHA (EVALSHA) and loaded again when the server answers NOSCRIPT (after
//! `SCRIPT FLUSH` or a restart); its typed call, with its KEYS and ARGV in the order its
//! header documents, is in `store/calls/`.

use std::sync::OnceLock;

use redis::Script;

/// A Lua function that several scripts call, written once and prepended to each of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Preamble {
    /// `scripts/guard.lua`: `restart_guard`, the node's age against the restart guard.
    Guard,
    /// `scripts/line.lua`: `first_in_line` and `join_line`, the line of a fair lock or a
    /// semaphore.
    Line,
}

impl Preamble {
    fn text(self) -> &'static str {
        match self {
            Self::Guard => include_str!("scripts/guard.lua"),
            Self::Line => include_str!("scripts/line.lua"),
        }
    }

    /// The functions it defines, by which a script shows it calls them.
    #[cfg(test)]
    fn functions(self) -> &'static [&'static str] {
        match self {
            Self::Guard => &["restart_guard("],
            Self::Line => &["first_in_line(", "join_line("],
        }
    }
}

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

    /// The script as sent: its preambles, then its own file.
    pub(crate) fn script(&self) -> &Script {
        self.script.get_or_init(|| {
            let mut text = String::new();
            for preamble in self.preambles {
                text.push_str(preamble.text());
            }
            text.push_str(self.body);
            Script::new(&text)
        })
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
    READ_ACQUIRE = "read_acquire.lua" after Guard;
    /// Take a fair lock in arrival order, or wait in line.
    FAIR_ACQUIRE = "fair_acquire.lua" after Guard, Line;
    /// Take semaphore permits, or wait in line.
    PERMIT_ACQUIRE = "permit_acquire.lua" after Guard, Line;
    /// A waiting writer that stopped waiting leaves the waiting writers.
    WITHDRAW = "withdraw.lua";
    /// Compare the token, delete, leave the latch, publish (the fair lock's line too).
    RELEASE = "release.lua" after Line;
    /// Drop a read lock; the last reader out tells a waiting writer.
    READ_RELEASE = "read_release.lua";
    /// Give semaphore permits back and tell the first waiter in line.
    PERMIT_RELEASE = "permit_release.lua" after Line;
    /// Compare the token and delete, nothing else (a RedLock node's grant to a try that did
    /// not win a majority).
    UNDO = "undo.lua";
    /// Compare the token and set a new lease, for a batch of exclusive locks.
    RENEW = "renew.lua";
    /// Extend readers' leases, for a batch of read locks.
    READ_RENEW = "read_renew.lua";
    /// Extend semaphore holders' leases, for a batch of them.
    PERMIT_RENEW = "permit_renew.lua";
    /// Issue the next fencing token to the lock's holder.
    FENCE = "fence.lua";
    /// Raise a fence counter to a token (RedLock write-back).
    RAISE_FENCE = "raise_fence.lua";
    /// Delete whoever holds the lock, publish.
    FORCE_UNLOCK = "force_unlock.lua";
    /// Read who holds a key (a lock or a semaphore of that name), for how long, and how many
    /// wait; writes nothing.
    INSPECT = "inspect.lua";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A script is composed with exactly the preambles whose functions it calls: one missing
    /// fails only at run time, one too many costs every call its text.
    #[test]
    fn each_script_has_the_preambles_it_calls() {
        for lua in ALL {
            for preamble in [Preamble::Guard, Preamble::Line] {
                let calls = preamble.functions().iter().any(|f| lua.body.contains(f));
                assert_eq!(
                    calls,
                    lua.preambles.contains(&preamble),
                    "{}: {preamble:?}",
                    lua.name
                );
            }
            assert!(lua.script().get_hash().len() == 40, "{}", lua.name);
        }
    }
}
