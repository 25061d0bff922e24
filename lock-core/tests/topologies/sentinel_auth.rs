//! Sentinel deployments with passwords: the sentinels' credentials come with their URLs, the
//! data nodes' with `sentinel_data_password` / `sentinel_data_user`, separately. Before, the
//! kit never authenticated to the primary (plain or TLS): every command failed with `NOAUTH`.

use crate::common;

use std::time::Duration;

use lock_core::{LockError, Locker, LockerBuilder, TlsConfig};
use lock_testkit::{RedisSentinel, SentinelPasswords, TestCa, TlsServerConfig, Validity};

const MASTER: &str = "auth";

fn passwords() -> SentinelPasswords {
    SentinelPasswords {
        data: "datapw".into(),
        sentinels: "sentinelpw".into(),
    }
}

/// A builder for `sentinel` (its URLs carry the sentinels' password) with a 30 s fallback
/// retry, so that only a release message can wake a waiter within a test.
fn builder(sentinel: &RedisSentinel) -> LockerBuilder {
    Locker::builder()
        .sentinel(MASTER, sentinel.sentinel_urls())
        .connect_timeout(Duration::from_secs(2))
        .fallback_retry(Duration::from_secs(30))
}

/// Locks, sees contention, and wakes a waiter of `waiter` by the release message (so the
/// pub/sub connection is authenticated too).
async fn lock_contend_and_wake(holder: &Locker, waiter: &Locker, sentinel: &RedisSentinel) {
    let guard = holder.lock("k").await.unwrap();
    assert!(waiter
        .lock("k")
        .wait(Duration::ZERO)
        .await
        .unwrap_err()
        .is_busy());
    let first = guard.fencing_token().await.unwrap();
    let master = sentinel.master();
    let (woken, token) =
        common::wake_up_after_release(guard, waiter, || !master.pubsub_channels().is_empty()).await;
    assert!(woken < Duration::from_secs(2), "woken after {woken:?}");
    assert!(token > first, "{token} after {first}");
}

/// The `user=` of every client connection on `server` but the asking one and the sentinels'.
fn client_users(server: &lock_testkit::RedisServer) -> Vec<String> {
    let list: String = server.cmd(&["CLIENT", "LIST"]);
    list.lines()
        .filter(|l| !l.contains(" cmd=client|list "))
        .filter(|l| !l.contains(" name=sentinel-"))
        .filter(|l| !l.contains(" flags=S ") && !l.contains(" flags=M "))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("user=")))
        .map(str::to_owned)
        .collect()
}

/// `requirepass` on primary and replica (`masterauth` between them), another password on the
/// sentinels: the locker asks the sentinels with theirs, connects to the primary with the data
/// password (commands and pub/sub), and follows a failover to the promoted replica. Without
/// the data password the primary answers `NOAUTH`, a wrong one fails authentication; a wrong
/// sentinel password is refused by the sentinels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_protected_data_nodes_and_sentinels_lock_and_follow_a_failover() {
    let mut sentinel = RedisSentinel::start_with_passwords(MASTER, &passwords()).unwrap();
    let holder = builder(&sentinel)
        .sentinel_data_password("datapw")
        .build()
        .await
        .unwrap();
    let waiter = builder(&sentinel)
        .sentinel_data_password("datapw")
        .build()
        .await
        .unwrap();
    lock_contend_and_wake(&holder, &waiter, &sentinel).await;

    for (data, expected) in [(None, "NOAUTH"), (Some("wrong"), "authentication failed")] {
        let mut refused = builder(&sentinel);
        if let Some(password) = data {
            refused = refused.sentinel_data_password(password);
        }
        let error = refused.build().await.unwrap_err();
        assert!(
            matches!(error, LockError::Backend { .. })
                && error
                    .to_string()
                    .to_lowercase()
                    .contains(&expected.to_lowercase()),
            "data password {data:?}: {error}"
        );
        assert!(!error.to_string().contains("datapw"), "{error}");
    }
    let wrong_sentinels: Vec<String> = sentinel
        .sentinels()
        .iter()
        .map(|s| format!("redis://:wrong@127.0.0.1:{}/", s.port()))
        .collect();
    let error = Locker::builder()
        .sentinel(MASTER, wrong_sentinels)
        .sentinel_data_password("datapw")
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap_err();
    assert!(error.is_backend(), "{error}");

    sentinel.kill_primary();
    sentinel.wait_for_failover(Duration::from_secs(15)).unwrap();
    let guard = holder
        .lock("after-failover")
        .wait(Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        sentinel.master().keys("lock:*:lock:after-failover").len(),
        1
    );
    guard.release().await.unwrap();
    lock_contend_and_wake(&waiter, &holder, &sentinel).await;
    common::assert_nothing_left(sentinel.master(), &[&holder, &waiter]).await;
}

/// An ACL user on the data nodes with the documented minimal ACL (`src/acl.md`; created on
/// both: ACL users are not replicated), the `default` user's password kept for replication and
/// the sentinels: every connection of the lockers to the primary is that user's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_on_the_data_nodes_locks_through_sentinel() {
    let sentinel = RedisSentinel::start_with_passwords(MASTER, &passwords()).unwrap();
    for node in [sentinel.primary(), sentinel.replica()] {
        common::create_documented_user(node, |_| true);
    }
    let (user, rules) = common::documented_acl();
    let password = rules
        .iter()
        .find_map(|r| r.strip_prefix('>'))
        .unwrap()
        .to_owned();
    let holder = builder(&sentinel)
        .sentinel_data_user(&user, &password)
        .build()
        .await
        .unwrap();
    let waiter = builder(&sentinel)
        .sentinel_data_user(&user, &password)
        .build()
        .await
        .unwrap();
    lock_contend_and_wake(&holder, &waiter, &sentinel).await;
    let users = client_users(sentinel.master());
    assert!(
        users.iter().filter(|u| **u == user).count() >= 3,
        "the lockers' command and pub/sub connections: {users:?}"
    );
    assert!(users.iter().all(|u| *u == user), "{users:?}");
    // Nothing refused, not even the role check that falls back to `INFO replication`.
    let denials: Vec<redis::Value> = sentinel.master().cmd(&["ACL", "LOG"]);
    assert!(denials.is_empty(), "ACL denials: {denials:?}");
    let error = builder(&sentinel)
        .sentinel_data_user(&user, "wrong")
        .build()
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .to_lowercase()
            .contains("authentication failed"),
        "{error}"
    );
    common::assert_nothing_left(sentinel.master(), &[&holder, &waiter]).await;
}

/// The TLS path: `rediss://` sentinels with their password, data nodes with theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_protected_data_nodes_behind_tls_sentinels() {
    common::install_crypto_provider();
    let ca = TestCa::new("lock-kit test CA");
    let cert = ca.server_cert(&["127.0.0.1"], Validity::Current);
    let sentinel = RedisSentinel::start_tls_with_passwords(
        MASTER,
        &TlsServerConfig::new(cert, &ca),
        &passwords(),
    )
    .unwrap();
    let tls_builder = || {
        Locker::builder()
            .sentinel(MASTER, sentinel.sentinel_tls_urls())
            .tls(TlsConfig::new().root_certificate_pem(ca.cert_pem()))
            .connect_timeout(Duration::from_secs(2))
            .fallback_retry(Duration::from_secs(30))
    };
    let holder = tls_builder()
        .sentinel_data_password("datapw")
        .build()
        .await
        .unwrap();
    let waiter = tls_builder()
        .sentinel_data_password("datapw")
        .build()
        .await
        .unwrap();
    lock_contend_and_wake(&holder, &waiter, &sentinel).await;
    let error = tls_builder().build().await.unwrap_err();
    assert!(error.to_string().contains("NOAUTH"), "{error}");
    common::assert_nothing_left(sentinel.master(), &[&holder, &waiter]).await;
}

/// Data-node credentials belong to Sentinel: elsewhere the URLs carry them.
#[tokio::test]
async fn data_node_credentials_without_sentinel_are_a_config_error() {
    let error = Locker::builder()
        .url("redis://127.0.0.1:1/")
        .sentinel_data_password("secret")
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Config(lock_core::ConfigError::DataCredentialsWithoutSentinel)
        ),
        "{error:?}"
    );
    let builder = Locker::builder()
        .sentinel(MASTER, ["redis://:sentinel-secret@127.0.0.1:1/"])
        .sentinel_data_user("app", "data-secret");
    let debug = format!("{builder:?}");
    assert!(
        !debug.contains("sentinel-secret") && !debug.contains("data-secret"),
        "{debug}"
    );
}
