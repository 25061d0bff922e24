//! The inventory database: one SQLite file in WAL mode, shared by every instance.
//!
//! Two tables: `skus` (the stock of each SKU, and the highest fencing token that touched the
//! row) and `orders` (one row per sale). There is deliberately no `CHECK (stock >= 0)` and no
//! single-statement `UPDATE .. SET stock = stock - 1 WHERE stock > 0`: the service reads, checks
//! and writes in separate statements, the way most services that call out to pricing, payment
//! or fraud checks between the read and the write are built, so the race is real.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

/// The SKU that the demo sells and that a new database is seeded with.
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

/// What a fenced write of "stock - 1 and one order" did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The stock was written and the order inserted, with this order id.
    Written {
        /// The new order's id.
        order_id: i64,
    },
    /// The fenced write was refused: a later lock holder has touched the row.
    Stale,
}

/// A small pool of SQLite connections to one database file.
///
/// rusqlite is synchronous, so every call runs on tokio's blocking pool with a connection
/// taken from the pool (or a new one) and put back afterwards.
#[derive(Debug, Clone)]
pub struct Db {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Db {
    /// Opens (creating if needed) the database at `path`, switches it to WAL mode, creates the
    /// tables and seeds [`DEMO_SKU`] with a stock of 100 when it does not exist.
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`] when the file cannot be opened or written, [`DbError::NotWal`]
    /// when SQLite refuses WAL mode.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DbError> {
        let db = Self {
            inner: Arc::new(Inner {
                path: path.as_ref().to_owned(),
                idle: Mutex::new(Vec::new()),
            }),
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
             CREATE INDEX IF NOT EXISTS orders_by_sku ON orders (sku_id);",
        )?;
        conn.execute(
            "INSERT OR IGNORE INTO skus (id, name, stock) VALUES (?1, 'demo widget', 100)",
            [DEMO_SKU],
        )?;
        db.checkin(conn);
        Ok(db)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    fn checkout(&self) -> Result<Connection, DbError> {
        if let Some(conn) = self.inner.idle.lock().expect("pool mutex").pop() {
            return Ok(conn);
        }
        let conn = Connection::open(&self.inner.path)?;
        // Writers of all instances queue on SQLite's write lock instead of failing at once.
        conn.busy_timeout(Duration::from_secs(10))?;
        // WAL with NORMAL: commits do not fsync (a power cut may lose the last commits, never
        // corrupt the file); the usual setting for WAL.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        Ok(conn)
    }

    fn checkin(&self, conn: Connection) {
        self.inner.idle.lock().expect("pool mutex").push(conn);
    }

    /// Runs `f` with a pooled connection on the blocking pool.
    ///
    /// # Errors
    ///
    /// What `f` returns, or [`DbError::Task`] when it panicked.
    pub async fn call<T, F>(&self, f: F) -> Result<T, DbError>
    where
        F: FnOnce(&mut Connection) -> Result<T, DbError> + Send + 'static,
        T: Send + 'static,
    {
        let db = self.clone();
        tokio::task::spawn_blocking(move || db.call_blocking(f)).await?
    }

    /// Runs `f` with a pooled connection on the current thread.
    ///
    /// # Errors
    ///
    /// What `f` returns.
    pub fn call_blocking<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        let mut conn = self.checkout()?;
        let result = f(&mut conn);
        self.checkin(conn);
        result
    }

    /// Sets the stock of `sku` (creating it), forgets its fencing token and deletes its
    /// orders: a fresh start for one demo round. Blocking.
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`].
    pub fn reset_blocking(&self, sku: i64, name: &str, stock: i64) -> Result<(), DbError> {
        self.call_blocking(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute("DELETE FROM orders WHERE sku_id = ?1", [sku])?;
            tx.execute(
                "INSERT INTO skus (id, name, stock, last_fence) VALUES (?1, ?2, ?3, 0)
                 ON CONFLICT (id) DO UPDATE SET name = ?2, stock = ?3, last_fence = 0",
                (sku, name, stock),
            )?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Sets the stock of `sku`, creating it if needed (orders are kept).
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`], [`DbError::Task`].
    pub async fn restock(&self, sku: i64, name: String, stock: i64) -> Result<(), DbError> {
        self.call(move |conn| {
            conn.execute(
                "INSERT INTO skus (id, name, stock) VALUES (?1, ?2, ?3)
                 ON CONFLICT (id) DO UPDATE SET name = ?2, stock = ?3",
                (sku, name, stock),
            )?;
            Ok(())
        })
        .await
    }

    /// The stock of `sku` and its number of orders, or `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`].
    pub fn status_blocking(&self, sku: i64) -> Result<Option<SkuStatus>, DbError> {
        self.call_blocking(|conn| status(conn, sku))
    }

    /// Async [`status_blocking`](Self::status_blocking).
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`], [`DbError::Task`].
    pub async fn status(&self, sku: i64) -> Result<Option<SkuStatus>, DbError> {
        self.call(move |conn| status(conn, sku)).await
    }

    /// Reads the stock of `sku` (one autocommit `SELECT`).
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`], [`DbError::Task`].
    pub async fn read_stock(&self, sku: i64) -> Result<Option<i64>, DbError> {
        self.call(move |conn| {
            Ok(conn
                .query_row("SELECT stock FROM skus WHERE id = ?1", [sku], |row| {
                    row.get(0)
                })
                .optional()?)
        })
        .await
    }

    /// Writes `new_stock` and inserts one order, in one transaction, unconditionally: whatever
    /// happened since the stock was read is overwritten. Returns the order id.
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`], [`DbError::Task`].
    pub async fn write_sale(
        &self,
        sku: i64,
        new_stock: i64,
        order: NewOrder,
    ) -> Result<i64, DbError> {
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute("UPDATE skus SET stock = ?1 WHERE id = ?2", (new_stock, sku))?;
            let order_id = insert_order(&tx, sku, &order, None)?;
            tx.commit()?;
            Ok(order_id)
        })
        .await
    }

    /// Records that the holder of `fence` is working on `sku` and reads its stock, in one
    /// transaction: `UPDATE skus SET last_fence = ?fence WHERE id = ?sku AND last_fence <
    /// ?fence`, then `SELECT stock`.
    ///
    /// Returns `Ok(None)` for an unknown SKU and [`ClaimOutcome::Stale`] when a holder with a
    /// larger token has already claimed the row.
    ///
    /// # Errors
    ///
    /// [`DbError::Sqlite`], [`DbError::Task`], [`DbError::FenceRange`].
    pub async fn claim_and_read(
        &self,
        sku: i64,
        fence: u64,
    ) -> Result<Option<ClaimOutcome>, DbError> {
        let fence_sql = i64::try_from(fence).map_err(|_| DbError::FenceRange(fence))?;
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let claimed = tx.execute(
                "UPDATE skus SET last_fence = ?1 WHERE id = ?2 AND last_fence < ?1",
                (fence_sql, sku),
            )?;
            let stock: Option<i64> = tx
                .query_row("SELECT stock FROM skus WHERE id = ?1", [sku], |row| {
                    row.get(0)
                })
                .optional()?;
            tx.commit()?;
            Ok(stock.map(|stock| {
                if claimed == 1 {
                    ClaimOutcome::Claimed { stock }
                } else {
                    ClaimOutcome::Stale
                }
            }))
        })
        .await
    }

    /// Writes `new_stock` and inserts one order only if the row is still claimed by `fence`:
    /// `UPDATE skus SET stock = ?new WHERE id = ?sku AND last_fence = ?fence`. When a later
    /// holder has claimed the row since, nothing is written and [`WriteOutcome::Stale`] is
    /// returned.
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
    ) -> Result<WriteOutcome, DbError> {
        let fence_sql = i64::try_from(fence).map_err(|_| DbError::FenceRange(fence))?;
        self.call(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let updated = tx.execute(
                "UPDATE skus SET stock = ?1 WHERE id = ?2 AND last_fence = ?3",
                (new_stock, sku, fence_sql),
            )?;
            if updated == 0 {
                // Dropping the transaction rolls it back.
                return Ok(WriteOutcome::Stale);
            }
            let order_id = insert_order(&tx, sku, &order, Some(fence_sql))?;
            tx.commit()?;
            Ok(WriteOutcome::Written { order_id })
        })
        .await
    }
}

/// What [`Db::claim_and_read`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The row is ours (for this token), with this stock.
    Claimed {
        /// The stock read under the claim.
        stock: i64,
    },
    /// A holder with a larger token has claimed the row: ours is stale.
    Stale,
}

/// Who took an order, stored with it.
#[derive(Debug, Clone)]
pub struct NewOrder {
    /// The purchase variant (`"unlocked"`, `"macro"`, ...).
    pub variant: &'static str,
    /// The instance that served it.
    pub instance: String,
}

fn insert_order(
    conn: &Connection,
    sku: i64,
    order: &NewOrder,
    fence: Option<i64>,
) -> Result<i64, DbError> {
    conn.execute(
        "INSERT INTO orders (sku_id, variant, instance, fence) VALUES (?1, ?2, ?3, ?4)",
        (sku, order.variant, &order.instance, fence),
    )?;
    Ok(conn.last_insert_rowid())
}

fn status(conn: &Connection, sku: i64) -> Result<Option<SkuStatus>, DbError> {
    Ok(conn
        .query_row(
            "SELECT stock, (SELECT COUNT(*) FROM orders WHERE sku_id = ?1) FROM skus WHERE id = ?1",
            [sku],
            |row| {
                Ok(SkuStatus {
                    id: sku,
                    stock: row.get(0)?,
                    sold: row.get(1)?,
                })
            },
        )
        .optional()?)
}
