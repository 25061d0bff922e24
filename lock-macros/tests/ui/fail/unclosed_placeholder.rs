use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "inventory:<sku_id")]
async fn unclosed(sku_id: u64) -> Result<u64, LockError> {
    Ok(sku_id)
}

fn main() {}
