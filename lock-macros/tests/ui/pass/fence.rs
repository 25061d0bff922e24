//! `fence = <name>` binds the lock's `Fence` in the body (`[Fence; N]` in template order for
//! `keys`), on every shape the attribute supports; the futures stay `Send`.
#![deny(warnings)]

use std::fmt::Display;

use lock_core::{distributed_lock, Fence, LockError, Locker};

pub struct Inventory {
    pub locker: Locker,
}

impl Inventory {
    /// The token goes to the database with the write.
    #[distributed_lock(key = "inventory:<sku>", wait = "3s", locker = self.locker, fence = fence)]
    pub async fn reserve(&self, sku: u64) -> Result<u64, LockError> {
        let token = fence.token().await?;
        Ok(sku + token)
    }

    /// Any name; `mode = "write"` spelled out; the fence can be handed on (it is owned).
    #[distributed_lock(key = "inventory:<sku>", mode = "write", fence = lock, locker = self.locker)]
    pub async fn hand_on(&self, sku: u64) -> Result<Fence, LockError> {
        let _ = sku;
        Ok(lock)
    }

    /// `keys`: one fence per template, in the order written, so it destructures.
    #[distributed_lock(keys = ["account:<from>", "account:<to>"], fence = fences, locker = self.locker)]
    pub async fn transfer(&self, from: u64, to: u64) -> Result<(u64, u64), LockError> {
        let [debit, credit] = fences;
        Ok((debit.token().await?, credit.token().await?))
    }

    /// With `on_lost = "continue"` and a fixed lease.
    #[distributed_lock(key = "job:<id>", lease = "10s", on_lost = "continue", fence = fence, locker = self.locker)]
    pub async fn job(&self, id: u32) -> Result<String, LockError> {
        let _ = id;
        Ok(fence.key().to_owned())
    }
}

/// A generic free fn with the global locker.
#[distributed_lock(key = "item:<item>", fence = fence)]
pub async fn generic<T: Display + Send + Sync>(item: T) -> Result<u64, LockError> {
    let _ = item;
    fence.token().await
}

#[async_trait::async_trait]
pub trait Ledger {
    async fn post(&self, from: u64, to: u64) -> Result<u64, LockError>;
    async fn close(&self, day: u32) -> Result<u64, LockError>;
}

#[async_trait::async_trait]
impl Ledger for Inventory {
    #[distributed_lock(keys = ["account:<from>", "account:<to>"], fence = fences, locker = self.locker)]
    async fn post(&self, from: u64, to: u64) -> Result<u64, LockError> {
        let _ = (from, to);
        fences[0].token().await
    }

    #[distributed_lock(key = "day:<day>", fence = fence, locker = self.locker)]
    async fn close(&self, day: u32) -> Result<u64, LockError> {
        let _ = day;
        fence.token().await
    }
}

fn assert_send<T: Send>(_: T) {}

#[allow(dead_code)]
fn check(inventory: &Inventory) {
    assert_send(inventory.reserve(1));
    assert_send(inventory.hand_on(1));
    assert_send(inventory.transfer(1, 2));
    assert_send(inventory.job(1));
    assert_send(generic(1));
    assert_send(inventory.post(1, 2));
    assert_send(inventory.close(1));
}

fn main() {}
