//! Several keys per request and the lock mode per request, against a real `redis-server`:
//! both keys of a transfer locked in either order without deadlock (the same transfers without
//! the layer overlap: the control), `GET`s reading together while `POST`s are exclusive (and
//! the opt-outs), a missing one of several keys failing closed like a missing key, and several
//! keys released when the response (or its body) ends.

use crate::common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use common::{client, locker, send, serve, server, Occupancy};
use http::{Method, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use lock_core::{LockError, Locker};
use lock_tower::{DistributedLockLayer, HeldLock, HeldLocks, HoldUntil, KeyFrom, MissingKey, Mode};
use tokio::sync::{mpsc, Semaphore};
use tower::ServiceExt;

/// A bound for anything that should take well under a second; a deadlock hits it.
const LIMIT: Duration = Duration::from_secs(20);

/// The transfer's critical section: both accounts occupied for 5 ms.
async fn occupy_both(accounts: &HashMap<u32, Occupancy>, from: u32, to: u32) {
    let _inside = [accounts[&from].enter(), accounts[&to].enter()];
    tokio::time::sleep(Duration::from_millis(5)).await;
}

/// `POST /transfer/{from}/{to}` behind both accounts' locks: checks that both keys are held
/// and that no other transfer of either account is inside, and answers both fencing tokens.
fn transfer_app(locker: Locker, accounts: Arc<HashMap<u32, Occupancy>>) -> Router {
    let handler = {
        let locker = locker.clone();
        move |Path((from, to)): Path<(u32, u32)>, locks: HeldLocks| {
            let (locker, accounts) = (locker.clone(), accounts.clone());
            async move {
                let keys = [format!("account:{from}"), format!("account:{to}")];
                let mut sorted = keys.to_vec();
                sorted.sort();
                assert_eq!(locks.keys().collect::<Vec<_>>(), sorted, "lock order");
                for key in &keys {
                    assert!(locker.is_locked(key).await.unwrap(), "{key} not held");
                }
                occupy_both(&accounts, from, to).await;
                let debit = locks.fencing_token(&keys[0]).await.unwrap();
                let credit = locks.fencing_token(&keys[1]).await.unwrap();
                format!("{debit} {credit}")
            }
        }
    };
    Router::new()
        .route("/transfer/{from}/{to}", post(handler))
        .route_layer(
            DistributedLockLayer::new(
                locker,
                KeyFrom::path_params(["from", "to"]).prefix("account:"),
            )
            .wait(LIMIT),
        )
}

/// The same route and critical section without the layer (the control run).
fn unlocked_transfer_app(accounts: Arc<HashMap<u32, Occupancy>>) -> Router {
    let handler = move |Path((from, to)): Path<(u32, u32)>| {
        let accounts = accounts.clone();
        async move {
            occupy_both(&accounts, from, to).await;
            "done"
        }
    };
    Router::new().route("/transfer/{from}/{to}", post(handler))
}

/// Three accounts, each checked by an occupancy counter.
fn three_accounts() -> Arc<HashMap<u32, Occupancy>> {
    Arc::new((1..=3).map(|a| (a, Occupancy::default())).collect())
}

/// 24 transfers sent at once, every pair of the three accounts in both orders; answers the
/// replies.
async fn transfers(addr: std::net::SocketAddr) -> Vec<common::Reply> {
    let client = client();
    let pairs = [(1, 2), (2, 1), (2, 3), (3, 2), (3, 1), (1, 3)];
    let requests: Vec<_> = (0..24)
        .map(|i| {
            let client = client.clone();
            let (from, to) = pairs[i % pairs.len()];
            let url = format!("http://{addr}/transfer/{from}/{to}");
            tokio::spawn(async move { common::post(&client, &url).await })
        })
        .collect();
    let mut replies = Vec::new();
    for request in requests {
        let reply = tokio::time::timeout(LIMIT, request)
            .await
            .expect("a transfer did not finish: deadlock?")
            .unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        replies.push(reply);
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_path_params_lock_both_accounts_in_either_order_without_deadlock() {
    let server = server();
    let locker = locker(&server).await;
    let accounts = three_accounts();
    let addr = serve(transfer_app(locker.clone(), accounts.clone())).await;
    for reply in transfers(addr).await {
        // A fencing token for each key.
        let tokens: Vec<u64> = reply.body.split(' ').map(|t| t.parse().unwrap()).collect();
        assert!(
            tokens.len() == 2 && tokens.iter().all(|t| *t > 0),
            "{reply:?}"
        );
    }
    for (account, occupancy) in accounts.iter() {
        assert_eq!(occupancy.entered(), 16, "transfers of account {account}");
        assert_eq!(
            occupancy.max(),
            1,
            "two transfers of account {account} overlapped"
        );
    }
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// The control: the same transfers without the layer overlap on every account, so the
/// occupancy counters above would catch two holders at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_two_path_params_without_the_layer_overlap() {
    let accounts = three_accounts();
    let addr = serve(unlocked_transfer_app(accounts.clone())).await;
    transfers(addr).await;
    let mut most = Vec::new();
    for account in 1..=3 {
        let occupancy = &accounts[&account];
        assert_eq!(occupancy.entered(), 16, "transfers of account {account}");
        most.push(occupancy.max());
    }
    lock_testkit::figure(&format!(
        "control: 24 transfers over 3 accounts without the layer, most inside at once per account: {most:?}"
    ));
    assert!(most.iter().all(|m| *m > 1), "{most:?}");
}

/// A handler that reports its lock and, for the `hold` routes, stays inside until the test
/// adds a permit to `leave` (after `entered` got a permit).
#[derive(Clone)]
struct Gate {
    entered: Arc<Semaphore>,
    leave: Arc<Semaphore>,
}

impl Gate {
    fn new() -> Self {
        Self {
            entered: Arc::new(Semaphore::new(0)),
            leave: Arc::new(Semaphore::new(0)),
        }
    }

    /// Waits until a handler is inside.
    async fn inside(&self) {
        let permit = tokio::time::timeout(LIMIT, self.entered.acquire())
            .await
            .expect("no handler entered")
            .unwrap();
        permit.forget();
    }

    fn open(&self) {
        self.leave.add_permits(1);
    }
}

/// `"shared"` or `"exclusive <token>"`: what the handler's `HeldLock` says.
async fn describe(lock: &HeldLock) -> String {
    if lock.is_shared() {
        let error = lock.fencing_token().await.unwrap_err();
        assert!(matches!(error, LockError::NotExclusive { .. }), "{error:?}");
        "shared".to_owned()
    } else {
        format!("exclusive {}", lock.fencing_token().await.unwrap())
    }
}

/// `GET|POST /catalogue/{id}` answers at once, `GET|POST /catalogue/{id}/hold` waits for the
/// gate; all lock `catalogue:<id>` with `layer`'s mode.
fn catalogue_app<M>(
    layer: DistributedLockLayer<KeyFrom, lock_tower::DefaultReject, M>,
    gate: Gate,
) -> Router
where
    M: lock_tower::ChooseMode<Body> + Send + Sync + 'static,
{
    let quick = |lock: HeldLock| async move { describe(&lock).await };
    let hold = move |lock: HeldLock| {
        let gate = gate.clone();
        async move {
            gate.entered.add_permits(1);
            gate.leave.acquire().await.unwrap().forget();
            describe(&lock).await
        }
    };
    Router::new()
        .route("/catalogue/{id}", get(quick).post(quick))
        .route("/catalogue/{id}/hold", get(hold.clone()).post(hold))
        .route_layer(layer)
}

fn catalogue_layer(locker: &Locker) -> DistributedLockLayer<KeyFrom> {
    DistributedLockLayer::new(
        locker.clone(),
        KeyFrom::path_param("id").prefix("catalogue:"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_read_together_and_posts_are_exclusive_by_default() {
    let server = server();
    let locker = locker(&server).await;
    let gate = Gate::new();
    let addr = serve(catalogue_app(catalogue_layer(&locker), gate.clone())).await;
    let client = client();
    let url = |path: &str| format!("http://{addr}/catalogue/7{path}");

    // A GET holds the read lock: another GET gets in at once (zero wait), a POST does not.
    let holder = tokio::spawn({
        let (client, url) = (client.clone(), url("/hold"));
        async move { send(&client, Method::GET, &url).await }
    });
    gate.inside().await;
    let reply = send(&client, Method::GET, &url("")).await;
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (StatusCode::OK, "shared")
    );
    let reply = send(&client, Method::HEAD, &url("")).await;
    assert_eq!(reply.status, StatusCode::OK, "HEAD reads too");
    let reply = send(&client, Method::POST, &url("")).await;
    assert_eq!(
        reply.status,
        StatusCode::CONFLICT,
        "a POST got in beside a GET"
    );
    gate.open();
    let reply = holder.await.unwrap();
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (StatusCode::OK, "shared")
    );

    // A POST holds the exclusive lock: a GET is refused.
    let holder = tokio::spawn({
        let (client, url) = (client.clone(), url("/hold"));
        async move { send(&client, Method::POST, &url).await }
    });
    gate.inside().await;
    let reply = send(&client, Method::GET, &url("")).await;
    assert_eq!(
        reply.status,
        StatusCode::CONFLICT,
        "a GET got in beside a POST"
    );
    gate.open();
    let reply = holder.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body.starts_with("exclusive "), "{reply:?}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mode_can_be_exclusive_for_every_request_or_chosen_by_a_closure() {
    let server = server();
    let locker = locker(&server).await;
    let client = client();

    // `.mode(Mode::Exclusive)`: the behaviour before read locks, GETs exclude each other.
    let gate = Gate::new();
    let exclusive = catalogue_layer(&locker).mode(Mode::Exclusive);
    let addr = serve(catalogue_app(exclusive, gate.clone())).await;
    let holder = tokio::spawn({
        let (client, url) = (client.clone(), format!("http://{addr}/catalogue/7/hold"));
        async move { send(&client, Method::GET, &url).await }
    });
    gate.inside().await;
    let reply = send(&client, Method::GET, &format!("http://{addr}/catalogue/7")).await;
    assert_eq!(
        reply.status,
        StatusCode::CONFLICT,
        "GETs shared an exclusive lock"
    );
    gate.open();
    let reply = holder.await.unwrap();
    assert!(reply.body.starts_with("exclusive "), "{reply:?}");

    // A closure: POSTs with `x-read-only` read, everything else is exclusive.
    let gate = Gate::new();
    let chosen = catalogue_layer(&locker).mode(|req: &Request| {
        if req.headers().contains_key("x-read-only") {
            Mode::Read
        } else {
            Mode::Exclusive
        }
    });
    let app = catalogue_app(chosen, gate.clone());
    let holder = tokio::spawn({
        let app = app.clone();
        async move {
            let request = http::Request::post("/catalogue/8/hold")
                .header("x-read-only", "1")
                .body(Body::empty())
                .unwrap();
            app.oneshot(request).await.unwrap()
        }
    });
    gate.inside().await;
    let call = |request: http::Request<Body>| {
        let app = app.clone();
        tokio::spawn(async move {
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8(body.to_vec()).unwrap())
        })
    };
    let read = http::Request::post("/catalogue/8")
        .header("x-read-only", "1")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        call(read).await.unwrap(),
        (StatusCode::OK, "shared".to_owned())
    );
    let get = http::Request::get("/catalogue/8")
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(get).await.unwrap().0, StatusCode::CONFLICT);
    gate.open();
    assert_eq!(holder.await.unwrap().status(), StatusCode::OK);
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// Reads the response of `request` to its end, from its own task.
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

/// The keys of `x-from` and `x-to`, both or none.
fn header_pair(req: &Request) -> Option<Vec<String>> {
    let from = req.headers().get("x-from")?.to_str().ok()?;
    let to = req.headers().get("x-to")?.to_str().ok()?;
    Some(vec![from.to_owned(), to.to_owned()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_one_of_several_keys_fails_closed_like_a_missing_key() {
    let server = server();
    let locker = locker(&server).await;
    let ran = Arc::new(AtomicUsize::new(0));
    let handler = {
        let ran = ran.clone();
        move |locks: Option<HeldLocks>| {
            ran.fetch_add(1, Ordering::SeqCst);
            async move {
                match locks {
                    Some(locks) => format!("locked {}", locks.keys().collect::<Vec<_>>().join(",")),
                    None => "unlocked".to_owned(),
                }
            }
        }
    };
    let app = Router::new()
        // The route lacks `{to}`: a misconfiguration, 500, as for a missing path parameter.
        .route("/transfer/{from}", post(handler.clone()))
        .route_layer(DistributedLockLayer::new(
            locker.clone(),
            KeyFrom::path_params(["from", "to"]).prefix("account:"),
        ))
        .merge(
            Router::new()
                .route("/headers", post(handler.clone()))
                .route_layer(DistributedLockLayer::new(locker.clone(), header_pair)),
        )
        .merge(
            Router::new()
                .route("/empty", post(handler.clone()))
                .route_layer(DistributedLockLayer::new(locker.clone(), |_: &Request| {
                    Some(Vec::<String>::new())
                })),
        )
        .merge(
            Router::new()
                .route("/pass", post(handler.clone()))
                .route_layer(
                    DistributedLockLayer::new(locker.clone(), header_pair)
                        .on_missing_key(MissingKey::Pass),
                ),
        )
        .merge(
            Router::new()
                .route(
                    "/one/{from}/{to}",
                    post(|lock: HeldLock| async move { lock.key().to_owned() }),
                )
                .route_layer(DistributedLockLayer::new(
                    locker.clone(),
                    KeyFrom::path_params(["from", "to"]),
                )),
        );
    let req = |uri: &str, headers: &[(&str, &str)]| {
        let mut builder = http::Request::post(uri);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(Body::empty()).unwrap()
    };

    let (status, _) = call(&app, req("/transfer/1", &[])).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    // Missing `x-to`: the client's fault, 400, never locked on `x-from` alone.
    let (status, _) = call(&app, req("/headers", &[("x-from", "a")])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // An empty list is no key.
    let (status, _) = call(&app, req("/empty", &[])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // An empty key among several: an invalid key, 400.
    let (status, _) = call(&app, req("/headers", &[("x-from", "a"), ("x-to", "")])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "a handler ran without its locks"
    );

    // Opted in: passed unlocked.
    let (status, body) = call(&app, req("/pass", &[("x-from", "a")])).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "unlocked"));
    // Both present: both locked (in sorted order).
    let (status, body) = call(&app, req("/headers", &[("x-from", "b"), ("x-to", "a")])).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "locked a,b"));
    // A handler that asks for one `HeldLock` on a route of several keys is told so.
    let (status, body) = call(&app, req("/one/1/2", &[])).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body, "several locks held for this request\n");
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A body fed by a channel: a frame per message, the end when the sender is dropped.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

/// `GET /report/{a}/{b}`: a body that streams until the test drops the sender pushed to
/// `senders`; locks both keys (a GET, but several keys are always exclusive).
fn streaming_app(
    locker: Locker,
    hold: HoldUntil,
) -> (Router, Arc<Mutex<Vec<mpsc::Sender<Bytes>>>>) {
    let senders = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route(
            "/report/{a}/{b}",
            get({
                let senders = senders.clone();
                move || {
                    let senders = senders.clone();
                    async move {
                        let (tx, rx) = mpsc::channel(4);
                        senders.lock().unwrap().push(tx);
                        Body::new(ChannelBody(rx))
                    }
                }
            }),
        )
        .route_layer(
            DistributedLockLayer::new(locker, KeyFrom::path_params(["a", "b"]).prefix("r:"))
                .hold_until(hold),
        );
    (app, senders)
}

async fn spawn_get(app: &Router, uri: &str) -> http::Response<Body> {
    let app = app.clone();
    let request = http::Request::get(uri).body(Body::empty()).unwrap();
    tokio::spawn(async move { app.oneshot(request).await.unwrap() })
        .await
        .unwrap()
}

async fn held(locker: &Locker, keys: &[&str]) -> Vec<bool> {
    let mut held = Vec::new();
    for key in keys {
        held.push(locker.is_locked(key).await.unwrap());
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_are_held_until_the_body_ends_and_released_together() {
    let server = server();
    let locker = locker(&server).await;
    let (app, senders) = streaming_app(locker.clone(), HoldUntil::BodyEnd);

    let first = spawn_get(&app, "/report/x/y").await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(held(&locker, &["r:x", "r:y"]).await, [true, true]);
    // Several keys are exclusive even for a GET; sharing one key is enough to be refused.
    let second = spawn_get(&app, "/report/y/z").await;
    assert_eq!(second.status(), StatusCode::CONFLICT);
    assert!(!locker.is_locked("r:z").await.unwrap(), "all or nothing");

    let tx = senders.lock().unwrap().pop().unwrap();
    let reader = tokio::spawn(async move { first.into_body().collect().await.unwrap().to_bytes() });
    tx.send(Bytes::from_static(b"row\n")).await.unwrap();
    assert_eq!(
        held(&locker, &["r:x", "r:y"]).await,
        [true, true],
        "held until the end"
    );
    drop(tx);
    assert_eq!(&reader.await.unwrap()[..], b"row\n");
    // The end of the body is passed on only after both releases.
    assert_eq!(held(&locker, &["r:x", "r:y"]).await, [false, false]);
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_several_keys_are_released_with_the_response_head() {
    let server = server();
    let locker = locker(&server).await;
    let (app, senders) = streaming_app(locker.clone(), HoldUntil::Response);

    let first = spawn_get(&app, "/report/x/y").await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(held(&locker, &["r:x", "r:y"]).await, [false, false]);
    let second = spawn_get(&app, "/report/y/x").await;
    assert_eq!(second.status(), StatusCode::OK);
    senders.lock().unwrap().clear();
    drop((first, second));
    common::assert_nothing_left(&server, &[&locker]).await;
}
