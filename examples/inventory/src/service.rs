//! The purchase itself: read the stock, answer `sold out` at 0, wait [`ServiceConfig::think`]
//! (a pricing or payment call in a real service), then write `stock - 1` and the order. What
//! differs between the endpoints is only what keeps two purchases of one SKU apart.
//!
//! The time a purchase holds its lock is the `tracing` span `critical_section`.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{distributed_lock, LockGuard, Locker};
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::db::{Db, Fenced, NewOrder};
use crate::error::AppError;

/// Settings of one service instance.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The instance's name, stored with each order it takes.
    pub instance: String,
    /// The await between reading the stock and writing it back.
    pub think: Duration,
    /// How long the layer's and `Locker::lock`'s purchases wait for the lock (the macro has
    /// its `wait = "10s"` in the attribute).
    pub wait: Duration,
    /// The fixed lease (no watchdog) of the `fenced` purchase.
    pub lease: Duration,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            instance: "inventory".to_owned(),
            think: Duration::from_millis(5),
            wait: Duration::from_secs(10),
            lease: Duration::from_millis(200),
        }
    }
}

/// The state shared by the handlers of one instance.
#[derive(Debug)]
pub struct Inventory {
    /// This instance's locker (one per process).
    pub locker: Locker,
    /// The shared database.
    pub db: Db,
    /// The instance's settings.
    pub config: ServiceConfig,
}

/// What the router holds.
pub type AppState = Arc<Inventory>;

/// A successful purchase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sale {
    /// The new order's id.
    pub order_id: i64,
    /// The SKU sold.
    pub sku: i64,
    /// The stock this purchase wrote.
    pub stock_left: i64,
    /// How the purchase was protected (the last segment of its route).
    pub variant: String,
    /// The instance that served it.
    pub instance: String,
    /// The fencing token the write carried, if it was fenced.
    pub fencing_token: Option<u64>,
}

/// The lock key of a SKU, the same for every endpoint: `inventory:<sku>`.
pub fn lock_key(sku: i64) -> String {
    format!("inventory:{sku}")
}

/// The span of the time a purchase holds the lock of `sku`; `lease_left` is what a fixed
/// lease had left right after the acquire.
pub fn critical_section(sku: i64, lease_left: Option<Duration>) -> tracing::Span {
    let lease_left_ns = lease_left.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    tracing::debug_span!("critical_section", key = %lock_key(sku), lease_left_ns)
}

impl Inventory {
    /// A new instance state.
    pub fn new(locker: Locker, db: Db, config: ServiceConfig) -> AppState {
        Arc::new(Self { locker, db, config })
    }

    /// `#[distributed_lock]` on the method: one holder of `inventory:<sku>` at a time across
    /// all instances, its lease renewed by the watchdog while the body runs; `fence` is the
    /// lock's fencing token, for the write.
    #[distributed_lock(key = "inventory:<sku>", wait = "10s", locker = self.locker, fence = fence)]
    pub async fn purchase_with_macro(&self, sku: i64) -> Result<Sale, AppError> {
        async {
            self.sell_fenced(sku, "macro", fence.token().await?, None)
                .await
        }
        .instrument(critical_section(sku, None))
        .await
    }

    /// `Locker::lock` with a fixed lease, checked before the write, and the fencing token
    /// guarding the write: a holder that stalled past its lease after the check cannot write
    /// over a later holder's sale.
    pub async fn purchase_fenced(&self, sku: i64) -> Result<Sale, AppError> {
        let lock = self.locker.lock(lock_key(sku));
        let guard = lock.wait(self.config.wait).lease(self.config.lease).await?;
        let sold = async {
            let fence = guard.fencing_token().await?;
            self.sell_fenced(sku, "fenced", fence, Some(&guard)).await
        }
        .instrument(critical_section(sku, Some(guard.remaining())))
        .await;
        release(guard).await;
        sold
    }

    /// Read, check, await, write, fenced by `fence`, the token of the lock held for `sku`. The
    /// read claims the row with the token, so a holder that stalled between its read and its
    /// write cannot write after a later holder's read.
    ///
    /// # Errors
    ///
    /// [`AppError::NotFound`], [`AppError::SoldOut`], [`AppError::LockLost`] (`guard` is
    /// checked before the write), [`AppError::StaleFence`] when a later holder claimed the
    /// row, database errors.
    pub async fn sell_fenced(
        &self,
        sku: i64,
        variant: &'static str,
        fence: u64,
        guard: Option<&LockGuard>,
    ) -> Result<Sale, AppError> {
        let stale = AppError::StaleFence { sku, fence };
        let stock = match self.db.claim_and_read(sku, fence).await? {
            Some(Fenced::Stale) => return Err(stale),
            Some(Fenced::Done(stock)) => Some(stock),
            None => None,
        };
        let stock = self.check_and_think(sku, stock, guard).await?;
        let order = self.order(variant);
        match self
            .db
            .write_sale_fenced(sku, stock - 1, fence, order)
            .await?
        {
            Fenced::Done(order_id) => Ok(self.sale(order_id, sku, stock - 1, variant, Some(fence))),
            Fenced::Stale => {
                tracing::info!(sku, fence, "stale write rejected by the fencing token");
                Err(stale)
            }
        }
    }

    /// The check of the read-check-write and the await before the write; last, a careful
    /// holder checks it still holds its lock.
    ///
    /// # Errors
    ///
    /// [`AppError::NotFound`], [`AppError::SoldOut`], [`AppError::LockLost`].
    pub async fn check_and_think(
        &self,
        sku: i64,
        stock: Option<i64>,
        guard: Option<&LockGuard>,
    ) -> Result<i64, AppError> {
        let stock = stock.ok_or(AppError::NotFound(sku))?;
        if stock <= 0 {
            return Err(AppError::SoldOut(sku));
        }
        tokio::time::sleep(self.config.think).await;
        match guard {
            Some(guard) if !guard.is_held() => Err(AppError::LockLost(guard.key().to_owned())),
            _ => Ok(stock),
        }
    }

    /// The order this instance takes for a purchase protected by `variant`.
    pub fn order(&self, variant: &'static str) -> NewOrder {
        let instance = self.config.instance.clone();
        NewOrder { variant, instance }
    }

    /// The answer to a purchase that wrote `stock_left` and the order `order_id`.
    pub fn sale(
        &self,
        order_id: i64,
        sku: i64,
        stock_left: i64,
        variant: &str,
        fence: Option<u64>,
    ) -> Sale {
        Sale {
            order_id,
            sku,
            stock_left,
            variant: variant.to_owned(),
            instance: self.config.instance.clone(),
            fencing_token: fence,
        }
    }
}

/// Releases a guard after the purchase. A fixed lease that ran out first is no failure of the
/// purchase: the key expired with it.
pub async fn release(guard: LockGuard) {
    match guard.release().await {
        Ok(()) => {}
        Err(error) if error.is_lost() => tracing::info!(%error, "lease ran out before the release"),
        Err(error) => tracing::warn!(%error, "lock release failed"),
    }
}
