//! [`RedisServers`]: independent masters for RedLock tests.

use std::io;
use std::ops::{Index, IndexMut};

use crate::probe;
use crate::server::{free_port, on_free_ports, Kind, Persistence, RedisServer};

/// `n` independent `redis-server` processes (no replication between them), as RedLock needs.
///
/// All processes are spawned first and then waited for, so five servers are up in about the
/// time of one. Each is a full [`RedisServer`] (index with `servers[i]`), killed on drop.
///
/// # Examples
///
/// ```no_run
/// let mut servers = lock_testkit::RedisServers::start(5).expect("redis-server on PATH");
/// let urls = servers.urls();
/// servers[2].kill9(); // one of five masters is gone
/// # drop(urls);
/// ```
#[derive(Debug)]
pub struct RedisServers {
    servers: Vec<RedisServer>,
}

impl RedisServers {
    /// Starts `n` plain servers and waits until every one answers `PING`.
    ///
    /// # Errors
    ///
    /// If a process cannot be spawned or does not become ready within 10 s; the ones already
    /// started are killed.
    pub fn start(n: usize) -> io::Result<Self> {
        Self::start_with(n, &[])
    }

    /// Like [`start`](Self::start), passing the same extra `--name value` arguments to every
    /// server.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start).
    pub fn start_with(n: usize, extra: &[&str]) -> io::Result<Self> {
        on_free_ports(|| {
            let mut servers = Vec::with_capacity(n);
            for _ in 0..n {
                servers.push(RedisServer::launch(
                    free_port(),
                    extra,
                    Persistence::None,
                    |_| Ok(Kind::Server),
                )?);
            }
            for server in &mut servers {
                server.wait_ready(probe::READY_TIMEOUT)?;
            }
            Ok(Self { servers })
        })
    }

    /// `redis://127.0.0.1:<port>/` of every server, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// The ports of every server, in index order.
    pub fn ports(&self) -> Vec<u16> {
        self.servers.iter().map(RedisServer::port).collect()
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Whether there are no servers (`start(0)`).
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// The servers, in index order.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The servers, mutably (to `kill9`, `stop` or `restart` some of them).
    pub fn servers_mut(&mut self) -> &mut [RedisServer] {
        &mut self.servers
    }

    /// Iterates over the servers.
    pub fn iter(&self) -> std::slice::Iter<'_, RedisServer> {
        self.servers.iter()
    }

    /// Keys matching `pattern` on any server, as `(index, key)` pairs (a leak check).
    ///
    /// # Panics
    ///
    /// If a running, unpaused server cannot be reached. Stopped and paused servers are skipped.
    pub fn keys(&self, pattern: &str) -> Vec<(usize, String)> {
        self.servers
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_running() && !s.is_paused())
            .flat_map(|(i, s)| s.keys(pattern).into_iter().map(move |k| (i, k)))
            .collect()
    }
}

impl Index<usize> for RedisServers {
    type Output = RedisServer;

    fn index(&self, index: usize) -> &RedisServer {
        &self.servers[index]
    }
}

impl IndexMut<usize> for RedisServers {
    fn index_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.servers[index]
    }
}

impl<'a> IntoIterator for &'a RedisServers {
    type Item = &'a RedisServer;
    type IntoIter = std::slice::Iter<'a, RedisServer>;

    fn into_iter(self) -> Self::IntoIter {
        self.servers.iter()
    }
}
