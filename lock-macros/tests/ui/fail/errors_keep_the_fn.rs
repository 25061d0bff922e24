//! On an error the fn stays as written: the macro's error is the only one, and the code that
//! calls the fn still compiles.
use lock_core::{distributed_lock, LockError};

#[distributed_lock(key = "k:<id>", nope = 1)]
async fn bad_option(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<missing>")]
async fn bad_key(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(key = "k:<id>")]
fn not_async(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

pub struct Stock;

impl Stock {
    #[distributed_lock(key = "k:<id>", wait = "soon")]
    async fn bad_wait(&self, id: u32) -> Result<u32, LockError> {
        Ok(id)
    }
}

#[allow(async_fn_in_trait)]
pub trait Repo {
    #[distributed_lock(key = "k:<id>")]
    async fn declared(&self, id: u32) -> Result<u32, LockError>;
}

impl Repo for Stock {
    async fn declared(&self, id: u32) -> Result<u32, LockError> {
        Ok(id)
    }
}

fn main() {
    let _ = bad_option(1);
    let _ = bad_key(2);
    let _ = not_async(3);
    let _ = Stock.bad_wait(4);
    let _ = Stock.declared(5);
}
