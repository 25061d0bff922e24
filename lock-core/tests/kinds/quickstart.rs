//! `examples/quickstart.rs`, the example the README links, runs as written against a Redis
//! server of the test's own: the example's body is compiled into this test as a module.

use crate::common;

// Its `main` is for `cargo run --example`; the test calls `run`.
#[allow(dead_code)]
#[path = "../../examples/quickstart.rs"]
mod example;

#[tokio::test]
async fn the_quickstart_example_runs_and_leaves_nothing_behind() {
    let server = common::server();
    example::run(&server.url()).await.unwrap();
    let locker = common::locker(&server).await;
    assert!(!locker.is_locked("inventory:42").await.unwrap());
    common::assert_nothing_left(&server, &[&locker]).await;
}
