//! The generated code uses absolute paths only: shadowing `lock_core`, `std`, `core`, prelude
//! types and variants, and `format!` at the call site changes nothing.
#![deny(warnings)]
#![allow(dead_code, non_camel_case_types, unused_imports, unused_macros)]

mod shadowed {
    use ::std as lock_core;

    mod std {}
    mod core {}
    mod __private {}
    struct Result;
    struct Option;
    struct Some;
    struct None;
    struct Ok;
    struct Err;
    struct String;
    struct Vec;
    macro_rules! vec {
        () => {};
    }
    struct Duration;
    struct Locker;
    struct Fence;
    struct LockGuard;
    trait Clone {}
    trait From {}
    macro_rules! format {
        () => {};
    }

    #[::lock_core::distributed_lock(key = "shadowed:<id>", wait = "1s", lease = "2s")]
    pub(crate) async fn locked(id: u32) -> ::core::result::Result<u32, ::lock_core::LockError> {
        ::core::result::Result::Ok(id)
    }

    #[::lock_core::distributed_lock(key = "shadowed:<id>", mode = "read")]
    pub(crate) async fn read(id: u32) -> ::core::result::Result<u32, ::lock_core::LockError> {
        ::core::result::Result::Ok(id)
    }

    #[::lock_core::distributed_lock(keys = ["a:<a>", "b:<b>"])]
    pub(crate) async fn all(a: u32, b: u32) -> ::core::result::Result<u32, ::lock_core::LockError> {
        ::core::result::Result::Ok(a + b)
    }

    #[::lock_core::distributed_lock(key = "shadowed:<id>", fence = fence)]
    pub(crate) async fn fenced(id: u32) -> ::core::result::Result<u32, ::lock_core::LockError> {
        let _: ::lock_core::Fence = fence;
        ::core::result::Result::Ok(id)
    }

    #[::lock_core::distributed_lock(keys = ["a:<a>", "b:<b>"], fence = fences)]
    pub(crate) async fn all_fenced(
        a: u32,
        b: u32,
    ) -> ::core::result::Result<u32, ::lock_core::LockError> {
        let _: [::lock_core::Fence; 2] = fences;
        ::core::result::Result::Ok(a + b)
    }

    #[::lock_core::distributed_lock(key = "fixed")]
    pub(crate) async fn fixed() -> ::core::result::Result<(), ::lock_core::LockError> {
        ::core::result::Result::Ok(())
    }
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(shadowed::locked(1));
    assert_send(shadowed::fixed());
    assert_send(shadowed::read(1));
    assert_send(shadowed::all(1, 2));
    assert_send(shadowed::fenced(1));
    assert_send(shadowed::all_fenced(1, 2));
}
