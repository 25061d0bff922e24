//! The router called in-process with `tower::ServiceExt::oneshot` (axum's `examples/testing`
//! style), against a real redis-server and a temporary SQLite file.

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use inventory::db::{Db, SkuStatus};
use inventory::service::{ErrorBody, ErrorCode, Sale};
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
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .expect("request");
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
        r#"{"name":"gadget","stock":5}"#,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let mut stock = 5;
    for variant in [
        Variant::Unlocked,
        Variant::Macro,
        Variant::Layer,
        Variant::Fenced,
        Variant::LockedNoFence,
    ] {
        let sale = buy(&app, 7, variant).await.expect("in stock");
        stock -= 1;
        assert_eq!(sale.stock_left, stock, "{variant}");
        assert_eq!(sale.variant, variant.name());
        // The fenced write and the layer carry the lock's fencing token.
        assert_eq!(
            sale.fencing_token.is_some(),
            matches!(variant, Variant::Fenced | Variant::Layer),
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
    assert_eq!((status.stock, status.sold), (0, 5));

    // The lock keys are all released.
    let held: Vec<String> = redis.cmd(&["KEYS", "lock:*:lock:*"]);
    assert!(held.is_empty(), "{held:?}");
}
