use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "k:<id>", timeout = "3s")]
async fn timeout(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", retries = 3)]
async fn retries(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
