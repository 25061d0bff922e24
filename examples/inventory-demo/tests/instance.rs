//! One demo instance in-process (its router called with `tower::ServiceExt::oneshot`, a real
//! redis-server, a temporary SQLite file): the control purchases, the recorder reading the
//! service's spans into attempts, and the chaos endpoint's bound.

use std::path::PathBuf;
use std::sync::Once;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::Router;
use inventory::db::Db;
use inventory::{ErrorBody, Inventory, Sale, ServiceConfig};
use inventory_demo::recorder::{Attempt, PURCHASE_HEADER};
use inventory_demo::{instance, Variant};
use lock_core::Locker;
use lock_testkit::RedisServer;
use tower::ServiceExt;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A demo instance on a temporary database, the process's subscriber the demo's (as in
/// `inventory-demo serve`: the recorder reads spans through it).
async fn instance(redis: &RedisServer, name: &str) -> (Router, Db, TempDir) {
    static SUBSCRIBER: Once = Once::new();
    SUBSCRIBER.call_once(|| {
        tracing::subscriber::set_global_default(instance::subscriber("error"))
            .expect("the first subscriber of the process");
    });
    let dir =
        TempDir(std::env::temp_dir().join(format!("inventory-demo-{name}-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let db = Db::open(dir.0.join("inventory.db")).expect("db");
    let locker = Locker::connect(&redis.url()).await.expect("locker");
    let config = ServiceConfig {
        instance: "i1".to_owned(),
        ..ServiceConfig::default()
    };
    let app = instance::app(Inventory::new(locker, db.clone(), config));
    (app, db, dir)
}

async fn call(
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

/// Every variant, the service's four and the demo's two, sells through the demo's router.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_variant_sells_through_the_demo_instance() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let (app, db, _dir) = instance(&redis, "variants").await;
    let variants = <Variant as clap::ValueEnum>::value_variants();
    restock(&db, 7, variants.len() as i64).await;
    for &variant in variants {
        let (status, body) = call(&app, Method::POST, &variant.path(7), &[], "").await;
        assert_eq!(status, StatusCode::OK, "{variant}: {body}");
        let sale: Sale = serde_json::from_str(&body).expect("sale");
        assert_eq!(sale.variant, variant.name());
        let fenced = !matches!(variant, Variant::Unlocked | Variant::LockedNoFence);
        assert_eq!(sale.fencing_token.is_some(), fenced, "{variant}");
    }
    for variant in [Variant::Unlocked, Variant::LockedNoFence] {
        let (status, body) = call(&app, Method::POST, &variant.path(7), &[], "").await;
        assert_eq!(status, StatusCode::CONFLICT, "{variant}");
        let error: ErrorBody = serde_json::from_str(&body).expect("error body");
        assert_eq!(error.error, "sold_out");
    }
    let held: Vec<String> = redis.cmd(&["KEYS", "lock:*:lock:*"]);
    assert!(held.is_empty(), "{held:?}");
}

/// While recording, a purchase that names itself becomes an attempt with its steps, read from
/// the service's spans: the lock, the read, the write, the release, in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_purchase_has_its_steps() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let (app, db, _dir) = instance(&redis, "recorder").await;
    let (status, _) = call(&app, Method::PUT, "/debug/trace", &[], "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for (variant, purchase) in [
        (Variant::Fenced, "17"),
        (Variant::LockedNoFence, "18"),
        (Variant::Macro, "19"),
    ] {
        restock(&db, 7, 1).await;
        let id = [(PURCHASE_HEADER, purchase)];
        let (status, _) = call(&app, Method::POST, &variant.path(7), &id, "").await;
        assert_eq!(status, StatusCode::OK, "{variant}");
    }
    let (status, _) = call(&app, Method::POST, &Variant::Fenced.path(7), &[], "").await;
    assert_eq!(status, StatusCode::CONFLICT, "sold out, and not recorded");
    let (status, body) = call(&app, Method::GET, "/debug/trace", &[], "").await;
    assert_eq!(status, StatusCode::OK);
    let attempts: Vec<Attempt> = serde_json::from_str(&body).expect("attempts");
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    for attempt in &attempts {
        assert_eq!((attempt.status, attempt.instance.as_str()), (200, "i1"));
        assert_eq!(
            (attempt.stock_read, attempt.stock_written),
            (Some(1), Some(0)),
            "{attempt:?}"
        );
        assert!(attempt.order_id.is_some() && attempt.stale_at.is_none());
        let (acquired, read, write) = (
            attempt.acquired.expect("acquired"),
            attempt.read.expect("read"),
            attempt.write.expect("write"),
        );
        let releasing = attempt.releasing.expect("released");
        assert!(attempt.received <= acquired && acquired <= read.start);
        assert!(read.start <= read.end && read.end <= write.start);
        assert!(write.start <= write.end && write.end <= releasing);
        assert!(releasing <= attempt.responded);
        // A fixed lease is known; the macro's watchdog lease is not.
        match attempt.purchase {
            17 | 18 => assert!(releasing < attempt.lease_end.expect("a fixed lease")),
            _ => assert_eq!(attempt.lease_end, None),
        }
    }
    let (status, _) = call(&app, Method::DELETE, "/debug/trace", &[], "").await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

/// The chaos endpoint stalls writes (and the locks held over them) only as long as it allows:
/// a longer pause is refused, and nothing is armed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chaos_pause_is_bounded() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let (app, _db, _dir) = instance(&redis, "chaos").await;
    let max = inventory_demo::chaos::MAX_PAUSE.as_millis();
    for (pause_ms, expected) in [
        (0, StatusCode::NO_CONTENT),
        (max, StatusCode::NO_CONTENT),
        (max + 1, StatusCode::BAD_REQUEST),
        (u128::from(u64::MAX), StatusCode::BAD_REQUEST),
    ] {
        let plan = format!(r#"{{"pause_ms":{pause_ms},"every":1,"max":1}}"#);
        let (status, body) = call(&app, Method::PUT, "/debug/chaos", &[], &plan).await;
        assert_eq!(status, expected, "pause_ms {pause_ms}: {body}");
        if expected == StatusCode::BAD_REQUEST {
            assert!(body.contains("longer than"), "{body}");
        }
    }
}
