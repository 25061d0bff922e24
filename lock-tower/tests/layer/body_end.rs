//! `HoldUntil::BodyEnd` at the edges of a body: a response that has no body to send (empty,
//! `204`, `304`, the answer to a `HEAD`) is released before it is passed on, since hyper drops
//! such a body without polling it; and a body whose lock is lost while it streams ends with
//! the lock-lost error instead of streaming on unlocked.

use crate::common;

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use common::{locker, server};
use http::{Method, Request, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use lock_tower::{DistributedLockLayer, HoldUntil, KeyFrom};

/// The routes of one key `{k}`: four that answer without a body, and `/next` to follow them.
fn app(locker: lock_core::Locker) -> Router {
    Router::new()
        .route("/empty/{k}", post(|| async { StatusCode::OK }))
        .route("/no-content/{k}", post(|| async { StatusCode::NO_CONTENT }))
        .route(
            "/not-modified/{k}",
            post(|| async { StatusCode::NOT_MODIFIED }),
        )
        // A `HEAD` of a `GET` route: axum runs the handler and hyper sends no body.
        .route("/page/{k}", get(|| async { "a page with a body" }))
        .route("/next/{k}", post(|| async { "next" }))
        .route_layer(
            // A fixed 30 s lease: only a release frees the key before the next request. The
            // `HEAD` takes the read lock (the default mode), `/next` the exclusive one.
            DistributedLockLayer::new(locker, KeyFrom::path_param("k").prefix("edge:"))
                .lease(Duration::from_secs(30))
                .hold_until(HoldUntil::BodyEnd),
        )
}

/// Serves `app` on a free loopback port with `TCP_NODELAY`: a `BodyEnd` body's last frame
/// goes out after the release, apart from the head, and Nagle's algorithm would hold it
/// back for the client's delayed ACK (about 40 ms a response).
async fn serve(app: Router) -> std::net::SocketAddr {
    use axum::serve::ListenerExt;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let listener = listener.tap_io(|stream| {
        let _ = stream.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

/// One keep-alive HTTP/1.1 connection.
struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
}

impl Connection {
    async fn open(addr: std::net::SocketAddr) -> Self {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        // Requests go out at once, not held back for the previous one's ACK.
        stream.set_nodelay(true).expect("nodelay");
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(connection);
        Self { sender }
    }

    /// Sends a request and reads its response to the end.
    async fn send(&mut self, method: Method, path: &str) -> StatusCode {
        self.sender.ready().await.expect("connection ready");
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "test")
            .body(Empty::new())
            .expect("request");
        let response = self.sender.send_request(request).await.expect("response");
        let status = response.status();
        response.into_body().collect().await.expect("body");
        status
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_without_a_body_is_released_before_it_is_passed_on() {
    let server = server();
    let locker = locker(&server).await;
    let addr = serve(app(locker.clone())).await;
    let cases = [
        (Method::POST, "empty", StatusCode::OK),
        (Method::POST, "no-content", StatusCode::NO_CONTENT),
        (Method::POST, "not-modified", StatusCode::NOT_MODIFIED),
        (Method::HEAD, "page", StatusCode::OK),
    ];
    let mut refusals = Vec::new();
    for (method, route, status) in cases {
        let mut connection = Connection::open(addr).await;
        let mut refused = 0;
        for i in 0..30 {
            assert_eq!(
                connection
                    .send(method.clone(), &format!("/{route}/{i}"))
                    .await,
                status,
                "{method} /{route}"
            );
            // At once, on the same connection: the first request's lock must be gone.
            let next = connection.send(Method::POST, &format!("/next/{i}")).await;
            refused += usize::from(next != StatusCode::OK);
        }
        refusals.push(format!("{method} /{route}: {refused}"));
        lock_testkit::figure(&format!(
            "BodyEnd, {method} /{route} then POST of the key on one connection: refused {refused} of 30"
        ));
    }
    assert!(
        refusals.iter().all(|r| r.ends_with(": 0")),
        "next requests for the key refused, of 30 each: {refusals:?}"
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A body that sends a frame every 50 ms, forever.
struct Ticker(tokio::time::Interval);

impl http_body::Body for Ticker {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_tick(cx)
            .map(|_| Some(Ok(Frame::data(Bytes::from_static(b"tick\n")))))
    }
}

/// `POST /report`, whose body ticks every 50 ms forever, behind a lock with a fixed 300 ms
/// lease (not renewed): the lock is lost 300 ms in, while the body streams.
fn ticking_app(locker: lock_core::Locker) -> Router {
    Router::new()
        .route(
            "/report",
            post(|| async { Body::new(Ticker(tokio::time::interval(Duration::from_millis(50)))) }),
        )
        .route_layer(
            DistributedLockLayer::new(locker, KeyFrom::fixed("report"))
                .lease(Duration::from_millis(300))
                .hold_until(HoldUntil::BodyEnd),
        )
}

/// Reads `body` until it ends, errs, or 5 s pass: the frames read, the error, and when.
async fn read_until_it_stops<B>(
    mut body: B,
    started: Instant,
) -> (usize, Option<B::Error>, Duration)
where
    B: http_body::Body + Unpin,
{
    let mut frames = 0;
    while started.elapsed() < Duration::from_secs(5) {
        match tokio::time::timeout(Duration::from_secs(5), body.frame()).await {
            Ok(Some(Ok(_))) => frames += 1,
            Ok(Some(Err(error))) => return (frames, Some(error), started.elapsed()),
            Ok(None) | Err(_) => break,
        }
    }
    (frames, None, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_whose_lock_is_lost_ends_with_the_lost_error() {
    use tower::ServiceExt;

    let server = server();
    let locker = locker(&server).await;
    let app = ticking_app(locker.clone());

    // In the process: the body's error is the lock-lost error.
    let started = Instant::now();
    let request = Request::post("/report").body(Body::empty()).unwrap();
    let response = tokio::spawn(app.clone().oneshot(request))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (frames, error, at) = read_until_it_stops(response.into_body(), started).await;
    let Some(error) = error else {
        panic!("{frames} frames over {at:?}, the lock lost 300 ms in, and no error");
    };
    // axum's body error wraps the layer's.
    let lost = std::error::Error::source(&error)
        .and_then(|source| source.downcast_ref::<lock_core::LockError>());
    assert!(
        matches!(lost, Some(lock_core::LockError::Lost { key, .. }) if key == "report"),
        "{error:?}"
    );
    lock_testkit::figure(&format!(
        "BodyEnd body, lock lost at its 300 ms lease: ended with LockError::Lost {at:?} in, after {frames} frames"
    ));
    assert!(frames >= 3, "streamed while held: {frames} frames");
    assert!(
        (Duration::from_millis(250)..Duration::from_secs(2)).contains(&at),
        "ended {at:?} in, the lease being 300 ms"
    );

    // Over HTTP: the client sees the response broken off, not a complete body. First the
    // key must be gone from Redis too: the local clock counts the lease 1 % short.
    common::time_until_unlocked(&locker, "report", Duration::from_secs(5))
        .await
        .expect("the lost lock's key expires");
    let addr = serve(app).await;
    let mut connection = Connection::open(addr).await;
    connection.sender.ready().await.unwrap();
    let request = Request::post("/report")
        .header(http::header::HOST, "test")
        .body(Empty::new())
        .unwrap();
    let started = Instant::now();
    let response = connection.sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (frames, error, at) = read_until_it_stops(response.into_body(), started).await;
    assert!(
        error.is_some(),
        "{frames} frames over {at:?} after the lock was lost, and no error"
    );
    assert!(at < Duration::from_secs(2), "ended {at:?} in");
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// The same four cases below hyper, with the response kept: the layer's response future has
/// released the lock by the time it hands the response over, body unread and not dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_of_a_body_less_response_is_released_when_the_response_is_handed_over() {
    use lock_tower::DistributedLockService;
    use tower::ServiceExt;

    let server = server();
    let locker = locker(&server).await;
    let inner = tower::service_fn(|request: Request<String>| async move {
        let status = match request.uri().path() {
            "/no-content" => StatusCode::NO_CONTENT,
            "/not-modified" => StatusCode::NOT_MODIFIED,
            _ => StatusCode::OK,
        };
        // The `HEAD` gets a body, as a `GET` handler writes it; hyper would not send it.
        let body = match request.uri().path() {
            "/page" => http_body_util::Full::new(Bytes::from_static(b"a page")),
            _ => http_body_util::Full::new(Bytes::new()),
        };
        let mut response = http::Response::new(body);
        *response.status_mut() = status;
        Ok::<_, Infallible>(response)
    });
    let layer = DistributedLockLayer::new(locker.clone(), KeyFrom::fixed("edge"))
        .lease(Duration::from_secs(30))
        .hold_until(HoldUntil::BodyEnd)
        .reject_with(|rejection: lock_tower::Rejection| {
            panic!("rejected: {rejection:?}");
        });
    let service: DistributedLockService<_, _, _> = tower::Layer::layer(&layer, inner);
    let mut held = Vec::new();
    for (method, path) in [
        (Method::POST, "/empty"),
        (Method::POST, "/no-content"),
        (Method::POST, "/not-modified"),
        (Method::HEAD, "/page"),
    ] {
        let request = Request::builder()
            .method(method.clone())
            .uri(path)
            .body(String::new())
            .unwrap();
        let response = tokio::spawn(service.clone().oneshot(request))
            .await
            .unwrap()
            .unwrap();
        if locker.is_locked("edge").await.unwrap() || response.body().holds_lock() {
            held.push(format!("{method} {path}"));
        }
        // Kept until here: dropping the body would release the lock in the background.
        drop(response);
        common::time_until_unlocked(&locker, "edge", Duration::from_secs(5))
            .await
            .expect("released");
    }
    assert!(
        held.is_empty(),
        "still locked when the response was handed over: {held:?}"
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}
