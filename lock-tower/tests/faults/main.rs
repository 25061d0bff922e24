//! The layer under faults: Redis down, contention, lost locks, the hold bound.
//!
//! One test binary of several modules (each links the whole dependency tree once).

#[path = "../common/mod.rs"]
mod common;

mod contention;
mod handler_knows;
mod hold_bound;
mod redis_down;
