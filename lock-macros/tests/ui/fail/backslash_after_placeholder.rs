use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "path:<dir>\\<file>")]
async fn touch(dir: String, file: String) -> Result<(), LockError> {
    let _ = (dir, file);
    Ok(())
}

fn main() {}
