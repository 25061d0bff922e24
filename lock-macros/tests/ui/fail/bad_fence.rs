use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "k:<id>", fence = "fence")]
async fn quoted(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", fence = self.fence)]
async fn not_a_name(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", fence = self)]
async fn keyword(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", fence)]
async fn no_value(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", fence = a, fence = b)]
async fn twice(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

// The body could no longer reach the parameter.
#[distributed_lock(key = "k:<id>", fence = id)]
async fn shadows(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", fence = fence)]
async fn shadows_fence(id: u32, fence: u64) -> Result<u64, LockError> {
    Ok(fence + u64::from(id))
}

// Readers share the key: no token can order them.
#[distributed_lock(key = "k:<id>", mode = "read", fence = fence)]
async fn read(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>", guard = guard)]
async fn guard_option(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

// `keys` binds one fence per template: an array, not a `Fence`.
#[distributed_lock(keys = ["a:<a>", "b:<b>"], fence = fence)]
async fn array(a: u32, b: u32) -> Result<u64, LockError> {
    let _ = (a, b);
    fence.token().await
}

fn main() {}
