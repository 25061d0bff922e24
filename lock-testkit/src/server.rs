//! One `redis-server` child process: [`RedisServer`], port allocation and availability checks.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::probe;
use crate::tls::TlsServerConfig;

/// Whether a restarted server keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// No RDB, no AOF: a restart starts empty.
    None,
    /// `appendonly yes` with `appendfsync always`: a restart keeps every acknowledged write.
    AofAlways,
}

/// What the child process is.
#[derive(Debug)]
pub(crate) enum Kind {
    /// A data server configured by command-line arguments.
    Server,
    /// `redis-server <conf> --sentinel`; the (rewritable) config file lives in the server's dir.
    Sentinel {
        /// Path of the sentinel's config file.
        conf: PathBuf,
    },
}

/// A `redis-server` child process on a free loopback port, killed on drop.
///
/// The server runs with `--daemonize no` (so it is owned by PID), `--save ''`,
/// `--repl-diskless-sync-delay 0` and `--enable-debug-command local`, in its own temporary
/// directory (created fresh under a random name, mode 0700; removed on drop). Its log goes to
/// `redis.log` in that directory; when the
/// process exits during start-up the error quotes the last lines of that log.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    /// The server's private directory (see [`private_dir`]), removed when this is dropped,
    /// after the process was killed (fields drop after `Drop::drop`).
    dir: TempDir,
    extra: Vec<String>,
    persistence: Persistence,
    kind: Kind,
    /// The TLS listener, for servers started with [`RedisServer::start_tls`].
    tls: Option<TlsListener>,
    child: Option<Child>,
    paused: AtomicBool,
}

/// The TLS port of a server and whether it requires client certificates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TlsListener {
    pub(crate) port: u16,
    pub(crate) auth_clients: bool,
    /// Whether `client.crt` / `client.key` are written (`--tls-client-cert-file`).
    pub(crate) client_identity: bool,
}

impl TlsListener {
    /// A listener on a free port, as `config` asks.
    pub(crate) fn for_config(config: &TlsServerConfig) -> Self {
        Self {
            port: free_port(),
            auth_clients: config.auth_clients,
            client_identity: config.client.is_some(),
        }
    }
}

/// Writes `config`'s certificate, key and CA into `tls/` of a server's directory and returns
/// that directory.
pub(crate) fn write_tls_files(dir: &Path, config: &TlsServerConfig) -> io::Result<PathBuf> {
    let tls_dir = dir.join(TLS_DIR);
    std::fs::create_dir_all(&tls_dir)?;
    std::fs::write(tls_dir.join("server.crt"), &config.server.cert_pem)?;
    std::fs::write(tls_dir.join("server.key"), &config.server.key_pem)?;
    std::fs::write(tls_dir.join("ca.crt"), &config.client_ca_pem)?;
    if let Some(client) = &config.client {
        std::fs::write(tls_dir.join("client.crt"), &client.cert_pem)?;
        std::fs::write(tls_dir.join("client.key"), &client.key_pem)?;
    }
    Ok(tls_dir)
}

/// Where a TLS server's certificate files live, inside its temporary directory.
const TLS_DIR: &str = "tls";

/// Number of `redis-server` processes started by this crate that are still running.
static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Ports (and cluster bus ports) already handed out by this process, so that two fixtures
/// started in parallel threads never receive the same port.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The highest port handed out: a cluster node's bus port (`port + 10000`) must stay valid.
const MAX_PORT: u16 = 55535;

/// Offset of the cluster bus port.
pub(crate) const BUS_OFFSET: u16 = 10000;

/// How many times [`on_free_ports`] starts a server on newly picked ports.
const PORT_TRIES: usize = 5;

/// Runs `start` (which picks its own free ports) again, up to [`PORT_TRIES`] times in all, when
/// redis-server could not bind a port it was given (`AddrInUse` from
/// [`RedisServer::wait_ready`]): a port free when picked can be taken before the server binds
/// it, because the kernel hands out the same range as the source ports of outgoing
/// connections, of this process or any other.
pub(crate) fn on_free_ports<T>(mut start: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut tries = 1;
    loop {
        match start() {
            Err(error) if error.kind() == io::ErrorKind::AddrInUse && tries < PORT_TRIES => {
                tries += 1;
            }
            result => return result,
        }
    }
}

/// Finds a free loopback TCP port below 55535.
///
/// Ports are taken from the kernel (bind to port 0) and remembered, so this process never
/// hands out the same port twice (nor a port reserved as some cluster node's bus port).
pub fn free_port() -> u16 {
    pick_port(false)
}

/// Finds a free loopback TCP port below 55535 whose cluster bus port (`port + 10000`) is free
/// as well, for `--cluster-enabled yes` servers.
pub fn free_cluster_port() -> u16 {
    pick_port(true)
}

fn bind_loopback(port: u16) -> io::Result<TcpListener> {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
}

fn pick_port(with_bus: bool) -> u16 {
    loop {
        let listener = bind_loopback(0).expect("bind an ephemeral loopback port");
        let port = listener.local_addr().expect("local addr").port();
        if port >= MAX_PORT {
            continue;
        }
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if handed_out.len() > 16_384 {
            handed_out.clear();
        }
        if handed_out.contains(&port) {
            continue;
        }
        let bus = port + BUS_OFFSET;
        if with_bus && (handed_out.contains(&bus) || bind_loopback(bus).is_err()) {
            continue;
        }
        handed_out.insert(port);
        if with_bus {
            handed_out.insert(bus);
        }
        return port;
    }
}

/// Marks `port` as handed out (e.g. a port some fixture bound itself), so that
/// [`free_port`] never returns it while it is temporarily unbound.
pub(crate) fn reserve_port(port: u16) {
    HANDED_OUT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(port);
}

/// Number of `redis-server` processes started through this crate (plain servers, cluster
/// nodes, replicas and sentinels) that are still running in this process.
///
/// Every fixture kills its processes on drop, so after all fixtures are dropped this is `0`.
pub fn running_servers() -> usize {
    RUNNING.load(Ordering::SeqCst)
}

/// Whether `redis-server` can be started on this machine.
pub fn redis_available() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl RedisServer {
    /// Starts a plain server (no persistence) and waits until it accepts connections.
    pub fn start() -> io::Result<Self> {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--name value` arguments, e.g. `["--maxmemory", "1mb"]`.
    pub fn start_with(extra: &[&str]) -> io::Result<Self> {
        Self::start_inner(extra, Persistence::None)
    }

    /// Starts a server with the given persistence.
    pub fn start_persistent(persistence: Persistence) -> io::Result<Self> {
        Self::start_inner(&[], persistence)
    }

    /// Starts a plain server on `port`, e.g. one taken from [`free_port`] earlier, for a test
    /// whose client was configured before its Redis came up (a lazily connected locker).
    ///
    /// ```no_run
    /// use lock_testkit::{free_port, RedisServer};
    ///
    /// let port = free_port(); // nothing listens here yet
    /// // ... a client configured for `redis://127.0.0.1:{port}` fails ...
    /// let server = RedisServer::start_on(port).unwrap();
    /// assert_eq!(server.port(), port);
    /// ```
    pub fn start_on(port: u16) -> io::Result<Self> {
        let mut server = Self::launch(port, &[], Persistence::None, |_| Ok(Kind::Server))?;
        server.wait_ready(probe::READY_TIMEOUT)?;
        Ok(server)
    }

    fn start_inner(extra: &[&str], persistence: Persistence) -> io::Result<Self> {
        on_free_ports(|| {
            let mut server = Self::launch(free_port(), extra, persistence, |_| Ok(Kind::Server))?;
            server.wait_ready(probe::READY_TIMEOUT)?;
            Ok(server)
        })
    }

    /// Starts a server that accepts TLS on a second free loopback port
    /// ([`tls_port`](Self::tls_port), [`tls_url`](Self::tls_url)), presenting `config.server`,
    /// with `--tls-auth-clients yes` when `config.auth_clients`.
    ///
    /// The plaintext [`port`](Self::port) stays open on loopback for the fixture's own
    /// helpers ([`cmd`](Self::cmd), [`client_count`](Self::client_count), readiness checks), so
    /// every assertion helper works unchanged; code under test is given the TLS URL. The
    /// certificate, key and CA files are written to `tls/` in the server's temporary
    /// directory and removed with it.
    ///
    /// ```no_run
    /// use lock_testkit::{RedisServer, TestCa, TlsServerConfig, Validity};
    ///
    /// let ca = TestCa::new("test CA");
    /// let cert = ca.server_cert(&["127.0.0.1"], Validity::Current);
    /// let server = RedisServer::start_tls(&TlsServerConfig::new(cert, &ca)).unwrap();
    /// let url = server.tls_url(); // rediss://127.0.0.1:<free port>/
    /// ```
    pub fn start_tls(config: &TlsServerConfig) -> io::Result<Self> {
        on_free_ports(|| {
            let tls = TlsListener::for_config(config);
            let mut server = Self::launch_inner(
                free_port(),
                &[],
                Persistence::None,
                Some(tls),
                |dir: &Path| {
                    write_tls_files(dir, config)?;
                    Ok(Kind::Server)
                },
            )?;
            server.wait_ready(probe::READY_TIMEOUT)?;
            Ok(server)
        })
    }

    /// Creates the server's directory and spawns the process without waiting for it to accept
    /// connections (fixtures spawn all their processes first, then wait for all of them).
    ///
    /// `kind` receives the server's directory (e.g. to write a sentinel config file there).
    pub(crate) fn launch(
        port: u16,
        extra: &[&str],
        persistence: Persistence,
        kind: impl FnOnce(&Path) -> io::Result<Kind>,
    ) -> io::Result<Self> {
        Self::launch_inner(port, extra, persistence, None, kind)
    }

    /// [`launch`](Self::launch) with an optional TLS listener (for [`Kind::Server`], the TLS
    /// arguments are added; a sentinel's config file must carry its own TLS settings).
    pub(crate) fn launch_inner(
        port: u16,
        extra: &[&str],
        persistence: Persistence,
        tls: Option<TlsListener>,
        kind: impl FnOnce(&Path) -> io::Result<Kind>,
    ) -> io::Result<Self> {
        let dir = private_dir()?;
        // On error `dir` is dropped, which removes it.
        let kind = kind(dir.path())?;
        let mut server = Self {
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            persistence,
            kind,
            tls,
            child: None,
            paused: AtomicBool::new(false),
        };
        // On error `server` is dropped here, which removes the directory.
        server.spawn_process()?;
        Ok(server)
    }

    fn spawn(&mut self) -> io::Result<()> {
        self.spawn_process()?;
        self.wait_ready(probe::READY_TIMEOUT)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn spawn_process(&mut self) -> io::Result<()> {
        let mut cmd = Command::new("redis-server");
        match &self.kind {
            Kind::Sentinel { conf } => {
                cmd.arg(conf).arg("--sentinel");
            }
            Kind::Server => {
                cmd.args(["--port", &self.port.to_string()])
                    .args(["--bind", "127.0.0.1"])
                    .args(["--daemonize", "no"])
                    .args(["--save", ""])
                    .args(["--repl-diskless-sync-delay", "0"])
                    .args(["--enable-debug-command", "local"])
                    .arg("--dir")
                    .arg(self.dir.path());
                match self.persistence {
                    Persistence::None => {
                        cmd.args(["--appendonly", "no"]);
                    }
                    Persistence::AofAlways => {
                        cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
                    }
                }
                if let Some(tls) = self.tls {
                    let tls_dir = self.dir.path().join(TLS_DIR);
                    cmd.args(["--tls-port", &tls.port.to_string()])
                        .arg("--tls-cert-file")
                        .arg(tls_dir.join("server.crt"))
                        .arg("--tls-key-file")
                        .arg(tls_dir.join("server.key"))
                        .arg("--tls-ca-cert-file")
                        .arg(tls_dir.join("ca.crt"))
                        .args([
                            "--tls-auth-clients",
                            if tls.auth_clients { "yes" } else { "no" },
                        ]);
                    if tls.client_identity {
                        cmd.arg("--tls-client-cert-file")
                            .arg(tls_dir.join("client.crt"))
                            .arg("--tls-client-key-file")
                            .arg(tls_dir.join("client.key"));
                    }
                }
            }
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        cmd.args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot start redis-server ({e}); install it with `apt-get install redis-server`"),
            )
        })?;
        RUNNING.fetch_add(1, Ordering::SeqCst);
        self.child = Some(child);
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Waits until the process answers `PING` (or fails if it exits first).
    pub(crate) fn wait_ready(&mut self, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port);
        while start.elapsed() < limit {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    RUNNING.fetch_sub(1, Ordering::SeqCst);
                    let tail = self.log_tail(20);
                    // Its port was taken after it was picked: the caller may pick another.
                    let kind = if tail.contains("Address already in use") {
                        io::ErrorKind::AddrInUse
                    } else {
                        io::ErrorKind::Other
                    };
                    return Err(io::Error::new(
                        kind,
                        format!(
                            "redis-server on port {} exited early: {status}; log tail:\n{tail}",
                            self.port,
                        ),
                    ));
                }
            }
            if let Ok(stream) = TcpStream::connect_timeout(&addr.into(), Duration::from_millis(100))
            {
                if ping(stream, probe::password(self.port).as_deref()).is_ok() {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("redis-server on port {} did not become ready", self.port),
        ))
    }

    /// The last `lines` lines of the server's log (empty if there is none).
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`; `redis://:<password>@127.0.0.1:<port>/` for a server that
    /// requires a password (the `default` user's, see
    /// [`RedisSentinel::start_with_passwords`](crate::RedisSentinel::start_with_passwords)).
    pub fn url(&self) -> String {
        probe::url(self.port)
    }

    /// The TLS port, for servers started with [`start_tls`](Self::start_tls).
    pub fn tls_port(&self) -> Option<u16> {
        self.tls.map(|t| t.port)
    }

    /// `rediss://127.0.0.1:<tls port>/`, with the `default` user's password as in
    /// [`url`](Self::url).
    ///
    /// # Panics
    ///
    /// If the server was not started with [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> String {
        let port = self
            .tls_port()
            .expect("a server started with RedisServer::start_tls");
        probe::url_with("rediss", port, probe::password(self.port).as_deref())
    }

    /// Connections the server has accepted since it started (`total_connections_received`
    /// of `INFO stats`), TLS and plaintext, including the fixture's own; each call of this
    /// method adds one.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub fn connections_received(&self) -> u64 {
        let info: String = self.cmd(&["INFO", "stats"]);
        probe::info_field(&info, "total_connections_received")
            .and_then(|n| n.parse().ok())
            .expect("total_connections_received in INFO stats")
    }

    /// The server's PID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's temporary directory: made for it alone (mode 0700, a random name under
    /// the system's temporary directory), removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether the process is running (started and not stopped or killed; it may be paused).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process is frozen by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.child.is_some() && self.paused.load(Ordering::SeqCst)
    }

    /// A synchronous client for assertions and set-up.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("valid url")
            .get_connection()
            .expect("connect to test redis-server")
    }

    /// Runs one command and returns its reply; panics on error (tests only).
    ///
    /// # Panics
    ///
    /// If the server cannot be reached or the command fails.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        probe::command(args)
            .query(&mut self.client())
            .expect("test command")
    }

    /// Runs one write command, then `WAIT replicas timeout` on the same connection; returns
    /// the command's reply and how many replicas acknowledged it (tests only).
    ///
    /// `WAIT` counts only the writes of its own connection. Sent through [`cmd`](Self::cmd),
    /// which opens a connection for every call, it returns at once with the replicas that are
    /// connected and proves nothing about an earlier write.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached or a command fails.
    pub fn write_and_wait<T: redis::FromRedisValue>(
        &self,
        args: &[&str],
        replicas: u32,
        timeout: Duration,
    ) -> (T, i64) {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout.as_millis() as u64);
        redis::pipe()
            .add_command(probe::command(args))
            .add_command(wait)
            .query(&mut self.client())
            .expect("test write and WAIT")
    }

    /// Runs one command on a fresh connection with a 1 s connect and 2 s reply timeout, so it
    /// returns an error (instead of hanging) when the server is killed or paused.
    pub fn try_cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        probe::query(self.port, args, probe::QUERY_TIMEOUT)
    }

    /// Total calls of a command according to `INFO commandstats` (e.g. `"evalsha"`, `"set"`).
    pub fn command_calls(&self, command: &str) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        let needle = format!("cmdstat_{}:calls=", command.to_ascii_lowercase());
        info.lines()
            .find_map(|line| line.strip_prefix(&needle))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Sum of all command calls in `INFO commandstats`, minus the `INFO` calls themselves.
    pub fn total_calls(&self) -> u64 {
        let info: String = self.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
            .filter_map(|l| l.split("calls=").nth(1))
            .filter_map(|rest| rest.split(',').next())
            .filter_map(|n| n.parse::<u64>().ok())
            .sum()
    }

    /// Resets `INFO commandstats`.
    pub fn reset_stats(&self) {
        let _: () = self.cmd(&["CONFIG", "RESETSTAT"]);
    }

    /// All keys of database 0 matching a glob `pattern` (via `SCAN ... MATCH`), sorted.
    ///
    /// Meant for leak checks at the end of a test, e.g. `assert!(server.keys("lock:*").is_empty())`.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        probe::scan_keys(self.port, pattern).expect("SCAN on test redis-server")
    }

    /// The pub/sub channels that currently have at least one subscriber (`PUBSUB CHANNELS`),
    /// sorted. Pattern subscriptions are not included.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub fn pubsub_channels(&self) -> Vec<String> {
        let mut channels: Vec<String> = self.cmd(&["PUBSUB", "CHANNELS"]);
        channels.sort();
        channels
    }

    /// Number of client connections to this server other than the one asking (normal and
    /// pub/sub clients; replication links are not counted). A connection closed an instant
    /// ago may still be counted until the server has processed the close: poll when
    /// asserting on it.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub fn client_count(&self) -> usize {
        let list: String = self.cmd(&["CLIENT", "LIST"]);
        list.lines()
            .filter(|l| !l.contains(" flags=S ") && !l.contains(" flags=M "))
            .count()
            .saturating_sub(1)
    }

    /// Stops the server with SIGKILL and reaps it (no shutdown save).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            RUNNING.fetch_sub(1, Ordering::SeqCst);
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Stops the server gracefully (SIGTERM) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.paused.load(Ordering::SeqCst) {
                signal(&child, "CONT");
            }
            signal(&child, "TERM");
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut exited = false;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    exited = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if !exited {
                let _ = child.kill();
                let _ = child.wait();
            }
            RUNNING.fetch_sub(1, Ordering::SeqCst);
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Freezes the server with SIGSTOP: connections stay open, nothing is answered.
    pub fn pause(&self) {
        if let Some(child) = &self.child {
            signal(child, "STOP");
            self.paused.store(true, Ordering::SeqCst);
        }
    }

    /// Resumes a paused server with SIGCONT.
    pub fn resume(&self) {
        if let Some(child) = &self.child {
            signal(child, "CONT");
            self.paused.store(false, Ordering::SeqCst);
        }
    }

    /// Starts the server again on the same port (after [`stop`](Self::stop) or
    /// [`kill9`](Self::kill9)); with AOF persistence it reloads its data.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        self.spawn()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.is_paused() {
            if let Some(child) = &self.child {
                signal(child, "CONT");
            }
        }
        self.kill9();
        // `dir` is removed when the field drops, after this.
    }
}

/// A new directory for one server: created by `mkdir` under a random name (never one that
/// exists already, so nobody can plant it or a symlink in its place beforehand), mode 0700
/// (nobody else reads the server's keys, config and data).
fn private_dir() -> io::Result<TempDir> {
    use std::os::unix::fs::PermissionsExt;
    // Set at `mkdir`, not after: there is no moment when the directory is open to others.
    tempfile::Builder::new()
        .prefix("lock-testkit-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
}

fn signal(child: &Child, sig: &str) {
    // The `kill` utility keeps this crate free of `unsafe`; the pid is our own live child.
    let _ = Command::new("kill")
        .args(["-s", sig, &child.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// `PING` on `stream` (after `AUTH password` for a server that requires one): whether the
/// server answers.
fn ping(mut stream: TcpStream, password: Option<&str>) -> io::Result<()> {
    use std::io::{Read, Write};
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    let (request, expected): (String, &[u8]) = match password {
        Some(password) => (format!("AUTH {password}\r\nPING\r\n"), b"+OK\r\n+PONG\r\n"),
        None => ("PING\r\n".to_owned(), b"+PONG\r\n"),
    };
    stream.write_all(request.as_bytes())?;
    let mut buf = vec![0u8; expected.len()];
    stream.read_exact(&mut buf)?;
    if buf == expected {
        Ok(())
    } else {
        Err(io::Error::other("not ready"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken() -> io::Error {
        io::Error::new(io::ErrorKind::AddrInUse, "taken")
    }

    #[test]
    fn a_start_whose_port_was_taken_is_tried_again_a_few_times_only() {
        let mut calls = 0;
        let started = on_free_ports(|| {
            calls += 1;
            if calls < 3 {
                Err(taken())
            } else {
                Ok(calls)
            }
        });
        assert_eq!(started.unwrap(), 3);

        let mut calls = 0;
        let failed = on_free_ports(|| -> io::Result<()> {
            calls += 1;
            Err(taken())
        });
        assert_eq!(failed.unwrap_err().kind(), io::ErrorKind::AddrInUse);
        assert_eq!(calls, PORT_TRIES);

        let mut calls = 0;
        let other = on_free_ports(|| -> io::Result<()> {
            calls += 1;
            Err(io::Error::other("not a port"))
        });
        assert!(other.is_err());
        assert_eq!(calls, 1, "only a taken port is worth another try");
    }
}
