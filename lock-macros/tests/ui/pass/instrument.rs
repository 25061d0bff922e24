//! Stacks with `#[tracing::instrument]` in either order.
#![deny(warnings)]

use lock_core::{distributed_lock, LockError, Locker};

#[tracing::instrument(err)]
#[distributed_lock(key = "above:<id>")]
pub async fn instrument_above(id: u64) -> Result<u64, LockError> {
    tracing::info!("inside");
    Ok(id)
}

#[distributed_lock(key = "below:<id>")]
#[tracing::instrument(level = "debug", ret, err)]
pub async fn instrument_below(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

pub struct Service {
    locker: Locker,
}

impl Service {
    #[tracing::instrument(skip(self), err)]
    #[distributed_lock(key = "svc:<id>", locker = self.locker)]
    pub async fn method_above(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }

    #[distributed_lock(key = "svc:<id>", locker = self.locker)]
    #[tracing::instrument(skip_all, fields(id = id))]
    pub async fn method_below(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn assert_send<T: Send>(_: T) {}

#[allow(dead_code)]
fn check(service: &Service) {
    assert_send(service.method_above(1));
    assert_send(service.method_below(1));
}

fn main() {
    assert_send(instrument_above(1));
    assert_send(instrument_below(1));
}
