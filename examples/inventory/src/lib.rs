//! An axum + SQLite inventory service whose purchases a Redis lock keeps apart, each write
//! fenced by the lock's token: the service to copy. Its instances share one database file and
//! one Redis. [`routes`]: the endpoints (macro, layer, `Locker::lock`); [`service`]: the
//! purchase; [`db`]: the fenced SQL; [`error`]; [`metrics`]; [`server`]: settings, shutdown.
//! The oversell demo (`scripts/demo.sh`, the `inventory-demo` crate) runs this service.

pub mod db;
pub mod error;
pub mod metrics;
pub mod routes;
pub mod server;
pub mod service;

pub use error::{AppError, ErrorBody};
pub use routes::app;
pub use server::{serve, shutdown_signal, ServeArgs};
pub use service::{AppState, Inventory, Sale, ServiceConfig};
