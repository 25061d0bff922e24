//! Generic fns, `where` clauses, const generics, `impl Trait` arguments, lifetimes.
#![deny(warnings)]

use std::fmt::Display;

use lock_core::{distributed_lock, LockError, Locker};

#[distributed_lock(key = "generic:<id>:<N>", locker = locker)]
pub async fn generic<'a, L, K, const N: usize>(
    locker: &'a L,
    id: K,
    data: [u8; N],
) -> Result<&'a L, LockError>
where
    L: AsRef<Locker> + Sync + ?Sized,
    K: Display + Send,
{
    let _ = data;
    Ok(locker)
}

#[distributed_lock(key = "impl:<name>")]
pub async fn impl_args(
    name: impl Display + Send,
    items: impl IntoIterator<Item = u32> + Send,
) -> Result<u32, LockError> {
    Ok(items.into_iter().sum())
}

#[distributed_lock(key = "lt:<name>:<other>")]
pub async fn lifetimes<'a, 'b: 'a>(name: &'a str, other: &'b str) -> Result<&'a str, LockError> {
    Ok(if other.len() > name.len() {
        other
    } else {
        name
    })
}

#[distributed_lock(key = "elided:<name>")]
pub async fn elided(name: &str) -> Result<&str, LockError> {
    Ok(name)
}

pub struct Wrapper<T>(T);

impl<T: Display + Sync> Wrapper<T> {
    #[distributed_lock(key = "wrapper:<self.0>")]
    pub async fn show(&self) -> Result<String, LockError> {
        Ok(self.0.to_string())
    }
}

fn assert_send<T: Send>(_: T) {}

#[allow(dead_code)]
fn check(locker: &Locker) {
    assert_send(generic(locker, 1u8, [0u8; 4]));
    assert_send(generic(&std::sync::Arc::new(locker.clone()), "k", []));
}

fn main() {
    assert_send(impl_args("n", vec![1, 2]));
    assert_send(lifetimes("a", "b"));
    assert_send(elided("a"));
    assert_send(Wrapper(5).show());
}
