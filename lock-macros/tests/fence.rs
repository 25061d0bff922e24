//! `fence = <name>` against a real `redis-server`: the body's fence issues the fencing token of
//! the lock the macro holds (the guard's own token), tokens increase across holders (the macro,
//! `Locker::lock`, another locker), `keys` gives one fence per template in the order written,
//! and a fence nobody asks costs nothing in Redis.

mod common;

use std::time::Duration;

use lock_core::{distributed_lock, LockError, Locker};
use lock_testkit::RedisServer;

const LIMIT: Duration = Duration::from_secs(20);

async fn start() -> (RedisServer, Locker) {
    let server = RedisServer::start().expect("start redis-server");
    let locker = connect(&server).await;
    (server, locker)
}

async fn connect(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .build()
        .await
        .expect("connect")
}

async fn within<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(LIMIT, future)
        .await
        .expect("timed out")
}

/// What a body saw of its fence.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    key: String,
    token: u64,
    /// The token of a nested `Locker::lock` of the same key: a guard of the same acquisition.
    guard_token: u64,
}

struct Inventory {
    locker: Locker,
}

impl Inventory {
    #[distributed_lock(key = "inventory:<sku>", wait = "5s", locker = self.locker, fence = fence)]
    async fn reserve(&self, sku: u64) -> Result<Seen, LockError> {
        let token = fence.token().await?;
        // Asked again: the same token, without a round trip.
        assert_eq!(fence.token().await?, token);
        let nested = self.locker.lock(format!("inventory:{sku}")).await?;
        let guard_token = nested.fencing_token().await?;
        nested.release().await?;
        Ok(Seen {
            key: fence.key().to_owned(),
            token,
            guard_token,
        })
    }

    /// Binds the fence but never asks for the token.
    #[distributed_lock(key = "inventory:<sku>", locker = self.locker, fence = fence)]
    async fn unfenced(&self, sku: u64) -> Result<String, LockError> {
        let _ = sku;
        Ok(fence.key().to_owned())
    }

    #[distributed_lock(keys = ["account:<from>", "account:<to>"], locker = self.locker, fence = fences)]
    async fn transfer(&self, from: u64, to: u64) -> Result<[Seen; 2], LockError> {
        let _ = (from, to);
        let mut seen = Vec::new();
        for fence in &fences {
            let token = fence.token().await?;
            let nested = self.locker.lock(fence.key()).await?;
            let guard_token = nested.fencing_token().await?;
            nested.release().await?;
            seen.push(Seen {
                key: fence.key().to_owned(),
                token,
                guard_token,
            });
        }
        let [debit, credit]: [Seen; 2] = seen.try_into().expect("two fences");
        Ok([debit, credit])
    }
}

/// The Redis keys of fencing counters.
fn fence_keys(server: &RedisServer) -> Vec<String> {
    server.keys("lock:*fence*")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_is_the_guards_token_and_increases_across_holders() {
    let (server, locker) = start().await;
    let other = connect(&server).await;
    let inventory = Inventory {
        locker: locker.clone(),
    };

    let first = within(inventory.reserve(42)).await.expect("first holder");
    assert_eq!(first.key, "inventory:42");
    assert_eq!(
        first.token, first.guard_token,
        "the fence is the held lock's"
    );
    assert!(
        !fence_keys(&server).is_empty(),
        "the token was issued in Redis"
    );

    // Holders in turn: the macro, `Locker::lock` on the same locker, the macro, another
    // locker (another process), the macro. Each token is larger than the one before.
    let mut tokens = vec![first.token];
    let direct = locker.lock("inventory:42").await.expect("lock");
    tokens.push(direct.fencing_token().await.expect("token"));
    direct.release().await.expect("release");
    let second = within(inventory.reserve(42)).await.expect("second holder");
    assert_eq!(second.token, second.guard_token);
    tokens.push(second.token);
    let elsewhere = other.lock("inventory:42").await.expect("lock elsewhere");
    tokens.push(elsewhere.fencing_token().await.expect("token elsewhere"));
    elsewhere.release().await.expect("release elsewhere");
    let third = within(inventory.reserve(42)).await.expect("third holder");
    tokens.push(third.token);
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens must increase across holders: {tokens:?}"
    );

    // Another key has its own counter, and keys the body does not fence get none.
    server.cmd::<()>(&["FLUSHALL"]);
    let key = within(inventory.unfenced(7)).await.expect("unfenced");
    assert_eq!(key, "inventory:7");
    assert_eq!(
        fence_keys(&server),
        Vec::<String>::new(),
        "a fence nobody asks writes nothing"
    );
    common::assert_nothing_left(&server, &[&locker, &other]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_get_one_fence_per_template_in_the_order_written() {
    let (server, locker) = start().await;
    let inventory = Inventory {
        locker: locker.clone(),
    };

    // Locked in the order account:3, account:7; the fences follow the templates.
    let [debit, credit] = within(inventory.transfer(7, 3)).await.expect("transfer");
    assert_eq!(debit.key, "account:7");
    assert_eq!(credit.key, "account:3");
    assert_eq!(debit.token, debit.guard_token);
    assert_eq!(credit.token, credit.guard_token);

    // The next holder of each account gets a larger token.
    let [debit_again, credit_again] = within(inventory.transfer(3, 7)).await.expect("back");
    assert_eq!(debit_again.key, "account:3");
    assert!(debit_again.token > credit.token, "account:3 again");
    assert!(credit_again.token > debit.token, "account:7 again");

    // A transfer to the same account locks it once: both fences are that lock's.
    let [from, to] = within(inventory.transfer(5, 5)).await.expect("to itself");
    assert_eq!(from, to);
    assert_eq!(from.key, "account:5");
    common::assert_nothing_left(&server, &[&locker]).await;
}
