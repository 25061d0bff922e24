//! Lock kinds and their API: mutex, fair, read-write, semaphore, multi-key, `with_lock`, the watchdog, limits, fencing state, inspect, shutdown, tracing and metrics.
//!
//! One test binary of several modules (each links the whole dependency tree once).

#[path = "../common/mod.rs"]
mod common;

mod fair;
mod fence_state;
mod holder_knows;
mod inspect;
mod limits;
mod locking;
mod metrics;
mod multi_key;
mod operating;
mod quickstart;
mod read_write;
mod semaphore;
mod tracing;
mod watchdog;
mod with_lock;
