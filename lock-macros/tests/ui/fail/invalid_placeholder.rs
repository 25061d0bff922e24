use lock_core::{distributed_lock, LockError};

pub struct Order {
    pub id: u64,
}

#[distributed_lock(key = "order:<order id>")]
async fn space(order: Order) -> Result<u64, LockError> {
    Ok(order.id)
}

#[distributed_lock(key = "order:<order.type>")]
async fn keyword(order: Order) -> Result<u64, LockError> {
    Ok(order.id)
}

fn main() {}
