//! The handler knows what the layer knows: `HeldLock::is_held` and `HeldLock::lost` (and the
//! same on `HeldLocks`) see a lock lost behind the request under `OnLost::Continue`; busy
//! answers carry `Retry-After` with whatever status the layer gives them, and a `Reject` that
//! builds its own busy answer keeps its status.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use common::{client, locker, post as post_to, serve, server};
use http::StatusCode;
use lock_core::{Locker, OnLost};
use lock_tower::{DistributedLockLayer, HeldLock, HeldLocks, KeyFrom};
use tokio::sync::Notify;

/// How long a handler waits to see the loss before it gives up.
const LIMIT: Duration = Duration::from_secs(5);

/// A locker whose watchdog renews every 200 ms, so a key deleted behind it is noticed soon.
async fn quick_locker(server: &lock_testkit::RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_millis(600))
        .build()
        .await
        .expect("connect locker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_continues_after_a_loss_sees_it() {
    let server = server();
    let admin = locker(&server).await;
    let locker = quick_locker(&server).await;
    let entered = Arc::new(Notify::new());
    let jobs = Router::new()
        .route(
            "/jobs/{id}",
            post({
                let entered = entered.clone();
                move |lock: HeldLock| async move {
                    let before = lock.is_held();
                    entered.notify_one();
                    let seen = tokio::time::timeout(LIMIT, lock.lost()).await.is_ok();
                    format!(
                        "{before} {seen} {} {:?}",
                        lock.is_held(),
                        lock.lost_reason()
                    )
                }
            }),
        )
        .route_layer(
            DistributedLockLayer::new(locker.clone(), KeyFrom::path_param("id"))
                .on_lost(OnLost::Continue),
        );
    let transfers = Router::new()
        .route(
            "/transfers/{from}/{to}",
            post({
                let entered = entered.clone();
                move |locks: HeldLocks| async move {
                    let before = locks.is_held();
                    entered.notify_one();
                    let seen = tokio::time::timeout(LIMIT, locks.lost()).await.is_ok();
                    let lost = locks.lost_lock().map(|lock| lock.key().to_owned());
                    format!("{before} {seen} {} {lost:?}", locks.is_held())
                }
            }),
        )
        .route_layer(
            DistributedLockLayer::new(locker.clone(), KeyFrom::path_params(["from", "to"]))
                .on_lost(OnLost::Continue),
        );
    let app = jobs.merge(transfers);
    let addr = serve(app).await;

    let request =
        tokio::spawn(async move { post_to(&client(), &format!("http://{addr}/jobs/1")).await });
    entered.notified().await;
    assert!(admin.force_unlock("1").await.unwrap(), "the key was held");
    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body, "true true false Some(Deleted)");

    let request =
        tokio::spawn(
            async move { post_to(&client(), &format!("http://{addr}/transfers/3/4")).await },
        );
    entered.notified().await;
    assert!(admin.force_unlock("4").await.unwrap(), "the key was held");
    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body, "true true false Some(\"4\")");
    common::assert_nothing_left(&server, &[&locker, &admin]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_answers_carry_retry_after_with_the_status_the_layer_gives_them() {
    let server = server();
    let locker = locker(&server).await;
    let holder = common::locker(&server).await;
    let held = holder.lock("sku:1").await.unwrap();
    for status in [
        StatusCode::CONFLICT,
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::SERVICE_UNAVAILABLE,
    ] {
        let mut layer =
            DistributedLockLayer::new(locker.clone(), KeyFrom::path_param("sku").prefix("sku:"));
        if status != StatusCode::CONFLICT {
            layer = layer.busy_status(status);
        }
        let app = Router::new()
            .route("/skus/{sku}/purchase", post(|| async { "bought" }))
            .route_layer(layer);
        let addr = serve(app).await;
        let reply = post_to(&client(), &format!("http://{addr}/skus/1/purchase")).await;
        assert_eq!(reply.status, status, "{reply:?}");
        assert!(matches!(reply.retry_after(), Some(1 | 2)), "{reply:?}");
        assert!(reply.body.contains("locked"), "{reply:?}");
    }
    held.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker, &holder]).await;
}

/// `busy_status` changes only busy answers that keep the default status: a `Reject` that
/// passes busy rejections on to the default response gets it, one that builds its own busy
/// answer keeps its own status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_status_leaves_a_custom_busy_answer_alone() {
    use axum::response::{IntoResponse, Response};
    use lock_tower::Rejection;

    let server = server();
    let locker = locker(&server).await;
    let holder = common::locker(&server).await;
    let held = holder.lock("sku:1").await.unwrap();
    let own = |rejection: Rejection| -> Response {
        match rejection {
            Rejection::Busy { .. } => (StatusCode::LOCKED, "locked\n").into_response(),
            other => other.into_response(),
        }
    };
    let passed_on = |rejection: Rejection| -> Response { rejection.into_response() };
    for (name, expected) in [
        ("own", StatusCode::LOCKED),
        ("passed_on", StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let layer =
            DistributedLockLayer::new(locker.clone(), KeyFrom::path_param("sku").prefix("sku:"))
                .busy_status(StatusCode::SERVICE_UNAVAILABLE);
        let route = Router::new().route("/skus/{sku}/purchase", post(|| async { "bought" }));
        let app = if name == "own" {
            route.route_layer(layer.reject_with(own))
        } else {
            route.route_layer(layer.reject_with(passed_on))
        };
        let addr = serve(app).await;
        let reply = post_to(&client(), &format!("http://{addr}/skus/1/purchase")).await;
        assert_eq!(reply.status, expected, "{name}: {reply:?}");
    }
    held.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker, &holder]).await;
}
