//! An axum + SQLite inventory service whose purchases are kept apart by a Redis lock: the
//! service to copy. Several instances share one database file and one Redis.
//!
//! - [`routes`]: the router, [`app`]: a purchase under `#[distributed_lock]`, one behind
//!   `DistributedLockLayer` (waiting, and failing fast), one with `Locker::lock`.
//! - [`service`]: the purchase, its write fenced by the lock's fencing token.
//! - [`db`]: the SQLite database (WAL mode) that checks the token.
//! - [`error`]: errors as status codes and JSON.
//! - [`metrics`]: `GET /metrics`, the lock metrics in the Prometheus text format.
//! - [`server`]: settings from the command line and `REDIS_URL`, graceful shutdown.
//!
//! The oversell demo (`scripts/demo.sh`, the `inventory-demo` crate) runs this service.

pub mod db;
pub mod error;
pub mod metrics;
pub mod routes;
pub mod server;
pub mod service;

pub use error::{AppError, ErrorBody, ErrorCode};
pub use routes::app;
pub use server::{serve, shutdown_signal, ServeArgs};
pub use service::{AppState, Inventory, Sale, ServiceConfig};
