//! The documented minimal ACL (`lock-core/src/acl.md`, included in the crate docs), used
//! exactly as written: every lock kind works under it, it reads no password, it keeps other
//! tenants' keys and channels out, and the start-up eviction-policy check needs no `CONFIG`.

use crate::common;

use std::time::Duration;

use common::{create_documented_user, documented_user_url};
use lock_core::Locker;
use lock_testkit::{LogBuffer, RedisServer, RedisServers};

/// A command as the documented user.
fn as_user<T: redis::FromRedisValue>(port: u16, args: &[&str]) -> redis::RedisResult<T> {
    let client = redis::Client::open(documented_user_url(port))?;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut client.get_connection()?)
}

/// Nothing the kit sent was refused, also where a refusal would be tolerated (a RedLock
/// minority, a start-up check): `ACL LOG` lists every denial.
fn assert_no_denials(server: &RedisServer) {
    let log: Vec<redis::Value> = server.cmd(&["ACL", "LOG"]);
    assert!(log.is_empty(), "ACL denials: {log:?}");
}

/// Under the documented rules: a mutex (fencing, renewals, an extension, a waiter woken by the
/// release message), read and write locks, a semaphore, a fair lock, `lock_all`, `is_locked`,
/// `inspect` of every kind, `force_unlock`, the restart guard (`INFO` in the scripts, the epoch key), `WAIT`, and a
/// script cache flushed behind the locker (`SCRIPT LOAD`). `CONFIG GET` is refused: it
/// returned `requirepass` and `masterauth` in clear text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_runs_every_lock_kind_and_reads_no_password() {
    let server = RedisServer::start().unwrap();
    let _: () = server.cmd(&["CONFIG", "SET", "masterauth", "primary-secret"]);
    create_documented_user(&server, |_| true);
    let leaked: redis::RedisResult<Vec<String>> =
        as_user(server.port(), &["CONFIG", "GET", "masterauth"]);
    assert!(
        leaked.is_err(),
        "the documented user read a password: {leaked:?}"
    );
    let _: () = server.cmd(&["ACL", "LOG", "RESET"]);

    let url = documented_user_url(server.port());
    let build = || {
        Locker::builder()
            .url(url.clone())
            .watchdog_lease(Duration::from_millis(300))
            .fallback_retry(Duration::from_secs(30))
            .restart_guard(Duration::from_millis(100))
            .build()
    };
    let holder = build().await.unwrap();
    let waiter = build().await.unwrap();

    let guard = holder.lock("k").wait(Duration::from_secs(2)).await.unwrap();
    let first = guard.fencing_token().await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(guard.is_held(), "renewed under the ACL");
    guard.extend(Duration::from_secs(2)).await.unwrap();
    assert!(waiter.is_locked("k").await.unwrap());
    let inspected = waiter.inspect("k").await.unwrap().unwrap();
    assert_eq!(inspected.kind(), lock_core::LockKind::Exclusive);
    let (woken, token) =
        common::wake_up_after_release(guard, &waiter, || !server.pubsub_channels().is_empty())
            .await;
    assert!(woken < Duration::from_secs(2), "woken after {woken:?}");
    assert!(token > first);

    let reader = holder.read("r").await.unwrap();
    assert_eq!(waiter.inspect("r").await.unwrap().unwrap().readers(), 1);
    assert!(waiter
        .write("r")
        .wait(Duration::ZERO)
        .await
        .unwrap_err()
        .is_busy());
    reader.release().await.unwrap();
    let writer = waiter.write("r").await.unwrap();
    writer.release().await.unwrap();

    let semaphore = holder.semaphore("s", 2);
    let permits = [
        semaphore.acquire().await.unwrap(),
        semaphore.acquire().await.unwrap(),
    ];
    assert!(waiter
        .semaphore("s", 2)
        .acquire()
        .wait(Duration::ZERO)
        .await
        .unwrap_err()
        .is_busy());
    assert_eq!(
        waiter.inspect("s").await.unwrap().unwrap().permits_in_use(),
        2
    );
    for permit in permits {
        permit.release().await.unwrap();
    }

    let fair = holder.fair_lock("f").await.unwrap();
    assert_eq!(
        waiter.inspect("f").await.unwrap().unwrap().kind(),
        lock_core::LockKind::Fair
    );
    assert!(fair.fencing_token().await.unwrap() > 0);
    fair.release().await.unwrap();
    let both = holder.lock_all(["a", "b"]).await.unwrap();
    both.release().await.unwrap();

    let held = holder.lock("forced").await.unwrap();
    assert!(waiter.force_unlock("forced").await.unwrap());
    assert!(held.release().await.unwrap_err().is_lost());

    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    let replicated = Locker::builder()
        .url(url.clone())
        .min_replicas(0, Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let guard = replicated.lock("k").await.unwrap();
    guard.release().await.unwrap();

    common::assert_nothing_left_under(
        &server,
        "lock:",
        &["node-epoch"],
        &[&holder, &waiter, &replicated],
    )
    .await;
    assert_no_denials(&server);
}

/// RedLock under the documented rules: the fence write-back runs on every node of the quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_runs_redlock_with_its_fence_write_back() {
    let nodes = RedisServers::start(3).unwrap();
    for node in nodes.iter() {
        create_documented_user(node, |_| true);
    }
    let locker = Locker::builder()
        .redlock(nodes.ports().into_iter().map(documented_user_url))
        .build()
        .await
        .unwrap();
    let mut last = 0;
    for _ in 0..3 {
        let guard = locker.lock("k").await.unwrap();
        let token = guard.fencing_token().await.unwrap();
        assert!(token > last);
        last = token;
        // Written back to a majority (a write-back refused on a minority would not fail the
        // fence: `ACL LOG` below catches that). The token is decided on the first majority
        // that issued one: a node that answered after it may hold a larger counter of its
        // own, and any later majority shares a node with the written-back one, so its token
        // is larger still (the `token > last` above).
        let kept: Vec<u64> = nodes
            .iter()
            .filter_map(|node| node.keys("lock:*:fence:k").pop().map(|key| (node, key)))
            .map(|(node, key)| node.cmd(&["GET", &key]))
            .collect();
        assert!(
            kept.iter().filter(|k| **k == token).count() >= 2,
            "{kept:?}"
        );
        guard.release().await.unwrap();
    }
    for node in nodes.iter() {
        common::assert_nothing_left(node, &[&locker]).await;
        assert_no_denials(node);
    }
}

/// The documented key and channel patterns are anchored to the prefix and the `{` of the
/// kit's hash tag: a tenant whose prefix merely starts with `lock:` (`lock:tenant2:`) is out
/// of reach, though `~lock:*` covered it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_patterns_keep_another_tenants_keys_and_channels_out() {
    let server = RedisServer::start().unwrap();
    create_documented_user(&server, |_| true);
    let other = "lock:tenant2:{0123456789abcdef}:lock:k";
    let _: () = server.cmd(&["SET", other, "their-token"]);
    let port = server.port();
    let read: redis::RedisResult<Option<String>> = as_user(port, &["GET", other]);
    assert!(read.is_err(), "read another tenant's lock: {read:?}");
    let deleted: redis::RedisResult<i64> = as_user(port, &["DEL", other]);
    assert!(
        deleted.is_err(),
        "deleted another tenant's lock: {deleted:?}"
    );
    let published: redis::RedisResult<i64> = as_user(
        port,
        &["PUBLISH", "lock:tenant2:{0123456789abcdef}:released:k", "x"],
    );
    assert!(
        published.is_err(),
        "published on another tenant's channel: {published:?}"
    );
    let intruder = Locker::builder()
        .url(documented_user_url(port))
        .prefix("lock:tenant2:")
        .build()
        .await
        .unwrap();
    let refused = intruder.lock("k").await.unwrap_err();
    assert!(refused.is_backend(), "{refused}");
    let own = Locker::builder()
        .url(documented_user_url(port))
        .build()
        .await
        .unwrap();
    own.lock("k").await.unwrap().release().await.unwrap();
    let theirs: String = server.cmd(&["GET", other]);
    assert_eq!(theirs, "their-token");
    let _: () = server.cmd(&["DEL", other]);
    common::assert_nothing_left(&server, &[&own, &intruder]).await;
}

/// The start-up warning about an eviction policy that may drop lock keys reads
/// `maxmemory_policy` from `INFO memory`: it works for the documented user, which has no
/// `CONFIG`, and says nothing under `noeviction`.
#[tokio::test]
async fn the_eviction_policy_warning_needs_no_config_rights() {
    for (policy, warned) in [("volatile-ttl", true), ("noeviction", false)] {
        let server = RedisServer::start_with(&["--maxmemory-policy", policy]).unwrap();
        create_documented_user(&server, |_| true);
        let (logs, _guard) = LogBuffer::capture(tracing::Level::WARN);
        let locker = Locker::builder()
            .url(documented_user_url(server.port()))
            .build()
            .await
            .unwrap();
        assert_no_denials(&server);
        let text = logs.text();
        assert_eq!(
            text.contains("maxmemory") && text.contains(policy),
            warned,
            "policy {policy}: logs: {text:?}"
        );
        drop(locker);
    }
}
