//! `crate = ".."` for a renamed dependency, while `lock_core` names something else.
#![deny(warnings)]

extern crate lock_core as renamed;

#[allow(unused_imports)]
use std as lock_core;

#[renamed::distributed_lock(key = "renamed:<id>", crate = "renamed")]
pub async fn renamed_path(id: u32) -> Result<u32, renamed::LockError> {
    Ok(id)
}

mod nested {
    pub(crate) use ::renamed as locks;
}

#[renamed::distributed_lock(key = "nested:<id>", crate = "crate::nested::locks")]
pub async fn nested_path(id: u32) -> Result<u32, renamed::LockError> {
    Ok(id)
}

#[renamed::distributed_lock(keys = ["a:<id>", "b:<id>"], crate = "renamed", fence = fences)]
pub async fn renamed_fence(id: u32) -> Result<u64, renamed::LockError> {
    let [a, _] = fences;
    Ok(a.token().await? + u64::from(id))
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(renamed_path(1));
    assert_send(nested_path(1));
    assert_send(renamed_fence(1));
}
