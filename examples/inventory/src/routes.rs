//! The router, [`app`]: `GET /health`, `GET /metrics` (Prometheus text), `GET /skus/{sku}`
//! (`{"id", "stock", "sold"}`), and `POST /skus/{sku}/purchase/<how>`: `macro`, `layer`
//! (behind [`DistributedLockLayer`]) or `fenced` (`Locker::lock`). A purchase answers `200`
//! with the [`Sale`], or an [`ErrorBody`](crate::ErrorBody).

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use lock_tower::{DistributedLockLayer, HeldLock, KeyFrom};
use tower_http::timeout::TimeoutLayer;
use tracing::Instrument;

use crate::db::SkuStatus;
use crate::error::AppError;
use crate::service::{critical_section, AppState, Sale};

/// How long a request may run on top of its lock wait (a purchase: a few SQLite statements).
const REQUEST_WORK_TIMEOUT: Duration = Duration::from_secs(20);

/// The router of one instance, split out of `serve` so tests can `oneshot` it.
pub fn app(state: AppState) -> Router {
    // Before the first purchase, so that every lock it takes is counted.
    crate::metrics::install();
    // `route_layer` wraps only the routes added before it. Without `.wait(..)` (default
    // zero), a request that finds the SKU locked is answered `409 busy` with `Retry-After`.
    let layered = Router::new()
        .route("/skus/{sku}/purchase/layer", post(purchase_layer))
        .route_layer(lock_layer(&state).wait(state.config.wait));

    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(crate::metrics::render))
        .route("/skus/{sku}", get(sku_status))
        .route("/skus/{sku}/purchase/macro", post(purchase_macro))
        .route("/skus/{sku}/purchase/fenced", post(purchase_fenced))
        .merge(layered)
        // In front of every lock: a request that runs far past its lock wait is cut off, and
        // its lock released. (No route reads a body; one that does wants a body timeout too.)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            state.config.wait.saturating_add(REQUEST_WORK_TIMEOUT),
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

/// The lock of a purchase route: the key is the SKU as `Path<i64>` reads it (`/skus/07` and
/// `/skus/7` both lock `inventory:7`, the key the other purchases lock); a SKU that is no
/// number is refused before any lock.
pub fn lock_layer(state: &AppState) -> DistributedLockLayer<KeyFrom> {
    let key = KeyFrom::path_param_as::<i64>("sku").prefix("inventory:");
    DistributedLockLayer::new(state.locker.clone(), key)
}

async fn purchase_layer(
    State(inventory): State<AppState>,
    Path(sku): Path<i64>,
    lock: HeldLock,
) -> Result<Json<Sale>, AppError> {
    sell_under_layer(&inventory, sku, "layer", &lock).await
}

/// Runs while the layer holds the lock (it lets go after the response). The watchdog renews
/// it, but a holder that stalls past its lease must still not write over a later holder's
/// sale: the write carries the lock's fencing token.
pub async fn sell_under_layer(
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
