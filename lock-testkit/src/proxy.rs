//! [`FaultProxy`]: an in-process TCP proxy that injects network faults between a client and
//! a `redis-server`.

use std::collections::BTreeMap;
use std::future::pending;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::probe;

/// How long [`FaultProxy::set_mode`] waits for the proxy to apply a mode.
const APPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Size of one read (a "chunk").
const CHUNK: usize = 16 * 1024;

/// What a [`FaultProxy`] does with traffic. Switch with [`FaultProxy::set_mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward everything in both directions (the initial mode).
    Pass,
    /// Forward everything, but hold each chunk read from either side for the given time
    /// before writing it on. A request/response round trip therefore takes about twice as
    /// long; throughput is not limited (chunks are delayed, not serialized).
    Delay(Duration),
    /// A blackhole: connections are accepted (new ones too) and both sides are read, but
    /// nothing is forwarded in either direction, so clients see timeouts. Data read meanwhile
    /// is *held*, like segments TCP retransmits after a partition heals: when the mode
    /// returns to [`Pass`](Self::Pass) or [`Delay`](Self::Delay) it is delivered, including
    /// requests whose client has since given up and closed the connection (the "ghost
    /// acquisition" of RELIABILITY.md). Switching to [`Drop`](Self::Drop),
    /// [`Reset`](Self::Reset) or [`Refuse`](Self::Refuse) instead discards it.
    Hole,
    /// Close every existing connection (FIN to both sides), and close new connections right
    /// after accepting them: clients read end-of-stream.
    Drop,
    /// Reset every existing connection (`SO_LINGER` 0, so both sides get an RST), then behave
    /// like [`Pass`](Self::Pass) for new connections. Setting it again resets again.
    Reset,
    /// Like a dead server: close every existing connection and stop listening, so new
    /// connections are refused (`ECONNREFUSED`). Leaving this mode listens again on the same
    /// port.
    Refuse,
}

/// What happened to connections older than an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Close,
    Reset,
}

/// The proxy's shared state, published through a `watch` channel.
#[derive(Debug, Clone, Copy)]
struct State {
    mode: ProxyMode,
    /// Incremented by every `set_mode`; the accept loop acknowledges it.
    seq: u64,
    /// Incremented by `Drop`, `Reset` and `Refuse`: connections from an older epoch are cut.
    epoch: u64,
    /// How the connections of older epochs are cut.
    cut: Cut,
}

#[derive(Debug, Default)]
struct Stats {
    accepted: AtomicUsize,
    /// Open proxied connections by the epoch they were accepted in.
    open: Mutex<BTreeMap<u64, usize>>,
}

impl Stats {
    fn open_total(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum()
    }

    fn open_before(&self, epoch: u64) -> usize {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .range(..epoch)
            .map(|(_, n)| n)
            .sum()
    }
}

/// Counts a connection as open while it lives.
struct OpenGuard {
    stats: Arc<Stats>,
    epoch: u64,
}

impl OpenGuard {
    fn new(stats: Arc<Stats>, epoch: u64) -> Self {
        *stats
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(epoch)
            .or_default() += 1;
        Self { stats, epoch }
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let mut open = self.stats.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.epoch) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.epoch);
            }
        }
    }
}

/// A TCP proxy on a free loopback port in front of `127.0.0.1:<upstream_port>`, with faults
/// switched at run time (see [`ProxyMode`]).
///
/// It runs as tasks on the current tokio runtime and stops (closing every connection) when
/// dropped. Point the code under test at [`url`](Self::url) instead of the server's URL.
///
/// The proxy needs the runtime to make progress: in a `current_thread` runtime (the
/// `#[tokio::test]` default) talk through it only with async clients; use
/// `#[tokio::test(flavor = "multi_thread")]` when blocking clients are involved.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use lock_testkit::{FaultProxy, ProxyMode, RedisServer};
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::start(server.port()).await?;
/// let client = redis::Client::open(proxy.url()).unwrap();
/// proxy.set_mode(ProxyMode::Hole).await; // requests now time out
/// proxy.set_mode(ProxyMode::Pass).await; // held requests are delivered
/// # drop(client);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    upstream_port: u16,
    state: watch::Sender<State>,
    applied: watch::Receiver<u64>,
    stats: Arc<Stats>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Binds a free loopback port and starts proxying to `127.0.0.1:<upstream_port>` in
    /// [`ProxyMode::Pass`].
    ///
    /// Upstream connections are opened per accepted client connection; if the upstream
    /// refuses, the client connection is closed.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime.
    pub async fn start(upstream_port: u16) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let port = listener.local_addr()?.port();
        crate::server::reserve_port(port);
        let (state, state_rx) = watch::channel(State {
            mode: ProxyMode::Pass,
            seq: 0,
            epoch: 0,
            cut: Cut::Close,
        });
        let (applied_tx, applied) = watch::channel(0);
        let stats = Arc::new(Stats::default());
        let task = tokio::spawn(accept_loop(
            listener,
            port,
            upstream_port,
            state_rx,
            applied_tx,
            Arc::clone(&stats),
        ));
        Ok(Self {
            port,
            upstream_port,
            state,
            applied,
            stats,
            task,
        })
    }

    /// The proxy's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>/`.
    pub fn url(&self) -> String {
        probe::url(self.port)
    }

    /// The port traffic is forwarded to.
    pub fn upstream_port(&self) -> u16 {
        self.upstream_port
    }

    /// The mode last set.
    pub fn mode(&self) -> ProxyMode {
        self.state.borrow().mode
    }

    /// Switches the mode and returns once it is in force: the listener is closed (for
    /// [`ProxyMode::Refuse`]) or listening again, and for `Drop`, `Reset` and `Refuse` every
    /// existing connection has been closed or reset. Chunks not yet forwarded when the mode
    /// changes follow the new mode.
    ///
    /// # Panics
    ///
    /// When the proxy does not apply the mode within 5 s (e.g. its port could not be bound
    /// again after `Refuse`), or its task has stopped.
    pub async fn set_mode(&self, mode: ProxyMode) {
        let mut seq = 0;
        let mut epoch = 0;
        self.state.send_modify(|s| {
            s.mode = mode;
            s.seq += 1;
            match mode {
                ProxyMode::Drop | ProxyMode::Refuse => {
                    s.epoch += 1;
                    s.cut = Cut::Close;
                }
                ProxyMode::Reset => {
                    s.epoch += 1;
                    s.cut = Cut::Reset;
                }
                ProxyMode::Pass | ProxyMode::Delay(_) | ProxyMode::Hole => {}
            }
            seq = s.seq;
            epoch = s.epoch;
        });
        let mut applied = self.applied.clone();
        let waited = tokio::time::timeout(APPLY_TIMEOUT, async {
            applied
                .wait_for(|&a| a >= seq)
                .await
                .map_err(|_| "the proxy task stopped")?;
            while self.stats.open_before(epoch) > 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Ok::<(), &str>(())
        })
        .await;
        match waited {
            Ok(Ok(())) => {}
            Ok(Err(why)) => panic!("fault proxy on port {}: {why}", self.port),
            Err(_) => panic!(
                "fault proxy on port {} did not apply {mode:?} within {APPLY_TIMEOUT:?}",
                self.port
            ),
        }
    }

    /// Number of client connections accepted since the start (including those closed at
    /// once in `Drop` mode).
    pub fn connections(&self) -> usize {
        self.stats.accepted.load(Ordering::SeqCst)
    }

    /// Number of proxied connections currently open.
    pub fn open_connections(&self) -> usize {
        self.stats.open_total()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its `JoinSet`, which aborts every connection task.
        self.task.abort();
    }
}

async fn accept_on(listener: &Option<TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => pending().await,
    }
}

async fn accept_loop(
    listener: TcpListener,
    port: u16,
    upstream_port: u16,
    mut state_rx: watch::Receiver<State>,
    applied: watch::Sender<u64>,
    stats: Arc<Stats>,
) {
    let mut listener = Some(listener);
    let mut connections = JoinSet::new();
    loop {
        let state = *state_rx.borrow_and_update();
        if state.mode == ProxyMode::Refuse {
            listener = None;
        } else if listener.is_none() {
            match TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await {
                Ok(bound) => listener = Some(bound),
                Err(_) => {
                    // Retry until bound (or until the mode goes back to `Refuse`).
                    tokio::select! {
                        changed = state_rx.changed() => if changed.is_err() { return },
                        () = tokio::time::sleep(Duration::from_millis(20)) => {}
                    }
                    continue;
                }
            }
        }
        applied.send_replace(state.seq);
        while connections.try_join_next().is_some() {}
        tokio::select! {
            changed = state_rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            accepted = accept_on(&listener) => {
                let Ok((stream, _)) = accepted else {
                    // e.g. too many open files: back off a little.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                stats.accepted.fetch_add(1, Ordering::SeqCst);
                let now = *state_rx.borrow();
                if matches!(now.mode, ProxyMode::Drop | ProxyMode::Refuse) {
                    drop(stream);
                    continue;
                }
                let guard = OpenGuard::new(Arc::clone(&stats), now.epoch);
                connections.spawn(connection(stream, upstream_port, state_rx.clone(), now.epoch, guard));
            }
        }
    }
}

/// The error a pump returns when its connection is cut by a mode change.
fn cut_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "cut by the fault proxy")
}

async fn connection(
    mut client: TcpStream,
    upstream_port: u16,
    mut state_rx: watch::Receiver<State>,
    epoch: u64,
    guard: OpenGuard,
) {
    let Ok(mut upstream) = TcpStream::connect((Ipv4Addr::LOCALHOST, upstream_port)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    {
        let (client_read, client_write) = client.split();
        let (upstream_read, upstream_write) = upstream.split();
        let up = pump(client_read, upstream_write, state_rx.clone(), epoch);
        let down = pump(upstream_read, client_write, state_rx.clone(), epoch);
        let cut = async {
            loop {
                if state_rx.changed().await.is_err() || state_rx.borrow_and_update().epoch != epoch
                {
                    return;
                }
            }
        };
        tokio::select! {
            _ = async { tokio::try_join!(up, down) } => {}
            () = cut => {}
        }
    }
    let now = *state_rx.borrow();
    if now.epoch != epoch && now.cut == Cut::Reset {
        // `SO_LINGER` 0 makes the close below send an RST. `set_linger` is deprecated (from
        // tokio 1.49) because a non-zero linger blocks on drop; a zero one does not, and
        // `set_zero_linger` only exists from 1.50 while the workspace allows 1.45.
        #[allow(deprecated)]
        {
            let _ = client.set_linger(Some(Duration::ZERO));
            let _ = upstream.set_linger(Some(Duration::ZERO));
        }
    }
    drop(client);
    drop(upstream);
    drop(guard);
}

/// Copies one direction: a reader that keeps reading (timestamping each chunk) and a writer
/// that applies the mode (hold in `Hole`, delay in `Delay`) before writing.
async fn pump(
    mut from: ReadHalf<'_>,
    mut to: WriteHalf<'_>,
    state_rx: watch::Receiver<State>,
    epoch: u64,
) -> io::Result<()> {
    let (tx, mut rx) = mpsc::channel::<(Vec<u8>, Instant)>(64);
    let read_state = state_rx.clone();
    let reading = async move {
        loop {
            let mut buf = vec![0u8; CHUNK];
            let n = from.read(&mut buf).await?;
            if n == 0 {
                // Dropping `tx` lets the writer drain and then half-close.
                return Ok::<(), io::Error>(());
            }
            buf.truncate(n);
            let due = match read_state.borrow().mode {
                ProxyMode::Delay(delay) => Instant::now() + delay,
                _ => Instant::now(),
            };
            if tx.send((buf, due)).await.is_err() {
                return Ok(());
            }
        }
    };
    let mut write_state = state_rx;
    let writing = async move {
        while let Some((buf, due)) = rx.recv().await {
            // A timer costs a timer-wheel tick (about 1 ms) even when already due: skip it then.
            if due > tokio::time::Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            loop {
                let state = *write_state.borrow_and_update();
                if state.epoch != epoch {
                    return Err(cut_error());
                }
                if state.mode != ProxyMode::Hole {
                    break;
                }
                if write_state.changed().await.is_err() {
                    return Err(cut_error());
                }
            }
            to.write_all(&buf).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(reading, writing).map(|_| ())
}
