use lock_core::{distributed_lock, LockError};

pub struct Tenant;

impl Tenant {
    #[distributed_lock(key = "<self.name>:<id>")]
    async fn associated(id: u32) -> Result<u32, LockError> {
        Ok(id)
    }
}

fn main() {}
