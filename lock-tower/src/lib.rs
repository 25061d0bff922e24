//! A tower middleware that takes a distributed lock per request key: requests for the same
//! key (the same SKU, account, order) run one at a time across every instance of a service
//! that shares one Redis, requests for different keys run in parallel. A request can lock
//! several keys at once (both accounts of a transfer), and reads (`GET`) of a key share its
//! read lock while writes are exclusive.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use axum::{extract::Path, routing::post, Router};
//! use lock_core::Locker;
//! use lock_tower::{DistributedLockLayer, HeldLock, KeyFrom};
//!
//! async fn purchase(Path(sku): Path<String>, lock: HeldLock) -> Result<String, String> {
//!     // Only one request for this SKU, in all instances, runs here at a time.
//!     let token = lock.fencing_token().await.map_err(|e| e.to_string())?;
//!     Ok(format!("bought {sku} (fencing token {token})"))
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let locker = Locker::connect("redis://127.0.0.1:6379").await?;
//! let app: Router = Router::new()
//!     .route("/skus/{sku}/purchase", post(purchase))
//!     .route_layer(
//!         DistributedLockLayer::new(locker, KeyFrom::path_param("sku").prefix("inventory:"))
//!             .wait(Duration::ZERO), // fail fast with 409 (the default)
//!     );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Behaviour
//!
//! - **Key.** A [`KeyExtractor`] names the lock of each request: any
//!   `Fn(&Request<B>) -> Option<String>`, or a ready-made [`KeyFrom`] (axum path parameter,
//!   header, query parameter, fixed key, each with an optional [`prefix`](KeyFrom::prefix)).
//!   **The key must be the resource's canonical form**: requests exclude each other only when
//!   they lock the same key, and the text extractors lock the value as the client wrote it
//!   (`/skus/07` and `/skus/7` are two keys, though `Path<u64>` reads both as 7). When the
//!   handler parses the value, use the typed extractor of its type
//!   ([`KeyFrom::path_param_as`], [`header_as`](KeyFrom::header_as),
//!   [`query_param_as`](KeyFrom::query_param_as), [`path_params_as`](KeyFrom::path_params_as)),
//!   which locks the parsed value's `Display` and refuses a value that does not parse
//!   ([`Rejection::MalformedKey`], `400`).
//! - **Several keys.** An extractor may name several keys ([`KeyFrom::path_params`], or a
//!   closure returning `Option<Vec<String>>` or an array; see [`LockKeys`]): the request then
//!   holds all of them, taken with `Locker::lock_all` (all or nothing, in one order for every
//!   request, so `/transfer/7/3` and `/transfer/3/7` cannot deadlock), exclusively whatever
//!   the mode. A request missing any of them is treated as a request without a key (below):
//!   it is never locked on some of its keys only.
//! - **Mode.** Each request takes its key's read lock or its exclusive lock, chosen by a
//!   [`ChooseMode`] set with [`mode`](DistributedLockLayer::mode). Default [`ByMethod`]: the
//!   safe methods `GET`, `HEAD`, `OPTIONS` and `TRACE` take the [read lock](Mode::Read)
//!   (requests for one key read together, in every instance, and never while a write holds
//!   it), every other method the [exclusive lock](Mode::Exclusive) (the key's write lock).
//!   **This changed:** before read locks existed, every request took the exclusive lock. A
//!   `GET` route whose handler writes under its key, or calls a `#[distributed_lock]` fn on
//!   the same key (which then fails with `LockError::WriteInsideRead`), needs
//!   `.mode(Mode::Exclusive)`, which restores the old behaviour for the layer.
//!   The layer never lets a request through unlocked by default: a request without a key is
//!   rejected ([`MissingKey::Reject`]), with `400` when the request lacks a header or query
//!   parameter, with `500` (logged as an error once per route) when the route lacks the path
//!   parameter, a server misconfiguration. [`MissingKey::Pass`] lets such requests through
//!   unlocked, as an explicit opt-in; a request that carries its key's value in a form that
//!   cannot be read (not UTF-8, a query parameter given twice) or parsed is rejected with
//!   `400` whatever the setting. An invalid key (empty, longer than
//!   [`lock_core::MAX_KEY_LEN`]) is rejected with `400`.
//! - **Acquire.** The lock is taken in `call` (the key is only known with the request), with
//!   the configured [`wait`](DistributedLockLayer::wait) (default zero: one attempt) and either
//!   a fixed [`lease`](DistributedLockLayer::lease) or the locker's watchdog (default), which
//!   renews the lock while the request holds it, up to the layer's
//!   [`max_hold`](DistributedLockLayer::max_hold) ([`DEFAULT_MAX_HOLD`], one minute). The lock
//!   is taken before the handler reads the request body, so the bound is what keeps a client
//!   that sends its headers and then nothing from holding a key for as long as its
//!   connection lives. `poll_ready` is the inner service's.
//! - **Rejections.** Every lock failure becomes a response, never an error, so the service
//!   keeps the inner service's error type and works under axum's `Infallible` routers. By
//!   default (see [`Rejection`]): contended, `409 Conflict` with a short, jittered
//!   `Retry-After` (1 or 2 s; [`RetryAfter`], set with
//!   [`retry_after`](DistributedLockLayer::retry_after); another status with
//!   [`busy_status`](DistributedLockLayer::busy_status), e.g. `429` or `503` for clients
//!   whose retry middleware retries only those); Redis unavailable,
//!   `503 Service Unavailable` with `Retry-After` (fail closed), or the request passes
//!   unlocked with a warning under [`fail_open`](DistributedLockLayer::fail_open); invalid or missing key,
//!   `400 Bad Request` (`500` for a path parameter the route lacks; `400` for a typed key that
//!   does not parse); any other lock error,
//!   `500`. Replace any of them with
//!   [`reject_with`](DistributedLockLayer::reject_with). Handlers and `#[distributed_lock]`
//!   methods answer their own lock errors the same way with `Rejection::from(error)`.
//! - **Holding.** The guard lives in the [`future::ResponseFuture`]: the lock is held until the
//!   inner service's response future completes, i.e. until the axum handler has returned its
//!   response. The body is then sent without the lock, which covers handlers that build their
//!   whole body (`Json`, `String`, ...). For a body that streams work done under the lock,
//!   [`HoldUntil::BodyEnd`] moves the guard into the [`LockedBody`], which holds it until the
//!   body ends (a response with no body to send, such as a `204` or the answer to a `HEAD`,
//!   is released before it is passed on), and ends the body with the lock-lost error if the
//!   lock is lost while it streams.
//! - **Loss.** The lock is watched while the handler runs: when it is lost (its `max_hold`
//!   reached, Redis lost the key), the handler is stopped at once and the request answered
//!   with [`Rejection::Lost`] (`503`), unless the layer says
//!   [`on_lost(OnLost::Continue)`](DistributedLockLayer::on_lost): then the handler finishes,
//!   and learns of the loss from [`HeldLock::is_held`] or [`HeldLock::lost`].
//! - **Release.** At the end of the hold the layer releases the lock and waits for Redis to
//!   confirm before it passes the response head (or the end of the body) on, so a client that
//!   gets its response and at once sends the next request for the same key finds the key free.
//!   That costs one Redis round trip per locked response; if Redis fails during the release,
//!   the response still goes out (after the locker's `command_timeout` at worst) and the lock
//!   expires with its lease. The release is cancel safe: if the response is dropped while it
//!   waits for it, `lock_core` finishes it in the background. A lock lost while the request
//!   held it is logged as a warning.
//!   When the response future or the body is dropped early (the client disconnected, an outer
//!   timeout fired, the handler panicked), the guard is dropped with it and `lock_core`
//!   releases it in the background at once. If the process dies, the lock expires after one
//!   lease.
//! - **In the handler.** A [`HeldLock`] (the key, whether it is a read lock, the fencing
//!   token on request (read locks have none), and whether the lock is still held) is inserted into the request extensions of a
//!   request locked on one key, and [`HeldLocks`] (every lock, each with its own fencing token)
//!   into those of every locked request; with axum both are extractors (also as `Option<..>`).
//!   A handler that extracts `HeldLock` on a route of several keys gets a `500` that says to
//!   extract `HeldLocks`, so it cannot fence one of the keys only by mistake.
//! - **Tracing.** Each locked request runs in a `distributed_lock` debug span with the `key`
//!   (or the keys, comma-separated), the `mode` (`read`, `exclusive`), the `outcome` (`acquired`, `busy`, `unavailable`, `fail_open`, `invalid_key`, `failed`);
//!   the inner service runs inside it.
//!
//! # Owners and reentrancy
//!
//! Locks of `lock_core` are reentrant per tokio task, and the acquire runs in the task that
//! polls the response future. hyper (and so `axum::serve`) polls each request in its own
//! task (an HTTP/1 connection serves one request at a time; each HTTP/2 stream gets a task),
//! so requests exclude each other, and a handler that takes the same key again (a
//! `#[distributed_lock]` function on the same key) nests inside the request's lock instead of
//! deadlocking. Sharp edge: response futures driven together inside one task (`join!`,
//! `FuturesUnordered`, two `oneshot` calls joined in one test) share the owner and do not
//! exclude each other: spawn each request.
//!
//! # Response body type
//!
//! The service answers `Response<LockedBody<B>>` for an inner `Response<B>`: [`LockedBody`]
//! is `B` unchanged plus, with [`HoldUntil::BodyEnd`], the guard, with its errors boxed
//! (`Box<dyn Error + Send + Sync>`, so `B::Error` must convert into one, as hyper and axum
//! require anyway); axum routers accept it like any body. Rejection responses are built as
//! `Response<B>` by the [`Reject`]: [`DefaultReject`] needs `B: From<&'static str>` (true of
//! `axum::body::Body`, `String`, `Full<Bytes>`) to write a short text body; for other bodies
//! pass a [`Reject`] of your own.
//!
//! # Feature flags
//!
//! - `axum` (default): [`KeyFrom::path_param`], [`KeyFrom::path_params`] and their typed
//!   forms [`KeyFrom::path_param_as`], [`KeyFrom::path_params_as`], the [`HeldLock`]
//!   and [`HeldLocks`] extractors and
//!   `IntoResponse for Rejection`. Without it the crate does not depend on axum and works with
//!   any tower stack over `http` types.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod body;
mod extension;
pub mod future;
mod key;
mod layer;
mod mode;
mod reject;
mod release;
mod service;
mod warn_limit;

pub use body::LockedBody;
#[cfg(feature = "axum")]
pub use extension::MissingHeldLock;
pub use extension::{HeldLock, HeldLocks};
pub use key::{KeyAbsence, KeyExtractor, KeyFrom, LockKeys};
pub use layer::{DistributedLockLayer, HoldUntil, MissingKey, DEFAULT_MAX_HOLD};
pub use mode::{ByMethod, ChooseMode, Mode};
pub use reject::{BusyInfo, DefaultReject, Reject, Rejection, RetryAfter, MAX_RETRY_AFTER_SECS};
pub use service::DistributedLockService;

/// Compiles every Rust block of the repository's README.md as a doctest, so the README's
/// program and snippets cannot drift from the API.
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

#[cfg(all(test, feature = "axum"))]
mod bounds {
    use super::*;

    fn is_send<T: Send>() {}
    fn is_sync<T: Sync>() {}

    #[test]
    fn bounds() {
        type Route = axum::routing::Route;
        type Svc = DistributedLockService<Route, KeyFrom>;
        is_send::<Svc>();
        is_sync::<Svc>();
        is_send::<future::ResponseFuture<Route, axum::body::Body, DefaultReject>>();
        is_send::<LockedBody<axum::body::Body>>();
        is_send::<DistributedLockLayer<KeyFrom>>();
        is_sync::<DistributedLockLayer<KeyFrom>>();
        is_send::<HeldLock>();
        is_sync::<HeldLock>();
        is_send::<HeldLocks>();
        is_sync::<HeldLocks>();
    }
}
