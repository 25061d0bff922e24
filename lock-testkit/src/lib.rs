//! Test support for the lock kit: real `redis-server` processes on free loopback ports.
//!
//! Every [`RedisServer`] is a child process started with `--daemonize no`, so it is owned by
//! PID and killed when the value is dropped. Ports are chosen by binding port 0 and are kept
//! below 55535 so that a cluster bus port (`port + 10000`) is valid too.
//!
//! ```no_run
//! # async fn demo() {
//! let server = lock_testkit::RedisServer::start().expect("redis-server on PATH");
//! let url = server.url(); // redis://127.0.0.1:<free port>/
//! # }
//! ```

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether a restarted server keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// No RDB, no AOF: a restart starts empty.
    None,
    /// `appendonly yes` with `appendfsync always`: a restart keeps every acknowledged write.
    AofAlways,
}

/// A `redis-server` child process on a free loopback port, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    persistence: Persistence,
    child: Option<Child>,
}

/// Finds a free loopback TCP port below 55535.
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
            .expect("bind an ephemeral loopback port");
        let port = listener.local_addr().expect("local addr").port();
        if port < 55535 {
            return port;
        }
    }
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

    fn start_inner(extra: &[&str], persistence: Persistence) -> io::Result<Self> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("lock-testkit-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut server = Self {
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            persistence,
            child: None,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> io::Result<()> {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--daemonize", "no"])
            .args(["--save", ""])
            .args(["--repl-diskless-sync-delay", "0"])
            .args(["--enable-debug-command", "local"])
            .arg("--dir")
            .arg(&self.dir);
        match self.persistence {
            Persistence::None => {
                cmd.args(["--appendonly", "no"]);
            }
            Persistence::AofAlways => {
                cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
            }
        }
        cmd.args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot start redis-server ({e}); install it with `apt-get install redis-server`"),
            )
        })?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(10))
    }

    fn wait_ready(&mut self, limit: Duration) -> io::Result<()> {
        let start = Instant::now();
        let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port);
        while start.elapsed() < limit {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    return Err(io::Error::other(format!(
                        "redis-server on port {} exited early: {status}",
                        self.port
                    )));
                }
            }
            if let Ok(stream) = TcpStream::connect_timeout(&addr.into(), Duration::from_millis(100))
            {
                if ping(stream).is_ok() {
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

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's PID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A synchronous client for assertions and set-up.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .expect("valid url")
            .get_connection()
            .expect("connect to test redis-server")
    }

    /// Runs one command and returns its reply; panics on error (tests only).
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.client()).expect("test command")
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

    /// Stops the server with SIGKILL and reaps it (no shutdown save).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server gracefully (SIGTERM) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(&child, "TERM");
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server with SIGSTOP: connections stay open, nothing is answered.
    pub fn pause(&self) {
        if let Some(child) = &self.child {
            signal(child, "STOP");
        }
    }

    /// Resumes a paused server with SIGCONT.
    pub fn resume(&self) {
        if let Some(child) = &self.child {
            signal(child, "CONT");
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
        if let Some(child) = &self.child {
            signal(child, "CONT");
        }
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn signal(child: &Child, sig: &str) {
    // The `kill` utility keeps this crate free of `unsafe`; the pid is our own live child.
    let _ = Command::new("kill")
        .args(["-s", sig, &child.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn ping(mut stream: TcpStream) -> io::Result<()> {
    use std::io::{Read, Write};
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    stream.write_all(b"PING\r\n")?;
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf)?;
    if &buf == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(io::Error::other("not ready"))
    }
}
