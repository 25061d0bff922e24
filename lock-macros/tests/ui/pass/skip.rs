//! `on_busy = "skip"` on every return type that can say "skipped", with one key, a read lock
//! and several keys, with a wait, on methods and `#[async_trait]`; their futures are `Send`.
#![deny(warnings)]

use lock_core::{distributed_lock, LockError, Locker};

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        Self
    }
}

#[distributed_lock(key = "job:<id>", on_busy = "skip")]
pub async fn optional(id: u32) -> Option<u32> {
    Some(id)
}

#[distributed_lock(key = "job:<id>", on_busy = "skip")]
pub async fn nothing(id: u32) {
    let _ = id;
}

#[distributed_lock(key = "job:<id>", on_busy = "skip")]
pub async fn unit(id: u32) -> () {
    let _ = id;
}

#[distributed_lock(key = "job:<id>", on_busy = "skip", wait = "100ms")]
pub async fn fallible(id: u32) -> Result<Option<u32>, AppError> {
    if id == 0 {
        return Err(AppError);
    }
    Ok(Some(id))
}

#[distributed_lock(key = "job:<id>", on_busy = "skip", mode = "read")]
pub async fn fallible_unit(id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(keys = ["a:<a>", "b:<b>"], on_busy = "skip", fence = fences)]
pub async fn several(a: u32, b: u32) -> Result<Option<u64>, LockError> {
    let [first, _] = fences;
    Ok(Some(first.token().await? + u64::from(a + b)))
}

/// An alias of `Result` the macro cannot read: the type checker accepts it.
pub type AppResult<T> = Result<T, AppError>;

#[distributed_lock(key = "job:<id>", on_busy = "skip")]
pub async fn aliased(id: u32) -> AppResult<Option<u32>> {
    Ok(Some(id))
}

pub struct Jobs {
    pub locker: Locker,
}

impl Jobs {
    #[distributed_lock(key = "report:<day>", on_busy = "skip", locker = self.locker, fence = fence)]
    pub async fn report(&self, day: u32) -> Option<u64> {
        fence.token().await.ok().map(|t| t + u64::from(day))
    }
}

#[async_trait::async_trait]
pub trait Job {
    async fn run(&self, id: u32) -> Option<u32>;
}

#[async_trait::async_trait]
impl Job for Jobs {
    #[distributed_lock(key = "job:<id>", on_busy = "skip", locker = self.locker)]
    async fn run(&self, id: u32) -> Option<u32> {
        Some(id)
    }
}

fn is_send<T: Send>(_: &T) {}

fn main() {
    is_send(&optional(1));
    is_send(&nothing(1));
    is_send(&unit(1));
    is_send(&fallible(1));
    is_send(&fallible_unit(1));
    is_send(&several(1, 2));
    is_send(&aliased(1));
}
