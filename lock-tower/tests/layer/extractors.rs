//! Key extraction in an axum app, requests without a key or with an invalid one, custom
//! rejections, and the `HeldLock` the handler sees.

use crate::common;

use lock_testkit::LogBuffer;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use common::{locker, server};
use http_body_util::BodyExt;
use lock_tower::{DistributedLockLayer, HeldLock, KeyFrom, MissingKey, Rejection};
use tower::ServiceExt;

/// Reports the lock the request holds, if any.
async fn whoami(lock: Option<HeldLock>) -> String {
    match lock {
        Some(lock) => format!(
            "locked {} {}",
            lock.key(),
            lock.fencing_token().await.unwrap()
        ),
        None => "unlocked".to_owned(),
    }
}

/// Sends `request` from its own task and reads the response.
async fn call(app: &Router, request: http::Request<Body>) -> (StatusCode, String) {
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

fn req(method: &str, uri: &str) -> http::request::Builder {
    http::Request::builder().method(method).uri(uri)
}

#[tokio::test]
async fn path_param_under_route_layer_and_router_layer() {
    let server = server();
    let locker = locker(&server).await;
    let key = KeyFrom::path_param("sku").prefix("inventory:");
    let with_route_layer = Router::new()
        .route("/skus/{sku}/purchase", post(whoami))
        .route_layer(DistributedLockLayer::new(locker.clone(), key.clone()));
    // `Router::layer` wraps each route too, after routing: the parameters are there.
    let with_layer = Router::new()
        .route("/skus/{sku}/purchase", post(whoami))
        .layer(DistributedLockLayer::new(locker.clone(), key.clone()));
    // Nested routers see the parameters of the nested route, percent-decoded.
    let nested = Router::new().nest(
        "/shop/{shop}",
        Router::new()
            .route("/skus/{sku}/purchase", post(whoami))
            .route_layer(DistributedLockLayer::new(locker.clone(), key)),
    );
    for app in [&with_route_layer, &with_layer] {
        let (status, body) = call(
            app,
            req("POST", "/skus/42/purchase")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.starts_with("locked inventory:42 "), "{body}");
    }
    let (status, body) = call(
        &nested,
        req("POST", "/shop/s1/skus/a%20b/purchase")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("locked inventory:a b "), "{body}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// `Router::layer` wraps the router's fallback too, where no route's parameters exist: a path
/// no route matches is a `404` (was: `500`, logged as "the layer runs before routing"). Never
/// passed on unlocked by default: a fallback service that is itself a router (here with the
/// layer in front of it) would run its route without the lock.
#[tokio::test]
async fn a_request_matching_no_route_is_not_found_and_never_runs_a_route_unlocked() {
    let server = server();
    let locker = locker(&server).await;
    let key = KeyFrom::path_param_as::<u64>("sku").prefix("inventory:");
    let layer = |missing: MissingKey| {
        DistributedLockLayer::new(locker.clone(), key.clone()).on_missing_key(missing)
    };
    let with_layer = Router::new()
        .route("/skus/{sku}/purchase", post(whoami))
        .layer(layer(MissingKey::Reject));
    let no_route = || req("POST", "/no/such/path").body(Body::empty()).unwrap();
    assert_eq!(
        call(&with_layer, no_route()).await,
        (
            StatusCode::NOT_FOUND,
            "no route matches the request\n".to_owned()
        )
    );
    // The routes still lock.
    let (status, body) = call(
        &with_layer,
        req("POST", "/skus/07/purchase")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("locked inventory:7 "), "{body}");
    // Under `Pass`, the fallback answers (axum's empty 404).
    let passing = Router::new()
        .route("/skus/{sku}/purchase", post(whoami))
        .layer(layer(MissingKey::Pass));
    assert_eq!(
        call(&passing, no_route()).await,
        (StatusCode::NOT_FOUND, String::new())
    );
    // A router as another router's fallback service, the layer in front of it: its route is
    // refused, not run unlocked.
    let inner = Router::new().route("/skus/{sku}/purchase", post(whoami));
    let outer = Router::new()
        .route("/health", get(|| async { "ok" }))
        .fallback_service(
            tower::ServiceBuilder::new()
                .layer(layer(MissingKey::Reject))
                .service(inner),
        );
    let (status, body) = call(
        &outer,
        req("POST", "/skus/7/purchase").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // In front of the whole app, the layer still says it is misconfigured.
    let in_front = tower::ServiceBuilder::new()
        .layer(layer(MissingKey::Reject))
        .service(Router::new().route("/skus/{sku}/purchase", post(whoami)));
    let response = in_front
        .oneshot(req("POST", "/skus/7/purchase").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn a_missing_path_parameter_is_a_server_error_by_default_and_passes_only_when_asked() {
    let server = server();
    let locker = locker(&server).await;
    // The route has no `{nope}` parameter: no request of it can ever have a key.
    let app = |missing: Option<MissingKey>| {
        let mut layer = DistributedLockLayer::new(locker.clone(), KeyFrom::path_param("nope"));
        if let Some(missing) = missing {
            layer = layer.on_missing_key(missing);
        }
        Router::new()
            .route("/skus/{sku}/purchase", post(whoami))
            .route_layer(layer)
    };
    let request = || {
        req("POST", "/skus/42/purchase")
            .body(Body::empty())
            .unwrap()
    };
    for rejecting in [app(None), app(Some(MissingKey::Reject))] {
        let (status, body) = call(&rejecting, request()).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body, "the lock could not be taken\n");
    }
    assert_eq!(
        call(&app(Some(MissingKey::Pass)), request()).await,
        (StatusCode::OK, "unlocked".to_owned())
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn a_missing_header_or_query_value_is_a_client_error_by_default() {
    let server = server();
    let locker = locker(&server).await;
    let app = Router::new()
        .route(
            "/pay",
            post(whoami).route_layer(DistributedLockLayer::new(
                locker.clone(),
                KeyFrom::header("x-account"),
            )),
        )
        .route(
            "/refund",
            post(whoami).route_layer(DistributedLockLayer::new(
                locker.clone(),
                KeyFrom::query_param("order"),
            )),
        )
        .route(
            "/custom",
            post(whoami).route_layer(DistributedLockLayer::new(
                locker.clone(),
                |_: &http::Request<Body>| None::<String>,
            )),
        );
    for uri in ["/pay", "/refund?other=1", "/custom"] {
        let (status, body) = call(&app, req("POST", uri).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(body, "the request does not name a lock key\n", "{uri}");
    }
    let (status, body) = call(
        &app,
        req("POST", "/refund?order=7").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("locked 7 "), "{body}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn a_route_without_its_key_parameter_is_logged_as_an_error_once_per_route() {
    let server = server();
    let locker = locker(&server).await;
    // This test's runtime has one thread: the requests' tasks log through this subscriber.
    let (logs, _default) = LogBuffer::capture(tracing::Level::ERROR);
    let layer = DistributedLockLayer::new(locker.clone(), KeyFrom::path_param("nope"));
    let app = Router::new()
        .route("/a/{sku}", post(whoami))
        .route("/b/{sku}", post(whoami))
        .route_layer(layer);
    for uri in ["/a/1", "/a/2", "/a/3", "/b/1", "/b/2"] {
        let (status, _) = call(&app, req("POST", uri).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    let text = logs.text();
    let errors: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("ERROR") && line.contains("finds no key on this route"))
        .collect();
    assert_eq!(errors.len(), 2, "once per route:\n{text}");
    assert!(
        errors[0].contains("/a/1") && errors[1].contains("/b/1"),
        "{text}"
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A path parameter the route has, sent by the client as bytes that are not UTF-8 once
/// percent-decoded: the client's request is wrong, not the route (400, nothing logged).
#[tokio::test]
async fn a_path_parameter_that_does_not_decode_is_a_client_error() {
    let server = server();
    let locker = locker(&server).await;
    let (logs, _default) = LogBuffer::capture(tracing::Level::ERROR);
    let app = Router::new()
        .route("/skus/{sku}/purchase", post(whoami))
        .route("/transfer/{from}/{to}", post(whoami))
        .route_layer(DistributedLockLayer::new(
            locker.clone(),
            KeyFrom::path_param("sku").prefix("inventory:"),
        ));
    let pair = Router::new()
        .route("/transfer/{from}/{to}", post(whoami))
        .route_layer(DistributedLockLayer::new(
            locker.clone(),
            KeyFrom::path_params(["from", "to"]).prefix("account:"),
        ));
    for (app, uri) in [(&app, "/skus/%FF/purchase"), (&pair, "/transfer/7/%C3%28")] {
        let (status, body) = call(app, req("POST", uri).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(body, "the request does not name a lock key\n", "{uri}");
    }
    let text = logs.text();
    assert!(text.is_empty(), "no error logged:\n{text}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// The layer in front of the whole router (`Layer::layer(router)`, or a `ServiceBuilder`
/// around it, as handed to `axum::serve`) runs before routing: no path parameters, no matched
/// route. Every request is a server misconfiguration (500, never unlocked), logged once for
/// the layer, which sees no routes, with a hint at `route_layer`.
#[tokio::test]
async fn a_path_param_layer_in_front_of_the_router_is_a_server_error_logged_once() {
    use tower::Layer;

    let server = server();
    let locker = locker(&server).await;
    let (logs, _default) = LogBuffer::capture(tracing::Level::ERROR);
    let router = Router::new()
        .route("/a/{sku}", post(whoami))
        .route("/b/{sku}", post(whoami));
    let layer = || DistributedLockLayer::new(locker.clone(), KeyFrom::path_param("sku"));
    let wrapped = layer().layer(router.clone());
    let built = tower::ServiceBuilder::new()
        .layer(layer())
        .service(router.clone());
    for uri in ["/a/1", "/a/2", "/b/1"] {
        for response in [
            wrapped
                .clone()
                .oneshot(req("POST", uri).body(Body::empty()).unwrap())
                .await
                .unwrap(),
            built
                .clone()
                .oneshot(req("POST", uri).body(Body::empty()).unwrap())
                .await
                .unwrap(),
        ] {
            assert_eq!(
                response.status(),
                StatusCode::INTERNAL_SERVER_ERROR,
                "{uri}"
            );
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"the lock could not be taken\n");
        }
    }
    let text = logs.text();
    let errors: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("ERROR") && line.contains("runs before routing"))
        .collect();
    // One per layer: each of the two sees all requests as one route.
    assert_eq!(errors.len(), 2, "once per layer:\n{text}");
    assert!(errors.iter().all(|line| line.contains("/a/1")), "{text}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn header_keys_missing_and_invalid() {
    let server = server();
    let locker = locker(&server).await;
    let app = |missing| {
        Router::new().route("/pay", post(whoami)).route_layer(
            DistributedLockLayer::new(
                locker.clone(),
                KeyFrom::header("x-account").prefix("account:"),
            )
            .on_missing_key(missing),
        )
    };
    let (pass, reject) = (app(MissingKey::Pass), app(MissingKey::Reject));
    let with = |value: &str| {
        req("POST", "/pay")
            .header("x-account", value)
            .body(Body::empty())
            .unwrap()
    };
    let without = || req("POST", "/pay").body(Body::empty()).unwrap();

    let (status, body) = call(&pass, with("7")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("locked account:7 "), "{body}");
    assert_eq!(
        call(&pass, without()).await,
        (StatusCode::OK, "unlocked".to_owned())
    );
    assert_eq!(call(&reject, without()).await.0, StatusCode::BAD_REQUEST);
    // An empty value is an invalid key (the prefix does not make it valid): 400 either way.
    for app in [&pass, &reject] {
        let (status, body) = call(app, with("")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body, "the request does not name a valid lock key\n");
    }
    // Too long for a lock key.
    let long = "x".repeat(lock_core::MAX_KEY_LEN + 1);
    assert_eq!(call(&pass, with(&long)).await.0, StatusCode::BAD_REQUEST);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn query_fixed_and_closure_keys() {
    let server = server();
    let locker = locker(&server).await;
    let query = Router::new()
        .route("/pay", post(whoami))
        .route_layer(DistributedLockLayer::new(
            locker.clone(),
            KeyFrom::query_param("order").prefix("order:"),
        ));
    let fixed =
        Router::new()
            .route("/nightly", post(whoami))
            .route_layer(DistributedLockLayer::new(
                locker.clone(),
                KeyFrom::fixed("job:nightly"),
            ));
    let closure =
        Router::new()
            .route("/{*path}", post(whoami))
            .route_layer(DistributedLockLayer::new(
                locker.clone(),
                |req: &Request| Some(req.uri().path().trim_start_matches('/').to_owned()),
            ));

    let (status, body) = call(
        &query,
        req("POST", "/pay?x=1&order=A%2F7")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.starts_with("locked order:A/7 "), "{body}");
    let (_, body) = call(&fixed, req("POST", "/nightly").body(Body::empty()).unwrap()).await;
    assert!(body.starts_with("locked job:nightly "), "{body}");
    let (_, body) = call(
        &closure,
        req("POST", "/files/a.txt").body(Body::empty()).unwrap(),
    )
    .await;
    assert!(body.starts_with("locked files/a.txt "), "{body}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn the_handler_sees_key_and_increasing_fencing_tokens() {
    let server = server();
    let locker = locker(&server).await;
    let app = Router::new()
        .route(
            "/skus/{sku}/purchase",
            post(
                |lock: HeldLock, Extension(same): Extension<HeldLock>| async move {
                    let token = lock.fencing_token().await.unwrap();
                    assert_eq!(same.key(), lock.key());
                    assert_eq!(same.fencing_token().await.unwrap(), token);
                    format!("{} {}", lock.key(), token)
                },
            ),
        )
        .route(
            "/unlocked",
            get(|lock: HeldLock| async move { lock.key().to_owned() }),
        )
        .route_layer(DistributedLockLayer::new(
            locker.clone(),
            KeyFrom::path_param("sku").prefix("inventory:"),
        ));
    let mut last = 0;
    for _ in 0..3 {
        let (status, body) = call(
            &app,
            req("POST", "/skus/42/purchase")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let (key, token) = body.split_once(' ').unwrap();
        assert_eq!(key, "inventory:42");
        let token: u64 = token.parse().unwrap();
        assert!(token > last, "fencing tokens increase across holders");
        last = token;
    }
    // No key there, so no lock: the `HeldLock` extractor says so with a 500.
    let (status, _) = call(&app, req("GET", "/unlocked").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn custom_rejections() {
    let server = server();
    let locker = locker(&server).await;
    let held = locker
        .lock("inventory:1")
        .lease(Duration::from_secs(10))
        .await
        .unwrap();
    let reject = |rejection: Rejection| -> Response {
        match rejection {
            Rejection::Busy { error, .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                format!("busy: {}", error.key().unwrap_or_default()),
            )
                .into_response(),
            other => other.into_response(),
        }
    };
    let app = Router::new()
        .route("/skus/{sku}/purchase", post(whoami))
        .route_layer(
            DistributedLockLayer::new(
                locker.clone(),
                KeyFrom::path_param("sku").prefix("inventory:"),
            )
            .on_missing_key(MissingKey::Reject)
            .reject_with(reject),
        );
    let (status, body) = call(
        &app,
        req("POST", "/skus/1/purchase").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "busy: inventory:1")
    );
    held.release().await.unwrap();
    assert_eq!(
        call(
            &app,
            req("POST", "/skus/1/purchase").body(Body::empty()).unwrap()
        )
        .await
        .0,
        StatusCode::OK
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn the_handler_can_take_the_requests_key_again() {
    let server = server();
    let locker = locker(&server).await;
    let app = Router::new()
        .route(
            "/skus/{sku}/purchase",
            post({
                let locker = locker.clone();
                move |lock: HeldLock| async move {
                    // Same task as the request's acquire: a nested guard, no deadlock.
                    let nested = locker.lock(lock.key()).wait(Duration::ZERO).await.unwrap();
                    assert_eq!(
                        nested.fencing_token().await.unwrap(),
                        lock.fencing_token().await.unwrap()
                    );
                    nested.release().await.unwrap();
                    "nested"
                }
            }),
        )
        .route_layer(DistributedLockLayer::new(
            locker.clone(),
            KeyFrom::path_param("sku").prefix("inventory:"),
        ));
    let request = req("POST", "/skus/3/purchase").body(Body::empty()).unwrap();
    assert_eq!(
        call(&app, request).await,
        (StatusCode::OK, "nested".to_owned())
    );
    assert!(!locker.is_locked("inventory:3").await.unwrap());
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A header or query value the request carries but that is not UTF-8 (once decoded) is not a
/// missing key: it is refused with `400` also under `MissingKey::Pass`, which only lets
/// through requests without the value. Passing it unlocked would let a client skip the lock
/// of a key it does name.
#[tokio::test]
async fn a_value_that_is_not_utf8_is_refused_also_when_missing_keys_pass() {
    let server = server();
    let locker = locker(&server).await;
    let app = |missing| {
        Router::new()
            .route(
                "/pay",
                post(whoami).route_layer(
                    DistributedLockLayer::new(locker.clone(), KeyFrom::header("x-account"))
                        .on_missing_key(missing),
                ),
            )
            .route(
                "/refund",
                post(whoami).route_layer(
                    DistributedLockLayer::new(locker.clone(), KeyFrom::query_param("order"))
                        .on_missing_key(missing),
                ),
            )
    };
    for missing in [MissingKey::Reject, MissingKey::Pass] {
        let app = app(missing);
        let header = req("POST", "/pay")
            .header(
                "x-account",
                http::HeaderValue::from_bytes(b"7\xff").unwrap(),
            )
            .body(Body::empty())
            .unwrap();
        let query = req("POST", "/refund?order=7%FF")
            .body(Body::empty())
            .unwrap();
        for (what, request) in [("header", header), ("query", query)] {
            assert_eq!(
                call(&app, request).await,
                (
                    StatusCode::BAD_REQUEST,
                    "the request does not name a lock key\n".to_owned()
                ),
                "{what} under {missing:?}"
            );
        }
        // Without the value at all, `Pass` still passes.
        let (status, body) = call(&app, req("POST", "/pay").body(Body::empty()).unwrap()).await;
        let expected = match missing {
            MissingKey::Pass => (StatusCode::OK, "unlocked"),
            _ => (
                StatusCode::BAD_REQUEST,
                "the request does not name a lock key\n",
            ),
        };
        assert_eq!((status, body.as_str()), expected, "{missing:?}");
    }
    common::assert_nothing_left(&server, &[&locker]).await;
}
