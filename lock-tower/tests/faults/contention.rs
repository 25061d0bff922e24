//! Mutual exclusion over real HTTP: one request per key in the handler at a time, 409 with
//! `Retry-After` for the others, waiting in turn with a wait, parallelism across keys.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::routing::post;
use axum::Router;
use common::{client, locker, post as post_to, serve, server, Occupancy};
use http::StatusCode;
use lock_tower::{DistributedLockLayer, HeldLock, KeyFrom};
use tokio::sync::Barrier;

/// The handler under test: stays in the critical section for `hold`.
fn purchase_app(occupancy: Occupancy, hold: Duration) -> Router {
    Router::new().route(
        "/skus/{sku}/purchase",
        post(move |lock: Option<HeldLock>| {
            let occupancy = occupancy.clone();
            async move {
                occupancy.occupy(hold).await;
                match lock {
                    Some(lock) => lock.fencing_token().await.unwrap().to_string(),
                    None => String::new(),
                }
            }
        }),
    )
}

/// Sends `n` purchases of one SKU at the same moment, each from its own task.
async fn burst(addr: std::net::SocketAddr, n: usize, sku: &str) -> Vec<common::Reply> {
    let client = client();
    let start = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (client, start) = (client.clone(), start.clone());
            let url = format!("http://{addr}/skus/{sku}/purchase");
            tokio::spawn(async move {
                start.wait().await;
                post_to(&client, &url).await
            })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.expect("request task"));
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_per_key_at_a_time_others_get_409_with_retry_after() {
    let server = server();
    let locker = locker(&server).await;
    let occupancy = Occupancy::default();
    let app = purchase_app(occupancy.clone(), Duration::from_millis(500)).route_layer(
        DistributedLockLayer::new(
            locker.clone(),
            KeyFrom::path_param("sku").prefix("inventory:"),
        ),
    );
    let addr = serve(app).await;

    let replies = burst(addr, 8, "42").await;

    let ok = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    let busy: Vec<_> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CONFLICT)
        .collect();
    assert_eq!(
        occupancy.max(),
        1,
        "two requests were in the handler at once"
    );
    assert!(ok >= 1, "nobody got the lock: {replies:?}");
    assert!(!busy.is_empty(), "no contention observed: {replies:?}");
    assert_eq!(
        ok + busy.len(),
        replies.len(),
        "unexpected statuses: {replies:?}"
    );
    assert_eq!(
        occupancy.entered(),
        ok,
        "only admitted requests reach the handler"
    );
    for reply in busy {
        // Short and jittered, whatever the holder's lease.
        let retry = reply.retry_after().expect("409 carries Retry-After");
        assert!((1..=2).contains(&retry), "Retry-After {retry}");
        assert_eq!(
            reply.headers[http::header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        assert!(
            reply.body.contains("locked by another request"),
            "{}",
            reply.body
        );
    }
    // Released with the responses.
    assert!(!locker.is_locked("inventory:42").await.unwrap());
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// The control: the same burst without the layer overlaps in the handler, so the checker above
/// can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_the_layer_overlaps() {
    let occupancy = Occupancy::default();
    let addr = serve(purchase_app(occupancy.clone(), Duration::from_millis(500))).await;

    let replies = burst(addr, 8, "42").await;

    assert!(replies.iter().all(|r| r.status == StatusCode::OK));
    assert!(
        occupancy.max() > 1,
        "no overlap without the lock: the occupancy check would be vacuous"
    );
    // No leak check: no redis-server and no locker (the control runs without the layer).
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_wait_requests_are_served_in_turn() {
    let server = server();
    let locker = locker(&server).await;
    let occupancy = Occupancy::default();
    let hold = Duration::from_millis(150);
    let app = purchase_app(occupancy.clone(), hold).route_layer(
        DistributedLockLayer::new(
            locker.clone(),
            KeyFrom::path_param("sku").prefix("inventory:"),
        )
        .wait(Duration::from_secs(10)),
    );
    let addr = serve(app).await;

    let started = Instant::now();
    let replies = burst(addr, 5, "7").await;
    let elapsed = started.elapsed();

    assert!(
        replies.iter().all(|r| r.status == StatusCode::OK),
        "{replies:?}"
    );
    assert_eq!(occupancy.max(), 1);
    assert_eq!(occupancy.entered(), 5);
    assert!(
        elapsed >= hold * 5,
        "served in turn, so at least 5 holds: {elapsed:?}"
    );
    // Each holder got its own, distinct fencing token.
    let mut tokens: Vec<u64> = replies.iter().map(|r| r.body.parse().unwrap()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 5);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_keys_run_in_parallel() {
    let server = server();
    let locker = locker(&server).await;
    let keys = ["a", "b", "c", "d"];
    // Every handler waits until all four are inside: only possible if they run in parallel.
    let all_inside = Arc::new(Barrier::new(keys.len()));
    let app = Router::new()
        .route(
            "/skus/{sku}/purchase",
            post(
                |State(all_inside): State<Arc<Barrier>>, Path(sku): Path<String>| async move {
                    match tokio::time::timeout(Duration::from_secs(5), all_inside.wait()).await {
                        Ok(_) => (StatusCode::OK, sku),
                        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, sku),
                    }
                },
            ),
        )
        .route_layer(DistributedLockLayer::new(
            locker.clone(),
            KeyFrom::path_param("sku").prefix("inventory:"),
        ))
        .with_state(all_inside);
    let addr = serve(app).await;

    let client = client();
    let tasks: Vec<_> = keys
        .iter()
        .map(|sku| {
            let client = client.clone();
            let url = format!("http://{addr}/skus/{sku}/purchase");
            tokio::spawn(async move { post_to(&client, &url).await })
        })
        .collect();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    }
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A holder in another instance (another `Locker`): the 409 comes from Redis. The default
/// `Retry-After` is short and jittered (1 or 2 s), not the holder's remaining lease (which,
/// with the watchdog, says nothing about when it releases); a policy set on the layer sees
/// that lease and may use it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_short_by_default_and_a_layer_policy_sees_the_holders_lease() {
    let server = server();
    let other_instance = locker(&server).await;
    let held = other_instance
        .lock("inventory:9")
        .lease(Duration::from_secs(20))
        .await
        .unwrap();
    let occupancy = Occupancy::default();
    let layer_locker = locker(&server).await;
    let layer = DistributedLockLayer::new(
        layer_locker.clone(),
        KeyFrom::path_param("sku").prefix("inventory:"),
    );
    let default_app = purchase_app(occupancy.clone(), Duration::ZERO).route_layer(layer.clone());
    let policy_app = purchase_app(occupancy.clone(), Duration::ZERO).route_layer(
        layer.retry_after(|busy: &lock_tower::BusyInfo| busy.holder_ttl.unwrap_or_default()),
    );
    let (default_addr, policy_addr) = (serve(default_app).await, serve(policy_app).await);
    let client = client();
    let url = format!("http://{default_addr}/skus/9/purchase");

    for _ in 0..5 {
        let reply = post_to(&client, &url).await;
        assert_eq!(reply.status, StatusCode::CONFLICT);
        let retry = reply.retry_after().unwrap();
        assert!((1..=2).contains(&retry), "Retry-After {retry}");
    }
    let reply = post_to(&client, &format!("http://{policy_addr}/skus/9/purchase")).await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    let retry = reply.retry_after().unwrap();
    assert!((19..=20).contains(&retry), "Retry-After {retry}");
    assert_eq!(occupancy.entered(), 0);

    held.release().await.unwrap();
    assert_eq!(post_to(&client, &url).await.status, StatusCode::OK);
    common::assert_nothing_left(&server, &[&other_instance, &layer_locker]).await;
}

/// The release is confirmed before the response goes out: a client that sends its next
/// request for the same key as soon as it has the previous response never finds it busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_requests_of_one_client_never_see_their_own_lock() {
    let server = server();
    let occupancy = Occupancy::default();
    let locker = locker(&server).await;
    let app =
        purchase_app(occupancy.clone(), Duration::ZERO).route_layer(DistributedLockLayer::new(
            locker.clone(),
            KeyFrom::path_param("sku").prefix("inventory:"),
        ));
    let addr = serve(app).await;
    let client = client();
    let url = format!("http://{addr}/skus/1/purchase");
    let mut last = 0;
    for _ in 0..200 {
        let reply = post_to(&client, &url).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        let token: u64 = reply.body.parse().unwrap();
        assert!(token > last, "fencing tokens increase");
        last = token;
    }
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A `Retry-After` policy that returns an absurd delay (`Duration::MAX`) gets a clamped
/// header, not an overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_policy_of_duration_max_is_clamped() {
    use tower::ServiceExt;

    let server = server();
    let locker = locker(&server).await;
    let held = locker
        .lock("inventory:3")
        .lease(Duration::from_secs(20))
        .await
        .unwrap();
    let app = purchase_app(Occupancy::default(), Duration::ZERO).route_layer(
        DistributedLockLayer::new(
            locker.clone(),
            KeyFrom::path_param("sku").prefix("inventory:"),
        )
        .retry_after(|_: &lock_tower::BusyInfo| Duration::MAX),
    );
    let request = http::Request::post("/skus/3/purchase")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = tokio::spawn(app.oneshot(request))
        .await
        .expect("the layer answers without panicking")
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(response.headers()[http::header::RETRY_AFTER], "2147483648");
    held.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}
