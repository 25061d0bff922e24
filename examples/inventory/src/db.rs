//! The inventory database: one SQLite file in WAL mode, shared by every instance.
//!
//! `skus` holds the stock and the highest fencing token that touched each row; `orders` one
//! row per sale. There is deliberately no `CHECK (stock >= 0)` and no single-statement
//! `UPDATE .. SET stock = stock - 1 WHERE stock > 0`: the service reads, checks and writes in
//! separate statements, as services that call out (pricing, payment) between read and write
//! do, so only the lock and the fencing token keep two sales of the last unit apart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use tracing::field::Empty;

/// The SKU a new database is seeded with (stock 100).
pub const DEMO_SKU: i64 = 42;

/// A failed database operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// SQLite reported an error (open, busy timeout, constraint, ...).
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The file could not be switched to WAL mode (e.g. a network file system).
    #[error("sqlite: journal_mode is {0:?}, not \"wal\"")]
    NotWal(String),
    /// The blocking task running the statement panicked or was cancelled.
    #[error("sqlite task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A fencing token does not fit SQLite's signed 64-bit integers.
    #[error("fencing token {0} does not fit a SQLite INTEGER")]
    FenceRange(u64),
}

/// The stock of one SKU and the orders taken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SkuStatus {
    /// The SKU id.
    pub id: i64,
    /// The stock as stored.
    pub stock: i64,
    /// Number of orders taken for it.
    pub sold: i64,
}

/// What a statement fenced by a token did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced<T> {
    /// It ran, and found or made this.
    Done(T),
    /// Refused: a holder with a larger token has claimed the row.
    Stale,
}

/// Who took an order, stored with it.
#[derive(Debug, Clone)]
pub struct NewOrder {
    /// How the purchase was protected (`"macro"`, `"fenced"`, ...).
    pub variant: &'static str,
    /// The instance that served it.
    pub instance: String,
}

/// A small pool of SQLite connections to one file. rusqlite is synchronous: every call runs
/// on tokio's blocking pool.
#[derive(Debug, Clone)]
pub struct Db {
    path: Arc<PathBuf>,
    idle: Arc<Mutex<Vec<Connection>>>,
}

impl Db {
    /// Opens (creating) the database at `path` in WAL mode, with its tables and [`DEMO_SKU`].
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`] when the file cannot be opened or written, [`DbError::NotWal`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DbError> {
        let db = Self {
            path: Arc::new(path.as_ref().to_owned()),
            idle: Arc::default(),
        };
        let conn = db.checkout()?;
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(DbError::NotWal(mode));
        }
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS skus (
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
        db.checkin(conn);
        Ok(db)
    }

    fn checkout(&self) -> Result<Connection, DbError> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        if let Some(conn) = idle {
            return Ok(conn);
        }
        let conn = Connection::open(self.path.as_ref())?;
        // Writers of all instances queue on SQLite's write lock instead of failing at once.
        conn.busy_timeout(Duration::from_secs(10))?;
        // WAL with NORMAL: a power cut may lose the last commits, never corrupt the file.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        Ok(conn)
    }

    fn checkin(&self, conn: Connection) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(conn);
    }

    /// Runs `f` with a pooled connection on the blocking pool, in the caller's `tracing` span.
    ///
    /// # Errors
    ///
    /// What `f` returns, or [`DbError::Task`] when it panicked.
    pub async fn call<T, F>(&self, f: F) -> Result<T, DbError>
    where
        F: FnOnce(&mut Connection) -> Result<T, DbError> + Send + 'static,
        T: Send + 'static,
    {
        let (db, span) = (self.clone(), tracing::Span::current());
        tokio::task::spawn_blocking(move || {
            // The blocking thread has no span of its own: the statements belong to the request.
            let _entered = span.enter();
            let mut conn = db.checkout()?;
            let result = f(&mut conn);
            db.checkin(conn);
            result
        })
        .await?
    }

    /// The stock of `sku` and its number of orders, or `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`], [`DbError::Task`].
    pub async fn status(&self, sku: i64) -> Result<Option<SkuStatus>, DbError> {
        let sql = "SELECT stock, (SELECT COUNT(*) FROM orders WHERE sku_id = ?1)
                   FROM skus WHERE id = ?1";
        self.call(move |conn| {
            let status = conn.query_row(sql, [sku], |row| {
                let (stock, sold) = (row.get(0)?, row.get(1)?);
                Ok(SkuStatus {
                    id: sku,
                    stock,
                    sold,
                })
            });
            Ok(status.optional()?)
        })
        .await
    }

    /// Claims `sku` for the holder of `fence` and reads its stock, in one transaction (span
    /// `claim_and_read`). The claim sets `last_fence` where it was smaller, so a holder that
    /// stalled between its read and its write cannot write after ours: its token is smaller.
    /// `Ok(None)`: no such SKU.
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`], [`DbError::Task`], [`DbError::FenceRange`].
    pub async fn claim_and_read(
        &self,
        sku: i64,
        fence: u64,
    ) -> Result<Option<Fenced<i64>>, DbError> {
        let token = i64::try_from(fence).map_err(|_| DbError::FenceRange(fence))?;
        self.call(move |conn| {
            let span =
                tracing::debug_span!("claim_and_read", sku, fence, stock = Empty, stale = Empty);
            let _entered = span.enter();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let claimed = tx.execute(
                "UPDATE skus SET last_fence = ?1 WHERE id = ?2 AND last_fence < ?1",
                (token, sku),
            )?;
            let stock: Option<i64> = tx
                .query_row("SELECT stock FROM skus WHERE id = ?1", [sku], |row| {
                    row.get(0)
                })
                .optional()?;
            tx.commit()?;
            Ok(stock.map(|stock| {
                if claimed == 0 {
                    span.record("stale", true);
                    return Fenced::Stale;
                }
                span.record("stock", stock);
                Fenced::Done(stock)
            }))
        })
        .await
    }

    /// Writes `new_stock` and inserts the order, in one transaction (span
    /// `write_sale_fenced`), only while the row is still claimed by `fence`. Returns the
    /// order id.
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`], [`DbError::Task`], [`DbError::FenceRange`].
    pub async fn write_sale_fenced(
        &self,
        sku: i64,
        new_stock: i64,
        fence: u64,
        order: NewOrder,
    ) -> Result<Fenced<i64>, DbError> {
        let token = i64::try_from(fence).map_err(|_| DbError::FenceRange(fence))?;
        self.call(move |conn| {
            let span = tracing::debug_span!(
                "write_sale_fenced",
                sku,
                new_stock,
                fence,
                order_id = Empty,
                stale = Empty
            );
            let _entered = span.enter();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let updated = tx.execute(
                "UPDATE skus SET stock = ?1 WHERE id = ?2 AND last_fence = ?3",
                (new_stock, sku, token),
            )?;
            if updated == 0 {
                span.record("stale", true);
                return Ok(Fenced::Stale); // dropping `tx` rolls it back
            }
            tx.execute(
                "INSERT INTO orders (sku_id, variant, instance, fence) VALUES (?1, ?2, ?3, ?4)",
                (sku, order.variant, &order.instance, token),
            )?;
            let order_id = tx.last_insert_rowid();
            tx.commit()?;
            span.record("order_id", order_id);
            Ok(Fenced::Done(order_id))
        })
        .await
    }
}
