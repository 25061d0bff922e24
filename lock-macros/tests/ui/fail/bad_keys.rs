use lock_core::{distributed_lock, LockError};

#[distributed_lock(keys = [])]
async fn empty(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(keys = "account:<id>")]
async fn not_a_list(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(keys = ["account:<id>", 7])]
async fn not_a_string(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(keys = ["account:<id>", "account:<id>"])]
async fn repeated(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(keys = ["account:<from>", "account:<too>", "audit:<>"])]
async fn bad_templates(from: u32, to: u32) -> Result<u32, LockError> {
    Ok(from + to)
}

#[distributed_lock(keys = ["a:<id>"], keys = ["b:<id>"])]
async fn twice(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(locks = ["a:<id>"])]
async fn misnamed(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
