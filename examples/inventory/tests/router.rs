//! The router called in-process with `tower::ServiceExt::oneshot` (axum's `examples/testing`
//! style), against a real redis-server and a temporary SQLite file.

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use inventory::db::{Db, SkuStatus};
use inventory::{app, ErrorBody, Inventory, Sale, ServiceConfig};
use lock_core::Locker;
use lock_testkit::RedisServer;
use tower::ServiceExt;

/// The purchase endpoints of the service.
const VARIANTS: [&str; 3] = ["macro", "layer", "fenced"];

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
    instance_with(redis, name, ServiceConfig::default()).await
}

async fn instance_with(
    redis: &RedisServer,
    name: &str,
    config: ServiceConfig,
) -> (Router, Db, TempDir) {
    let dir =
        TempDir(std::env::temp_dir().join(format!("inventory-{name}-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let db = Db::open(dir.0.join("inventory.db")).expect("db");
    let locker = Locker::connect(&redis.url()).await.expect("locker");
    let app = app(Inventory::new(locker, db.clone(), config));
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

    restock(&db, 7, 3).await;
    let mut stock = 3;
    let mut fences = Vec::new();
    for variant in VARIANTS {
        let sale = buy(&app, 7, variant).await.expect("in stock");
        stock -= 1;
        assert_eq!(sale.stock_left, stock, "{variant}");
        assert_eq!(sale.variant, variant);
        // Every write carries the lock's fencing token, larger for every later holder.
        fences.push(sale.fencing_token.expect("fenced"));
    }
    assert!(fences.is_sorted() && fences[0] < fences[2], "{fences:?}");
    for variant in VARIANTS {
        let error = buy(&app, 7, variant).await.expect_err("sold out");
        assert_eq!(error.error, "sold_out", "{variant}");
    }
    let error = buy(&app, 999, "fenced").await.expect_err("no such sku");
    assert_eq!(error.error, "not_found");

    let (status, body) = call(&app, Method::GET, "/skus/7").await;
    assert_eq!(status, StatusCode::OK);
    let status: SkuStatus = serde_json::from_str(&body).expect("status");
    assert_eq!((status.stock, status.sold), (0, 3));

    // The lock keys are all released.
    let held: Vec<String> = redis.cmd(&["KEYS", "lock:*:lock:*"]);
    assert!(held.is_empty(), "{held:?}");
}

/// A SKU written five ways in the path (`Path<i64>` reads each as 7) locks one key in the
/// layer's route: while another instance holds `inventory:7`, every spelling finds it busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_sku_locks_the_same_key_in_the_layer_route() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let config = ServiceConfig {
        wait: std::time::Duration::from_millis(50),
        ..ServiceConfig::default()
    };
    let (app, db, _dir) = instance_with(&redis, "spellings", config).await;
    restock(&db, 7, 50).await;

    let other_instance = Locker::connect(&redis.url()).await.expect("locker");
    let held = other_instance
        .lock(inventory::service::lock_key(7))
        .await
        .expect("lock");
    let mut sold = Vec::new();
    for spelling in ["7", "07", "+7", "%2B7", "0007"] {
        let uri = format!("/skus/{spelling}/purchase/layer");
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
        assert_eq!(error.error, "stale_fence", "{variant}");
    }
    let status = db.status(8).await.expect("status").expect("sku 8");
    assert_eq!((status.stock, status.sold), (5, 0), "nothing written");
}

/// The answers of a handler's errors: the service's own with their code, a lock failure as
/// the layer answers it (lock-tower's status and `Retry-After`, never naming the key).
mod responses {
    use std::time::Duration;

    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    use inventory::db::DbError;
    use inventory::AppError;
    use lock_core::{LockError, LostReason};

    async fn answer(error: AppError) -> (StatusCode, Option<String>, String) {
        let response = error.into_response();
        let retry = response.headers().get(header::RETRY_AFTER);
        let retry = retry.map(|v| v.to_str().expect("ascii").to_owned());
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 4096).await;
        let body = String::from_utf8(body.expect("body").to_vec()).expect("utf-8");
        (status, retry, body)
    }

    #[tokio::test]
    async fn lock_failures_answer_like_the_layer_without_the_key() {
        let key = "inventory:customer-4711";
        let busy = AppError::Lock(LockError::Busy {
            key: key.into(),
            waited: Duration::from_secs(10),
            holder_ttl: Some(Duration::from_secs(25)),
            holder: Some("web-1:4711".into()),
        });
        let (status, retry, body) = answer(busy).await;
        assert_eq!(status, StatusCode::CONFLICT);
        // Short and jittered, not the holder's 25 s lease.
        assert!(matches!(retry.as_deref(), Some("1" | "2")), "{retry:?}");
        assert!(!body.contains("4711"), "{body}");
        let lost = AppError::Lock(LockError::Lost {
            key: key.into(),
            reason: LostReason::Expired,
        });
        let (status, _, body) = answer(lost).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!body.contains("4711"), "{body}");
        let unconfigured = AppError::Lock(LockError::NotConfigured);
        assert_eq!(
            answer(unconfigured).await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[tokio::test]
    async fn the_services_errors_answer_with_their_code() {
        let stale = AppError::Db(DbError::StaleFence { sku: 1, fence: 7 });
        for (error, status, code) in [
            (AppError::SoldOut(1), StatusCode::CONFLICT, "sold_out"),
            (AppError::NotFound(1), StatusCode::NOT_FOUND, "not_found"),
            (stale, StatusCode::CONFLICT, "stale_fence"),
        ] {
            assert_eq!(error.code(), (status, code));
            let (answered, _, body) = answer(error).await;
            assert_eq!(answered, status);
            let body: inventory::ErrorBody = serde_json::from_str(&body).expect("json");
            assert_eq!(body.error, code);
        }
    }
}
