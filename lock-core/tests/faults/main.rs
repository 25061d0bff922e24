//! Faults: connection resets, partitions, paused and killed processes, restarts, ACL refusals, and the chaos soak.
//!
//! One test binary of several modules (each links the whole dependency tree once).

#[path = "../common/mod.rs"]
mod common;

mod acl;
mod faults;
mod first_try;
mod late_answers;
mod owner_waits;
mod partition;
mod processes;
mod review_m;
mod review_o;
mod review_p;
mod review_q;
mod safety;
mod soak;
mod wipe_replays;
