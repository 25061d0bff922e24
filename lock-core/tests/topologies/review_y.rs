//! A review of b6195aa (N4's third fix with X1, X3, X4 fixed): the pool of connections of
//! their own for writes and their `WAIT`s (`store/wait.rs`) and its callers. Each test
//! shows one finding and fails on b6195aa; its doc comment says what it shows and what
//! 4effc48 did.
//!
//! Fixed after this read (RELIABILITY, "A fourteenth read"): a pool connection is opened
//! with tries again after short pauses (10 ms, doubled up to 200 ms) within the connect
//! timeout in all (Y1: "extend(30 s) during a 150 ms refusal: \"Ok\" after 161.765885ms");
//! a connection idle for over 500 ms answers a `PING` before it is lent, and one that does
//! not is closed with the others idle as long (Y2: three extensions `Ok`, the first after
//! 1.045 s, the others after 44 ms: the first waits out the `PING`'s command timeout on the
//! forgotten flow).
//!
//! Since E1 and E2 (`review_e.rs`) explicit extensions go on the shared connection again:
//! the tests here that extend now meet it, not the pool (`y2_acquires_..` keeps Y2's check
//! on the pool through acquires; X1's restart and Sentinel release tests keep X1's).

use crate::common;

use std::time::{Duration, Instant};

use lock_core::{LockError, Locker};
use lock_testkit::ProxyMode;

/// The error text, or `Ok`.
fn shown<T>(answer: &Result<T, LockError>) -> String {
    match answer {
        Ok(_) => "Ok".to_owned(),
        Err(e) => e.to_string(),
    }
}

/// Finding Y1: a brief outage that 4effc48 rode through fails an extension. X4's fix opens
/// a pool connection with one try, and an extension's `retry_dropped` makes three tries
/// within 55 ms (at once, 5 ms and 50 ms later), each of which now needs a connection of
/// its own: while the server refuses connections for longer than that (a restart, as the
/// client sees it; a proxy or balancer that restarts) every try's connect is refused and
/// the extension fails. On 4effc48 the extension went on the shared connection, whose
/// manager reconnects with three tries and backoff (100 ms, then 200 ms, with jitter), and
/// the retry 5 ms after the dropped try waits for that reconnection: it rode through an
/// outage of a few hundred milliseconds.
///
/// Interleaving: the locker reaches the primary through a proxy (`front`), the replica in
/// sync (`min_replicas(1, 400 ms)`, command timeout 1 s, connect timeout 1 s); `h` taken
/// (30 s lease); the proxy closes every connection and refuses new ones (`Refuse`, as a
/// stopped server) and `extend(30 s)` is called; 150 ms later the proxy listens again.
///
/// Expected: `extend` is `Ok` (the server is up again 150 ms later, with `h`, and the
/// replica never fell behind), as on 4effc48 ("extend(30 s) during a 150 ms refusal: \"Ok\"
/// after 541.479046ms"). Observed on b6195aa: "extend(30 s) during a 150 ms refusal:
/// \"redis error on lock `h`: the extension got no decisive answer from redis\" after
/// 151.387492ms; h on the primary Some((\"lock:{27d5482eebd075de}:lock:h\", 29845))".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn y1_an_extension_rides_through_a_brief_refusal_as_before() {
    let (primary, _replica, _link) = common::replica_behind_a_proxy().await;
    let front = lock_testkit::FaultProxy::start(primary.port())
        .await
        .unwrap();
    let locker = common::replicated_locker_via(&front, Duration::from_secs(1)).await;
    let held = common::replicated_lock_leased(&locker, "h", Some(Duration::from_secs(30))).await;
    // Warm: one extension that works, so both ways have their scripts and connections.
    held.extend(Duration::from_secs(30)).await.unwrap();
    front.set_mode(ProxyMode::Refuse).await;
    let asked = Instant::now();
    let extending = held.extend(Duration::from_secs(30));
    let reopen = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        front.set_mode(ProxyMode::Pass).await;
    };
    let (extended, ()) = tokio::join!(extending, reopen);
    let took = asked.elapsed();
    let h_in_redis = common::lock_key_pttl(&primary, "h");
    let observed = format!(
        "extend(30 s) during a 150 ms refusal: {:?} after {took:?}; h on the primary {h_in_redis:?}",
        shown(&extended)
    );
    lock_testkit::figure(&format!("Y1: {observed}"));
    assert!(extended.is_ok(), "{observed}");
}

/// A TCP proxy in front of a server whose [`cut_idle`](IdleCut::cut_idle) silently
/// blackholes the connections idle longer than a threshold, as a NAT gateway, a stateful
/// firewall or a cloud load balancer does to a flow idle past its idle timeout (no FIN, no
/// RST: later packets are dropped), while busy and new connections pass.
struct IdleCut {
    port: u16,
    started: Instant,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::sync::Arc<ConnState>>>>,
    task: tokio::task::JoinHandle<()>,
}

struct ConnState {
    /// When data last crossed it, in ms since the proxy started.
    last: std::sync::atomic::AtomicU64,
    frozen: std::sync::atomic::AtomicBool,
}

type Reader = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
type Writer = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

impl IdleCut {
    async fn start(upstream: u16) -> Self {
        use std::sync::atomic::Ordering;
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: Arc<std::sync::Mutex<Vec<Arc<ConnState>>>> = Arc::default();
        let started = Instant::now();
        let list = conns.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                let state = Arc::new(ConnState {
                    last: (started.elapsed().as_millis() as u64).into(),
                    frozen: false.into(),
                });
                list.lock().unwrap().push(state.clone());
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let ways: [(Reader, Writer); 2] =
                    [(Box::new(cr), Box::new(sw)), (Box::new(sr), Box::new(cw))];
                for (mut from, mut to) in ways {
                    let state = state.clone();
                    tokio::spawn(async move {
                        use tokio::io::{AsyncReadExt, AsyncWriteExt};
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => {
                                    if state.frozen.load(Ordering::SeqCst) {
                                        // Nothing more is said on a forgotten flow.
                                        std::future::pending::<()>().await;
                                    }
                                    let _ = to.shutdown().await;
                                    return;
                                }
                                Ok(n) => n,
                            };
                            if state.frozen.load(Ordering::SeqCst) {
                                continue; // dropped, as by a gateway that forgot the flow
                            }
                            state
                                .last
                                .store(started.elapsed().as_millis() as u64, Ordering::SeqCst);
                            if to.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Self {
            port,
            started,
            conns,
            task,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Blackholes every connection idle for `idle` or longer; returns how many it cut and
    /// how many it left alone (busy ones; closed ones count as busy or cut as they were).
    fn cut_idle(&self, idle: Duration) -> (usize, usize) {
        use std::sync::atomic::Ordering;
        let now = self.started.elapsed().as_millis() as u64;
        let mut counts = (0, 0);
        for conn in self.conns.lock().unwrap().iter() {
            if now.saturating_sub(conn.last.load(Ordering::SeqCst)) >= idle.as_millis() as u64 {
                conn.frozen.store(true, Ordering::SeqCst);
                counts.0 += 1;
            } else {
                counts.1 += 1;
            }
        }
        counts
    }
}

impl Drop for IdleCut {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Finding Y2: the pool keeps idle connections for good and lends them unlooked-at, and X1's
/// fix notices only a connection the server *closed*. A connection a NAT gateway, a stateful
/// firewall or a cloud load balancer forgot while it sat idle (its idle timeout: minutes; the
/// flow is dropped silently, no FIN or RST) is lent as if alive: the call's write and `WAIT`
/// vanish, it fails after the whole command timeout as a timeout (not a dropped connection,
/// so nothing is retried and the other idle connections are kept), and the next call takes
/// the next dead one: up to eight calls in a row fail, each after a command timeout, on a
/// server that answers at once. The shared connection, which 4effc48's extensions used, is
/// kept busy by the watchdog's renewals (every third of the lease), so no idle timeout ever
/// forgets it.
///
/// Interleaving: the locker reaches the primary through `IdleCut` (replica in sync,
/// `min_replicas(1, 400 ms)`, command timeout 1 s, watchdog lease 1.5 s, so the shared
/// connection carries a renewal every 500 ms); `h` held; eight acquires at once (replica link
/// 50 ms each way, so their `WAIT`s overlap and the pool opens eight connections), released;
/// 1.5 s later the proxy forgets the flows idle for a second; then `extend(10 s)` of `h`
/// three times in a row.
///
/// Expected: each extension `Ok` within milliseconds (the server and its replica are up), as
/// on 4effc48 ("the gateway forgot 1 flows idle 1 s, 1 busy ones pass; three extend(10 s)
/// of h in a row: [\"\\\"Ok\\\" after 711.184µs\", ..]"). Observed on b6195aa: "the gateway forgot 9
/// flows idle 1 s, 1 busy ones pass; three extend(10 s) of h in a row: [\"\\\"redis error on
/// lock `h`: the extension got no decisive answer from redis\\\" after 1.001833358s\", .. after
/// 1.00172485s, .. after 1.001923572s]; h held: true".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn y2_extensions_after_a_gateway_forgot_idle_connections_succeed() {
    after_a_gateway_forgot_idle_connections(Probe::Extend).await;
}

/// Y2 through acquires: since E1 and E2 an extension goes on the shared connection, so the
/// test above no longer meets the pool; zero-wait acquires do (their write and `WAIT` on a
/// pooled connection). Without the `PING` before lending (checked by removing it): each
/// acquire waits out its command timeout on a forgotten flow and fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn y2_acquires_after_a_gateway_forgot_idle_connections_succeed() {
    after_a_gateway_forgot_idle_connections(Probe::Acquire).await;
}

/// What Y2 tries after the gateway forgot the idle flows, three times.
#[derive(Debug, Clone, Copy)]
enum Probe {
    /// `extend(10 s)` of the held lock.
    Extend,
    /// A zero-wait acquire of a new key.
    Acquire,
}

/// Y2's scenario (see `y2_extensions_..`), with `probe` tried three times at the end; asserts
/// each is `Ok`.
async fn after_a_gateway_forgot_idle_connections(probe: Probe) {
    let (primary, _replica, link) = common::replica_behind_a_proxy().await;
    let front = IdleCut::start(primary.port()).await;
    let locker = Locker::builder()
        .url(front.url())
        .min_replicas(1, Duration::from_millis(400))
        .command_timeout(Duration::from_secs(1))
        .watchdog_lease(Duration::from_millis(1500))
        .build()
        .await
        .unwrap();
    let held = common::replicated_lock(&locker, "h").await;
    link.set_mode(ProxyMode::Delay(Duration::from_millis(50)))
        .await;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let locker = locker.clone();
            tokio::spawn(async move {
                match locker
                    .lock(format!("b{i}"))
                    .wait(Duration::from_secs(5))
                    .await
                {
                    Ok(guard) => shown(&guard.release().await),
                    Err(e) => e.to_string(),
                }
            })
        })
        .collect();
    let mut burst = std::collections::BTreeMap::<String, usize>::new();
    for task in tasks {
        *burst.entry(task.await.unwrap()).or_default() += 1;
    }
    link.set_mode(ProxyMode::Pass).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (cut, busy) = front.cut_idle(Duration::from_secs(1));
    let mut answers = Vec::new();
    let mut all_ok = true;
    for i in 0..3 {
        let asked = Instant::now();
        let answer = match probe {
            Probe::Extend => held.extend(Duration::from_secs(10)).await,
            Probe::Acquire => locker
                .lock(format!("k{i}"))
                .wait(Duration::ZERO)
                .await
                .map(drop),
        };
        let took = asked.elapsed();
        all_ok &= answer.is_ok();
        answers.push(format!("{:?} after {took:?}", shown(&answer)));
    }
    let observed = format!(
        "8 acquires at once: {burst:?}; the gateway forgot {cut} flows idle 1 s, {busy} \
         busy ones pass; three {probe:?} in a row: {answers:?}; h held: {}",
        held.is_held()
    );
    lock_testkit::figure(&format!("Y2 ({probe:?}): {observed}"));
    assert!(all_ok, "{observed}");
}
