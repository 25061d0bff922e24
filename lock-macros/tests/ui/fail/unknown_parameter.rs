use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "inventory:<sku>")]
async fn typo(sku_id: u64, qty: u32) -> Result<u32, LockError> {
    let _ = sku_id;
    Ok(qty)
}

#[distributed_lock(key = "inventory:<warehouse>")]
async fn unrelated(sku_id: u64) -> Result<u64, LockError> {
    Ok(sku_id)
}

#[distributed_lock(key = "inventory:<id>")]
async fn no_params() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
