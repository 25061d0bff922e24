//! `crate = ".."`: the generated code reaches lock-core only through the given path, and hands
//! its helpers the attribute's values. Here the path leads to a copy of lock-core's hidden
//! helpers whose calls are recorded; the fns run against a real `redis-server`.
#![deny(warnings)]

use std::time::Duration;

use lock_core::{distributed_lock, LockError, Locker};
use lock_testkit::RedisServer;

use recorded::__private::{Call, OnLost, CALLS};

mod recorded {
    pub mod __private {
        use std::future::Future;
        use std::sync::Mutex;
        use std::time::Duration;

        pub use lock_core::__private::*;

        /// One call of a helper, with the values it got.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Call {
            Locker {
                named: bool,
            },
            Acquire {
                key: String,
                wait: Option<Duration>,
                lease: Option<Duration>,
            },
            AcquireRead {
                key: String,
                wait: Option<Duration>,
                lease: Option<Duration>,
            },
            AcquireAll {
                keys: Vec<String>,
                wait: Option<Duration>,
                lease: Option<Duration>,
            },
            Run {
                on_lost: OnLost,
            },
        }

        pub static CALLS: Mutex<Vec<Call>> = Mutex::new(Vec::new());

        fn record(call: Call) {
            CALLS.lock().unwrap().push(call);
        }

        pub fn locker<L: AsRef<Locker> + ?Sized>(named: Option<&L>) -> Result<&Locker, LockError> {
            record(Call::Locker {
                named: named.is_some(),
            });
            lock_core::__private::locker(named)
        }

        pub async fn acquire(
            locker: &Locker,
            key: String,
            wait: Option<Duration>,
            lease: Option<Duration>,
        ) -> Result<LockGuard, LockError> {
            record(Call::Acquire {
                key: key.clone(),
                wait,
                lease,
            });
            lock_core::__private::acquire(locker, key, wait, lease).await
        }

        pub async fn acquire_read(
            locker: &Locker,
            key: String,
            wait: Option<Duration>,
            lease: Option<Duration>,
        ) -> Result<LockGuard, LockError> {
            record(Call::AcquireRead {
                key: key.clone(),
                wait,
                lease,
            });
            lock_core::__private::acquire_read(locker, key, wait, lease).await
        }

        pub async fn acquire_all(
            locker: &Locker,
            keys: Vec<String>,
            wait: Option<Duration>,
            lease: Option<Duration>,
        ) -> Result<MultiLockGuard, LockError> {
            record(Call::AcquireAll {
                keys: keys.clone(),
                wait,
                lease,
            });
            lock_core::__private::acquire_all(locker, keys, wait, lease).await
        }

        pub async fn run<G, T, E, F>(guard: G, on_lost: OnLost, body: F) -> Result<T, E>
        where
            G: Section,
            F: Future<Output = Result<T, E>>,
            E: From<LockError>,
        {
            record(Call::Run { on_lost });
            lock_core::__private::run(guard, on_lost, body).await
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
    assert_eq!(
        calls,
        [
            Call::Locker { named: true },
            Call::Acquire {
                key: "inventory:x:1".to_owned(),
                wait: Some(Duration::from_secs(3)),
                lease: Some(Duration::from_millis(60_250)),
            },
            Call::Run {
                on_lost: OnLost::Continue,
            },
            // Defaults: the locker's wait and watchdog lease, abort when lost; the value's `:`
            // is escaped against the `:` that follows it.
            Call::Locker { named: true },
            Call::Acquire {
                key: r"pair:x\:y:z".to_owned(),
                wait: None,
                lease: None,
            },
            Call::Run {
                on_lost: OnLost::Abort,
            },
            // `mode = "read"` takes the read lock, `mode = "write"` the exclusive one.
            Call::Locker { named: true },
            Call::AcquireRead {
                key: "catalogue:5".to_owned(),
                wait: Some(Duration::from_secs(1)),
                lease: None,
            },
            Call::Run {
                on_lost: OnLost::Abort,
            },
            Call::Locker { named: true },
            Call::Acquire {
                key: "catalogue:5".to_owned(),
                wait: None,
                lease: None,
            },
            Call::Run {
                on_lost: OnLost::Abort,
            },
            // `keys`: every key, in the order written (lock-core sorts them), in one acquire.
            Call::Locker { named: true },
            Call::AcquireAll {
                keys: vec!["account:9".to_owned(), "account:3".to_owned()],
                wait: Some(Duration::from_secs(2)),
                lease: Some(Duration::from_secs(10)),
            },
            Call::Run {
                on_lost: OnLost::Continue,
            },
            // No `locker`: the global one, which is not set, so nothing else runs.
            Call::Locker { named: false },
        ]
    );
}
