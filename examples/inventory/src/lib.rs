//! An axum + SQLite inventory service whose purchases a Redis lock keeps apart, each write
//! fenced by the lock's token: the service to copy. [`routes`]: the endpoints (macro, layer,
//! `Locker::lock`); [`service`]: the purchase; [`db`]: the fenced SQL; [`server`]: settings
//! and shutdown. The oversell demo (`scripts/demo.sh`, crate `inventory-demo`) runs it.

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
