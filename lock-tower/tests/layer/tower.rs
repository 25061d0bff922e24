//! The layer in a plain tower stack (no axum): generic bodies, `poll_ready` back-pressure, and
//! the ready inner service being the one that is called.

use crate::common;

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::{locker, server};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use lock_tower::{
    DistributedLockLayer, DistributedLockService, HeldLock, KeyFrom, LockedBody, MissingKey,
};
use tower::{Service, ServiceBuilder, ServiceExt};

type Reply = Response<LockedBody<Full<Bytes>>>;

async fn read(response: Reply) -> (StatusCode, String) {
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn works_with_a_plain_service_and_full_bodies() {
    let server = server();
    let locker = locker(&server).await;
    let service = ServiceBuilder::new()
        .layer(
            DistributedLockLayer::new(locker.clone(), |req: &Request<String>| {
                req.uri()
                    .path()
                    .strip_prefix("/orders/")
                    .map(|id| format!("order:{id}"))
            })
            .wait(Duration::ZERO)
            // The layer wraps every path; only `/orders/..` needs the lock.
            .on_missing_key(MissingKey::Pass),
        )
        .service_fn(|req: Request<String>| async move {
            let lock = req.extensions().get::<HeldLock>().cloned();
            let text = match lock {
                Some(lock) => format!("{} {}", lock.key(), req.body()),
                None => format!("unlocked {}", req.body()),
            };
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
        });

    let request = |path: &str| Request::builder().uri(path).body("hi".to_owned()).unwrap();
    let svc = service.clone();
    let reply = tokio::spawn(svc.oneshot(request("/orders/7")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read(reply).await, (StatusCode::OK, "order:7 hi".to_owned()));
    let svc = service.clone();
    let reply = tokio::spawn(svc.oneshot(request("/health")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        read(reply).await,
        (StatusCode::OK, "unlocked hi".to_owned())
    );

    // Busy, answered by the default rejection with a `Full` body.
    let held = locker.lock("order:8").await.unwrap();
    let svc = service.clone();
    let reply = tokio::spawn(svc.oneshot(request("/orders/8")))
        .await
        .unwrap()
        .unwrap();
    assert!(reply.headers().contains_key(http::header::RETRY_AFTER));
    let (status, body) = read(reply).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(body.contains("locked by another request"));
    held.release().await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// An inner service that is ready only when `open`, panics when called without having been
/// driven to readiness, and whose clones start not ready.
#[derive(Debug)]
struct Picky {
    open: Arc<AtomicBool>,
    ready: bool,
    calls: Arc<AtomicUsize>,
}

impl Clone for Picky {
    fn clone(&self) -> Self {
        Self {
            open: self.open.clone(),
            ready: false,
            calls: self.calls.clone(),
        }
    }
}

impl Service<Request<String>> for Picky {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.open.load(Ordering::SeqCst) {
            self.ready = true;
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, req: Request<String>) -> Self::Future {
        assert!(self.ready, "called without poll_ready");
        self.ready = false;
        self.calls.fetch_add(1, Ordering::SeqCst);
        let locked = req.extensions().get::<HeldLock>().is_some();
        ready(Ok(Response::new(format!("locked={locked}"))))
    }
}

#[tokio::test]
async fn readiness_is_the_inner_services_and_the_ready_one_is_called() {
    let server = server();
    let locker = locker(&server).await;
    let open = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let inner = Picky {
        open: open.clone(),
        ready: false,
        calls: calls.clone(),
    };
    let mut service = DistributedLockService::new(inner, locker.clone(), KeyFrom::fixed("picky"));

    // Back-pressure: not ready while the inner service is not.
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    assert!(service.poll_ready(&mut cx).is_pending());
    open.store(true, Ordering::SeqCst);

    // Each call is preceded by readiness; the lock is taken after `call` returned, so the
    // service that was made ready must travel with the response future.
    for _ in 0..3 {
        let future = service
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()));
        let response = tokio::spawn(future).await.unwrap().unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"locked=true");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // The service left behind is a fresh clone that must be driven to readiness again.
    assert!(!service.get_ref().ready);
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// The layer's durations at their extremes: a `wait` and a `max_hold` of `Duration::MAX`
/// saturate (no deadline, no limit), a `Retry-After` policy of `Duration::MAX` sends the
/// largest header, and a lease out of range answers `500` with the range error; nothing
/// panics, in the request or in the locker's watchdog.
#[tokio::test]
async fn the_layers_durations_saturate_or_are_refused_never_panic() {
    let server = server();
    let locker = lock_core::Locker::builder()
        .url(server.url())
        .watchdog_lease(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let layer = |layer: DistributedLockLayer<_>| {
        ServiceBuilder::new()
            .layer(layer)
            .service_fn(|req: Request<String>| async move {
                let held = req.extensions().get::<HeldLock>().is_some();
                // Long enough for watchdog ticks to pass while the lock is held.
                tokio::time::sleep(Duration::from_millis(400)).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(held.to_string()))))
            })
    };
    let key = |_: &Request<String>| Some("order:1".to_owned());
    let request = || Request::builder().uri("/").body(String::new()).unwrap();

    let saturated = layer(
        DistributedLockLayer::new(locker.clone(), key)
            .wait(Duration::MAX)
            .max_hold(Duration::MAX)
            .retry_after(|_: &lock_tower::BusyInfo| Duration::MAX),
    );
    let reply = saturated.clone().oneshot(request()).await.unwrap();
    assert_eq!(read(reply).await, (StatusCode::OK, "true".to_owned()));
    // The watchdog survived the max_hold: another lock is still renewed.
    let other = locker.lock("other").await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(other.is_held(), "the watchdog stopped renewing");
    other.release().await.unwrap();

    let busy = layer(
        DistributedLockLayer::new(locker.clone(), key)
            .retry_after(|_: &lock_tower::BusyInfo| Duration::MAX),
    );
    let held = locker.lock("order:1").await.unwrap();
    // Another task: this one's lock would be reentered.
    let reply = tokio::spawn(busy.oneshot(request()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.status(), StatusCode::CONFLICT);
    assert_eq!(
        reply.headers()[http::header::RETRY_AFTER],
        lock_tower::MAX_RETRY_AFTER_SECS.to_string()
    );
    held.release().await.unwrap();

    let refused = layer(DistributedLockLayer::new(locker.clone(), key).lease(Duration::MAX));
    let reply = refused.oneshot(request()).await.unwrap();
    assert_eq!(reply.status(), StatusCode::INTERNAL_SERVER_ERROR);
    common::assert_nothing_left(&server, &[&locker]).await;
}
