//! The layer: keys from requests, every lock kind, the limit layer, releases at the end of the body, tower and axum integration.
//!
//! One test binary of several modules (each links the whole dependency tree once).

#[path = "../common/mod.rs"]
mod common;

mod body_end;
mod canonical;
mod extractors;
mod kinds;
mod limit;
mod release;
mod tower;
