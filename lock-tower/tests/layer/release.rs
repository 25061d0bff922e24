//! The lock lives as long as the response: released when the client disconnects, when the
//! handler panics, and (with `HoldUntil::BodyEnd`) held until the body ends.

use crate::common;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use common::{client, locker, post as post_to, serve, server, time_until_unlocked};
use http::StatusCode;
use http_body::Frame;
use http_body_util::BodyExt;
use lock_tower::{DistributedLockLayer, HoldUntil, KeyFrom, Mode};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};
use tower::ServiceExt;
use tower_http::catch_panic::CatchPanicLayer;

/// Sends a handle when the guarded future is dropped.
struct OnDrop(Option<oneshot::Sender<()>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_releases_the_lock() {
    let server = server();
    let locker = locker(&server).await;
    let (entered_tx, mut entered_rx) = mpsc::unbounded_channel::<()>();
    let (dropped_tx, dropped_rx) = oneshot::channel::<()>();
    let dropped_tx = Arc::new(Mutex::new(Some(dropped_tx)));
    let app = Router::new()
        .route(
            "/skus/{sku}/purchase",
            post(move |request: Request| {
                let entered_tx = entered_tx.clone();
                let dropped_tx = dropped_tx.clone();
                async move {
                    if request.uri().query() == Some("slow") {
                        let _cancelled = OnDrop(dropped_tx.lock().unwrap().take());
                        entered_tx.send(()).unwrap();
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    "done"
                }
            }),
        )
        .route_layer(
            // A fixed 30 s lease: only a release can free the key before it runs out.
            DistributedLockLayer::new(
                locker.clone(),
                KeyFrom::path_param("sku").prefix("inventory:"),
            )
            .lease(Duration::from_secs(30)),
        );
    let addr = serve(app).await;

    // A raw HTTP/1.1 client that sends its request and hangs up while the handler sleeps.
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"POST /skus/42/purchase?slow HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n",
        )
        .await
        .unwrap();
    entered_rx.recv().await.expect("the handler runs");
    assert!(locker.is_locked("inventory:42").await.unwrap());
    drop(stream);

    // hyper notices the hang-up and drops the request future, and with it the guard.
    tokio::time::timeout(Duration::from_secs(5), dropped_rx)
        .await
        .expect("handler future dropped after the disconnect")
        .unwrap();
    let freed = time_until_unlocked(&locker, "inventory:42", Duration::from_secs(5))
        .await
        .expect("lock released after the disconnect");
    assert!(freed < Duration::from_secs(2), "released after {freed:?}");
    // The next request gets the lock at once (the layer fails fast by default).
    let reply = post_to(&client(), &format!("http://{addr}/skus/42/purchase")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_releases_the_lock() {
    let server = server();
    let locker = locker(&server).await;
    let app = Router::new()
        .route(
            "/skus/{sku}/purchase",
            post(|request: Request| async move {
                if request.uri().query() == Some("panic") {
                    panic!("handler bug (expected by the test)");
                }
                "done"
            }),
        )
        .route_layer(
            DistributedLockLayer::new(
                locker.clone(),
                KeyFrom::path_param("sku").prefix("inventory:"),
            )
            .lease(Duration::from_secs(30)),
        )
        .layer(CatchPanicLayer::new());
    let addr = serve(app).await;
    let client = client();

    let reply = post_to(&client, &format!("http://{addr}/skus/42/purchase?panic")).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);

    let freed = time_until_unlocked(&locker, "inventory:42", Duration::from_secs(5))
        .await
        .expect("lock released after the panic");
    assert!(freed < Duration::from_secs(2), "released after {freed:?}");
    let reply = post_to(&client, &format!("http://{addr}/skus/42/purchase")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A body fed by a channel: a frame per message, the end when the sender is dropped.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

/// A route whose response body streams until the test ends it through the sender pushed to
/// `senders`.
fn streaming_app(
    locker: lock_core::Locker,
    hold: HoldUntil,
) -> (Router, Arc<Mutex<Vec<mpsc::Sender<Bytes>>>>) {
    let senders = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route(
            "/report",
            get({
                let senders = senders.clone();
                move || {
                    let senders = senders.clone();
                    async move {
                        let (tx, rx) = mpsc::channel(4);
                        senders.lock().unwrap().push(tx);
                        Body::new(ChannelBody(rx))
                    }
                }
            }),
        )
        .route_layer(
            // Exclusive for the GETs too (the default would let them read together): these
            // tests see the hold through a second request that finds the key taken.
            DistributedLockLayer::new(locker, KeyFrom::fixed("report"))
                .mode(Mode::Exclusive)
                .lease(Duration::from_secs(30))
                .hold_until(hold),
        );
    (app, senders)
}

/// One request from its own task (a lock owner of its own), returning the response unread.
async fn spawn_get(app: &Router) -> http::Response<Body> {
    let app = app.clone();
    let request = http::Request::get("/report").body(Body::empty()).unwrap();
    tokio::spawn(async move { app.oneshot(request).await.unwrap() })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_end_holds_the_lock_until_the_body_is_finished() {
    let server = server();
    let locker = locker(&server).await;
    let (app, senders) = streaming_app(locker.clone(), HoldUntil::BodyEnd);

    let first = spawn_get(&app).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(
        locker.is_locked("report").await.unwrap(),
        "held while the body streams"
    );
    let second = spawn_get(&app).await;
    assert_eq!(second.status(), StatusCode::CONFLICT);

    let tx = senders.lock().unwrap().pop().unwrap();
    let reader = tokio::spawn(async move { first.into_body().collect().await.unwrap().to_bytes() });
    tx.send(Bytes::from_static(b"row 1\n")).await.unwrap();
    tx.send(Bytes::from_static(b"row 2\n")).await.unwrap();
    assert!(
        locker.is_locked("report").await.unwrap(),
        "held until the end"
    );
    drop(tx);
    assert_eq!(&reader.await.unwrap()[..], b"row 1\nrow 2\n");
    // The end of the body is passed on only after the release.
    assert!(!locker.is_locked("report").await.unwrap());
    assert_eq!(spawn_get(&app).await.status(), StatusCode::OK);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_body_that_is_dropped_releases_the_lock() {
    let server = server();
    let locker = locker(&server).await;
    let (app, _senders) = streaming_app(locker.clone(), HoldUntil::BodyEnd);

    let first = spawn_get(&app).await;
    assert!(locker.is_locked("report").await.unwrap());
    drop(first);
    let freed = time_until_unlocked(&locker, "report", Duration::from_secs(5))
        .await
        .expect("released when the body is dropped");
    assert!(freed < Duration::from_secs(2), "released after {freed:?}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_the_lock_is_released_with_the_response_head() {
    let server = server();
    let locker = locker(&server).await;
    let (app, senders) = streaming_app(locker.clone(), HoldUntil::Response);

    let first = spawn_get(&app).await;
    assert_eq!(first.status(), StatusCode::OK);
    // The body is still open, but the lock is already released.
    assert!(!locker.is_locked("report").await.unwrap());
    let second = spawn_get(&app).await;
    assert_eq!(second.status(), StatusCode::OK);
    senders.lock().unwrap().clear();
    assert!(first
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .is_empty());
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_end_with_a_single_frame_body_over_http() {
    let server = server();
    let locker = locker(&server).await;
    let app = Router::new()
        .route("/skus/{sku}/purchase", post(|| async { "bought" }))
        .route_layer(
            DistributedLockLayer::new(
                locker.clone(),
                KeyFrom::path_param("sku").prefix("inventory:"),
            )
            .hold_until(HoldUntil::BodyEnd),
        );
    let addr = serve(app).await;
    let client = client();
    for _ in 0..50 {
        let reply = post_to(&client, &format!("http://{addr}/skus/5/purchase")).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert_eq!(reply.body, "bought");
        assert_eq!(reply.headers[http::header::CONTENT_LENGTH], "6");
    }
    assert!(!locker.is_locked("inventory:5").await.unwrap());
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A response future dropped while it waits for Redis to confirm the release (the client hangs
/// up at that moment) still releases the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_response_while_it_releases_still_releases() {
    use std::future::Future;

    use lock_tower::DistributedLockService;
    use tower::Service;

    let server = server();
    let locker = locker(&server).await;
    let inner = tower::service_fn(|_: http::Request<String>| async {
        Ok::<_, Infallible>(http::Response::new(String::from("done")))
    });
    let mut service = DistributedLockService::new(inner, locker.clone(), KeyFrom::fixed("k"));
    let mut reached = 0;
    for _ in 0..20 {
        service.ready().await.unwrap();
        let mut future = Box::pin(service.call(http::Request::new(String::new())));
        let releasing = std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
            Poll::Ready(_) => Poll::Ready(false),
            Poll::Pending if format!("{future:?}").contains("releasing") => Poll::Ready(true),
            Poll::Pending => Poll::Pending,
        })
        .await;
        reached += usize::from(releasing);
        drop(future);
        let freed = time_until_unlocked(&locker, "k", Duration::from_secs(5))
            .await
            .expect("released although the response future was dropped mid-release");
        assert!(freed < Duration::from_secs(2), "released after {freed:?}");
    }
    assert!(reached > 0, "never caught the future mid-release");
    common::assert_nothing_left(&server, &[&locker]).await;
}
