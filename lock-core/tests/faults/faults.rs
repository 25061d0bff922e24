//! Server-side faults and hostile conditions against a real redis-server (RELIABILITY.md rows
//! noted per test).

use crate::common;

use std::time::{Duration, Instant};

use common::{eventually, keys, lock_key, locker, locker_with_lease, lost_reason, server};
use lock_core::{ConfigError, LockError, Locker, LostReason};
use lock_testkit::{Persistence, RedisServer};

fn lock_keys(server: &RedisServer) -> Vec<String> {
    keys(server, "lock:")
        .into_iter()
        .filter(|k| k.contains(":lock:"))
        .collect()
}

/// F5: an acquire whose reply times out may still run on the server later; the kit removes
/// that ghost lock by its token instead of leaving it for the whole lease.
#[tokio::test]
async fn a_timed_out_acquire_leaves_no_ghost_lock() {
    let server = server();
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    // Warm up the script cache so the stalled command is the acquire itself.
    locker.lock("k").await.unwrap().release().await.unwrap();
    let stall = common::freeze(server.url(), "1");
    // By then the server sleeps, with 850 ms of its second left.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let started = Instant::now();
    let err = locker.lock("k").wait(Duration::ZERO).await.unwrap_err();
    assert!(err.is_backend() && err.is_timeout(), "{err:?}");
    assert!(started.elapsed() < Duration::from_millis(900));
    stall.await.unwrap();
    // The stalled SET ran after the server woke up; the background cleanup removes it.
    assert!(
        eventually(Duration::from_secs(4), || lock_keys(&server).is_empty()).await,
        "ghost lock left: {:?}",
        lock_keys(&server)
    );
    locker
        .lock("k")
        .wait(Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// F6: a restart without persistence loses the key; the holder learns it within a renewal
/// interval, with the reason (the server is younger than the hold), and a new acquire works.
#[tokio::test]
async fn a_restart_without_persistence_is_detected_as_loss() {
    let mut server = server();
    let lease = Duration::from_millis(600);
    let holder = locker_with_lease(&server, lease).await;
    let guard = holder.lock("k").await.unwrap();
    // Held for a while: the server's uptime after the restart, in whole seconds and within
    // one of the real one, is then certainly shorter than the hold.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.restart().unwrap();
    let restarted = Instant::now();
    tokio::time::timeout(lease * 2, guard.lost())
        .await
        .expect("loss detected");
    let took = restarted.elapsed();
    lock_testkit::figure(&format!(
        "loss detection, Redis restarted without persistence: {took:?} (lease {lease:?})"
    ));
    assert!(
        took <= lease / 3 + Duration::from_millis(300),
        "detected after {took:?}"
    );
    // While the lost guard lives, this task's reentrant acquire reports the loss; after it is
    // dropped a fresh acquire works.
    let lost = holder.lock("k").await.unwrap_err();
    assert_eq!(lost_reason(lost), LostReason::ServerRestarted);
    drop(guard);
    holder
        .lock("k")
        .wait(Duration::from_secs(3))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// F7: with AOF `always`, a quick restart keeps the lock and raises no false loss.
#[tokio::test]
async fn a_restart_with_aof_keeps_the_lock() {
    let mut server = RedisServer::start_persistent(Persistence::AofAlways).unwrap();
    let lease = Duration::from_secs(3);
    let holder = locker_with_lease(&server, lease).await;
    let guard = holder.lock("k").await.unwrap();
    server.restart().unwrap();
    tokio::time::sleep(lease).await;
    assert!(guard.is_held(), "no false loss");
    assert!(holder.is_locked("k").await.unwrap());
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// F8: killing the holder's command connection does not lose the lock; renewals go on.
#[tokio::test]
async fn a_killed_command_connection_reconnects_and_keeps_renewing() {
    let server = server();
    let lease = Duration::from_millis(450);
    let holder = locker_with_lease(&server, lease).await;
    let guard = holder.lock("k").await.unwrap();
    let _: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    tokio::time::sleep(lease * 3).await;
    assert!(guard.is_held());
    let pttl: i64 = server.cmd(&["PTTL", &lock_key(&server, "k")]);
    assert!(pttl > 0);
    guard.release().await.unwrap();
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// F9: the subscriber connection is killed while waiters wait; they resubscribe, retry, and
/// are all served promptly after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_subscriber_connection_loses_no_wake_up() {
    let server = server();
    let holder = locker(&server).await;
    let waiter = Locker::builder()
        .url(server.url())
        .fallback_retry(Duration::from_secs(30))
        .build()
        .await
        .unwrap();
    let guard = holder.lock("k").await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let waiter = waiter.clone();
        tasks.push(tokio::spawn(async move {
            let g = waiter
                .lock("k")
                .wait(Duration::from_secs(20))
                .await
                .unwrap();
            g.release().await.unwrap();
            Instant::now()
        }));
    }
    assert!(eventually(Duration::from_secs(2), || waiter.stats().subscriptions == 1).await);
    let _: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    // Wait until the subscription is back on the server.
    assert!(
        eventually(Duration::from_secs(3), || server
            .cmd::<Vec<String>>(&["PUBSUB", "CHANNELS"])
            .len()
            == 1)
        .await
    );
    let released = Instant::now();
    guard.release().await.unwrap();
    for t in tasks {
        let at = t.await.unwrap();
        assert!(
            at - released < Duration::from_secs(3),
            "woken late: {:?}",
            at - released
        );
    }
    common::assert_nothing_left(&server, &[&holder, &waiter]).await;
}

/// F11: a server busy with a long script answers BUSY; the acquire retries until its deadline
/// and then succeeds or reports a backend error, never Busy-by-contention or a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_server_is_retried_within_the_deadline() {
    let server = RedisServer::start_with(&["--busy-reply-threshold", "100"]).unwrap();
    let locker = Locker::builder()
        .url(server.url())
        .command_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    locker.lock("warm").await.unwrap().release().await.unwrap();
    let url = server.url();
    let busy = tokio::task::spawn_blocking(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: redis::RedisResult<()> = redis::cmd("EVAL")
            .arg("local t = redis.call('TIME') local s = tonumber(t[1]) while tonumber(redis.call('TIME')[1]) < s + 1 do end")
            .arg(0)
            .query(&mut conn);
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let guard = locker.lock("k").wait(Duration::from_secs(5)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    guard.release().await.unwrap();
    busy.await.unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// F21: an evicted lock key is a loss the holder learns at the next renewal.
#[tokio::test]
async fn an_evicted_lock_is_reported_lost() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "volatile-ttl"]).unwrap();
    let lease = Duration::from_millis(450);
    let holder = locker_with_lease(&server, lease).await;
    let guard = holder.lock("k").await.unwrap();
    // Evict: shrink memory below use, then write; volatile-ttl evicts keys with a TTL.
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let _: redis::RedisResult<()> = redis::cmd("SET")
        .arg("filler")
        .arg("x")
        .arg("PX")
        .arg(1)
        .query(&mut server.client());
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    tokio::time::timeout(lease, guard.lost())
        .await
        .expect("eviction noticed");
    let lost = guard.release().await.unwrap_err();
    assert_eq!(lost_reason(lost), LostReason::Deleted);
    common::assert_nothing_left(&server, &[&holder]).await;
}

/// B21: a server out of memory refuses the acquire with a backend error, not "busy".
#[tokio::test]
async fn out_of_memory_is_a_backend_error() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]).unwrap();
    let locker = locker(&server).await;
    locker.lock("warm").await.unwrap().release().await.unwrap();
    let _: () = server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let err = locker
        .lock("k")
        .wait(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(err.to_string().contains("OOM"), "{err}");
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// B18: an ACL user without pub/sub rights can still lock and release; the release script's
/// PUBLISH failure does not turn a completed release into an error, and waiters fall back to
/// TTLs and the safety-net retry. The user has the documented minimal ACL (`src/acl.md`) less
/// its channel rules.
#[tokio::test]
async fn least_privilege_acl_user_without_channels() {
    let server = server();
    common::create_documented_user(&server, |rule| !rule.starts_with('&'));
    let url = common::documented_user_url(server.port());
    let a = Locker::builder()
        .url(url.clone())
        .fallback_retry(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let b = Locker::builder()
        .url(url)
        .fallback_retry(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let waiting = b.clone();
    let guard = a.lock("k").await.unwrap();
    let waiter =
        tokio::spawn(async move { b.lock("k").wait(Duration::from_secs(5)).await.map(drop) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.release().await.unwrap();
    assert!(waiter.await.unwrap().is_ok());
    assert!(lock_keys(&server).is_empty());
    common::assert_nothing_left(&server, &[&a, &waiting]).await;
}

/// B23: a hostile server answering with the wrong shapes, with truncated replies (an array
/// that never completes, a bulk string cut short) or with bytes that are not RESP gives typed
/// errors within the deadlines, never a panic or a hang. `+OK` is the one reply that grants:
/// it is what `SET NX` answers when it took the lock.
#[tokio::test]
async fn hostile_replies_are_typed_errors() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for reply in [
        &b"+OK\r\n"[..],
        b"*2\r\n:1\r\n$3\r\nabc\r\n",
        b"*1\r\n:1\r\n",
        b"$-1\r\n",
        b":7\r\n",
        b"-ERR nope\r\n",
        b"*2\r\n:1\r\n",
        b"$10\r\nabc",
        b"?garbage\r\n",
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let text = String::from_utf8_lossy(reply).into_owned();
        let reply_is_ok = reply == b"+OK\r\n";
        let reply = reply.to_vec();
        let fake = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let reply = reply.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = socket.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        // One reply per command in the chunk (each command starts with '*').
                        let commands = buf[..n].iter().filter(|b| **b == b'*').count().max(1);
                        for _ in 0..commands {
                            if socket.write_all(&reply).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        let built = Locker::builder()
            .url(format!("redis://127.0.0.1:{port}/"))
            .command_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300))
            .build()
            .await;
        let locker = match built {
            Ok(locker) => locker,
            Err(e) => {
                assert!(e.is_backend(), "connect, reply {text:?}: {e:?}");
                fake.abort();
                continue;
            }
        };
        {
            let result = tokio::time::timeout(
                Duration::from_secs(5),
                locker.lock("k").wait(Duration::from_millis(200)),
            )
            .await
            .expect("a hostile reply must not hang the acquire");
            match result {
                Ok(_) if reply_is_ok => {}
                Err(LockError::Backend { .. } | LockError::Busy { .. }) if !reply_is_ok => {}
                other => panic!(
                    "reply {:?}: {other:?}",
                    String::from_utf8_lossy(&reply_text(&other))
                ),
            }
        }
        fake.abort();
    }
    // No leak check: there is no redis-server, only fake ones that answer nonsense.
}

fn reply_text<T: std::fmt::Debug>(v: &T) -> Vec<u8> {
    format!("{v:?}").into_bytes()
}

/// B6/B7: leases Redis cannot take are refused before anything is sent.
#[tokio::test]
async fn impossible_leases_are_refused_before_sending() {
    let server = server();
    let locker = locker(&server).await;
    server.reset_stats();
    let before = server.total_calls();
    for lease in [
        Duration::ZERO,
        Duration::from_micros(999),
        Duration::MAX,
        lock_core::MAX_LEASE * 2,
    ] {
        let err = locker.lock("k").lease(lease).await.unwrap_err();
        assert!(matches!(err, LockError::Config(_)), "{lease:?}: {err:?}");
    }
    assert_eq!(server.total_calls() - before, 0);
    // A huge wait is fine: it is only a deadline.
    locker
        .lock("k")
        .wait(Duration::MAX)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// The RedLock restart guard is refused where it cannot work, before any connection (the
/// URLs point at a closed port: a connect attempt would be a `Backend` error).
#[tokio::test]
async fn a_misplaced_or_empty_restart_guard_is_a_config_error() {
    let closed = "redis://127.0.0.1:1/";
    let err = Locker::builder()
        .cluster([closed])
        .restart_guard(Duration::from_secs(1))
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LockError::Config(lock_core::ConfigError::RestartGuardInCluster)
        ),
        "{err:?}"
    );
    for guard in [Duration::ZERO, Duration::MAX] {
        let err = Locker::builder()
            .redlock([closed, closed, closed])
            .restart_guard(guard)
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                LockError::Config(lock_core::ConfigError::OutOfRange {
                    setting: lock_core::DurationSetting::RestartGuard,
                    ..
                })
            ),
            "{guard:?}: {err:?}"
        );
    }
    // No leak check: no server and no locker (every build is refused).
}

/// B17: a wrong password is a prompt, typed error that does not echo the password.
#[tokio::test]
async fn a_wrong_password_is_a_clear_error_without_the_secret() {
    let server = RedisServer::start().unwrap();
    let _: () = server.cmd(&["CONFIG", "SET", "requirepass", "right-one"]);
    let started = Instant::now();
    let err = Locker::builder()
        .url(format!(
            "redis://:hunter2-secret@127.0.0.1:{}/",
            server.port()
        ))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(!format!("{err} {err:?}").contains("hunter2-secret"));
    // It names the server, with the password redacted.
    let host = format!("redis://:***@127.0.0.1:{}/", server.port());
    assert!(
        err.to_string().contains(&format!("connecting to {host}")),
        "{err}"
    );
    let ok = Locker::builder()
        .url(format!("redis://:right-one@127.0.0.1:{}/", server.port()))
        .build()
        .await
        .unwrap();
    ok.lock("k").await.unwrap().release().await.unwrap();
    // The fixture's own connections have no password: drop it again for the leak check.
    let mut admin = redis::Client::open(format!("redis://:right-one@127.0.0.1:{}/", server.port()))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("")
        .query(&mut admin)
        .unwrap();
    common::assert_nothing_left(&server, &[&ok]).await;
}

/// F13: RedLock nodes too slow for the lease: no acquire, and nothing left behind.
#[tokio::test]
async fn redlock_with_slow_nodes_does_not_acquire_and_rolls_back() {
    use lock_testkit::{FaultProxy, ProxyMode};
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start().unwrap()).collect();
    let mut proxies = Vec::new();
    for s in &servers[..3] {
        proxies.push(FaultProxy::start(s.port()).await.unwrap());
    }
    let mut urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    urls.extend(servers[3..].iter().map(RedisServer::url));
    let locker = Locker::builder().redlock(urls).build().await.unwrap();
    locker
        .lock("warm")
        .lease(Duration::from_secs(1))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for p in &proxies {
        p.set_mode(ProxyMode::Delay(Duration::from_millis(80)))
            .await;
    }
    let err = locker
        .lock("k")
        .lease(Duration::from_millis(150))
        .wait(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(err.is_backend() || err.is_busy(), "{err:?}");
    for p in &proxies {
        p.set_mode(ProxyMode::Pass).await;
    }
    assert!(
        eventually(Duration::from_secs(3), || servers
            .iter()
            .all(|s| lock_keys(s).is_empty()))
        .await,
        "partial grants rolled back"
    );
    for server in &servers {
        common::assert_nothing_left(server, &[&locker]).await;
    }
}

/// Start-up errors say which server could not be reached, and what is missing from an empty
/// topology.
#[tokio::test]
async fn start_up_errors_name_the_server_and_what_is_missing() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let err = Locker::builder()
        .url(format!("redis://app:pw-secret@127.0.0.1:{port}/0"))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "redis error: connecting to redis://app:***@127.0.0.1:{port}/0: "
        )),
        "{text}"
    );
    assert!(!format!("{err:?}").contains("pw-secret"));

    // Three servers that are down (three addresses: one named twice is refused before any
    // connection).
    let ports: Vec<u16> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect::<Vec<_>>()
        .iter()
        .map(|closed| closed.local_addr().unwrap().port())
        .collect();
    let err = Locker::builder()
        .redlock([
            format!("redis://127.0.0.1:{}", ports[0]),
            format!("redis://:pw-secret@127.0.0.1:{}", ports[1]),
            format!("redis://127.0.0.1:{}/1", ports[2]),
        ])
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("unreachable: redis://127.0.0.1:"), "{text}");
    assert!(text.contains("redis://:***@127.0.0.1:"), "{text}");
    assert!(!text.contains("pw-secret"), "{text}");

    let err = Locker::builder()
        .cluster(Vec::<String>::new())
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Config(ConfigError::NoClusterSeeds)),
        "{err:?}"
    );
    assert!(err.to_string().contains("no cluster seed urls"), "{err}");
    let err = Locker::builder()
        .sentinel("mymaster", Vec::<String>::new())
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Config(ConfigError::NoSentinels { ref master }) if master == "mymaster"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("no sentinel urls for primary `mymaster`"),
        "{err}"
    );
    let err = Locker::builder().build().await.unwrap_err();
    assert!(
        matches!(err, LockError::Config(ConfigError::MissingUrl)),
        "{err:?}"
    );
}
