use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "k:<id>")]
async fn wrong_body(id: u32) -> Result<u32, LockError> {
    Ok("not a number")
}

fn main() {}
