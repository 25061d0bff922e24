//! `crate = ".."`: the generated code reaches lock-core only through the given path, and hands
//! the public closure API (`Locker::lock`/`read`/`lock_all`, the builders' `wait`, `lease`,
//! `on_lost`, then `with_lock`) the attribute's values. Here the path leads to stand-ins of
//! those types that record what they got and call lock-core; the fns run against a real
//! `redis-server`.
#![deny(warnings)]

use std::time::Duration;

use lock_core::{distributed_lock, LockError, Locker, OnLost};
use lock_testkit::RedisServer;

use recorded::{Call, CALLS};

mod recorded {
    use std::future::Future;
    use std::sync::Mutex;
    use std::time::Duration;

    pub use lock_core::{Fence, LockError, OnLost};

    pub mod __private {
        pub use lock_core::__private::*;

        use super::{record, Call};

        pub fn locker<L: AsRef<Locker> + ?Sized>(named: Option<&L>) -> Result<&Locker, LockError> {
            record(Call::Locker {
                named: named.is_some(),
            });
            lock_core::__private::locker(named)
        }
    }

    /// One acquire, as the generated code configured it, or the locker lookup.
    #[derive(Debug, Clone, PartialEq)]
    pub enum Call {
        Locker {
            named: bool,
        },
        WithLock {
            how: &'static str,
            keys: Vec<String>,
            wait: Option<Duration>,
            lease: Option<Duration>,
            on_lost: OnLost,
        },
    }

    pub static CALLS: Mutex<Vec<Call>> = Mutex::new(Vec::new());

    fn record(call: Call) {
        CALLS.lock().unwrap().push(call);
    }

    /// What the builder was told, recorded when `with_lock` runs.
    struct Seen {
        how: &'static str,
        keys: Vec<String>,
        wait: Option<Duration>,
        lease: Option<Duration>,
        on_lost: OnLost,
    }

    impl Seen {
        fn new(how: &'static str, keys: Vec<String>) -> Self {
            Self {
                how,
                keys,
                wait: None,
                lease: None,
                on_lost: OnLost::Abort,
            }
        }

        fn record(self) {
            record(Call::WithLock {
                how: self.how,
                keys: self.keys,
                wait: self.wait,
                lease: self.lease,
                on_lost: self.on_lost,
            });
        }
    }

    pub struct Locker;

    impl Locker {
        pub fn lock(locker: &lock_core::Locker, key: String) -> Acquire {
            Acquire(Seen::new("lock", vec![key.clone()]), locker.lock(key))
        }

        pub fn read(locker: &lock_core::Locker, key: String) -> Acquire {
            Acquire(Seen::new("read", vec![key.clone()]), locker.read(key))
        }

        pub fn lock_all<const N: usize>(
            locker: &lock_core::Locker,
            keys: [String; N],
        ) -> AcquireAll {
            AcquireAll(Seen::new("all", keys.to_vec()), locker.lock_all(keys))
        }
    }

    pub struct Acquire(Seen, lock_core::Acquire);

    impl Acquire {
        pub fn wait(mut self, wait: Duration) -> Self {
            self.0.wait = Some(wait);
            Self(self.0, self.1.wait(wait))
        }

        pub fn lease(mut self, lease: Duration) -> Self {
            self.0.lease = Some(lease);
            Self(self.0, self.1.lease(lease))
        }

        pub fn on_lost(mut self, on_lost: OnLost) -> Self {
            self.0.on_lost = on_lost;
            Self(self.0, self.1.on_lost(on_lost))
        }

        pub async fn with_lock<T, E, F, Fut>(self, body: F) -> Result<T, E>
        where
            F: FnOnce(Fence) -> Fut,
            Fut: Future<Output = Result<T, E>>,
            E: From<LockError>,
        {
            self.0.record();
            self.1.with_lock(body).await
        }
    }

    pub struct AcquireAll(Seen, lock_core::AcquireAll);

    impl AcquireAll {
        pub fn wait(mut self, wait: Duration) -> Self {
            self.0.wait = Some(wait);
            Self(self.0, self.1.wait(wait))
        }

        pub fn lease(mut self, lease: Duration) -> Self {
            self.0.lease = Some(lease);
            Self(self.0, self.1.lease(lease))
        }

        pub fn on_lost(mut self, on_lost: OnLost) -> Self {
            self.0.on_lost = on_lost;
            Self(self.0, self.1.on_lost(on_lost))
        }

        pub async fn with_lock<T, E, F, Fut>(self, body: F) -> Result<T, E>
        where
            F: FnOnce(Vec<Fence>) -> Fut,
            Fut: Future<Output = Result<T, E>>,
            E: From<LockError>,
        {
            self.0.record();
            self.1.with_lock(body).await
        }
    }
}

#[distributed_lock(
    key = "inventory:<sku_id>",
    wait = "3s",
    lease = "1m 250ms",
    locker = locker,
    on_lost = "continue",
    crate = "crate::recorded",
)]
async fn every_option(locker: &Locker, sku_id: &str) -> Result<u32, LockError> {
    let _ = sku_id;
    Ok(7)
}

#[distributed_lock(key = "pair:<a>:<b>", locker = locker, crate = "crate::recorded")]
async fn defaults(locker: &Locker, a: &str, b: &str) -> Result<String, LockError> {
    Ok(format!("{a}{b}"))
}

#[distributed_lock(key = "catalogue:<id>", mode = "read", wait = "1s", locker = locker, crate = "crate::recorded")]
async fn reader(locker: &Locker, id: u32) -> Result<u32, LockError> {
    // A read lock: shared, no fencing token.
    Ok(id)
}

#[distributed_lock(key = "catalogue:<id>", mode = "write", locker = locker, crate = "crate::recorded")]
async fn writer(locker: &Locker, id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(
    keys = ["account:<from>", "account:<to>"],
    wait = "2s",
    lease = "10s",
    locker = locker,
    on_lost = "continue",
    crate = "crate::recorded",
)]
async fn transfer(locker: &Locker, from: u32, to: u32) -> Result<(u32, u32), LockError> {
    Ok((from, to))
}

#[distributed_lock(key = "fixed", crate = "crate::recorded")]
async fn global_locker() -> Result<(), LockError> {
    unreachable!("no global locker is set: the body does not run")
}

fn main() {
    let server = RedisServer::start().expect("start redis-server");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let locker = Locker::builder().url(server.url()).build().await.unwrap();
        assert_eq!(every_option(&locker, "x:1").await.unwrap(), 7);
        assert_eq!(defaults(&locker, "x:y", "z").await.unwrap(), "x:yz");
        assert_eq!(reader(&locker, 5).await.unwrap(), 5);
        assert_eq!(writer(&locker, 5).await.unwrap(), 5);
        assert_eq!(transfer(&locker, 9, 3).await.unwrap(), (9, 3));
        assert!(matches!(
            global_locker().await,
            Err(LockError::NotConfigured)
        ));
    });
    let calls = CALLS.lock().unwrap().clone();
    let with_lock = |how, keys: &[&str], wait, lease, on_lost| Call::WithLock {
        how,
        keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        wait,
        lease,
        on_lost,
    };
    assert_eq!(
        calls,
        [
            Call::Locker { named: true },
            with_lock(
                "lock",
                &["inventory:x:1"],
                Some(Duration::from_secs(3)),
                Some(Duration::from_millis(60_250)),
                OnLost::Continue,
            ),
            // Defaults: the locker's wait and watchdog lease, abort when lost; the value's `:`
            // is escaped against the `:` that follows it.
            Call::Locker { named: true },
            with_lock("lock", &[r"pair:x\:y:z"], None, None, OnLost::Abort),
            // `mode = "read"` takes the read lock, `mode = "write"` the exclusive one.
            Call::Locker { named: true },
            with_lock(
                "read",
                &["catalogue:5"],
                Some(Duration::from_secs(1)),
                None,
                OnLost::Abort,
            ),
            Call::Locker { named: true },
            with_lock("lock", &["catalogue:5"], None, None, OnLost::Abort),
            // `keys`: every key, in the order written (lock-core sorts them), in one acquire.
            Call::Locker { named: true },
            with_lock(
                "all",
                &["account:9", "account:3"],
                Some(Duration::from_secs(2)),
                Some(Duration::from_secs(10)),
                OnLost::Continue,
            ),
            // No `locker`: the global one, which is not set, so nothing else runs.
            Call::Locker { named: false },
        ]
    );
}
