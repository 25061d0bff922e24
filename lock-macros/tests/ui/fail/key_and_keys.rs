use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "account:<from>", keys = ["account:<from>", "account:<to>"])]
async fn key_first(from: u32, to: u32) -> Result<u32, LockError> {
    Ok(from + to)
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "1s", key = "account:<from>")]
async fn keys_first(from: u32, to: u32) -> Result<u32, LockError> {
    Ok(from + to)
}

fn main() {}
