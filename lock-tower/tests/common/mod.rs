//! Shared set-up of the integration tests: a fresh redis-server and locker per test, an axum
//! app served over real HTTP, an HTTP client and an occupancy checker.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use lock_core::Locker;
use lock_testkit::RedisServer;

pub fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server (apt-get install redis-server)")
}

/// A locker with a 5 s watchdog lease, so `Retry-After` values stay small.
pub async fn locker(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_secs(5))
        .build()
        .await
        .expect("connect locker")
}

/// Serves `app` on a free loopback port with `axum::serve`; the server task lives until the
/// test's runtime stops.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A response read to its end.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    /// The `Retry-After` header in seconds.
    pub fn retry_after(&self) -> Option<u64> {
        let value = self.headers.get(http::header::RETRY_AFTER)?;
        Some(
            value
                .to_str()
                .ok()?
                .parse()
                .expect("Retry-After is whole seconds"),
        )
    }
}

/// Sends `method url` with an empty body over HTTP and reads the whole response.
pub async fn send(client: &HttpClient, method: Method, url: &str) -> Reply {
    let request = Request::builder()
        .method(method)
        .uri(url)
        .body(Empty::new())
        .expect("request");
    let response = client.request(request).await.expect("http request");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("read body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).expect("utf-8 body"),
    }
}

pub async fn post(client: &HttpClient, url: &str) -> Reply {
    send(client, Method::POST, url).await
}

/// Counts the requests inside a critical section and remembers the most seen at once.
#[derive(Debug, Clone, Default)]
pub struct Occupancy {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
    entered: Arc<AtomicUsize>,
}

impl Occupancy {
    /// Stays inside for `hold` (left also when the future is dropped).
    pub async fn occupy(&self, hold: Duration) {
        let _inside = self.enter();
        tokio::time::sleep(hold).await;
    }

    pub fn enter(&self) -> Inside {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        self.entered.fetch_add(1, Ordering::SeqCst);
        Inside(self.now.clone())
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    pub fn entered(&self) -> usize {
        self.entered.load(Ordering::SeqCst)
    }

    pub fn now(&self) -> usize {
        self.now.load(Ordering::SeqCst)
    }
}

/// One request inside; leaves on drop.
#[derive(Debug)]
pub struct Inside(Arc<AtomicUsize>);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Polls `locker.is_locked(key)` until it is false or `limit` passes; returns how long it
/// took, or `None` if the key stayed locked.
pub async fn time_until_unlocked(locker: &Locker, key: &str, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !locker.is_locked(key).await.expect("is_locked") {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Polls `locker.is_locked(key)` until it is true; `false` if it never was within `limit`.
pub async fn time_until_locked(locker: &Locker, key: &str, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if locker.is_locked(key).await.expect("is_locked") {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// The end state every test must reach: `locker` holds, queues, renews and subscribes
/// nothing, and the server has no lock key, no key without an expiry and no subscribed
/// channel under `lock:`. Polls, since releases run in the background and subscriptions
/// linger 500 ms after their last use.
pub async fn assert_nothing_left(server: &RedisServer, lockers: &[&Locker]) {
    lock_testkit::assert_nothing_left(server, "lock:", &[], || busy(lockers)).await;
}

/// `None` when every locker is idle (no watchdog entry, local key or subscription), else their
/// counters.
fn busy(lockers: &[&Locker]) -> Option<String> {
    let counters: Vec<_> = lockers
        .iter()
        .map(|l| {
            (
                l.stats().watchdog_locks,
                l.stats().local_keys,
                l.stats().subscriptions,
            )
        })
        .collect();
    counters
        .iter()
        .any(|c| *c != (0, 0, 0))
        .then(|| format!("per locker (watchdog locks, local keys, subscriptions): {counters:?}"))
}
