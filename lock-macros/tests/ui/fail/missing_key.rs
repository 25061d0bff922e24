use lock_core::{distributed_lock, LockError};

#[distributed_lock(wait = "3s")]
async fn no_key(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock]
async fn no_args(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock("order:<id>")]
async fn positional(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
