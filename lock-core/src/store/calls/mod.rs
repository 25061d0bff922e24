//! Each script's contract in one place: a typed call per script, which lays out its KEYS and
//! ARGV in the order its `.lua` header documents, next to the typed reply it decodes. `node.rs`
//! says which call it makes; how the arguments are laid out is here, one file per operation.

pub(crate) mod acquire;
pub(crate) mod fence;
pub(crate) mod force_unlock;
pub(crate) mod inspect;
pub(crate) mod release;
pub(crate) mod renew;

use std::marker::PhantomData;

use std::io::Write as _;

use redis::{Cmd, FromRedisValue, RedisResult, RedisWrite, ToRedisArgs, Value};

use super::RestartGuard;
use crate::backend_error::BackendError;
use crate::connection::Connection;
use crate::key::Name;
use crate::limits::lease_ms;
use crate::scripts::Lua;
use crate::token::{Token, MAX_STORED_LEN};

/// A name is written into the command in place, part by part: releases send three or four
/// names besides the lock key, and none gets a string of its own.
impl ToRedisArgs for Name<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        // Joined on the stack when short (names of keys up to about 150 bytes), so the
        // command takes the name in one copy; written part by part into it otherwise.
        let mut joined = [0u8; 256];
        let mut len = 0;
        for part in self.parts() {
            let Some(slot) = joined.get_mut(len..len + part.len()) else {
                let mut arg = out.writer_for_next_arg();
                for part in self.parts() {
                    // Writing into a command's buffer cannot fail: it only grows a `Vec`.
                    let _ = arg.write_all(part.as_bytes());
                }
                return;
            };
            slot.copy_from_slice(part.as_bytes());
            len += part.len();
        }
        out.write_arg(&joined[..len]);
    }
}

/// A token is written into the command in place as its stored value (see `holder.rs`): the
/// acquire's `SET` and every release send one, and a string of its own for each cost an
/// allocation and its free.
impl ToRedisArgs for &Token {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        // Written on the stack and added in one copy, as a name is; part by part into the
        // command (which cannot fail: it only grows a `Vec`) should it not fit.
        let mut stored = [0u8; MAX_STORED_LEN];
        let written = {
            let mut rest = &mut stored[..];
            let room = rest.len();
            self.write_stored(&mut rest).map(|()| room - rest.len())
        };
        match written {
            Ok(len) => out.write_arg(&stored[..len]),
            Err(_) => {
                let _ = self.write_stored(&mut out.writer_for_next_arg());
            }
        }
    }
}

/// One call of a script, built once as the `EVALSHA` command it is sent as (also in a
/// pipeline with `WAIT`), and decoded as `R`.
pub(crate) struct ScriptCall<R> {
    lua: &'static Lua,
    cmd: Cmd,
    /// KEYS still to write: every key comes before the first argument (debug builds check).
    keys_left: usize,
    reply: PhantomData<fn() -> R>,
}

impl<R> std::fmt::Debug for ScriptCall<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptCall")
            .field("script", &self.lua.name)
            .finish_non_exhaustive()
    }
}

impl<R: FromRedisValue> ScriptCall<R> {
    /// A call of `lua` with `keys` KEYS: `EVALSHA sha keys`, the keys and arguments to follow.
    fn new(lua: &'static Lua, keys: usize) -> Self {
        // Sized for the calls of one lock (about a dozen arguments, a few names of a short key
        // and a token) so that the hot path's acquires and releases do not grow it: each
        // growth is a reallocation and a copy.
        let mut cmd = Cmd::with_capacity(3 + keys + 6, 512);
        cmd.arg("EVALSHA").arg(lua.script().get_hash()).arg(keys);
        Self {
            lua,
            cmd,
            keys_left: keys,
            reply: PhantomData,
        }
    }

    /// A call with the restart guard's epoch key as its last key when `guard` is set (see
    /// `scripts/guard.lua`): `keys` is the count without it.
    fn guarded(lua: &'static Lua, keys: usize, guard: Option<&RestartGuard>) -> Self {
        Self::new(lua, keys + usize::from(guard.is_some()))
    }

    /// Adds the next of `KEYS`.
    fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        debug_assert!(
            self.keys_left > 0,
            "{}: more KEYS than declared",
            self.lua.name
        );
        self.keys_left = self.keys_left.saturating_sub(1);
        self.cmd.arg(key);
        self
    }

    /// Adds the next of `ARGV`.
    fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "{}: ARGV before KEYS", self.lua.name);
        self.cmd.arg(arg);
        self
    }

    /// Adds the restart guard's epoch key, when set, as the last of `KEYS`.
    fn guard_key(&mut self, guard: Option<&RestartGuard>) -> &mut Self {
        if let Some(guard) = guard {
            self.key(&guard.epoch_key);
        }
        self
    }

    /// Adds the restart guard, when set, as the last of `ARGV`.
    fn guard_arg(&mut self, guard: Option<&RestartGuard>) -> &mut Self {
        if let Some(guard) = guard {
            self.arg(lease_ms(guard.guard));
        }
        self
    }

    /// Runs the call alone; loads the script and sends the same command again when the server
    /// answers NOSCRIPT (its script cache was flushed, or it is a promoted replica): first
    /// where the call's key is, then, if the call is refused again (a cluster's slot that
    /// migrates, whose `ASK` sends it to another primary), on every primary.
    pub(crate) async fn invoke(&self, conn: &mut Connection) -> Result<R, BackendError> {
        let mut sent: RedisResult<Value> = self.cmd.query_async(conn).await;
        for everywhere in [false, true] {
            match sent {
                Err(e) if is_no_script(&e) => {
                    let on = if everywhere {
                        LoadOn::Everywhere
                    } else {
                        LoadOn::KeysServer(self.first_key())
                    };
                    sent = match load(self.lua, conn, on).await {
                        Ok(()) => self.cmd.query_async(conn).await,
                        Err(e) => Err(e),
                    };
                }
                _ => break,
            }
        }
        self.decode(sent.map_err(BackendError::redis)?)
    }

    /// The call's first key (`EVALSHA sha numkeys key ..`), where it runs; empty without one.
    fn first_key(&self) -> &[u8] {
        match self.cmd.args_iter().nth(3) {
            Some(redis::Arg::Simple(key)) => key,
            _ => &[],
        }
    }

    /// The command and its script, to send in a pipeline, keeping the call (see
    /// [`into_command`](Self::into_command)).
    pub(crate) fn command(&self) -> (&Cmd, &'static Lua) {
        (&self.cmd, self.lua)
    }

    /// The command, to send in a pipeline (see [`invoke`](Self::invoke) for one sent alone);
    /// its reply is read with [`decode`](Self::decode), and after NOSCRIPT the script is
    /// loaded with [`load`].
    pub(crate) fn into_command(self) -> (Cmd, &'static Lua) {
        (self.cmd, self.lua)
    }

    /// The call's reply as its type.
    pub(crate) fn decode(&self, reply: Value) -> Result<R, BackendError> {
        decode(self.lua, reply)
    }
}

/// `reply` as the reply of `lua`, or the error that names the script.
pub(crate) fn decode<R: FromRedisValue>(lua: &Lua, reply: Value) -> Result<R, BackendError> {
    R::from_redis_value(reply).map_err(|e| BackendError::unexpected_reply(lua.name, e))
}

/// Where a script is loaded after NOSCRIPT.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LoadOn<'a> {
    /// The server that holds this key: on a cluster the primary of its slot only. A primary
    /// that is slow to answer then holds up no other shard's first call of the script (a
    /// watchdog round renews every shard's locks at once).
    KeysServer(&'a [u8]),
    /// Every primary of a cluster (`SCRIPT LOAD` as sent alone): also the node a migrating
    /// slot's `ASK` sends the call to.
    Everywhere,
}

/// Loads `lua` into the script cache (after NOSCRIPT), on the server or servers `on` says.
pub(crate) async fn load(lua: &Lua, conn: &mut Connection, on: LoadOn<'_>) -> RedisResult<()> {
    match on {
        LoadOn::KeysServer(key) => {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(lua.text());
            conn.send_for_key(&load, key).await.map(drop)
        }
        LoadOn::Everywhere => lua.script().load_async(conn).await.map(drop),
    }
}

/// Whether the server does not have the script (its cache was flushed, or it restarted).
pub(crate) fn is_no_script(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        || error.code() == Some("NOSCRIPT")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn int(i: i64) -> Value {
        Value::Int(i)
    }

    /// What a call sends after `EVALSHA sha`: the number of KEYS, the KEYS, the ARGV.
    pub(crate) fn sent<R: FromRedisValue>(call: ScriptCall<R>) -> Vec<String> {
        let (cmd, lua) = call.into_command();
        let args: Vec<String> = cmd
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not a plain argument>".to_owned(),
            })
            .collect();
        assert_eq!(args[..2], ["EVALSHA", lua.script().get_hash()]);
        args[2..].to_vec()
    }

    /// A command's arguments, as the bytes sent.
    fn arg_bytes(cmd: &Cmd) -> Vec<&[u8]> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes,
                _ => b"<not a plain argument>",
            })
            .collect()
    }

    /// A name goes into a command as one argument with the bytes of its string, whether it
    /// is joined on the stack (short) or written part by part (long), and whatever follows.
    #[test]
    fn names_are_written_whole_short_or_long() {
        for len in [1, 100, 200, 230, 255, 256, 300, crate::key::MAX_KEY_LEN] {
            let key = "k".repeat(len);
            let keys = crate::key::RedisKeys::new("prefix:", &key);
            let mut cmd = Cmd::new();
            cmd.arg(keys.waiting()).arg(keys.latch("t0k")).arg("next");
            let args = arg_bytes(&cmd);
            let (waiting, latch) = (keys.waiting().to_string(), keys.latch("t0k").to_string());
            assert_eq!(
                args,
                [waiting.as_bytes(), latch.as_bytes(), b"next"],
                "{len}"
            );
        }
    }

    /// A token goes into a command as one argument, its stored value, for every kind and
    /// holder name, between the arguments around it; also one longer than any the kit
    /// accepts, which does not fit the stack and is written part by part.
    #[test]
    fn tokens_are_written_as_their_stored_value() {
        use crate::kind::Kind;
        let longest = "h".repeat(crate::holder::MAX_HOLDER_NAME_LEN);
        let too_long = "x".repeat(300);
        for holder in ["h", "web-1:42", longest.as_str(), too_long.as_str()] {
            let holder: std::sync::Arc<str> = std::sync::Arc::from(holder);
            for (kind, permits) in [
                (Kind::Exclusive, 1),
                (Kind::Shared, 1),
                (Kind::Fair, 1),
                (Kind::Permits { limit: 5 }, 3),
                (Kind::Permits { limit: u32::MAX }, u32::MAX),
            ] {
                let token = Token::new(&holder, kind, permits);
                let mut cmd = Cmd::new();
                cmd.arg("before").arg(&token).arg("after");
                let args = arg_bytes(&cmd);
                let stored = token.stored();
                assert_eq!(args, [&b"before"[..], stored.as_bytes(), b"after"]);
                assert!(stored.len() <= token.stored_capacity(), "{stored}");
            }
        }
    }
}
