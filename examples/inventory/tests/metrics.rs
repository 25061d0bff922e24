//! `GET /metrics` of one instance (the router in-process, a real redis-server, a temporary
//! SQLite file): the lock kit's metrics appear in the Prometheus text once a purchase took a
//! lock. A test binary of its own, since the recorder is process-wide.

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use inventory::db::Db;
use inventory::{app, Inventory, ServiceConfig};
use lock_core::Locker;
use lock_testkit::RedisServer;
use tower::ServiceExt;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Status, content type and body of a request to `app`.
async fn call(app: &Router, method: Method, uri: &str) -> (StatusCode, String, String) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().expect("ascii").to_owned())
        .unwrap_or_default();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    (
        status,
        content_type,
        String::from_utf8(bytes.to_vec()).expect("utf-8"),
    )
}

/// The value of the sample of `name` whose labels include every one of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once(' '))
        .find(|(series, _)| {
            series.strip_prefix(name).is_some_and(|rest| {
                rest.starts_with('{') && labels.iter().all(|l| rest.contains(l))
            })
        })
        .map(|(_, value)| value.trim().parse().expect("a number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_shows_in_the_lock_metrics() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let dir =
        TempDir(std::env::temp_dir().join(format!("inventory-metrics-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let db = Db::open(dir.0.join("inventory.db")).expect("db");
    let locker = Locker::connect(&redis.url()).await.expect("locker");
    let app = app(Inventory::new(locker, db, ServiceConfig::default()));

    let acquired = ["kind=\"mutex\"", "outcome=\"acquired\""];
    let (status, content_type, before) = call(&app, Method::GET, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    assert_eq!(
        sample(&before, "lock_acquisitions_total", &acquired),
        None,
        "no lock was taken yet:\n{before}"
    );

    // The demo SKU is seeded: the macro variant takes `inventory:42`.
    let (status, _, body) = call(&app, Method::POST, "/skus/42/purchase/macro").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, _, after) = call(&app, Method::GET, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let count = sample(&after, "lock_acquisitions_total", &acquired);
    assert_eq!(count, Some(1.0), "one acquisition:\n{after}");
    assert!(
        after.contains("# HELP lock_acquisitions_total"),
        "described:\n{after}"
    );
    // Released after the purchase: one release, nothing held.
    assert_eq!(
        sample(&after, "lock_releases_total", &["outcome=\"released\""]),
        Some(1.0),
        "{after}"
    );
    assert_eq!(
        sample(&after, "lock_held", &["kind=\"mutex\""]),
        Some(0.0),
        "{after}"
    );
    // Histograms have buckets (Prometheus can aggregate them across instances), not
    // summaries: the acquire's wait and its Redis call, each in one bucket up to +Inf.
    for histogram in ["lock_acquire_wait_seconds", "lock_acquire_call_seconds"] {
        let bucket = format!("{histogram}_bucket");
        assert_eq!(
            sample(&after, &bucket, &["outcome=\"acquired\"", "le=\"+Inf\""]),
            Some(1.0),
            "{after}"
        );
        assert!(
            !after.contains(&format!(
                "{histogram}{{kind=\"mutex\",outcome=\"acquired\",quantile="
            )),
            "no summary:\n{after}"
        );
    }
}
