//! `keys = [..]` and `mode = ".."` on the shapes the attribute supports: methods with field
//! paths, generic fns, trait impls, `#[async_trait]`; their futures are `Send`.
#![deny(warnings)]

use std::fmt::Display;

use lock_core::{distributed_lock, LockError, Locker};

pub struct Transfer {
    pub from: u64,
    pub to: u64,
}

pub struct Bank {
    pub locker: Locker,
    pub branch: String,
}

impl Bank {
    /// Both accounts, whatever order the caller names them in.
    #[distributed_lock(keys = ["account:<t.from>", "account:<t.to>"], wait = "3s", locker = self.locker)]
    pub async fn transfer(&self, t: Transfer, amount: u64) -> Result<u64, LockError> {
        Ok(t.from + t.to + amount)
    }

    /// A trailing comma in the list, one template with the receiver's field.
    #[distributed_lock(
        keys = ["branch:<self.branch>", "audit:<day>",],
        mode = "write",
        locker = self.locker,
    )]
    pub async fn close_day(&mut self, day: u32) -> Result<u32, LockError> {
        self.branch.push('!');
        Ok(day)
    }

    /// A reader: many at once, none while a writer holds the key.
    #[distributed_lock(key = "branch:<self.branch>", mode = "read", locker = self.locker)]
    pub async fn report(&self) -> Result<String, LockError> {
        Ok(self.branch.clone())
    }

    /// A one-element list is allowed (a `MultiLockGuard` of one key).
    #[distributed_lock(keys = ["only:<id>"], locker = self.locker)]
    pub async fn one_of_all(&self, id: u8) -> Result<u8, LockError> {
        Ok(id)
    }
}

/// Generic parameters in several templates.
#[distributed_lock(keys = ["left:<a>", "right:<b>"], locker = locker)]
pub async fn pair<A: Display + Send + Sync, B>(locker: &Locker, a: A, b: B) -> Result<(), LockError>
where
    B: Display + Send + Sync,
{
    let _ = (a, b);
    Ok(())
}

pub trait Catalogue {
    fn lookup(&self, sku: u32) -> impl std::future::Future<Output = Result<u32, LockError>> + Send;
}

impl Catalogue for Bank {
    #[distributed_lock(key = "sku:<sku>", mode = "read", locker = self.locker)]
    async fn lookup(&self, sku: u32) -> Result<u32, LockError> {
        Ok(sku)
    }
}

#[async_trait::async_trait]
pub trait Ledger {
    async fn post(&self, from: u64, to: u64) -> Result<(), LockError>;
    async fn read(&self, account: u64) -> Result<u64, LockError>;
}

#[async_trait::async_trait]
impl Ledger for Bank {
    #[distributed_lock(keys = ["account:<from>", "account:<to>"], locker = self.locker)]
    async fn post(&self, from: u64, to: u64) -> Result<(), LockError> {
        let _ = (from, to);
        Ok(())
    }

    #[distributed_lock(key = "account:<account>", mode = "read", locker = self.locker)]
    async fn read(&self, account: u64) -> Result<u64, LockError> {
        Ok(account)
    }
}

fn assert_send<T: Send>(_: T) {}

#[allow(dead_code)]
fn check(bank: &mut Bank, locker: &Locker) {
    assert_send(bank.transfer(Transfer { from: 1, to: 2 }, 3));
    assert_send(bank.report());
    assert_send(bank.one_of_all(1));
    assert_send(bank.lookup(1));
    assert_send(bank.post(1, 2));
    assert_send(bank.read(1));
    assert_send(pair(locker, 1, "b"));
    assert_send(bank.close_day(1));
}

fn main() {}
