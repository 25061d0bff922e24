//! Trait impl methods (native `async fn` in traits), and a trait's default method.
#![deny(warnings)]

use lock_core::{distributed_lock, LockError, Locker};

#[derive(Debug)]
pub struct RepoError;

impl From<LockError> for RepoError {
    fn from(_: LockError) -> Self {
        Self
    }
}

#[allow(async_fn_in_trait)]
pub trait Repo {
    fn locker(&self) -> &Locker;

    async fn reserve(&self, sku_id: u64, qty: u32) -> Result<u32, RepoError>;

    #[distributed_lock(key = "default:<id>", locker = self.locker())]
    async fn with_default(&self, id: u64) -> Result<u64, RepoError> {
        Ok(id)
    }
}

pub struct Db {
    locker: Locker,
}

impl Repo for Db {
    fn locker(&self) -> &Locker {
        &self.locker
    }

    #[distributed_lock(key = "inventory:<sku_id>", locker = self.locker, wait = "2s")]
    async fn reserve(&self, sku_id: u64, qty: u32) -> Result<u32, RepoError> {
        let _ = sku_id;
        Ok(qty)
    }
}

fn assert_send<T: Send>(_: T) {}

#[allow(dead_code)]
fn check(db: &Db) {
    assert_send(db.reserve(1, 2));
    assert_send(db.with_default(1));
}

fn main() {}
