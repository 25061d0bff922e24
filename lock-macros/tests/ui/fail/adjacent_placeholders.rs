use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "pair:<a><b>")]
async fn swap(a: u64, b: u64) -> Result<(), LockError> {
    let _ = (a, b);
    Ok(())
}

fn main() {}
