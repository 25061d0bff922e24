use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "inventory:<>")]
async fn empty(sku_id: u64) -> Result<u64, LockError> {
    Ok(sku_id)
}

#[distributed_lock(key = "")]
async fn empty_key(sku_id: u64) -> Result<u64, LockError> {
    Ok(sku_id)
}

fn main() {}
