//! `keys = [..]` and `mode = "read"` against a real `redis-server` (one per test): every key is
//! held while the body runs, opposite orders do not deadlock, readers share and writers
//! exclude, and a write inside a read is refused.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lock_core::{distributed_lock, LockError, Locker};
use lock_testkit::RedisServer;
use tokio::sync::{oneshot, Barrier};

/// A generous bound for anything that should take milliseconds; a deadlock hits it.
const LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

impl AppError {
    fn is_busy(&self) -> bool {
        matches!(self, Self::Lock(e) if e.is_busy())
    }
}

async fn start() -> (RedisServer, Locker) {
    let server = RedisServer::start().expect("start redis-server");
    let locker = Locker::builder()
        .url(server.url())
        .build()
        .await
        .expect("connect");
    (server, locker)
}

async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(LIMIT, future)
        .await
        .expect("timed out (deadlock?)")
}

/// Per account: how many transfers are inside at once, and the most ever seen.
#[derive(Default)]
struct Occupancy {
    inside: HashMap<u32, AtomicUsize>,
    max: HashMap<u32, AtomicUsize>,
}

impl Occupancy {
    fn new(accounts: &[u32]) -> Self {
        Self {
            inside: accounts.iter().map(|a| (*a, AtomicUsize::new(0))).collect(),
            max: accounts.iter().map(|a| (*a, AtomicUsize::new(0))).collect(),
        }
    }

    async fn section(&self, accounts: [u32; 2]) {
        for a in accounts {
            let now = self.inside[&a].fetch_add(1, Ordering::SeqCst) + 1;
            self.max[&a].fetch_max(now, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        for a in accounts {
            self.inside[&a].fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn max(&self) -> usize {
        self.max
            .values()
            .map(|m| m.load(Ordering::SeqCst))
            .max()
            .unwrap_or(0)
    }
}

struct Bank {
    locker: Locker,
    accounts: Occupancy,
}

impl Bank {
    #[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "20s", locker = self.locker)]
    async fn transfer(&self, from: u32, to: u32) -> Result<(), AppError> {
        // Both keys are held while the body runs, whichever order the caller named them in.
        for account in [from, to] {
            assert!(self.locker.is_locked(&format!("account:{account}")).await?);
        }
        self.accounts.section([from, to]).await;
        Ok(())
    }

    /// The same body without the lock: the control for the occupancy checker.
    async fn transfer_unlocked(&self, from: u32, to: u32) -> Result<(), AppError> {
        self.accounts.section([from, to]).await;
        Ok(())
    }

    #[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "0s", locker = self.locker)]
    async fn try_transfer(&self, from: u32, to: u32) -> Result<(), AppError> {
        let _ = (from, to);
        Ok(())
    }

    #[distributed_lock(key = "account:<account>", wait = "0s", locker = self.locker)]
    async fn hold_account(
        &self,
        account: u32,
        entered: oneshot::Sender<()>,
        leave: oneshot::Receiver<()>,
    ) -> Result<(), AppError> {
        let _ = entered.send(());
        let _ = leave.await;
        Ok(())
    }
}

/// Transfers among 3 accounts in every order, from 12 tasks at once.
async fn transfers(bank: &Arc<Bank>, locked: bool) {
    let pairs = [(1, 2), (2, 1), (2, 3), (3, 2), (3, 1), (1, 3)];
    let handles: Vec<_> = (0..12)
        .map(|i| {
            let bank = bank.clone();
            let (from, to) = pairs[i % pairs.len()];
            tokio::spawn(async move {
                if locked {
                    bank.transfer(from, to).await
                } else {
                    bank.transfer_unlocked(from, to).await
                }
            })
        })
        .collect();
    for handle in handles {
        within(handle).await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_in_opposite_orders_exclude_each_other_without_deadlock() {
    let (server, locker) = start().await;
    let bank = Arc::new(Bank {
        locker: locker.clone(),
        accounts: Occupancy::new(&[1, 2, 3]),
    });
    transfers(&bank, true).await;
    assert_eq!(
        bank.accounts.max(),
        1,
        "two transfers of one account overlapped"
    );
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_without_the_macro_transfers_overlap() {
    let (_server, locker) = start().await;
    let bank = Arc::new(Bank {
        locker,
        accounts: Occupancy::new(&[1, 2, 3]),
    });
    transfers(&bank, false).await;
    assert!(
        bank.accounts.max() > 1,
        "the checker must catch overlapping transfers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_all_or_nothing() {
    let (server, locker) = start().await;
    let bank = Arc::new(Bank {
        locker: locker.clone(),
        accounts: Occupancy::new(&[]),
    });
    // Another task holds account 2 alone.
    let (entered_tx, entered) = oneshot::channel();
    let (leave, leave_rx) = oneshot::channel();
    let holder = tokio::spawn({
        let bank = bank.clone();
        async move { bank.hold_account(2, entered_tx, leave_rx).await }
    });
    within(entered).await.unwrap();

    let error = within(tokio::spawn({
        let bank = bank.clone();
        async move { bank.try_transfer(1, 2).await }
    }))
    .await
    .unwrap()
    .unwrap_err();
    assert!(error.is_busy(), "{error:?}");
    // Account 1 (taken first, in sorted order) was given back before the error.
    assert!(!locker.is_locked("account:1").await.unwrap());

    leave.send(()).unwrap();
    within(holder).await.unwrap().unwrap();
    within(bank.try_transfer(2, 1)).await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

struct Catalogue {
    locker: Locker,
}

impl Catalogue {
    /// Returns only once `barrier` saw every reader inside at once.
    #[distributed_lock(key = "catalogue:<id>", mode = "read", wait = "0s", locker = self.locker)]
    async fn read_together(&self, id: u32, barrier: Arc<Barrier>) -> Result<u32, AppError> {
        barrier.wait().await;
        Ok(id)
    }

    #[distributed_lock(key = "catalogue:<id>", mode = "read", wait = "0s", locker = self.locker)]
    async fn read_until(
        &self,
        id: u32,
        entered: oneshot::Sender<()>,
        leave: oneshot::Receiver<()>,
    ) -> Result<u32, AppError> {
        let _ = entered.send(());
        let _ = leave.await;
        Ok(id)
    }

    #[distributed_lock(key = "catalogue:<id>", mode = "write", wait = "0s", locker = self.locker)]
    async fn write_until(
        &self,
        id: u32,
        entered: oneshot::Sender<()>,
        leave: oneshot::Receiver<()>,
    ) -> Result<u32, AppError> {
        let _ = entered.send(());
        let _ = leave.await;
        Ok(id)
    }

    #[distributed_lock(key = "catalogue:<id>", mode = "read", wait = "0s", locker = self.locker)]
    async fn read(&self, id: u32) -> Result<u32, AppError> {
        Ok(id)
    }

    /// `mode` left out: the exclusive lock, as before `mode` existed.
    #[distributed_lock(key = "catalogue:<id>", wait = "0s", locker = self.locker)]
    async fn write(&self, id: u32) -> Result<u32, AppError> {
        Ok(id)
    }

    #[distributed_lock(key = "catalogue:<id>", mode = "read", locker = self.locker)]
    async fn write_inside_read(&self, id: u32) -> Result<u32, AppError> {
        self.write(id).await
    }

    #[distributed_lock(key = "catalogue:<id>", locker = self.locker)]
    async fn read_inside_write(&self, id: u32) -> Result<u32, AppError> {
        self.read(id).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_the_key_and_writers_exclude_them() {
    let (server, locker) = start().await;
    let catalogue = Arc::new(Catalogue {
        locker: locker.clone(),
    });
    // Two readers inside at once (with a zero wait: neither waited for the other).
    let barrier = Arc::new(Barrier::new(2));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (catalogue, barrier) = (catalogue.clone(), barrier.clone());
            tokio::spawn(async move { catalogue.read_together(7, barrier).await })
        })
        .collect();
    for reader in readers {
        assert_eq!(within(reader).await.unwrap().unwrap(), 7);
    }

    // While a reader holds: another reader gets in, a writer is busy.
    let (entered_tx, entered) = oneshot::channel();
    let (leave, leave_rx) = oneshot::channel();
    let reader = tokio::spawn({
        let catalogue = catalogue.clone();
        async move { catalogue.read_until(7, entered_tx, leave_rx).await }
    });
    within(entered).await.unwrap();
    let spawn_read = |c: Arc<Catalogue>| tokio::spawn(async move { c.read(7).await });
    let spawn_write = |c: Arc<Catalogue>| tokio::spawn(async move { c.write(7).await });
    assert_eq!(
        within(spawn_read(catalogue.clone()))
            .await
            .unwrap()
            .unwrap(),
        7
    );
    let error = within(spawn_write(catalogue.clone()))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        error.is_busy(),
        "a writer got in beside a reader: {error:?}"
    );
    leave.send(()).unwrap();
    within(reader).await.unwrap().unwrap();

    // While a writer holds: a reader is busy.
    let (entered_tx, entered) = oneshot::channel();
    let (leave, leave_rx) = oneshot::channel();
    let writer = tokio::spawn({
        let catalogue = catalogue.clone();
        async move { catalogue.write_until(7, entered_tx, leave_rx).await }
    });
    within(entered).await.unwrap();
    let error = within(spawn_read(catalogue.clone()))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        error.is_busy(),
        "a reader got in beside a writer: {error:?}"
    );
    leave.send(()).unwrap();
    within(writer).await.unwrap().unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_inside_a_read_is_refused_and_a_read_inside_a_write_nests() {
    let (server, locker) = start().await;
    let catalogue = Catalogue {
        locker: locker.clone(),
    };
    let error = within(catalogue.write_inside_read(3)).await.unwrap_err();
    assert!(
        matches!(&error, AppError::Lock(LockError::WriteInsideRead { key }) if key == "catalogue:3"),
        "{error:?}"
    );
    assert_eq!(within(catalogue.read_inside_write(3)).await.unwrap(), 3);
    common::assert_nothing_left(&server, &[&locker]).await;
}
