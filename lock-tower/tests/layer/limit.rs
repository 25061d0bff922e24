//! The distributed concurrency limit (`Mode::Limit`) against a real `redis-server`: at most N
//! requests per key inside across two instances, the others answered `429` with
//! `Retry-After`, waiting requests let in as permits come back, other keys unaffected.

use crate::common;

use std::time::Duration;

use axum::extract::Path;
use axum::routing::post;
use axum::Router;
use common::{client, locker, post as send_post, serve, server, Occupancy};
use http::StatusCode;
use lock_core::Locker;
use lock_tower::{DistributedLockLayer, KeyFrom};

/// `POST /export/t1` to every address at once; the replies in order.
async fn at_once(
    addrs: impl Iterator<Item = std::net::SocketAddr>,
    client: &common::HttpClient,
) -> Vec<common::Reply> {
    let sent: Vec<_> = addrs
        .map(|addr| {
            let client = client.clone();
            tokio::spawn(
                async move { send_post(&client, &format!("http://{addr}/export/t1")).await },
            )
        })
        .collect();
    let mut replies = Vec::new();
    for reply in sent {
        replies.push(reply.await.unwrap());
    }
    replies
}

/// `POST /export/{tenant}` holding a permit of the tenant's limit of 2 for 150 ms.
fn export_app(locker: Locker, inside: Occupancy, wait: Duration) -> Router {
    Router::new()
        .route(
            "/export/{tenant}",
            post(move |Path(_tenant): Path<String>| {
                let inside = inside.clone();
                async move {
                    inside.occupy(Duration::from_millis(150)).await;
                    "exported"
                }
            }),
        )
        .route_layer(
            DistributedLockLayer::concurrency_limit(
                locker,
                KeyFrom::path_param("tenant").prefix("exports:"),
                2,
            )
            .expect("a limit of 2")
            .wait(wait),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_two_requests_per_key_across_two_instances_the_rest_429() {
    let server = server();
    let inside = Occupancy::default();
    let a = serve(export_app(
        locker(&server).await,
        inside.clone(),
        Duration::ZERO,
    ))
    .await;
    let b = serve(export_app(
        locker(&server).await,
        inside.clone(),
        Duration::ZERO,
    ))
    .await;
    let client = client();
    let replies = at_once((0..8).map(|i| if i % 2 == 0 { a } else { b }), &client).await;
    let ok = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    let full: Vec<_> = replies
        .iter()
        .filter(|r| r.status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert_eq!(
        ok + full.len(),
        8,
        "{:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert!(ok >= 2, "the two permits were used ({ok})");
    assert!(
        inside.max() <= 2,
        "{} requests inside at once",
        inside.max()
    );
    assert!(full.iter().all(|r| r.retry_after().is_some_and(|s| s >= 1)));
    // Another tenant has its own permits.
    let other = send_post(&client, &format!("http://{a}/export/t2")).await;
    assert_eq!(other.status, StatusCode::OK);
    // (The lockers live in the apps: the server's side is checked.)
    common::assert_nothing_left(&server, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_all_get_through_two_at_a_time() {
    let server = server();
    let inside = Occupancy::default();
    let wait = Duration::from_secs(20);
    let a = serve(export_app(locker(&server).await, inside.clone(), wait)).await;
    let b = serve(export_app(locker(&server).await, inside.clone(), wait)).await;
    let client = client();
    let replies = at_once((0..8).map(|i| if i % 2 == 0 { a } else { b }), &client).await;
    assert!(replies.iter().all(|r| r.status == StatusCode::OK));
    assert_eq!(inside.max(), 2, "the limit was reached and never passed");
    common::assert_nothing_left(&server, &[]).await;
}

/// The checker of the tests above, with the layer taken away: it sees more than two inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_the_limit_more_than_two_are_inside() {
    let inside = Occupancy::default();
    let app = {
        let inside = inside.clone();
        Router::new().route(
            "/export/{tenant}",
            post(move || {
                let inside = inside.clone();
                async move {
                    inside.occupy(Duration::from_millis(150)).await;
                    "exported"
                }
            }),
        )
    };
    let addr = serve(app).await;
    at_once((0..8).map(|_| addr), &client()).await;
    assert!(inside.max() > 2, "{}", inside.max());
}

/// Redis down: the limit fails closed like the mutex, `503 Service Unavailable`, promptly,
/// and the handler never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_503() {
    let mut server = server();
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    server.kill9();
    let inside = Occupancy::default();
    let addr = serve(export_app(locker, inside.clone(), Duration::ZERO)).await;
    let started = std::time::Instant::now();
    let reply = send_post(&client(), &format!("http://{addr}/export/t1")).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert!(reply.body.contains("unavailable"), "{}", reply.body);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(inside.max(), 0, "the handler ran without a permit");
    // No leak check: the server is dead for good (SIGKILL).
}

/// A limit of 0 can admit nobody: the layer refuses it when it is built, instead of answering
/// every request `500`; a limit of 1 is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_of_zero_is_refused_when_the_layer_is_built() {
    let server = server();
    let locker = locker(&server).await;
    let key = || KeyFrom::path_param_as::<u32>("tenant").prefix("exports:");
    let refused = DistributedLockLayer::concurrency_limit(locker.clone(), key(), 0);
    let Err(error) = refused else {
        panic!("a limit of 0 was accepted");
    };
    assert!(
        matches!(
            error,
            lock_core::ConfigError::Permits {
                permits: 0,
                wanted: 1
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("0 permits"), "{error}");

    let one = DistributedLockLayer::concurrency_limit(locker.clone(), key(), 1)
        .expect("a limit of 1 is built");
    let app = Router::new()
        .route("/export/{tenant}", post(|| async { "exported" }))
        .route_layer(one);
    let addr = serve(app).await;
    let reply = send_post(&client(), &format!("http://{addr}/export/1")).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// n simultaneous requests to one instance under a limit of n, every permit free: all are
/// admitted, every round. (Before the zero-wait semaphore acquire stopped taking the process's
/// one-place turn, a request that met a sibling mid-try was answered 429 with permits free:
/// about one request per key and instance got in at a time.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_requests_under_a_limit_with_permits_free_are_all_admitted() {
    let server = server();
    let inside = Occupancy::default();
    let app = serve(export_app(
        locker(&server).await,
        inside.clone(),
        Duration::ZERO,
    ))
    .await;
    let client = client();
    for round in 0..20 {
        let replies = at_once([app, app].into_iter(), &client).await;
        let statuses: Vec<_> = replies.iter().map(|r| r.status).collect();
        assert_eq!(
            statuses,
            [StatusCode::OK, StatusCode::OK],
            "round {round}: 2 requests under a limit of 2 with both permits free"
        );
    }
    assert!(inside.max() <= 2, "{} inside at once", inside.max());
    assert_eq!(inside.entered(), 40);
    common::assert_nothing_left(&server, &[]).await;
}
