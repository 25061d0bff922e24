//! The purchase: read the stock, answer `sold out` at 0, wait [`ServiceConfig::think`] (a
//! pricing or payment call), then write `stock - 1` and the order, fenced by the lock's token.
//! Only how the lock is taken differs. The `tracing` span `critical_section` is its hold.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{distributed_lock, LockGuard, Locker};
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::db::Db;
use crate::error::AppError;

/// Settings of one service instance.
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceConfig {
    /// Name stored with the orders this instance takes.
    #[arg(long, default_value = "inventory")]
    pub instance: String,
    /// The await between reading the stock and writing it back.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5ms")]
    pub think: Duration,
    /// How long the layer and `Locker::lock` wait for the lock (the macro: `wait = "10s"`).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub wait: Duration,
    /// The fixed lease of the `fenced` purchase (no watchdog).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "200ms")]
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

/// The state shared by the handlers of one instance: its locker, the database, its settings.
#[derive(Debug)]
#[allow(missing_docs)] // the summary names each field
pub struct Inventory {
    pub locker: Locker,
    pub db: Db,
    pub config: ServiceConfig,
}

/// What the router holds.
pub type AppState = Arc<Inventory>;

/// A purchase: its order (0 until written), the stock it left, how it was protected (its
/// route's last segment), who served it and the fencing token it wrote with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // the summary names each field
pub struct Sale {
    pub order_id: i64,
    pub sku: i64,
    pub stock_left: i64,
    pub variant: String,
    pub instance: String,
    pub fencing_token: Option<u64>,
}

/// The lock key of a SKU, the same for every endpoint: `inventory:<sku>`.
pub fn lock_key(sku: i64) -> String {
    format!("inventory:{sku}")
}

/// The span of the time a purchase holds the lock of `sku`; `lease_left`: what a fixed lease
/// had left right after the acquire.
pub fn critical_section(sku: i64, lease_left: Option<Duration>) -> tracing::Span {
    let lease_left_ns = lease_left.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    tracing::debug_span!("critical_section", key = %lock_key(sku), lease_left_ns)
}

impl Inventory {
    /// A new instance state.
    pub fn new(locker: Locker, db: Db, config: ServiceConfig) -> AppState {
        Arc::new(Self { locker, db, config })
    }

    /// `#[distributed_lock]`: one holder of `inventory:<sku>` at a time across all instances,
    /// its lease renewed by the watchdog while the body runs; `fence` gives its token.
    #[distributed_lock(key = "inventory:<sku>", wait = "10s", locker = self.locker, fence = fence)]
    pub async fn purchase_with_macro(&self, sku: i64) -> Result<Sale, AppError> {
        let span = critical_section(sku, None);
        let fence = fence.token().instrument(span.clone()).await?;
        self.sell_fenced(sku, "macro", fence).instrument(span).await
    }

    /// `Locker::lock` with a fixed lease: a holder that stalls past it cannot write over a
    /// later holder's sale, the fencing token stops it (no `is_held()` check could: the stall
    /// can come right after it).
    pub async fn purchase_fenced(&self, sku: i64) -> Result<Sale, AppError> {
        let lock = self.locker.lock(lock_key(sku));
        let guard = lock.wait(self.config.wait).lease(self.config.lease).await?;
        let span = critical_section(sku, Some(guard.remaining()));
        let sold = async {
            let fence = guard.fencing_token().await?;
            self.sell_fenced(sku, "fenced", fence).await
        };
        let sold = sold.instrument(span).await;
        release(guard).await;
        sold
    }

    /// Read, check, await, write, fenced by `fence`, the token of the lock held for `sku`.
    /// The read claims the row with it, so that a holder that stalled between its read and
    /// its write cannot write after a later holder's read.
    pub async fn sell_fenced(&self, sku: i64, variant: &str, fence: u64) -> Result<Sale, AppError> {
        let stock = self.db.claim_and_read(sku, fence).await?;
        let sale = self.check_and_think(sku, stock, variant).await?;
        Ok(self.db.write_sale_fenced(sale, fence).await?)
    }

    /// The check of the read-check-write and the await before the write: the sale to write.
    pub async fn check_and_think(
        &self,
        sku: i64,
        stock: Option<i64>,
        variant: &str,
    ) -> Result<Sale, AppError> {
        let stock = stock.ok_or(AppError::NotFound(sku))?;
        if stock <= 0 {
            return Err(AppError::SoldOut(sku));
        }
        tokio::time::sleep(self.config.think).await;
        let mut sale = Sale::default();
        (sale.sku, sale.stock_left) = (sku, stock - 1);
        (sale.variant, sale.instance) = (variant.to_owned(), self.config.instance.clone());
        Ok(sale)
    }
}

/// Releases a guard after the purchase. A fixed lease that ran out first is no failure of the
/// purchase: the key expired with it.
pub async fn release(guard: LockGuard) {
    match guard.release().await {
        Err(error) if !error.is_lost() => tracing::warn!(%error, "lock release failed"),
        _ => {}
    }
}
