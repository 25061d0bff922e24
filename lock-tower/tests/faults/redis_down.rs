//! Redis unavailable: fail closed with 503 by default, pass through unlocked with `fail_open`.

use crate::common;

use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use common::{client, post as post_to, serve, server};
use http::StatusCode;
use lock_core::Locker;
use lock_tower::{DistributedLockLayer, HeldLock, KeyFrom};

fn app(layer: DistributedLockLayer<KeyFrom>) -> Router {
    Router::new()
        .route(
            "/skus/{sku}/purchase",
            post(|lock: Option<HeldLock>| async move {
                match lock {
                    Some(lock) => format!("locked {}", lock.key()),
                    None => "unlocked".to_owned(),
                }
            }),
        )
        .route_layer(layer)
}

/// A locker on a server that is then killed; short timeouts so it fails fast.
async fn dead_locker() -> (lock_testkit::RedisServer, Locker) {
    let mut server = server();
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    server.kill9();
    (server, locker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_closed_with_503_by_default() {
    let (_server, locker) = dead_locker().await;
    let layer = DistributedLockLayer::new(locker, KeyFrom::path_param("sku").prefix("inventory:"));
    let addr = serve(app(layer)).await;

    let started = Instant::now();
    let reply = post_to(&client(), &format!("http://{addr}/skus/42/purchase")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert!(reply.body.contains("unavailable"), "{}", reply.body);
    // A retrying client is told when to come back, a second or two, jittered.
    assert!(matches!(reply.retry_after(), Some(1 | 2)), "{reply:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // No leak check: the server is dead for good (SIGKILL).
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_passes_the_request_through_unlocked() {
    let (_server, locker) = dead_locker().await;
    let layer = DistributedLockLayer::new(locker, KeyFrom::path_param("sku").prefix("inventory:"))
        .fail_open();
    let addr = serve(app(layer)).await;

    let reply = post_to(&client(), &format!("http://{addr}/skus/42/purchase")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body, "unlocked");
    // No leak check: the server is dead for good (SIGKILL).
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_server_locks_as_usual() {
    let server = server();
    let locker = common::locker(&server).await;
    let layer = DistributedLockLayer::new(
        locker.clone(),
        KeyFrom::path_param("sku").prefix("inventory:"),
    )
    .fail_open();
    let addr = serve(app(layer)).await;

    let reply = post_to(&client(), &format!("http://{addr}/skus/42/purchase")).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "locked inventory:42");
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// During an outage the layer writes its warning about once a second with the number left out,
/// not one line per rejected request.
#[tokio::test]
async fn an_outage_is_logged_once_a_second_not_per_request() {
    let (logs, _capture) = lock_testkit::LogBuffer::capture(tracing::Level::WARN);
    let (_server, locker) = dead_locker().await;
    let layer = DistributedLockLayer::new(locker, KeyFrom::path_param("sku").prefix("inventory:"));
    let addr = serve(app(layer)).await;
    let client = client();
    let started = Instant::now();
    let requests = 300;
    // In waves of 50 at once: each rejection waits for the connect timeout.
    for wave in 0..requests / 50 {
        let replies = (0..50).map(|i| {
            let client = client.clone();
            async move {
                let url = format!("http://{addr}/skus/{}/purchase", wave * 50 + i);
                post_to(&client, &url).await
            }
        });
        for reply in futures_util::future::join_all(replies).await {
            assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
        }
    }
    let seconds = started.elapsed().as_secs() + 1;
    let text = logs.text();
    let lines = text.matches("request rejected (fail closed)").count();
    lock_testkit::figure(&format!(
        "outage: {requests} requests rejected in {:?}, {lines} warning lines",
        started.elapsed()
    ));
    assert!(lines >= 1, "the outage was not logged: {text}");
    assert!(
        u64::try_from(lines).unwrap() <= seconds + 1,
        "{lines} warning lines for {requests} requests in {seconds} s"
    );
    if lines > 1 {
        assert!(text.contains("left_out="), "{text}");
    }
}
