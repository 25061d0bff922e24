//! A client cannot keep a key locked by going quiet: the layer's `max_hold` ends the lock in
//! Redis whatever the request is doing, and a handler still running then is stopped and
//! answered as lost.
//!
//! - A client that sends its headers and one of a thousand body bytes, then nothing: the
//!   handler waits on the body extractor, under the lock.
//! - A client that asks for a streamed response under `HoldUntil::BodyEnd` and never reads
//!   it: hyper stops polling the body once the socket's buffers are full.
//!
//! Each test also asks for the key from another connection all along: refused while the
//! quiet client holds it, admitted once the hold is over.

use crate::common;

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::routing::post;
use axum::Router;
use common::{client, locker, post as post_to, serve, server};
use http::StatusCode;
use lock_tower::{DistributedLockLayer, HoldUntil, KeyFrom, DEFAULT_MAX_HOLD};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The hold these tests give the layer; the locker's watchdog lease is 5 s, so a lock that
/// merely stopped being renewed at this point would stay for seconds more.
const MAX_HOLD: Duration = Duration::from_secs(1);

/// Sends `head` (and whatever body bytes it carries) on a new connection and keeps the
/// connection open, reading nothing, until the returned stream is dropped.
async fn quiet_client(addr: std::net::SocketAddr, head: &str) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write");
    stream
}

/// Asks for `url` every 50 ms until it is answered `200`; returns when, from `since`, and
/// how many requests were refused as busy (`409`) before.
async fn admitted_after(url: &str, since: Instant, limit: Duration) -> (Option<Duration>, usize) {
    let client = client();
    let mut busy = 0;
    while since.elapsed() < limit {
        let reply = post_to(&client, url).await;
        match reply.status {
            StatusCode::OK => return (Some(since.elapsed()), busy),
            StatusCode::CONFLICT => busy += 1,
            other => panic!("unexpected answer {other}: {}", reply.body),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (None, busy)
}

/// Waits until `key` is locked (by the quiet client's request), then asks for `url` until it
/// is admitted: asserts that the quiet request held the key (requests were refused) and that
/// the key was free again at the hold's end, not before and not a lease later.
async fn assert_held_until_the_max_hold(
    locker: &lock_core::Locker,
    key: &str,
    url: &str,
    started: Instant,
    what: &str,
) {
    assert!(
        common::time_until_locked(locker, key, Duration::from_secs(2)).await,
        "{what}: the request never took the lock"
    );
    let (admitted, busy) = admitted_after(url, started, MAX_HOLD * 4).await;
    let admitted = admitted.unwrap_or_else(|| panic!("{what}: the key stayed locked"));
    lock_testkit::figure(&format!(
        "{what}, max_hold {MAX_HOLD:?}: key free again after {admitted:?} ({busy} requests refused before)"
    ));
    assert!(busy > 0, "{what}: the request did not hold the key");
    assert!(
        admitted >= MAX_HOLD - Duration::from_millis(100)
            && admitted < MAX_HOLD + Duration::from_millis(900),
        "{what}: admitted {admitted:?} after; max_hold {MAX_HOLD:?}"
    );
}

#[test]
fn the_default_hold_is_at_most_a_minute() {
    assert!(DEFAULT_MAX_HOLD > Duration::ZERO && DEFAULT_MAX_HOLD <= Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_holds_the_key_no_longer_than_the_max_hold() {
    let server = server();
    let locker = locker(&server).await;
    let app = Router::new()
        .route(
            "/orders/{id}",
            post(|body: Bytes| async move { format!("{} bytes", body.len()) }),
        )
        .route_layer(
            DistributedLockLayer::new(locker.clone(), KeyFrom::path_param_as::<u64>("id"))
                .max_hold(MAX_HOLD),
        );
    let addr = serve(app).await;
    let started = Instant::now();
    let mut silent = quiet_client(
        addr,
        "POST /orders/42 HTTP/1.1\r\nhost: test\r\ncontent-length: 1000\r\n\r\nA",
    )
    .await;
    assert_held_until_the_max_hold(
        &locker,
        "42",
        &format!("http://{addr}/orders/42"),
        started,
        "silent client",
    )
    .await;
    // The silent request itself is answered: lock lost, 503, its handler stopped.
    let mut answer = vec![0; 64];
    let read = tokio::time::timeout(Duration::from_secs(2), silent.read(&mut answer))
        .await
        .expect("the silent request is answered")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    drop(silent);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_body_end_response_loses_the_key_at_the_max_hold() {
    let server = server();
    let locker = locker(&server).await;
    // 256 MiB in 64 KiB chunks: far more than the socket buffers take.
    let stream = || async {
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let chunks = (0..4096).map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
        Body::from_stream(futures_util::stream::iter(chunks))
    };
    let app = Router::new()
        .route("/export/{id}", post(stream))
        .route("/orders/{id}", post(|| async { "ordered" }))
        .route_layer(
            DistributedLockLayer::new(locker.clone(), KeyFrom::path_param_as::<u64>("id"))
                .hold_until(HoldUntil::BodyEnd)
                .max_hold(MAX_HOLD),
        );
    let addr = serve(app).await;
    let started = Instant::now();
    let reader = quiet_client(
        addr,
        "POST /export/7 HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n",
    )
    .await;
    assert_held_until_the_max_hold(
        &locker,
        "7",
        &format!("http://{addr}/orders/7"),
        started,
        "non-reading client under BodyEnd",
    )
    .await;
    drop(reader);
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A handler still running when its lock is lost is stopped and answered `503` under the
/// default `OnLost::Abort` (its work after the loss never runs); under `OnLost::Continue` it
/// finishes and its own answer goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_hold_is_stopped_unless_told_to_continue() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let server = server();
    let locker = locker(&server).await;
    let finished = Arc::new(AtomicUsize::new(0));
    let slow = {
        let finished = finished.clone();
        move || async move {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            finished.fetch_add(1, Ordering::SeqCst);
            "done"
        }
    };
    let hold = Duration::from_millis(500);
    let layer = DistributedLockLayer::new(locker.clone(), KeyFrom::path_param_as::<u64>("id"))
        .max_hold(hold);
    let app = Router::new()
        .route("/abort/{id}", post(slow.clone()))
        .route_layer(layer.clone())
        .route("/continue/{id}", post(slow))
        .route_layer(layer.on_lost(lock_core::OnLost::Continue));
    let addr = serve(app).await;
    let client = client();

    let started = Instant::now();
    let aborted = post_to(&client, &format!("http://{addr}/abort/1")).await;
    let answered = started.elapsed();
    assert_eq!(
        aborted.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        aborted.body
    );
    assert!(
        answered < Duration::from_millis(1_400),
        "answered after {answered:?}"
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the aborted handler ran on"
    );

    let continued = post_to(&client, &format!("http://{addr}/continue/2")).await;
    assert_eq!(continued.status, StatusCode::OK, "{}", continued.body);
    assert_eq!(finished.load(Ordering::SeqCst), 1);
    common::assert_nothing_left(&server, &[&locker]).await;
}
