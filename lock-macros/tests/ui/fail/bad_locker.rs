use lock_core::{distributed_lock, LockError};

pub struct State {
    pub url: String,
}

#[distributed_lock(key = "k:<id>", locker = state.url)]
async fn not_a_locker(state: &State, id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn main() {}
