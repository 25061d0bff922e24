use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "k:<ids>")]
async fn not_display(ids: Vec<u32>) -> Result<usize, LockError> {
    Ok(ids.len())
}

fn main() {}
