use lock_core::{distributed_lock, LockError};

#[allow(async_fn_in_trait)]
pub trait Repo {
    #[distributed_lock(key = "k:<id>")]
    async fn reserve(&self, id: u32) -> Result<u32, LockError>;
}

fn main() {}
