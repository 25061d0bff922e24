//! The router, [`app`]: `GET /health`, `/metrics`, `/skus/{sku}` (`{"id", "stock", "sold"}`),
//! and `POST /skus/{sku}/purchase/<how>`: `macro`, `layer` ([`DistributedLockLayer`]) or
//! `fenced` (`Locker::lock`), answered with the [`Sale`] or an [`ErrorBody`](crate::ErrorBody).

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

/// The router of one instance, split out of `serve` so tests can `oneshot` it.
pub fn app(state: AppState) -> Router {
    // Before the first purchase, so that every lock is counted.
    crate::metrics::install();
    // Without `.wait(..)` (zero), a request that finds the SKU locked would be answered `409`
    // with `Retry-After` at once. `route_layer` wraps only the routes added before it.
    let layer = lock_layer(&state).wait(state.config.wait);
    let layered = Router::new().route("/skus/{sku}/purchase/layer", post(purchase_layer));
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(crate::metrics::render))
        .route("/skus/{sku}", get(sku_status))
        .route("/skus/{sku}/purchase/macro", post(purchase_macro))
        .route("/skus/{sku}/purchase/fenced", post(purchase_fenced))
        .merge(layered.route_layer(layer))
        // In front of every lock: a request that runs far past its lock wait (a purchase is a
        // few statements) is cut off, and its lock released. (No route reads a body; one that
        // does wants a body timeout too.)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            state.config.wait.saturating_add(Duration::from_secs(20)),
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

/// Runs while the layer holds the lock (it lets go after the response). The watchdog renews
/// it, but a holder that stalls past its lease must still not write over a later holder's
/// sale: the write carries the lock's fencing token.
async fn purchase_layer(
    State(inventory): State<AppState>,
    Path(sku): Path<i64>,
    lock: HeldLock,
) -> Result<Json<Sale>, AppError> {
    let span = critical_section(sku, None);
    let fence = lock.fencing_token().instrument(span.clone()).await?;
    let sold = inventory.sell_fenced(sku, "layer", fence);
    sold.instrument(span).await.map(Json)
}

async fn sku_status(
    State(inventory): State<AppState>,
    Path(sku): Path<i64>,
) -> Result<Json<SkuStatus>, AppError> {
    let status = inventory.db.status(sku).await?;
    status.map(Json).ok_or(AppError::NotFound(sku))
}
