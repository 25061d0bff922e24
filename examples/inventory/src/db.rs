//! The database: one SQLite file in WAL mode, shared by every instance. `skus` holds the stock
//! and the highest fencing token that touched each row, `orders` one row per sale. There is
//! deliberately no `CHECK (stock >= 0)`, nor a one-statement `UPDATE .. WHERE stock > 0`: the
//! service reads, checks and writes apart, as services that call out (pricing, payment) in
//! between do, so only the lock and the fencing token keep two sales of one unit apart.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use tracing::field::Empty;

use crate::service::Sale;

/// A failed database operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// A holder of the lock with a larger fencing token has claimed the row: ours is stale.
    #[error("stale fencing token {fence} for sku {sku}: a later lock holder has written")]
    StaleFence {
        /// The SKU.
        sku: i64,
        /// Our token.
        fence: u64,
    },
    /// SQLite reported an error (open, busy timeout, constraint, ...).
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The blocking task running the statements panicked.
    #[error("sqlite task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A fencing token does not fit SQLite's signed 64-bit integers.
    #[error("fencing token {0} does not fit a SQLite INTEGER")]
    FenceRange(u64),
}

/// The stock of one SKU and the orders taken for it (`GET /skus/{sku}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[allow(missing_docs)] // named for what they hold
pub struct SkuStatus {
    pub id: i64,
    pub stock: i64,
    pub sold: i64,
}

/// A pool of connections to the database file (closing the last one of a WAL file
/// checkpoints it). rusqlite is synchronous: every call runs on tokio's blocking pool.
#[derive(Debug, Clone)]
pub struct Db {
    path: Arc<Path>,
    idle: Arc<Mutex<Vec<Connection>>>,
}

impl Db {
    /// Opens (creating) the database at `path` in WAL mode, with its tables and SKU 42.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DbError> {
        let (path, idle) = (path.as_ref().into(), Arc::default());
        let db = Self { path, idle };
        let conn = db.connect()?;
        // WAL: readers do not block the writer, nor it them.
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE IF NOT EXISTS skus (
                 id         INTEGER PRIMARY KEY,
                 name       TEXT    NOT NULL,
                 stock      INTEGER NOT NULL,
                 last_fence INTEGER NOT NULL DEFAULT 0
             );
             CREATE TABLE IF NOT EXISTS orders (
                 id         INTEGER PRIMARY KEY AUTOINCREMENT,
                 sku_id     INTEGER NOT NULL REFERENCES skus (id),
                 variant    TEXT    NOT NULL,
                 instance   TEXT    NOT NULL,
                 fence      INTEGER,
                 created_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
             );
             CREATE INDEX IF NOT EXISTS orders_by_sku ON orders (sku_id);
             INSERT OR IGNORE INTO skus (id, name, stock) VALUES (42, 'demo widget', 100);",
        )?;
        db.idle().push(conn);
        Ok(db)
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner) // a push or pop is atomic
    }

    fn connect(&self) -> Result<Connection, DbError> {
        if let Some(conn) = self.idle().pop() {
            return Ok(conn);
        }
        let conn = Connection::open(&self.path)?;
        // Writers of all instances queue on SQLite's write lock instead of failing at once.
        conn.busy_timeout(Duration::from_secs(10))?;
        // WAL with NORMAL: a power cut may lose the last commits, never corrupt the file.
        conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")?;
        Ok(conn)
    }

    /// Runs `f` with a connection on the blocking pool, in the caller's `tracing` span.
    pub async fn call<T, F>(&self, f: F) -> Result<T, DbError>
    where
        F: FnOnce(&mut Connection) -> Result<T, DbError> + Send + 'static,
        T: Send + 'static,
    {
        let (db, span) = (self.clone(), tracing::Span::current());
        tokio::task::spawn_blocking(move || {
            // The blocking thread has no span of its own: the statements belong to the request.
            let _entered = span.enter();
            let mut conn = db.connect()?;
            let result = f(&mut conn);
            db.idle().push(conn);
            result
        })
        .await?
    }

    /// The stock of `sku` and its number of orders, or `None` when it does not exist.
    pub async fn status(&self, sku: i64) -> Result<Option<SkuStatus>, DbError> {
        let sql = "SELECT stock, (SELECT COUNT(*) FROM orders WHERE sku_id = ?1)
                   FROM skus WHERE id = ?1";
        self.call(move |conn| {
            let status = conn.query_row(sql, [sku], |row| {
                let (id, stock, sold) = (sku, row.get(0)?, row.get(1)?);
                Ok(SkuStatus { id, stock, sold })
            });
            Ok(status.optional()?)
        })
        .await
    }

    /// Claims `sku` for the holder of `fence` and reads its stock, in one transaction (span
    /// `claim_and_read`). The claim raises `last_fence` to `fence`, so a holder that stalled
    /// between its read and its write cannot write after ours: its token is smaller. A larger
    /// token there already: [`DbError::StaleFence`].
    pub async fn claim_and_read(&self, sku: i64, fence: u64) -> Result<Option<i64>, DbError> {
        let token = i64::try_from(fence).map_err(|_| DbError::FenceRange(fence))?;
        self.call(move |conn| {
            let (stock, stale) = (Empty, Empty);
            let span = tracing::debug_span!("claim_and_read", sku, fence, stock, stale);
            let _entered = span.enter();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let claimed = tx.execute(
                "UPDATE skus SET last_fence = ?1 WHERE id = ?2 AND last_fence < ?1",
                (token, sku),
            )?;
            let read = "SELECT stock FROM skus WHERE id = ?1";
            let stock: Option<i64> = tx.query_row(read, [sku], |row| row.get(0)).optional()?;
            tx.commit()?;
            if stock.is_some() && claimed == 0 {
                span.record("stale", true);
                return Err(DbError::StaleFence { sku, fence });
            }
            span.record("stock", stock);
            Ok(stock)
        })
        .await
    }

    /// Writes the stock `sale` left and inserts its order, in one transaction (span
    /// `write_sale_fenced`), only while the row is still claimed by `fence` (else
    /// [`DbError::StaleFence`]). Returns the sale with its order id and token.
    pub async fn write_sale_fenced(&self, mut sale: Sale, fence: u64) -> Result<Sale, DbError> {
        let (sku, new_stock) = (sale.sku, sale.stock_left);
        let token = i64::try_from(fence).map_err(|_| DbError::FenceRange(fence))?;
        self.call(move |conn| {
            let (order_id, stale) = (Empty, Empty);
            let span = tracing::debug_span!("write_sale_fenced", sku, new_stock, order_id, stale);
            let _entered = span.enter();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let updated = tx.execute(
                "UPDATE skus SET stock = ?1 WHERE id = ?2 AND last_fence = ?3",
                (new_stock, sku, token),
            )?;
            if updated == 0 {
                span.record("stale", true);
                return Err(DbError::StaleFence { sku, fence }); // dropping `tx` rolls it back
            }
            tx.execute(
                "INSERT INTO orders (sku_id, variant, instance, fence) VALUES (?1, ?2, ?3, ?4)",
                (sku, &sale.variant, &sale.instance, token),
            )?;
            (sale.order_id, sale.fencing_token) = (tx.last_insert_rowid(), Some(fence));
            tx.commit()?;
            span.record("order_id", sale.order_id);
            Ok(sale)
        })
        .await
    }
}
