//! The router called in-process with `tower::ServiceExt::oneshot` (axum's `examples/testing`
//! style), against a real redis-server and a temporary SQLite file.

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use inventory::db::{Db, SkuStatus};
use inventory::{app, ErrorBody, ErrorCode, Inventory, Sale, ServiceConfig};
use lock_core::Locker;
use lock_testkit::RedisServer;
use tower::ServiceExt;

/// The purchase endpoints of the service.
const VARIANTS: [&str; 4] = ["macro", "layer", "layer-fail-fast", "fenced"];

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn call(app: &Router, method: Method, uri: &str) -> (StatusCode, String) {
    let request = Request::builder().method(method).uri(uri);
    let request = request.body(Body::empty()).expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    (status, String::from_utf8(bytes.to_vec()).expect("utf-8"))
}

/// Sets the stock of `sku` (creating it).
async fn restock(db: &Db, sku: i64, stock: i64) {
    db.call(move |conn| {
        conn.execute(
            "INSERT INTO skus (id, name, stock) VALUES (?1, 'gadget', ?2)
             ON CONFLICT (id) DO UPDATE SET stock = ?2",
            (sku, stock),
        )?;
        Ok(())
    })
    .await
    .expect("restock");
}

async fn buy(app: &Router, sku: i64, variant: &str) -> Result<Sale, ErrorBody> {
    let uri = format!("/skus/{sku}/purchase/{variant}");
    let (status, body) = call(app, Method::POST, &uri).await;
    if status == StatusCode::OK {
        Ok(serde_json::from_str(&body).expect("sale"))
    } else {
        Err(serde_json::from_str(&body).expect("error body"))
    }
}

/// A fresh instance on a temporary database; the database too, to set stocks.
async fn instance(redis: &RedisServer, name: &str) -> (Router, Db, TempDir) {
    let dir =
        TempDir(std::env::temp_dir().join(format!("inventory-{name}-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let db = Db::open(dir.0.join("inventory.db")).expect("db");
    let locker = Locker::connect(&redis.url()).await.expect("locker");
    let app = app(Inventory::new(locker, db.clone(), ServiceConfig::default()));
    (app, db, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_through_every_endpoint() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let (app, db, _dir) = instance(&redis, "router").await;

    assert_eq!(
        call(&app, Method::GET, "/health").await,
        (StatusCode::OK, "ok".into())
    );
    // The demo SKU is seeded.
    let (status, body) = call(&app, Method::GET, "/skus/42").await;
    assert_eq!(status, StatusCode::OK);
    let seeded: SkuStatus = serde_json::from_str(&body).expect("status");
    assert_eq!((seeded.stock, seeded.sold), (100, 0));

    restock(&db, 7, 4).await;
    let mut stock = 4;
    let mut fences = Vec::new();
    for variant in VARIANTS {
        let sale = buy(&app, 7, variant).await.expect("in stock");
        stock -= 1;
        assert_eq!(sale.stock_left, stock, "{variant}");
        assert_eq!(sale.variant, variant);
        // Every write carries the lock's fencing token, larger for every later holder.
        fences.push(sale.fencing_token.expect("fenced"));
    }
    assert!(fences.is_sorted() && fences[0] < fences[3], "{fences:?}");
    for variant in VARIANTS {
        let error = buy(&app, 7, variant).await.expect_err("sold out");
        assert_eq!(error.error, ErrorCode::SoldOut, "{variant}");
    }
    let error = buy(&app, 999, "fenced").await.expect_err("no such sku");
    assert_eq!(error.error, ErrorCode::NotFound);

    let (status, body) = call(&app, Method::GET, "/skus/7").await;
    assert_eq!(status, StatusCode::OK);
    let status: SkuStatus = serde_json::from_str(&body).expect("status");
    assert_eq!((status.stock, status.sold), (0, 4));

    // The lock keys are all released.
    let held: Vec<String> = redis.cmd(&["KEYS", "lock:*:lock:*"]);
    assert!(held.is_empty(), "{held:?}");
}

/// A SKU written five ways in the path (`Path<i64>` reads each as 7) locks one key in the
/// layer's routes: while another instance holds `inventory:7`, every spelling finds it busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_sku_locks_the_same_key_in_the_layer_routes() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let (app, db, _dir) = instance(&redis, "spellings").await;
    restock(&db, 7, 50).await;

    let other_instance = Locker::connect(&redis.url()).await.expect("locker");
    let held = other_instance
        .lock(inventory::service::lock_key(7))
        .await
        .expect("lock");
    let mut sold = Vec::new();
    for spelling in ["7", "07", "+7", "%2B7", "0007"] {
        let uri = format!("/skus/{spelling}/purchase/layer-fail-fast");
        let (status, body) = call(&app, Method::POST, &uri).await;
        if status != StatusCode::CONFLICT {
            sold.push(format!("{spelling}: {status} {body}"));
        }
    }
    assert!(
        sold.is_empty(),
        "purchases of SKU 7 ran while another instance held inventory:7: {sold:?}"
    );
    held.release().await.expect("release");
    // A spelling that is no number is the client's error, refused before any lock.
    let (status, body) = call(&app, Method::POST, "/skus/seven/purchase/layer").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

/// Every endpoint writes with its lock's fencing token: a row claimed by a later holder (a
/// larger token) refuses the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_writes_with_its_fencing_token() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let (app, db, _dir) = instance(&redis, "fence").await;
    restock(&db, 8, 5).await;
    // A holder with a far larger token has claimed the row (it stalled, and we came after).
    let latest = u64::try_from(i64::MAX).expect("fits");
    db.claim_and_read(8, latest).await.expect("claim");

    for variant in VARIANTS {
        let error = buy(&app, 8, variant).await.expect_err("a stale write");
        assert_eq!(error.error, ErrorCode::StaleFence, "{variant}");
    }
    let status = db.status(8).await.expect("status").expect("sku 8");
    assert_eq!((status.stock, status.sold), (5, 0), "nothing written");
}

/// Lock failures, from the layer or a handler, answer alike and never name the key.
mod responses {
    use std::time::Duration;

    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use inventory::error::lock_response;
    use inventory::{AppError, ErrorBody, ErrorCode};
    use lock_core::LockError;
    use lock_tower::Rejection;

    /// Each rejection answers with its own code and status, a body that does not name the
    /// lock key, and no error log for a misconfigured route (lock-tower logs that once).
    /// Held by the tests that log through `lock_response`: tracing caches per log call site
    /// whether a subscriber wants it, and a site first reached by one test while another
    /// starts capturing its logs could stay disabled for the capture.
    static LOCK_RESPONSE_LOGS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    #[tokio::test]
    async fn lock_rejections_answer_with_their_kind_and_without_the_key() {
        let _serial = LOCK_RESPONSE_LOGS.lock().await;
        let (logs, _default) = lock_testkit::LogBuffer::capture(tracing::Level::ERROR);

        let key = "inventory:customer-4711";
        let busy = || LockError::Busy {
            key: key.into(),
            waited: Duration::from_secs(1),
            holder_ttl: None,
            holder: None,
        };
        let cases = [
            (
                Rejection::from(busy()),
                StatusCode::CONFLICT,
                ErrorCode::Busy,
            ),
            (
                Rejection::from(busy()).under_limit(),
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::Full,
            ),
            (
                Rejection::from(LockError::InvalidKey {
                    key: key.into(),
                    reason: lock_core::InvalidKeyReason::TooLong,
                }),
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidKey,
            ),
            (
                Rejection::MissingKey,
                StatusCode::BAD_REQUEST,
                ErrorCode::MissingKey,
            ),
            (
                Rejection::MalformedKey,
                StatusCode::BAD_REQUEST,
                ErrorCode::MalformedKey,
            ),
            (
                Rejection::Misconfigured,
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
            ),
            (
                Rejection::from(LockError::Lost {
                    key: key.into(),
                    reason: lock_core::LostReason::Expired,
                }),
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::LockLost,
            ),
        ];
        logs.refresh();
        for (rejection, status, code) in cases {
            let kind = rejection.kind();
            let response = lock_response(rejection);
            assert_eq!(response.status(), status, "{kind}");
            let body = axum::body::to_bytes(response.into_body(), 4096)
                .await
                .unwrap();
            let body: ErrorBody = serde_json::from_slice(&body).unwrap();
            assert_eq!(body.error, code, "{kind}");
            assert!(!body.message.contains("customer-4711"), "{kind}: {body:?}");
            assert!(!body.message.is_empty(), "{kind}");
        }
        // Only the lost lock (a 503) is logged here, once.
        let text = logs.text();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("kind=\"lost\""), "{text}");
    }

    #[test]
    fn lock_errors_answer_like_the_layer() {
        let _serial = LOCK_RESPONSE_LOGS.blocking_lock();
        let busy = AppError::Lock(LockError::Busy {
            key: "inventory:1".into(),
            waited: Duration::from_secs(10),
            holder_ttl: Some(Duration::from_secs(25)),
            holder: Some("web-1:4711".into()),
        })
        .into_response();
        assert_eq!(busy.status(), StatusCode::CONFLICT);
        // Short and jittered, not the holder's 25 s lease.
        let retry = busy.headers()[axum::http::header::RETRY_AFTER]
            .to_str()
            .unwrap();
        assert!(retry == "1" || retry == "2", "{retry}");
        let lost = AppError::Lock(LockError::Lost {
            key: "inventory:1".into(),
            reason: lock_core::LostReason::Expired,
        });
        assert_eq!(
            lost.into_response().status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let unconfigured = AppError::Lock(LockError::NotConfigured).into_response();
        assert_eq!(unconfigured.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            AppError::SoldOut(1).code(),
            (StatusCode::CONFLICT, ErrorCode::SoldOut)
        );
        assert_eq!(
            AppError::StaleFence { sku: 1, fence: 7 }.code(),
            (StatusCode::CONFLICT, ErrorCode::StaleFence)
        );
    }
}
