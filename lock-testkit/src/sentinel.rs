//! [`RedisSentinel`]: a primary, one replica and three sentinels, in plaintext or over TLS.

use std::io;
use std::time::{Duration, Instant};

use crate::probe::{self, info_field, query, POLL_TIMEOUT, QUERY_TIMEOUT};
use crate::server::{free_port, write_tls_files, Kind, Persistence, RedisServer, TlsListener};
use crate::tls::TlsServerConfig;

/// How long [`RedisSentinel::start`] waits for replication and the sentinels' quorum.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// How long replication changes (`break_replication`, `restore_replication`) may take.
const LINK_TIMEOUT: Duration = Duration::from_secs(5);

/// Number of sentinels; the quorum is 2.
const SENTINELS: usize = 3;

/// A Sentinel deployment of real processes: one primary, one replica
/// (`--replicaof 127.0.0.1 <primary port>`) and three sentinels that monitor the primary
/// under a master name with quorum 2. Everything is killed (and the temporary directories,
/// including the sentinels' rewritten config files, removed) on drop.
///
/// The sentinels use `down-after-milliseconds 1000`, `failover-timeout 3000` and
/// `parallel-syncs 1`, so a killed primary is replaced in about 2.3 s (RELIABILITY.md).
///
/// The fixture tracks the *current master*: it starts as [`primary`](Self::primary) and
/// becomes the promoted node each time [`wait_for_failover`](Self::wait_for_failover)
/// returns; [`kill_primary`](Self::kill_primary) and
/// [`break_replication`](Self::break_replication) act relative to it.
///
/// # Examples
///
/// ```no_run
/// # fn demo() -> std::io::Result<()> {
/// use std::time::Duration;
/// let mut sentinel = lock_testkit::RedisSentinel::start("mymaster")?;
/// let urls = sentinel.sentinel_urls(); // for a sentinel-aware client
/// sentinel.kill_primary();
/// let new_master = sentinel.wait_for_failover(Duration::from_secs(10))?;
/// assert_eq!(new_master, sentinel.replica().port());
/// # drop(urls);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct RedisSentinel {
    master_name: String,
    primary: RedisServer,
    replica: RedisServer,
    sentinels: Vec<RedisServer>,
    master_port: u16,
    passwords: Option<SentinelPasswords>,
}

/// The passwords of a Sentinel deployment started with
/// [`RedisSentinel::start_with_passwords`]: one for the data nodes, another for the sentinels.
/// Letters and digits only (they go into URLs and config files as they are).
#[derive(Clone)]
pub struct SentinelPasswords {
    /// The `default` user's password of the primary and the replica (`requirepass`), which they
    /// also replicate with (`masterauth`) and the sentinels monitor them with (`auth-pass`).
    pub data: String,
    /// The sentinels' own password (`requirepass`), which they also talk to each other with
    /// (`sentinel-pass`).
    pub sentinels: String,
}

impl std::fmt::Debug for SentinelPasswords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SentinelPasswords { .. }")
    }
}

impl SentinelPasswords {
    fn validate(&self) -> io::Result<()> {
        for password in [&self.data, &self.sentinels] {
            if password.is_empty() || !password.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "sentinel fixture passwords must be non-empty letters and digits",
                ));
            }
        }
        Ok(())
    }
}

impl RedisSentinel {
    /// Starts the primary and the replica, waits for `master_link_status:up` on the replica,
    /// then starts three sentinels and waits until each one answers `SENTINEL CKQUORUM` with
    /// OK, knows the two other sentinels and sees the replica (at most 15 s in total).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an empty master name or one with whitespace; otherwise when a
    /// process cannot be started or the deployment is not ready in time. Processes already
    /// started are killed.
    pub fn start(master_name: &str) -> io::Result<Self> {
        Self::start_inner(master_name, None, None)
    }

    /// Like [`start`](Self::start), but the whole deployment speaks TLS: the primary and the
    /// replica get a TLS port (with `--tls-replication yes`, so the replica replicates over
    /// TLS from the primary's TLS port), and the sentinels get a TLS port and
    /// `tls-replication yes`, so they monitor the servers, and talk to each other, over TLS.
    /// Every process presents `config.server` (give it an IP SAN `127.0.0.1`) and trusts
    /// `config.client_ca_pem`.
    ///
    /// The sentinels monitor the TLS ports, so they report TLS ports as the master's address
    /// ([`known_master_port`](Self::known_master_port),
    /// [`current_master_port`](Self::current_master_port) and
    /// [`wait_for_failover`](Self::wait_for_failover) return TLS ports; compare them with
    /// [`RedisServer::tls_port`]). Every process keeps its plaintext port on loopback for the
    /// fixture's own probes and the assertion helpers; code under test is given
    /// [`sentinel_tls_urls`](Self::sentinel_tls_urls).
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lock_testkit::{RedisSentinel, TestCa, TlsServerConfig, Validity};
    ///
    /// let ca = TestCa::new("test CA");
    /// let cert = ca.server_cert(&["127.0.0.1"], Validity::Current);
    /// let sentinel = RedisSentinel::start_tls("mymaster", &TlsServerConfig::new(cert, &ca)).unwrap();
    /// let urls = sentinel.sentinel_tls_urls(); // rediss://127.0.0.1:<port>/ of each sentinel
    /// # drop(urls);
    /// ```
    pub fn start_tls(master_name: &str, config: &TlsServerConfig) -> io::Result<Self> {
        Self::start_inner(master_name, Some(config), None)
    }

    /// Like [`start`](Self::start), with passwords: the primary and the replica require
    /// `passwords.data` for the `default` user (`requirepass`, and `masterauth` to replicate),
    /// the sentinels monitor them with it (`auth-pass`), and the sentinels require
    /// `passwords.sentinels` (`requirepass`, and `sentinel-pass` among themselves).
    ///
    /// The fixture's helpers authenticate by themselves; [`RedisServer::url`] (and so
    /// [`sentinel_urls`](Self::sentinel_urls)) carries each process's password
    /// (`redis://:<password>@127.0.0.1:<port>/`). ACL users are per server and not replicated:
    /// create one on both data nodes (`ACL SETUSER` through [`RedisServer::cmd`]).
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start); `InvalidInput` for a password that is empty or not only
    /// letters and digits.
    pub fn start_with_passwords(
        master_name: &str,
        passwords: &SentinelPasswords,
    ) -> io::Result<Self> {
        Self::start_inner(master_name, None, Some(passwords))
    }

    /// [`start_tls`](Self::start_tls) with the passwords of
    /// [`start_with_passwords`](Self::start_with_passwords);
    /// [`sentinel_tls_urls`](Self::sentinel_tls_urls) carry the sentinels' password.
    ///
    /// # Errors
    ///
    /// As for [`start_with_passwords`](Self::start_with_passwords).
    pub fn start_tls_with_passwords(
        master_name: &str,
        config: &TlsServerConfig,
        passwords: &SentinelPasswords,
    ) -> io::Result<Self> {
        Self::start_inner(master_name, Some(config), Some(passwords))
    }

    fn start_inner(
        master_name: &str,
        tls: Option<&TlsServerConfig>,
        passwords: Option<&SentinelPasswords>,
    ) -> io::Result<Self> {
        if master_name.is_empty() || master_name.contains(|c: char| c.is_whitespace() || c == '"') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid sentinel master name {master_name:?}"),
            ));
        }
        if let Some(passwords) = passwords {
            passwords.validate()?;
        }
        let deadline = Instant::now() + START_TIMEOUT;
        let data_auth: Vec<&str> = match passwords {
            Some(p) => vec!["--requirepass", &p.data, "--masterauth", &p.data],
            None => Vec::new(),
        };
        let server = |port: u16, extra: &[&str]| {
            let listener = tls.map(TlsListener::for_config);
            let mut args = extra.to_vec();
            args.extend_from_slice(&data_auth);
            if let Some(passwords) = passwords {
                probe::set_password(port, &passwords.data);
            }
            RedisServer::launch_inner(port, &args, Persistence::None, listener, |dir| {
                if let Some(config) = tls {
                    write_tls_files(dir, config)?;
                }
                Ok(Kind::Server)
            })
        };
        let tls_replication: &[&str] = if tls.is_some() {
            &["--tls-replication", "yes"]
        } else {
            &[]
        };
        let mut primary = server(free_port(), tls_replication)?;
        // The port the sentinels monitor and the replica replicates from.
        let primary_port = advertised(&primary);
        let primary_port_arg = primary_port.to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &primary_port_arg];
        replica_args.extend_from_slice(tls_replication);
        let mut replica = server(free_port(), &replica_args)?;
        primary.wait_ready(probe::READY_TIMEOUT)?;
        replica.wait_ready(probe::READY_TIMEOUT)?;
        wait_link(
            &replica,
            "up",
            deadline.saturating_duration_since(Instant::now()),
        )?;

        let mut sentinels = Vec::with_capacity(SENTINELS);
        for _ in 0..SENTINELS {
            let port = free_port();
            if let Some(passwords) = passwords {
                probe::set_password(port, &passwords.sentinels);
            }
            let listener = tls.map(TlsListener::for_config);
            sentinels.push(RedisServer::launch_inner(
                port,
                &[],
                Persistence::None,
                listener,
                |dir| {
                    let conf = dir.join("sentinel.conf");
                    let mut text = format!(
                        "port {port}\n\
                         bind 127.0.0.1\n\
                         daemonize no\n\
                         dir \"{dir}\"\n",
                        dir = dir.display(),
                    );
                    if let (Some(config), Some(listener)) = (tls, listener) {
                        let tls_dir = write_tls_files(dir, config)?;
                        text.push_str(&format!(
                            "tls-port {tls_port}\n\
                             tls-cert-file \"{cert}\"\n\
                             tls-key-file \"{key}\"\n\
                             tls-ca-cert-file \"{ca}\"\n\
                             tls-auth-clients {auth}\n\
                             tls-replication yes\n",
                            tls_port = listener.port,
                            cert = tls_dir.join("server.crt").display(),
                            key = tls_dir.join("server.key").display(),
                            ca = tls_dir.join("ca.crt").display(),
                            auth = if listener.auth_clients { "yes" } else { "no" },
                        ));
                    }
                    text.push_str(&format!(
                        "sentinel monitor {name} 127.0.0.1 {primary_port} 2\n\
                         sentinel down-after-milliseconds {name} 1000\n\
                         sentinel failover-timeout {name} 3000\n\
                         sentinel parallel-syncs {name} 1\n",
                        name = master_name,
                    ));
                    if let Some(passwords) = passwords {
                        text.push_str(&format!(
                            "sentinel auth-pass {name} {data}\n\
                             requirepass {sentinels}\n\
                             sentinel sentinel-pass {sentinels}\n",
                            name = master_name,
                            data = passwords.data,
                            sentinels = passwords.sentinels,
                        ));
                    }
                    std::fs::write(&conf, text)?;
                    Ok(Kind::Sentinel { conf })
                },
            )?);
        }
        for sentinel in &mut sentinels {
            sentinel.wait_ready(probe::READY_TIMEOUT)?;
        }
        let fixture = Self {
            master_name: master_name.to_string(),
            primary,
            replica,
            sentinels,
            master_port: primary_port,
            passwords: passwords.cloned(),
        };
        fixture.wait_quorum(deadline.saturating_duration_since(Instant::now()))?;
        Ok(fixture)
    }

    fn wait_quorum(&self, timeout: Duration) -> io::Result<()> {
        let name = self.master_name.as_str();
        let replica_port = advertised(&self.replica).to_string();
        probe::wait_until(timeout, "the sentinels' quorum", || {
            for sentinel in &self.sentinels {
                let port = sentinel.port();
                let ok: String = query(port, &["SENTINEL", "CKQUORUM", name], POLL_TIMEOUT)
                    .map_err(|e| format!("sentinel {port}: CKQUORUM: {e}"))?;
                if !ok.starts_with("OK") {
                    return Err(format!("sentinel {port}: CKQUORUM: {ok}"));
                }
                let master: Vec<String> = query(port, &["SENTINEL", "MASTER", name], POLL_TIMEOUT)
                    .map_err(|e| format!("sentinel {port}: SENTINEL MASTER: {e}"))?;
                let others = field(&master, "num-other-sentinels").unwrap_or("?");
                if others != (SENTINELS - 1).to_string() {
                    return Err(format!("sentinel {port} knows {others} other sentinels"));
                }
                let replicas: Vec<Vec<String>> =
                    query(port, &["SENTINEL", "REPLICAS", name], POLL_TIMEOUT)
                        .map_err(|e| format!("sentinel {port}: SENTINEL REPLICAS: {e}"))?;
                let seen = replicas.iter().any(|r| {
                    field(r, "port") == Some(replica_port.as_str())
                        && field(r, "flags") == Some("slave")
                        && field(r, "master-link-status") == Some("ok")
                });
                if !seen {
                    return Err(format!("sentinel {port} does not see the replica up yet"));
                }
            }
            Ok(())
        })
    }

    /// `redis://127.0.0.1:<port>/` of the three sentinels (their plaintext ports), with the
    /// sentinels' password for a deployment started with
    /// [`start_with_passwords`](Self::start_with_passwords).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// `rediss://127.0.0.1:<tls port>/` of the three sentinels, for a deployment started with
    /// [`start_tls`](Self::start_tls).
    ///
    /// # Panics
    ///
    /// If the deployment was started without TLS.
    pub fn sentinel_tls_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::tls_url).collect()
    }

    /// The master name the sentinels monitor.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The server started as primary (after a failover it may be dead or a replica).
    pub fn primary(&self) -> &RedisServer {
        &self.primary
    }

    /// The server started as primary, mutably (to `kill9`, `stop`, `restart`).
    pub fn primary_mut(&mut self) -> &mut RedisServer {
        &mut self.primary
    }

    /// The server started as replica (after a failover it is the master).
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// The server started as replica, mutably.
    pub fn replica_mut(&mut self) -> &mut RedisServer {
        &mut self.replica
    }

    /// The three sentinel processes (each a [`RedisServer`] running with `--sentinel`).
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The sentinels, mutably (to kill or pause one).
    pub fn sentinels_mut(&mut self) -> &mut [RedisServer] {
        &mut self.sentinels
    }

    /// The port of the current master as the fixture knows it: the primary's at start, the
    /// promoted node's after [`wait_for_failover`](Self::wait_for_failover). This is the port
    /// the sentinels report: the TLS port for a deployment started with
    /// [`start_tls`](Self::start_tls).
    pub fn known_master_port(&self) -> u16 {
        self.master_port
    }

    /// The server the fixture knows as current master (see
    /// [`known_master_port`](Self::known_master_port)).
    pub fn master(&self) -> &RedisServer {
        self.server_on(self.master_port)
    }

    /// The server the fixture knows as current replica (the other one of the pair).
    pub fn current_replica(&self) -> &RedisServer {
        if advertised(&self.primary) == self.master_port {
            &self.replica
        } else {
            &self.primary
        }
    }

    /// The server the sentinels know under `port` (see [`advertised`]).
    fn server_on(&self, port: u16) -> &RedisServer {
        if advertised(&self.replica) == port {
            &self.replica
        } else {
            &self.primary
        }
    }

    /// Asks the sentinels (the first running, unpaused one that answers) for the master's
    /// port with `SENTINEL GET-MASTER-ADDR-BY-NAME` (a TLS port for a deployment started with
    /// [`start_tls`](Self::start_tls)).
    ///
    /// # Errors
    ///
    /// When no sentinel answers.
    pub fn current_master_port(&self) -> io::Result<u16> {
        let mut last = String::from("no sentinel is running");
        for sentinel in self.live_sentinels() {
            match self.master_port_from(sentinel.port()) {
                Ok(port) => return Ok(port),
                Err(e) => last = e,
            }
        }
        Err(io::Error::other(last))
    }

    fn live_sentinels(&self) -> impl Iterator<Item = &RedisServer> {
        self.sentinels
            .iter()
            .filter(|s| s.is_running() && !s.is_paused())
    }

    fn master_port_from(&self, sentinel: u16) -> Result<u16, String> {
        let addr: Vec<String> = query(
            sentinel,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.master_name],
            POLL_TIMEOUT,
        )
        .map_err(|e| format!("sentinel {sentinel}: {e}"))?;
        addr.get(1)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("sentinel {sentinel}: unexpected reply {addr:?}"))
    }

    /// Kills the current master (see [`known_master_port`](Self::known_master_port)) with
    /// SIGKILL and returns its port (as the sentinels know it).
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.master_port;
        if advertised(&self.primary) == port {
            self.primary.kill9();
        } else {
            self.replica.kill9();
        }
        port
    }

    /// Waits until every running sentinel that answers reports the same master port,
    /// different from [`known_master_port`](Self::known_master_port), and that node answers
    /// `ROLE` as `master`. Returns the new port and remembers it as the current master.
    ///
    /// # Errors
    ///
    /// `TimedOut` when no failover is observed within `timeout`.
    pub fn wait_for_failover(&mut self, timeout: Duration) -> io::Result<u16> {
        let old = self.master_port;
        let mut promoted = old;
        probe::wait_until(timeout, "a sentinel failover", || {
            let ports: Vec<u16> = self
                .live_sentinels()
                .filter_map(|s| self.master_port_from(s.port()).ok())
                .collect();
            let Some(&first) = ports.first() else {
                return Err("no sentinel answered".to_string());
            };
            if ports.iter().any(|&p| p != first) {
                return Err(format!("sentinels disagree: {ports:?}"));
            }
            if first == old {
                return Err(format!("sentinels still report {old}"));
            }
            let server = [&self.primary, &self.replica]
                .into_iter()
                .find(|s| advertised(s) == first)
                .ok_or_else(|| format!("sentinels report an unknown port {first}"))?;
            match probe::role(server.port()).as_deref() {
                Some("master") => {
                    promoted = first;
                    Ok(())
                }
                role => Err(format!("{first} answers ROLE {role:?}")),
            }
        })?;
        self.master_port = promoted;
        Ok(promoted)
    }

    /// The deterministic lock-loss recipe (RELIABILITY.md): on the current replica,
    /// `CONFIG SET masterauth bogus` then `CLIENT KILL TYPE master`, and wait until the
    /// replica reports `master_link_status:down` and the master `connected_slaves:0`.
    ///
    /// The replica stays healthy and promotable but receives no more writes (its reconnects
    /// fail at AUTH), so after a write on the master `WAIT 1 200` returns 0, and after
    /// [`kill_primary`](Self::kill_primary) the promoted replica lacks that write.
    ///
    /// Sentinel only promotes a replica whose link has been down for less than about
    /// `10 × down-after-milliseconds` (10 s here) before the master went down, so kill the
    /// primary within a few seconds of this call.
    ///
    /// # Errors
    ///
    /// When a command fails or the link is still up after 5 s.
    pub fn break_replication(&self) -> io::Result<()> {
        let replica = self.current_replica();
        let _: () = replica
            .try_cmd(&["CONFIG", "SET", "masterauth", "bogus"])
            .map_err(|e| probe::io_err("CONFIG SET masterauth", e))?;
        let _: i64 = replica
            .try_cmd(&["CLIENT", "KILL", "TYPE", "master"])
            .map_err(|e| probe::io_err("CLIENT KILL TYPE master", e))?;
        wait_link(replica, "down", LINK_TIMEOUT)?;
        let master = self.master();
        probe::wait_until(LINK_TIMEOUT, "the master to drop its replica", || {
            let info: String = query(master.port(), &["INFO", "replication"], POLL_TIMEOUT)
                .map_err(|e| e.to_string())?;
            match info_field(&info, "connected_slaves") {
                Some("0") => Ok(()),
                other => Err(format!("connected_slaves:{other:?}")),
            }
        })
    }

    /// Undoes [`break_replication`](Self::break_replication): sets `masterauth` on the
    /// current replica back (cleared, or the data password of
    /// [`start_with_passwords`](Self::start_with_passwords)) and waits (at most 5 s) for
    /// `master_link_status:up`.
    ///
    /// # Errors
    ///
    /// When the command fails or the link is not up in time.
    pub fn restore_replication(&self) -> io::Result<()> {
        let replica = self.current_replica();
        let masterauth = self.passwords.as_ref().map_or("", |p| p.data.as_str());
        let _: () = query(
            replica.port(),
            &["CONFIG", "SET", "masterauth", masterauth],
            QUERY_TIMEOUT,
        )
        .map_err(|e| probe::io_err("CONFIG SET masterauth", e))?;
        wait_link(replica, "up", LINK_TIMEOUT)
    }
}

/// The port the sentinels know a server by: its TLS port when it has one (the sentinels of a
/// TLS deployment monitor the TLS ports, and a replica with `tls-replication yes` announces its
/// TLS port), else its plaintext port.
fn advertised(server: &RedisServer) -> u16 {
    server.tls_port().unwrap_or(server.port())
}

/// The value after `name` in a flat `[name, value, name, value, ...]` reply.
fn field<'a>(pairs: &'a [String], name: &str) -> Option<&'a str> {
    pairs
        .chunks_exact(2)
        .find(|pair| pair[0] == name)
        .map(|pair| pair[1].as_str())
}

fn wait_link(replica: &RedisServer, want: &str, timeout: Duration) -> io::Result<()> {
    probe::wait_until(
        timeout,
        &format!("master_link_status:{want} on {}", replica.port()),
        || {
            let info: String = query(replica.port(), &["INFO", "replication"], POLL_TIMEOUT)
                .map_err(|e| e.to_string())?;
            match info_field(&info, "master_link_status") {
                Some(status) if status == want => Ok(()),
                other => Err(format!("master_link_status:{other:?}")),
            }
        },
    )
}
