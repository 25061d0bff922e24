//! The router called in-process with `tower::ServiceExt::oneshot` (axum's `examples/testing`
//! style), against a real redis-server and a temporary SQLite file.

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use inventory::db::{Db, SkuStatus};
use inventory::service::{ErrorBody, ErrorCode, Sale};
use inventory::trace::Attempt;
use inventory::{app, Inventory, ServiceConfig, Variant};
use lock_core::Locker;
use lock_testkit::RedisServer;
use tower::ServiceExt;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn call(app: &Router, method: Method, uri: &str, body: &str) -> (StatusCode, String) {
    call_with(app, method, uri, &[], body).await
}

async fn call_with(
    app: &Router,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, String) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Body::from(body.to_owned())).expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    (status, String::from_utf8(bytes.to_vec()).expect("utf-8"))
}

async fn buy(app: &Router, sku: i64, variant: Variant) -> Result<Sale, ErrorBody> {
    let (status, body) = call(app, Method::POST, &variant.path(sku), "").await;
    if status == StatusCode::OK {
        Ok(serde_json::from_str(&body).expect("sale"))
    } else {
        Err(serde_json::from_str(&body).expect("error body"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_through_every_variant() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let dir =
        TempDir(std::env::temp_dir().join(format!("inventory-router-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let db = Db::open(dir.0.join("inventory.db")).expect("db");
    let locker = Locker::connect(&redis.url()).await.expect("locker");
    let app = app(Inventory::new(locker, db, ServiceConfig::default()));

    assert_eq!(
        call(&app, Method::GET, "/health", "").await,
        (StatusCode::OK, "ok".into())
    );
    // The demo SKU is seeded.
    let (status, body) = call(&app, Method::GET, "/skus/42", "").await;
    assert_eq!(status, StatusCode::OK);
    let seeded: SkuStatus = serde_json::from_str(&body).expect("status");
    assert_eq!((seeded.stock, seeded.sold), (100, 0));

    let (status, _) = call(
        &app,
        Method::PUT,
        "/skus/7",
        r#"{"name":"gadget","stock":6}"#,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let mut stock = 6;
    for &variant in <Variant as clap::ValueEnum>::value_variants() {
        let sale = buy(&app, 7, variant).await.expect("in stock");
        stock -= 1;
        assert_eq!(sale.stock_left, stock, "{variant}");
        assert_eq!(sale.variant, variant.name());
        // The fenced write and the layer carry the lock's fencing token.
        assert_eq!(
            sale.fencing_token.is_some(),
            matches!(
                variant,
                Variant::Fenced | Variant::Layer | Variant::LayerFailFast
            ),
            "{variant}"
        );
    }
    for variant in [
        Variant::Unlocked,
        Variant::Macro,
        Variant::Layer,
        Variant::Fenced,
    ] {
        let error = buy(&app, 7, variant).await.expect_err("sold out");
        assert_eq!(error.error, ErrorCode::SoldOut, "{variant}");
    }
    let error = buy(&app, 999, Variant::Fenced)
        .await
        .expect_err("no such sku");
    assert_eq!(error.error, ErrorCode::NotFound);

    let (status, body) = call(&app, Method::GET, "/skus/7", "").await;
    assert_eq!(status, StatusCode::OK);
    let status: SkuStatus = serde_json::from_str(&body).expect("status");
    assert_eq!((status.stock, status.sold), (0, 6));

    // While tracing, a purchase that names itself is recorded with its steps.
    let (status, _) = call(&app, Method::PUT, "/debug/trace", "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    call(
        &app,
        Method::PUT,
        "/skus/7",
        r#"{"name":"gadget","stock":1}"#,
    )
    .await;
    let id = [(inventory::trace::PURCHASE_HEADER, "17")];
    let (status, _) = call_with(&app, Method::POST, &Variant::Fenced.path(7), &id, "").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(&app, Method::POST, &Variant::Fenced.path(7), "").await;
    assert_eq!(status, StatusCode::CONFLICT, "sold out, and not recorded");
    let (status, body) = call(&app, Method::GET, "/debug/trace", "").await;
    assert_eq!(status, StatusCode::OK);
    let attempts: Vec<Attempt> = serde_json::from_str(&body).expect("attempts");
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    let attempt = &attempts[0];
    assert_eq!((attempt.purchase, attempt.status), (17, 200));
    assert_eq!(
        (attempt.stock_read, attempt.stock_written),
        (Some(1), Some(0))
    );
    let (acquired, read, write) = (
        attempt.acquired.expect("acquired"),
        attempt.read.expect("read"),
        attempt.write.expect("write"),
    );
    let lease_end = attempt.lease_end.expect("a fixed lease");
    let releasing = attempt.releasing.expect("released");
    assert!(attempt.received <= acquired && acquired <= read.start);
    assert!(read.end <= write.start && write.end <= releasing);
    assert!(releasing <= attempt.responded && releasing < lease_end);
    let (status, _) = call(&app, Method::DELETE, "/debug/trace", "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    // The lock keys are all released.
    let held: Vec<String> = redis.cmd(&["KEYS", "lock:*:lock:*"]);
    assert!(held.is_empty(), "{held:?}");
}

/// A SKU written five ways in the path (`Path<i64>` reads each as 7) locks one key in the
/// layer's routes: while another instance holds `inventory:7`, every spelling finds it busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_sku_locks_the_same_key_in_the_layer_routes() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let dir =
        TempDir(std::env::temp_dir().join(format!("inventory-spellings-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let db = Db::open(dir.0.join("inventory.db")).expect("db");
    let locker = Locker::connect(&redis.url()).await.expect("locker");
    let app = app(Inventory::new(locker, db, ServiceConfig::default()));
    let (status, _) = call(
        &app,
        Method::PUT,
        "/skus/7",
        r#"{"name":"gadget","stock":50}"#,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let other_instance = Locker::connect(&redis.url()).await.expect("locker");
    let held = other_instance
        .lock(inventory::service::lock_key(7))
        .await
        .expect("lock");
    let mut sold = Vec::new();
    for spelling in ["7", "07", "+7", "%2B7", "0007"] {
        let uri = format!("/skus/{spelling}/purchase/layer-fail-fast");
        let (status, body) = call(&app, Method::POST, &uri, "").await;
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
    let (status, body) = call(&app, Method::POST, "/skus/seven/purchase/layer", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

/// The `layer` variant writes with the lock's fencing token, as the `fenced` variant does: a
/// row claimed by a later holder (a larger token) refuses its write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_variant_writes_with_its_fencing_token() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let dir = TempDir(std::env::temp_dir().join(format!("inventory-fence-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let db = Db::open(dir.0.join("inventory.db")).expect("db");
    let locker = Locker::connect(&redis.url()).await.expect("locker");
    let app = app(Inventory::new(locker, db.clone(), ServiceConfig::default()));
    let (status, _) = call(
        &app,
        Method::PUT,
        "/skus/8",
        r#"{"name":"gizmo","stock":5}"#,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // A holder with a far larger token has claimed the row (it stalled, and we came after).
    let latest = u64::try_from(i64::MAX).expect("fits");
    db.claim_and_read(8, latest).await.expect("claim");

    for variant in [Variant::Layer, Variant::LayerFailFast] {
        let error = buy(&app, 8, variant).await.expect_err("a stale write");
        assert_eq!(error.error, ErrorCode::StaleFence, "{variant}");
    }
    let status = db.status(8).await.expect("status").expect("sku 8");
    assert_eq!((status.stock, status.sold), (5, 0), "nothing written");
}

/// The chaos endpoint stalls writes (and the locks held over them) only as long as it allows:
/// a longer pause is refused, and nothing is armed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chaos_pause_is_bounded() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let dir = TempDir(std::env::temp_dir().join(format!("inventory-chaos-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let db = Db::open(dir.0.join("inventory.db")).expect("db");
    let locker = Locker::connect(&redis.url()).await.expect("locker");
    let app = app(Inventory::new(locker, db, ServiceConfig::default()));
    let max = inventory::service::MAX_PAUSE.as_millis();
    for (pause_ms, expected) in [
        (0, StatusCode::NO_CONTENT),
        (max, StatusCode::NO_CONTENT),
        (max + 1, StatusCode::BAD_REQUEST),
        (u128::from(u64::MAX), StatusCode::BAD_REQUEST),
    ] {
        let plan = format!(r#"{{"pause_ms":{pause_ms},"every":1,"max":1}}"#);
        let (status, body) = call(&app, Method::PUT, "/debug/chaos", &plan).await;
        assert_eq!(status, expected, "pause_ms {pause_ms}: {body}");
        if expected == StatusCode::BAD_REQUEST {
            assert!(body.contains("longer than"), "{body}");
        }
    }
}
