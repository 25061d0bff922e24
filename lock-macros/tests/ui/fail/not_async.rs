use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "k:<id>")]
fn not_async(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
