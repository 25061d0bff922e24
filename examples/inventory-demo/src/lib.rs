//! The oversell demo: runs several instances of the inventory service (the `inventory`
//! example) against one SQLite file and one Redis, fires concurrent purchases of one SKU at
//! them for each purchase variant, and reports what each sold.
//!
//! - [`instance`]: `inventory-demo serve`, one instance: the service's router plus what the
//!   demo adds to it: [`control`] (the `unlocked` and `locked-no-fence` purchases), the
//!   [`recorder`] of what each purchase did when, and [`chaos`] (stalled writes).
//! - [`variant`]: the purchase variants and their routes.
//! - [`demo`]: starts Redis, the instances and the load, and tabulates what each variant sold.
//! - [`report`]: the HTML report: timelines and charts of what happened.
//!
//! Run it with `scripts/demo.sh` from the repository root, or
//! `cargo run --release -p inventory-demo -- --help`.

pub mod chaos;
pub mod control;
pub mod demo;
pub mod instance;
mod instances;
pub mod recorder;
pub mod report;
pub mod variant;

pub use variant::Variant;
