//! The router, [`app`]:
//!
//! | route | what it does |
//! |---|---|
//! | `GET /health` | `ok` |
//! | `GET /metrics` | the lock kit's metrics (`lock_*`), Prometheus text |
//! | `GET /skus/{sku}` | `{"id", "stock", "sold"}` |
//! | `POST /skus/{sku}/purchase/macro` | under `#[distributed_lock]` |
//! | `POST /skus/{sku}/purchase/layer` | behind `DistributedLockLayer`, waiting for the lock; fenced write |
//! | `POST /skus/{sku}/purchase/layer-fail-fast` | the same layer without a wait: `409 busy` with `Retry-After` |
//! | `POST /skus/{sku}/purchase/fenced` | `Locker::lock` with a fixed lease; fenced write |
//!
//! A purchase answers `200` with the [`Sale`], or an [`ErrorBody`](crate::ErrorBody).

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use lock_tower::{DistributedLockLayer, HeldLock, KeyFrom, Rejection};
use tower_http::timeout::{RequestBodyTimeoutLayer, TimeoutLayer};
use tracing::Instrument;

use crate::db::SkuStatus;
use crate::error::{lock_response, AppError};
use crate::service::{critical_section, AppState, Sale};

/// How long a client may take to send a request body.
const REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a request may run once it has its lock, on top of the lock wait (a purchase is a
/// few SQLite statements).
const REQUEST_WORK_TIMEOUT: Duration = Duration::from_secs(20);

/// The router of one instance, split out of `serve` so tests can `oneshot` it.
pub fn app(state: AppState) -> Router {
    // Before the first purchase, so that every lock it takes is counted.
    crate::metrics::install();
    // The key is the SKU as `Path<i64>` reads it (`/skus/07` and `/skus/7` both lock
    // `inventory:7`, the key the other endpoints lock); a SKU that is no number is refused
    // before any lock. `route_layer` wraps only the routes added before it.
    let lock = DistributedLockLayer::new(
        state.locker.clone(),
        KeyFrom::path_param_as::<i64>("sku").prefix("inventory:"),
    )
    .reject_with(lock_response as fn(Rejection) -> Response);
    let waiting = Router::new()
        .route("/skus/{sku}/purchase/layer", post(purchase_layer))
        .route_layer(lock.clone().wait(state.config.wait));
    let fail_fast = Router::new()
        .route(
            "/skus/{sku}/purchase/layer-fail-fast",
            post(purchase_layer_fail_fast),
        )
        .route_layer(lock);

    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(crate::metrics::render))
        .route("/skus/{sku}", get(sku_status))
        .route("/skus/{sku}/purchase/macro", post(purchase_macro))
        .route("/skus/{sku}/purchase/fenced", post(purchase_fenced))
        .merge(waiting)
        .merge(fail_fast)
        // In front of every lock: a client that stops sending its body, or a request that runs
        // far past its lock wait, is cut off and its lock released.
        .layer((
            RequestBodyTimeoutLayer::new(REQUEST_BODY_TIMEOUT),
            TimeoutLayer::with_status_code(
                StatusCode::REQUEST_TIMEOUT,
                state.config.wait.saturating_add(REQUEST_WORK_TIMEOUT),
            ),
        ))
        .with_state(state)
}

async fn purchase_macro(
    State(inventory): State<AppState>,
    Path(sku): Path<i64>,
) -> Result<Json<Sale>, AppError> {
    inventory.purchase_with_macro(sku).await.map(Json)
}

async fn purchase_fenced(
    State(inventory): State<AppState>,
    Path(sku): Path<i64>,
) -> Result<Json<Sale>, AppError> {
    inventory.purchase_fenced(sku).await.map(Json)
}

async fn purchase_layer(
    State(inventory): State<AppState>,
    Path(sku): Path<i64>,
    lock: HeldLock,
) -> Result<Json<Sale>, AppError> {
    sell_under_layer(&inventory, sku, "layer", &lock).await
}

async fn purchase_layer_fail_fast(
    State(inventory): State<AppState>,
    Path(sku): Path<i64>,
    lock: HeldLock,
) -> Result<Json<Sale>, AppError> {
    sell_under_layer(&inventory, sku, "layer-fail-fast", &lock).await
}

/// Runs while the layer holds the lock (it lets go after the response). The watchdog renews
/// it, but a holder that stalls past its lease must still not write over a later holder's
/// sale: the write carries the lock's fencing token.
async fn sell_under_layer(
    inventory: &AppState,
    sku: i64,
    variant: &'static str,
    lock: &HeldLock,
) -> Result<Json<Sale>, AppError> {
    async {
        let fence = lock.fencing_token().await?;
        inventory.sell_fenced(sku, variant, fence, None).await
    }
    .instrument(critical_section(sku, None))
    .await
    .map(Json)
}

async fn sku_status(
    State(inventory): State<AppState>,
    Path(sku): Path<i64>,
) -> Result<Json<SkuStatus>, AppError> {
    let status = inventory.db.status(sku).await?;
    status.map(Json).ok_or(AppError::NotFound(sku))
}
