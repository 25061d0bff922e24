//! Return types the macro cannot read: the type checker refuses what cannot say "skipped".
use lock_core::{distributed_lock, LockError};

type Count = Result<u32, LockError>;

#[distributed_lock(key = "job:<id>", on_busy = "skip")]
async fn aliased_count(id: u32) -> Count {
    Ok(id)
}

type Counter = u32;

#[distributed_lock(key = "job:<id>", on_busy = "skip")]
async fn aliased_value(id: u32) -> Counter {
    id
}

#[derive(Debug)]
struct NotFromLockError;

#[distributed_lock(key = "job:<id>", on_busy = "skip")]
async fn error_without_from(id: u32) -> Result<Option<u32>, NotFromLockError> {
    Ok(Some(id))
}

fn main() {}
