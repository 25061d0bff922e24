use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "k:<id>", lease = "0s")]
async fn zero(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", lease = "500us")]
async fn sub_millisecond(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
