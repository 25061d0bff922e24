//! Who holds it: holder names travel with every kind of lock, `Locker::inspect` reads them back
//! with the remaining lease and the counts, and `Busy` names the holder. Against real Redis.

use crate::common;

use std::time::Duration;

use common::{assert_nothing_left, server};
use lock_core::{ConfigError, HolderNameReason, LockError, LockInfo, LockKind, Locker};
use lock_testkit::RedisServer;

async fn named(server: &RedisServer, name: &str) -> Locker {
    Locker::builder()
        .url(server.url())
        .holder_name(name)
        .build()
        .await
        .expect("connect locker")
}

/// The lock's info; panics when `inspect` says it is free.
async fn info(locker: &Locker, key: &str) -> LockInfo {
    locker
        .inspect(key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("inspect found `{key}` free while it is held"))
}

/// A waiter of `locker` on `key` that gives up after `wait`, started and given time to queue in
/// Redis.
async fn waiting<T: Send + 'static>(
    waiter: impl std::future::Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    let handle = tokio::spawn(waiter);
    tokio::time::sleep(Duration::from_millis(150)).await;
    handle
}

#[tokio::test]
async fn inspect_answers_none_for_a_free_key_and_after_release() {
    let server = server();
    let locker = named(&server, "web-1").await;
    assert!(locker.inspect("free").await.unwrap().is_none());
    let guard = locker.lock("free").await.unwrap();
    assert!(locker.inspect("free").await.unwrap().is_some());
    guard.release().await.unwrap();
    assert!(locker.inspect("free").await.unwrap().is_none());
    assert!(matches!(
        locker.inspect("").await,
        Err(LockError::InvalidKey { .. })
    ));
    assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_names_the_mutex_holder_its_lease_and_its_waiters() {
    let server = server();
    let (a, b, probe) = (
        named(&server, "web-1").await,
        named(&server, "web-2").await,
        named(&server, "probe").await,
    );
    let guard = a
        .lock("order:7")
        .lease(Duration::from_secs(10))
        .await
        .unwrap();
    let held = info(&probe, "order:7").await;
    assert_eq!(held.kind(), LockKind::Exclusive);
    assert_eq!(held.holder(), Some("web-1"));
    assert!(
        held.remaining() > Duration::from_secs(9) && held.remaining() <= Duration::from_secs(10),
        "{:?}",
        held.remaining()
    );
    assert_eq!(
        (held.readers(), held.permits_in_use(), held.waiters()),
        (0, 0, 0)
    );

    let b2 = b.clone();
    let waiter =
        waiting(async move { b2.lock("order:7").wait(Duration::from_secs(5)).await }).await;
    let contended = info(&probe, "order:7").await;
    assert_eq!(contended.waiters(), 1, "{contended:?}");
    assert_eq!(contended.holder(), Some("web-1"));
    guard.release().await.unwrap();
    let theirs = waiter.await.unwrap().unwrap();
    let now = info(&probe, "order:7").await;
    assert_eq!((now.holder(), now.waiters()), (Some("web-2"), 0));
    // Watchdog lease (30 s by default).
    assert!(now.remaining() > Duration::from_secs(25), "{now:?}");
    theirs.release().await.unwrap();
    assert_nothing_left(&server, &[&a, &b, &probe]).await;
}

/// Readers waiting for a writer leave one mark in the waiting writers' set: it is not counted
/// as a waiter, a writer waiting beside them is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_counts_waiting_writers_not_the_readers_mark() {
    let server = server();
    let (a, b, probe) = (
        named(&server, "web-1").await,
        named(&server, "web-2").await,
        named(&server, "probe").await,
    );
    let writer = a.write("doc").await.unwrap();
    let b2 = b.clone();
    let reader = waiting(async move {
        b2.read("doc")
            .wait(Duration::from_secs(5))
            .await?
            .release()
            .await
    })
    .await;
    assert_eq!(info(&probe, "doc").await.waiters(), 0);
    let probe2 = probe.clone();
    let other = waiting(async move {
        probe2
            .write("doc")
            .wait(Duration::from_secs(5))
            .await?
            .release()
            .await
    })
    .await;
    assert_eq!(info(&probe, "doc").await.waiters(), 1);
    writer.release().await.unwrap();
    reader.await.unwrap().unwrap();
    other.await.unwrap().unwrap();
    assert_nothing_left(&server, &[&a, &b, &probe]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_counts_readers_and_names_a_writer() {
    let server = server();
    let (a, b, probe) = (
        named(&server, "reader-a").await,
        named(&server, "reader-b").await,
        named(&server, "probe").await,
    );
    let r1 = a
        .read("catalogue")
        .lease(Duration::from_secs(5))
        .await
        .unwrap();
    let r2 = b
        .read("catalogue")
        .lease(Duration::from_secs(8))
        .await
        .unwrap();
    let readers = info(&probe, "catalogue").await;
    assert_eq!(readers.kind(), LockKind::Read);
    assert_eq!(readers.readers(), 2);
    // The reader whose lease ends last is named first, and the lock is free when it ends.
    assert_eq!(readers.holder(), Some("reader-b"));
    assert_eq!(readers.holders(), ["reader-b", "reader-a"]);
    assert!(
        readers.remaining() > Duration::from_secs(7)
            && readers.remaining() <= Duration::from_secs(8),
        "{readers:?}"
    );
    // A writer of another locker waits: counted.
    let probe2 = probe.clone();
    let writer =
        waiting(async move { probe2.write("catalogue").wait(Duration::from_secs(5)).await }).await;
    assert_eq!(info(&probe, "catalogue").await.waiters(), 1);
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let write = writer.await.unwrap().unwrap();
    let written = info(&a, "catalogue").await;
    assert_eq!(written.kind(), LockKind::Exclusive);
    assert_eq!((written.holder(), written.readers()), (Some("probe"), 0));
    write.release().await.unwrap();
    assert_nothing_left(&server, &[&a, &b, &probe]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_counts_permits_in_use_and_the_line() {
    let server = server();
    let (a, b, probe) = (
        named(&server, "export-a").await,
        named(&server, "export-b").await,
        named(&server, "probe").await,
    );
    let p1 = a.semaphore("exports", 3).acquire_many(2).await.unwrap();
    let p2 = b.semaphore("exports", 3).acquire().await.unwrap();
    let full = info(&probe, "exports").await;
    assert_eq!(full.kind(), LockKind::Semaphore);
    assert_eq!(full.permits_in_use(), 3);
    let mut names = full.holders().to_vec();
    names.sort();
    assert_eq!(names, ["export-a", "export-b"]);
    assert!(full.remaining() > Duration::from_secs(25), "{full:?}");
    let sem = probe.semaphore("exports", 3);
    let waiter = waiting(async move { sem.acquire().wait(Duration::from_secs(5)).await }).await;
    assert_eq!(info(&probe, "exports").await.waiters(), 1);
    p1.release().await.unwrap();
    let p3 = waiter.await.unwrap().unwrap();
    let after = info(&a, "exports").await;
    assert_eq!((after.permits_in_use(), after.waiters()), (2, 0));
    p2.release().await.unwrap();
    p3.release().await.unwrap();
    assert!(a.inspect("exports").await.unwrap().is_none());
    assert_nothing_left(&server, &[&a, &b, &probe]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_tells_a_fair_lock_and_counts_its_line() {
    let server = server();
    let (a, b, probe) = (
        named(&server, "fair-a").await,
        named(&server, "fair-b").await,
        named(&server, "probe").await,
    );
    let guard = a.fair_lock("queue").await.unwrap();
    let held = info(&probe, "queue").await;
    assert_eq!(
        (held.kind(), held.holder()),
        (LockKind::Fair, Some("fair-a"))
    );
    let b2 = b.clone();
    let first =
        waiting(async move { b2.fair_lock("queue").wait(Duration::from_secs(5)).await }).await;
    let probe2 = probe.clone();
    let second =
        waiting(async move { probe2.fair_lock("queue").wait(Duration::from_secs(5)).await }).await;
    assert_eq!(info(&probe, "queue").await.waiters(), 2);
    guard.release().await.unwrap();
    let next = first.await.unwrap().unwrap();
    assert_eq!(info(&a, "queue").await.holder(), Some("fair-b"));
    next.release().await.unwrap();
    second.await.unwrap().unwrap().release().await.unwrap();
    assert_nothing_left(&server, &[&a, &b, &probe]).await;
}

#[tokio::test]
async fn busy_names_the_holder_of_every_kind() {
    let server = server();
    let (a, b) = (
        named(&server, "web-1").await,
        named(&server, "cron {nightly} ✓").await,
    );
    let busy = |e: LockError| match e {
        e @ LockError::Busy { .. } => e.to_string(),
        other => panic!("expected busy, got {other}"),
    };

    let guard = b.lock("k").await.unwrap();
    let message = busy(a.lock("k").wait(Duration::ZERO).await.unwrap_err());
    assert!(message.contains("held by `cron {nightly} ✓`"), "{message}");
    // A reader finds the writer.
    let message = busy(a.read("k").wait(Duration::ZERO).await.unwrap_err());
    assert!(message.contains("held by `cron {nightly} ✓`"), "{message}");
    // Another task of the holder's own process: its own locker's name.
    let b2 = b.clone();
    let other_task = tokio::spawn(async move { b2.lock("k").wait(Duration::ZERO).await });
    let message = busy(other_task.await.unwrap().unwrap_err());
    assert!(message.contains("held by `cron {nightly} ✓`"), "{message}");
    guard.release().await.unwrap();

    let fair = a.fair_lock("f").await.unwrap();
    let message = busy(b.fair_lock("f").wait(Duration::ZERO).await.unwrap_err());
    assert!(message.contains("held by `web-1`"), "{message}");
    fair.release().await.unwrap();

    let permit = a.semaphore("s", 1).acquire().await.unwrap();
    let message = busy(
        b.semaphore("s", 1)
            .acquire()
            .wait(Duration::ZERO)
            .await
            .unwrap_err(),
    );
    assert!(message.contains("held by `web-1`"), "{message}");
    permit.release().await.unwrap();

    // After waiting too.
    let guard = a.lock("k").await.unwrap();
    let message = busy(
        b.lock("k")
            .wait(Duration::from_millis(200))
            .await
            .unwrap_err(),
    );
    assert!(message.contains("held by `web-1`"), "{message}");
    guard.release().await.unwrap();
    assert_nothing_left(&server, &[&a, &b]).await;
}

#[tokio::test]
async fn holder_names_are_checked_when_the_locker_is_built() {
    let server = server();
    let long = "x".repeat(65);
    for (name, expected) in [
        ("", HolderNameReason::Empty),
        (long.as_str(), HolderNameReason::TooLong),
        ("a|b", HolderNameReason::Character('|')),
        ("web\n1", HolderNameReason::Character('\n')),
        ("\u{1b}[31mred", HolderNameReason::Character('\u{1b}')),
        ("x\u{202e}y", HolderNameReason::Character('\u{202e}')),
        ("nul\0", HolderNameReason::Character('\0')),
    ] {
        let result = Locker::builder()
            .url(server.url())
            .holder_name(name)
            .build()
            .await;
        match result {
            Err(LockError::Config(error @ ConfigError::HolderName { .. })) => {
                let ConfigError::HolderName { reason, .. } = &error else {
                    unreachable!()
                };
                assert_eq!(*reason, expected, "{name:?}");
                let message = error.to_string();
                assert!(!message.chars().any(char::is_control), "{message:?}");
            }
            other => panic!("{name:?} was not refused: {other:?}"),
        }
    }
    // Unicode, spaces, braces and the longest name are fine, and come back as given.
    for name in ["планировщик ✓", "a {b} c:1", &"é".repeat(32)] {
        let locker = named(&server, name).await;
        let guard = locker.lock("u").await.unwrap();
        assert_eq!(info(&locker, "u").await.holder(), Some(name));
        guard.release().await.unwrap();
        assert_nothing_left(&server, &[&locker]).await;
    }
}

#[tokio::test]
async fn the_default_holder_name_is_host_and_pid() {
    let server = server();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let guard = locker.lock("d").await.unwrap();
    let held = info(&locker, "d").await;
    let holder = held.holder().unwrap();
    assert!(
        holder.ends_with(&format!(":{}", std::process::id())),
        "{holder}"
    );
    guard.release().await.unwrap();
    assert_nothing_left(&server, &[&locker]).await;
}

#[tokio::test]
async fn fencing_tokens_still_increase_across_named_holders() {
    let server = server();
    let (a, b) = (named(&server, "web-1").await, named(&server, "web-2").await);
    let mut last = 0;
    for i in 0..6 {
        let locker = if i % 2 == 0 { &a } else { &b };
        let guard = locker.lock("fenced").await.unwrap();
        let token = guard.fencing_token().await.unwrap();
        assert!(token > last, "{token} after {last}");
        last = token;
        guard.release().await.unwrap();
    }
    assert_nothing_left(&server, &[&a, &b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_on_redlock_answers_what_a_majority_holds() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start().unwrap()).collect();
    let locker = Locker::builder()
        .redlock(nodes.iter().map(RedisServer::url).collect::<Vec<_>>())
        .holder_name("quorum-1")
        .build()
        .await
        .unwrap();
    let guard = locker
        .lock("k")
        .lease(Duration::from_secs(10))
        .await
        .unwrap();
    let held = info(&locker, "k").await;
    assert_eq!(
        (held.kind(), held.holder()),
        (LockKind::Exclusive, Some("quorum-1"))
    );
    assert!(held.remaining() <= Duration::from_secs(10), "{held:?}");
    let name = common::lock_key(&nodes[0], "k");
    // One node's value replaced: the majority still names the holder.
    let _: () = nodes[0].cmd(&["SET", &name, "someone-else", "PX", "60000"]);
    assert_eq!(info(&locker, "k").await.holder(), Some("quorum-1"));
    // Two nodes without it: no holder has a majority.
    let _: i64 = nodes[1].cmd(&["DEL", &name]);
    assert!(locker.inspect("k").await.unwrap().is_none());
    let _: i64 = nodes[0].cmd(&["DEL", &name]);
    assert!(
        guard.release().await.is_err(),
        "the lock was taken from under it"
    );
    let reader = locker.read("r").await.unwrap();
    let read = info(&locker, "r").await;
    assert_eq!((read.kind(), read.readers()), (LockKind::Read, 1));
    assert_eq!(read.holder(), Some("quorum-1"));
    reader.release().await.unwrap();
    assert!(locker.inspect("r").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_on_a_cluster_reads_every_kind_from_the_keys_node() {
    let cluster = lock_testkit::RedisCluster::start(3, 0).unwrap();
    let named = |name: &'static str| {
        Locker::builder()
            .cluster(cluster.urls())
            .holder_name(name)
            .build()
    };
    let (a, probe) = (
        named("shard-a").await.unwrap(),
        named("probe").await.unwrap(),
    );
    // Keys on every shard: one of each kind per key.
    for i in 0..6 {
        let (mutex, reader, fair, sem) = (
            format!("m:{i}"),
            format!("r:{i}"),
            format!("f:{i}"),
            format!("s:{i}"),
        );
        let m = a.lock(mutex.as_str()).await.unwrap();
        let r = a.read(reader.as_str()).await.unwrap();
        let f = a.fair_lock(fair.as_str()).await.unwrap();
        let s = a.semaphore(sem.as_str(), 2).acquire().await.unwrap();
        for (key, kind) in [
            (&mutex, LockKind::Exclusive),
            (&reader, LockKind::Read),
            (&fair, LockKind::Fair),
            (&sem, LockKind::Semaphore),
        ] {
            let found = info(&probe, key).await;
            assert_eq!(
                (found.kind(), found.holder()),
                (kind, Some("shard-a")),
                "{key}"
            );
        }
        assert_eq!(info(&probe, &sem).await.permits_in_use(), 1);
        for released in [
            m.release().await,
            r.release().await,
            f.release().await,
            s.release().await,
        ] {
            released.unwrap();
        }
        for key in [&mutex, &reader, &fair, &sem] {
            assert!(probe.inspect(key).await.unwrap().is_none(), "{key}");
        }
    }
}
