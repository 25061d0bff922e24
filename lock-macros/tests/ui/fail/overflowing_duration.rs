// Totals at the very end of `Duration`'s range: humantime 2.4 panics on these (a carry of
// exactly one second past `u64::MAX` seconds); the attribute reports them as too large.
use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "k:<id>", wait = "18446744073709551615s 1000000000ns")]
async fn wait_overflows(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", lease = "18446744073709551615s 500ms 500ms")]
async fn lease_overflows(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
