use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "k:<id>", wait = "1s", wait = "2s")]
async fn twice(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "a:<id>", key = "b:<id>")]
async fn two_keys(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
