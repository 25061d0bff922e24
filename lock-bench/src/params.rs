//! Every workload parameter in one place: the full value, the `--quick` value, and a clap flag
//! (`--w1-cycles 2000`, ...) that overrides either.

use clap::Args;
use serde::Serialize;

macro_rules! params {
    ($( $(#[doc = $doc:literal])* $name:ident : $ty:ty = $full:expr, $quick:expr; )*) => {
        /// The resolved parameters of one run.
        #[derive(Debug, Clone, Serialize)]
        pub(crate) struct Params {
            /// Whether the `--quick` sizes were the base.
            pub(crate) quick: bool,
            $( $(#[doc = $doc])* pub(crate) $name: $ty, )*
        }

        /// Per-parameter overrides; each defaults to the full (or `--quick`) value.
        #[derive(Debug, Clone, Args)]
        pub(crate) struct Overrides {
            $( $(#[doc = $doc])* #[arg(long, help_heading = "Workload parameters")] $name: Option<$ty>, )*
        }

        impl Params {
            fn base(quick: bool) -> Self {
                if quick {
                    Self { quick, $( $name: $quick, )* }
                } else {
                    Self { quick, $( $name: $full, )* }
                }
            }

            /// The full or quick sizes with the overrides applied.
            pub(crate) fn resolve(quick: bool, overrides: &Overrides) -> Self {
                let mut params = Self::base(quick);
                $( if let Some(value) = overrides.$name.clone() { params.$name = value; } )*
                params
            }
        }
    };
}

params! {
    /// Alternating kit/floor repetitions per workload; medians are reported.
    reps: usize = 3, 3;
    /// Lease of the floor's `SET NX PX` (ms); the kit's watchdog lease is 30 s by default too.
    floor_lease_ms: u64 = 30_000, 30_000;
    /// Pause between two `SET NX` tries of a waiting floor task (µs); 0 = busy retry.
    floor_retry_us: u64 = 0, 0;
    /// W1: acquire+release cycles on fresh keys, one task.
    w1_cycles: usize = 5_000, 500;
    /// W1: slices each side's cycles are cut into; the sides take turns slice by slice.
    w1_slices: usize = 20, 5;
    /// W1: untimed warm-up cycles before each measured run.
    w1_warmup: usize = 200, 50;
    /// W2: tasks, each on its own fresh keys.
    w2_tasks: usize = 64, 64;
    /// W2: seconds per side and repetition.
    w2_secs: f64 = 10.0, 1.0;
    /// W2: slices each side's time is cut into; the sides take turns slice by slice.
    w2_slices: usize = 10, 2;
    /// W3: tasks contending for one key in one process.
    w3_tasks: usize = 16, 16;
    /// W3 cross-process: worker processes.
    w3_procs: usize = 4, 4;
    /// W3 cross-process: tasks per worker process.
    w3_tasks_per_proc: usize = 4, 4;
    /// W3: seconds per run.
    w3_secs: f64 = 10.0, 1.0;
    /// W3: how long each holder keeps the lock (µs).
    w3_hold_us: u64 = 1_000, 1_000;
    /// W3/W4: longest wait for the lock (s).
    w3_wait_secs: f64 = 10.0, 10.0;
    /// W4: tasks incrementing one counter.
    w4_tasks: usize = 16, 16;
    /// W4: read-modify-write increments per task.
    w4_increments: usize = 200, 50;
    /// W4: kit lockers ("service instances") the tasks are spread over, so exclusion goes
    /// through Redis and not only through one locker's local queue.
    w4_lockers: usize = 2, 2;
    /// W5: nested acquire+release cycles of a held key.
    w5_cycles: usize = 100_000, 10_000;
    /// W6: locks held by one locker.
    w6_locks: usize = 10_000, 2_000;
    /// W6: watchdog lease (ms); renewal every third of it.
    w6_lease_ms: u64 = 3_000, 1_500;
    /// W6: lease periods to hold the locks for.
    w6_periods: u32 = 3, 2;
    /// W7: concurrent HTTP/1.1 keep-alive connections.
    w7_conns: usize = 64, 64;
    /// W7: seconds of load per route and repetition (run in slices of about 0.5 s, the routes
    /// taking turns).
    w7_secs: f64 = 5.0, 1.0;
    /// W8: permits of the semaphore (its tasks, processes, hold and time are W3's).
    w8_permits: u32 = 3, 3;
    /// W9: tasks on one key, reading or writing.
    w9_tasks: usize = 16, 16;
    /// W9: percentage of cycles that read (the others write).
    w9_read_pct: u32 = 90, 90;
    /// W9: how long each holder keeps the lock (µs).
    w9_hold_us: u64 = 1_000, 1_000;
    /// W9: seconds per run of each arm.
    w9_secs: f64 = 5.0, 1.0;
    /// W10: uncontended acquire+release cycles of fresh key pairs, one task.
    w10_cycles: usize = 2_000, 300;
    /// W10: tasks transferring between random pairs of accounts.
    w10_tasks: usize = 16, 16;
    /// W10: accounts the transfers choose from.
    w10_accounts: usize = 8, 8;
    /// W10: how long each transfer holds its two keys (µs).
    w10_hold_us: u64 = 1_000, 1_000;
    /// W10: seconds per contended run of each arm.
    w10_secs: f64 = 5.0, 1.0;
    /// W12: tasks cycling on fresh keys.
    w12_tasks: usize = 32, 32;
    /// W12: seconds of cycling per run.
    w12_secs: f64 = 3.0, 1.0;
    /// W12: seconds after the run to count again (the kit's release retry window is 1 s).
    w12_after_secs: f64 = 2.0, 2.0;
}
