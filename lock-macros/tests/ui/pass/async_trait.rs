//! Methods of an `#[async_trait]` impl (the macro sees the boxed-future shape).
#![deny(warnings)]

use async_trait::async_trait;
use lock_core::{distributed_lock, LockError, Locker};

#[derive(Debug)]
pub struct RepoError;

impl From<LockError> for RepoError {
    fn from(_: LockError) -> Self {
        Self
    }
}

#[async_trait]
pub trait Repo: Send + Sync {
    async fn reserve(&self, sku_id: u64, qty: u32) -> Result<u32, RepoError>;
    async fn bump(&mut self, by: u32) -> Result<u32, RepoError>;
    async fn show(&self, name: &str) -> Result<String, RepoError>;
}

pub struct Db {
    locker: Locker,
    tenant: String,
    count: u32,
}

#[async_trait]
impl Repo for Db {
    #[distributed_lock(key = "<self.tenant>:<sku_id>", locker = self.locker, wait = "2s")]
    async fn reserve(&self, sku_id: u64, qty: u32) -> Result<u32, RepoError> {
        if sku_id == 0 {
            return Err(RepoError);
        }
        Ok(qty + self.count)
    }

    #[distributed_lock(key = "count:<self.tenant>", locker = self.locker, on_lost = "continue")]
    async fn bump(&mut self, by: u32) -> Result<u32, RepoError> {
        self.count += by;
        Ok(self.count)
    }

    #[distributed_lock(key = "show:<name>", locker = self.locker)]
    async fn show(&self, name: &str) -> Result<String, RepoError> {
        Ok(format!("{name}{}", self.tenant))
    }
}

fn assert_send<T: Send>(_: T) {}

#[allow(dead_code)]
fn check(db: &mut Db, dynamic: &dyn Repo) {
    assert_send(dynamic.reserve(1, 2));
    assert_send(db.reserve(1, 2));
    assert_send(db.bump(1));
}

fn main() {}
