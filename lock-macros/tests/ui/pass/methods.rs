//! Inherent methods: `&self`, `&mut self`, `self`, `self: Arc<Self>`, associated fns, `Self`.
#![deny(warnings)]

use std::sync::Arc;

use lock_core::{distributed_lock, LockError, Locker};

pub struct Inventory {
    locker: Locker,
    tenant: String,
    count: u32,
}

impl Inventory {
    #[distributed_lock(key = "<self.tenant>:<sku_id>", locker = self.locker)]
    pub async fn by_ref(&self, sku_id: u64) -> Result<u64, LockError> {
        // nested locked call on the same key: reentrant
        self.nested(sku_id).await
    }

    #[distributed_lock(key = "<self.tenant>:<sku_id>", locker = self.locker)]
    async fn nested(&self, sku_id: u64) -> Result<u64, LockError> {
        Ok(sku_id + u64::from(self.count))
    }

    #[distributed_lock(key = "count:<self.count>", locker = self.locker, wait = "1s")]
    pub async fn by_mut(&mut self, by: u32) -> Result<u32, LockError> {
        self.count += by;
        Ok(self.count)
    }

    #[distributed_lock(key = "consume:<self.tenant>", locker = self.locker.clone())]
    pub async fn by_value(self) -> Result<String, LockError> {
        Ok(self.tenant)
    }

    #[distributed_lock(key = "arc:<self.tenant>", locker = self.locker)]
    pub async fn by_arc(self: Arc<Self>) -> Result<Arc<Self>, LockError> {
        Ok(self)
    }

    #[distributed_lock(key = "new:<tenant>", locker = locker)]
    pub async fn create(locker: Locker, tenant: String) -> Result<Self, LockError> {
        Ok(Self {
            locker: locker.clone(),
            tenant,
            count: 0,
        })
    }
}

fn assert_send<T: Send>(_: T) {}

#[allow(dead_code)]
fn check(mut inventory: Inventory, locker: Locker) {
    assert_send(inventory.by_ref(1));
    assert_send(inventory.by_mut(1));
    assert_send(Inventory::create(locker, String::new()));
    assert_send(inventory.by_value());
}

#[allow(dead_code)]
fn check_arc(inventory: Arc<Inventory>) {
    assert_send(inventory.by_arc());
}

fn main() {}
