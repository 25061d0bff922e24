use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "k:<id>", wait = 5)]
async fn int_wait(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = order_key, wait = "1s")]
async fn ident_key(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", on_lost = abort)]
async fn ident_on_lost(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", on_lost = "retry")]
async fn bad_on_lost(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", wait)]
async fn no_value(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
