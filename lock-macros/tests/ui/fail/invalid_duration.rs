use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "k:<id>", wait = "3 parsecs")]
async fn bad_unit(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", lease = "soon")]
async fn not_a_duration(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
