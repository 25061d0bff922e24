//! The layer's key is the resource's canonical form: every spelling of one SKU that the
//! handler's `Path<u64>` reads as the same number locks the same key, so purchases of it never
//! run together; a duplicated query parameter is refused rather than locked on one of its
//! values.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::routing::post;
use axum::Router;
use common::{client, locker, post as post_to, serve, server, Occupancy};
use http::StatusCode;
use lock_core::Locker;
use lock_tower::{DistributedLockLayer, HeldLock, KeyFrom};
use tokio::sync::Barrier;

/// Five ways to write SKU 7 in a path that `Path<u64>` reads as 7.
const SPELLINGS: [&str; 5] = ["7", "07", "+7", "%2B7", "0007"];

/// `POST /skus/{sku}/purchase` as the README writes it: the handler takes `Path<u64>` and stays
/// 20 ms in the section of the SKU it parsed; it answers the key it holds.
fn purchase_app(locker: Locker, key: KeyFrom, inside: Occupancy) -> Router {
    Router::new()
        .route(
            "/skus/{sku}/purchase",
            post(move |Path(sku): Path<u64>, lock: HeldLock| {
                let inside = inside.clone();
                async move {
                    assert_eq!(sku, 7);
                    inside.occupy(Duration::from_millis(20)).await;
                    lock.key().to_owned()
                }
            }),
        )
        .route_layer(DistributedLockLayer::new(locker, key).wait(Duration::from_secs(10)))
}

/// `rounds` times, the five spellings at the same moment, each from its own task; the keys
/// the handler saw.
async fn spellings_at_once(addr: std::net::SocketAddr, rounds: usize) -> Vec<String> {
    let client = client();
    let mut keys = Vec::new();
    for _ in 0..rounds {
        let start = Arc::new(Barrier::new(SPELLINGS.len()));
        let tasks: Vec<_> = SPELLINGS
            .iter()
            .map(|sku| {
                let (client, start) = (client.clone(), start.clone());
                let url = format!("http://{addr}/skus/{sku}/purchase");
                tokio::spawn(async move {
                    start.wait().await;
                    post_to(&client, &url).await
                })
            })
            .collect();
        for task in tasks {
            let reply = task.await.expect("request task");
            assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
            keys.push(reply.body);
        }
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_spellings_of_one_sku_are_never_inside_together() {
    let server = server();
    let locker = locker(&server).await;
    let inside = Occupancy::default();
    let key = KeyFrom::path_param_as::<u64>("sku").prefix("inventory:");
    let addr = serve(purchase_app(locker.clone(), key, inside.clone())).await;

    let keys = spellings_at_once(addr, 20).await;

    lock_testkit::figure(&format!(
        "typed key: 5 spellings of SKU 7 x 20 rounds, most inside at once: {}",
        inside.max()
    ));
    assert_eq!(inside.entered(), 100);
    assert_eq!(
        inside.max(),
        1,
        "purchases of SKU 7 ran together: {} inside at once",
        inside.max()
    );
    assert!(keys.iter().all(|k| k == "inventory:7"), "{keys:?}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// The control: the same rounds behind the text extractor, which locks each spelling as
/// written; the checker above sees them inside together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_the_text_extractor_lets_spellings_of_one_sku_run_together() {
    let server = server();
    let locker = locker(&server).await;
    let inside = Occupancy::default();
    let key = KeyFrom::path_param("sku").prefix("inventory:");
    let addr = serve(purchase_app(locker.clone(), key, inside.clone())).await;

    let mut keys = spellings_at_once(addr, 20).await;

    lock_testkit::figure(&format!(
        "control: text key, 5 spellings of SKU 7 x 20 rounds, most inside at once: {}",
        inside.max()
    ));
    assert_eq!(inside.entered(), 100);
    assert!(
        inside.max() > 1,
        "no overlap behind the text extractor: the check above would be vacuous"
    );
    keys.sort();
    keys.dedup();
    assert_eq!(
        keys,
        [
            "inventory:+7",
            "inventory:0007",
            "inventory:07",
            "inventory:7"
        ]
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// Sends `request` from its own task and reads the response.
async fn call(app: &Router, request: http::Request<axum::body::Body>) -> (StatusCode, String) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let app = app.clone();
    tokio::spawn(async move {
        let response = app.oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    })
    .await
    .unwrap()
}

/// Answers the keys the request holds, comma-separated, or `unlocked`.
async fn held(locks: Option<lock_tower::HeldLocks>) -> String {
    locks.map_or("unlocked".to_owned(), |locks| {
        locks.keys().collect::<Vec<_>>().join(",")
    })
}

#[tokio::test]
async fn typed_headers_query_values_and_path_pairs_lock_their_canonical_form() {
    use axum::body::Body;
    use lock_tower::{HeldLocks, MissingKey};

    let server = server();
    let locker = locker(&server).await;
    let malformed = (
        StatusCode::BAD_REQUEST,
        "the request names its lock key in a form this route does not accept\n".to_owned(),
    );
    for missing in [MissingKey::Reject, MissingKey::Pass] {
        let layer =
            |key: KeyFrom| DistributedLockLayer::new(locker.clone(), key).on_missing_key(missing);
        let app = Router::new()
            .route(
                "/pay",
                post(held).route_layer(layer(
                    KeyFrom::header_as::<u64>("x-account").prefix("account:"),
                )),
            )
            .route(
                "/refund",
                post(held).route_layer(layer(
                    KeyFrom::query_param_as::<u64>("order").prefix("order:"),
                )),
            )
            .route(
                "/transfer/{from}/{to}",
                post(
                    |Path((from, to)): Path<(u64, u64)>, locks: HeldLocks| async move {
                        // The handler names the keys from the values it parsed.
                        let debit = locks.fencing_token(&format!("account:{from}")).await;
                        let credit = locks.fencing_token(&format!("account:{to}")).await;
                        assert!(debit.is_ok() && credit.is_ok(), "{debit:?} {credit:?}");
                        held(Some(locks)).await
                    },
                )
                .route_layer(layer(
                    KeyFrom::path_params_as::<u64>(["from", "to"]).prefix("account:"),
                )),
            );
        let post = |uri: &str| http::Request::post(uri);
        let ok = |keys: &str| (StatusCode::OK, keys.to_owned());
        let cases = [
            (
                post("/pay").header("x-account", "0042").body(Body::empty()),
                ok("account:42"),
            ),
            (
                post("/pay")
                    .header("x-account", "forty-two")
                    .body(Body::empty()),
                malformed.clone(),
            ),
            (
                post("/refund?order=%2B9").body(Body::empty()),
                ok("order:9"),
            ),
            (
                post("/refund?order=9x").body(Body::empty()),
                malformed.clone(),
            ),
            (
                post("/transfer/07/3").body(Body::empty()),
                ok("account:3,account:7"),
            ),
            (
                post("/transfer/3/+07").body(Body::empty()),
                ok("account:3,account:7"),
            ),
            (post("/transfer/3/x").body(Body::empty()), malformed.clone()),
        ];
        for (request, expected) in cases {
            let request = request.unwrap();
            let what = format!(
                "{} {:?} under {missing:?}",
                request.uri(),
                request.headers()
            );
            assert_eq!(call(&app, request).await, expected, "{what}");
        }
    }
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn a_duplicated_query_parameter_is_refused_not_locked_on_one_value() {
    use axum::body::Body;
    use http_body_util::BodyExt;
    use lock_tower::MissingKey;
    use tower::ServiceExt;

    let server = server();
    let locker = locker(&server).await;
    for missing in [MissingKey::Reject, MissingKey::Pass] {
        let app = Router::new()
            .route(
                "/refund",
                post(|lock: Option<HeldLock>| async move {
                    lock.map_or("unlocked".to_owned(), |l| l.key().to_owned())
                }),
            )
            .route_layer(
                DistributedLockLayer::new(locker.clone(), KeyFrom::query_param("order"))
                    .on_missing_key(missing),
            );
        // `Query<HashMap<..>>` would read 8 here, the layer would lock 7.
        let request = http::Request::post("/refund?order=7&order=8")
            .body(Body::empty())
            .unwrap();
        let response = tokio::spawn(app.oneshot(request)).await.unwrap().unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            (status, String::from_utf8_lossy(&body).into_owned()),
            (
                StatusCode::BAD_REQUEST,
                "the request does not name a lock key\n".to_owned()
            ),
            "{missing:?}"
        );
    }
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A function locked by `#[distributed_lock(key = "inventory:<sku>")]` and a route locked by
/// `KeyFrom::path_param("sku").prefix("inventory:")` exclude each other for every SKU text:
/// while the route holds the lock, the function is refused `Busy`. Before, the macro doubled
/// every `\` of the value that ends the key and the layer did not: for `a\b` the two locked
/// different keys and ran at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_and_the_macro_lock_one_key_for_every_value() {
    use lock_core::{distributed_lock, LockError};

    #[distributed_lock(key = "inventory:<sku>", wait = "0s", locker = locker)]
    async fn reserve(locker: &Locker, sku: &str) -> Result<(), LockError> {
        let _ = sku;
        Ok(())
    }

    let server = server();
    let locker = locker(&server).await;
    let held = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(tokio::sync::Notify::new());
    let app = {
        let (held, entered) = (held.clone(), entered.clone());
        Router::new()
            .route(
                "/skus/{sku}/purchase",
                post(move |lock: HeldLock| {
                    let (held, entered) = (held.clone(), entered.clone());
                    async move {
                        entered.notify_one();
                        held.notified().await;
                        lock.key().to_owned()
                    }
                }),
            )
            .route_layer(DistributedLockLayer::new(
                locker.clone(),
                KeyFrom::path_param("sku").prefix("inventory:"),
            ))
    };
    let addr = serve(app).await;
    let http = client();
    // (the value, as the path writes it)
    for (sku, path) in [
        ("7", "7"),
        ("a\\b", "a%5Cb"),
        ("a\\", "a%5C"),
        ("a:b", "a:b"),
        ("\\\\", "%5C%5C"),
        ("<x>", "%3Cx%3E"),
    ] {
        let purchase = {
            let (http, url) = (http.clone(), format!("http://{addr}/skus/{path}/purchase"));
            tokio::spawn(async move { post_to(&http, &url).await })
        };
        entered.notified().await;
        let reserved = reserve(&locker, sku).await;
        held.notify_one();
        let reply = purchase.await.unwrap();
        assert_eq!(
            (reply.status, reply.body),
            (StatusCode::OK, format!("inventory:{sku}"))
        );
        assert!(
            matches!(&reserved, Err(LockError::Busy { .. })),
            "the macro ran for SKU {sku:?} while the route held its lock: {reserved:?}"
        );
        // Once the route is done, the function gets it.
        assert!(reserve(&locker, sku).await.is_ok(), "{sku:?}");
    }
    common::assert_nothing_left(&server, &[&locker]).await;
}
