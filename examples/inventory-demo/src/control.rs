//! The purchases the service does not have and the demo runs, added to its router:
//!
//! - `unlocked`, the bug a lock prevents (the control round, which shows that the demo's
//!   checks catch an oversell);
//! - `locked-no-fence`, a lock with a fixed lease but no fencing token, which oversells once
//!   a holder stalls past its lease (`--chaos`);
//! - `layer-fail-fast`, the service's `layer` purchase behind its lock layer as it comes,
//!   without a wait: `409 busy` with `Retry-After` while the SKU is locked.
//!
//! The first two use the service's steps and write the stock unconditionally, in spans named
//! like the service's (`read_stock`, `write_sale`), so the recorder draws them alike.

use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use inventory::db::{Db, DbError};
use inventory::routes::lock_layer;
use inventory::service::{critical_section, lock_key, release};
use inventory::{AppError, AppState, Sale};
use lock_core::{LockError, LockGuard, LostReason};
use lock_tower::HeldLock;
use rusqlite::{OptionalExtension, TransactionBehavior};
use tracing::field::Empty;
use tracing::Instrument;

use crate::variant::Variant;

/// The routes of the demo's purchases.
pub fn routes(state: AppState) -> Router {
    let fail_fast = post(purchase_layer_fail_fast).route_layer(lock_layer(&state));
    Router::new()
        .route(Variant::Unlocked.route(), post(purchase_unlocked))
        .route(
            Variant::LockedNoFence.route(),
            post(purchase_locked_no_fence),
        )
        .route(Variant::LayerFailFast.route(), fail_fast)
        .with_state(state)
}

async fn purchase_layer_fail_fast(
    State(inventory): State<AppState>,
    Path(sku): Path<i64>,
    lock: HeldLock,
) -> Result<Json<Sale>, AppError> {
    // The service's `layer` purchase: its handler is private to its router.
    let span = critical_section(sku, None);
    let fence = lock.fencing_token().instrument(span.clone()).await?;
    let sold = inventory.sell_fenced(sku, Variant::LayerFailFast.name(), fence);
    sold.instrument(span).await.map(Json)
}

async fn purchase_unlocked(
    State(inventory): State<AppState>,
    Path(sku): Path<i64>,
) -> Result<Json<Sale>, AppError> {
    sell_unfenced(&inventory, sku, Variant::Unlocked, None)
        .await
        .map(Json)
}

/// The service's `fenced` purchase without the token: correct until a holder stalls between
/// its `is_held()` check and its write for longer than its lease.
async fn purchase_locked_no_fence(
    State(inventory): State<AppState>,
    Path(sku): Path<i64>,
) -> Result<Json<Sale>, AppError> {
    let config = &inventory.config;
    let lock = inventory.locker.lock(lock_key(sku));
    let guard = lock.wait(config.wait).lease(config.lease).await?;
    let sold = sell_unfenced(&inventory, sku, Variant::LockedNoFence, Some(&guard))
        .instrument(critical_section(sku, Some(guard.remaining())))
        .await;
    release(guard).await;
    sold.map(Json)
}

/// Read, check, await, write, with nothing to refuse a write based on a stale read. `guard`,
/// when given, is checked to be still held right before the write: a stall can come after
/// the check all the same.
async fn sell_unfenced(
    inventory: &AppState,
    sku: i64,
    variant: Variant,
    guard: Option<&LockGuard>,
) -> Result<Sale, AppError> {
    let stock = read_stock(&inventory.db, sku).await?;
    let sale = inventory
        .check_and_think(sku, stock, variant.name())
        .await?;
    if let Some(guard) = guard.filter(|guard| !guard.is_held()) {
        let (key, reason) = (guard.key().into(), LostReason::Expired);
        return Err(AppError::Lock(LockError::Lost { key, reason }));
    }
    Ok(write_sale(&inventory.db, sale).await?)
}

async fn read_stock(db: &Db, sku: i64) -> Result<Option<i64>, DbError> {
    db.call(move |conn| {
        let span = tracing::debug_span!("read_stock", sku, stock = Empty);
        let _entered = span.enter();
        let stock: Option<i64> = conn
            .query_row("SELECT stock FROM skus WHERE id = ?1", [sku], |row| {
                row.get(0)
            })
            .optional()?;
        if let Some(stock) = stock {
            span.record("stock", stock);
        }
        Ok(stock)
    })
    .await
}

/// Writes the stock `sale` left and its order, whatever happened since the stock was read.
async fn write_sale(db: &Db, mut sale: Sale) -> Result<Sale, DbError> {
    let (sku, new_stock) = (sale.sku, sale.stock_left);
    db.call(move |conn| {
        let span = tracing::debug_span!("write_sale", sku, new_stock, order_id = Empty);
        let _entered = span.enter();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute("UPDATE skus SET stock = ?1 WHERE id = ?2", (new_stock, sku))?;
        tx.execute(
            "INSERT INTO orders (sku_id, variant, instance) VALUES (?1, ?2, ?3)",
            (sku, &sale.variant, &sale.instance),
        )?;
        sale.order_id = tx.last_insert_rowid();
        tx.commit()?;
        span.record("order_id", sale.order_id);
        Ok(sale)
    })
    .await
}
