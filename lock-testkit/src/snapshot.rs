//! RDB snapshots of a [`RedisServer`], for restarts that bring back an older data set.
//!
//! A server runs with `--save ''` and, unless started with [`Persistence::AofAlways`], without
//! AOF: it never writes a snapshot by itself, and a [`restart`](RedisServer::restart) starts
//! empty. [`snapshot`](RedisServer::snapshot) writes `dump.rdb` in the server's directory now;
//! the next restart loads it, so the server comes back with the keys of that moment whose TTL
//! has not passed (expiry times are absolute) and without everything written since, as after
//! a crash of a server that snapshots every few seconds. [`discard_snapshot`](
//! RedisServer::discard_snapshot) removes the file, so the next restart starts empty again.
//!
//! [`Persistence::AofAlways`]: crate::Persistence::AofAlways

use std::io;
use std::path::PathBuf;

use crate::server::RedisServer;

/// The snapshot file in the server's directory (Redis's default `dbfilename`).
const DUMP: &str = "dump.rdb";

impl RedisServer {
    /// `SAVE`: writes the data set to `dump.rdb` in the server's [`dir`](Self::dir) (blocking
    /// the server while it writes). Replaces an earlier snapshot.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or the save fails.
    pub fn snapshot(&self) -> io::Result<()> {
        let _: () = self
            .try_cmd(&["SAVE"])
            .map_err(|e| io::Error::other(format!("SAVE on port {}: {e}", self.port())))?;
        Ok(())
    }

    /// Removes the snapshot written by [`snapshot`](Self::snapshot), if any: the next
    /// [`restart`](Self::restart) starts empty (with AOF off).
    ///
    /// # Errors
    ///
    /// When the file exists but cannot be removed.
    pub fn discard_snapshot(&self) -> io::Result<()> {
        match std::fs::remove_file(self.snapshot_path()) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Where [`snapshot`](Self::snapshot) writes: `dump.rdb` in the server's directory.
    pub fn snapshot_path(&self) -> PathBuf {
        self.dir().join(DUMP)
    }
}
