use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "catalogue:<id>", mode = "shared")]
async fn unknown_mode(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "catalogue:<id>", mode = read)]
async fn not_a_string(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "catalogue:<id>", read)]
async fn flag(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

// Several keys are only locked together exclusively.
#[distributed_lock(keys = ["account:<from>", "account:<to>"], mode = "read")]
async fn read_all(from: u32, to: u32) -> Result<u32, LockError> {
    Ok(from + to)
}

#[distributed_lock(mode = "read")]
async fn no_key(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
