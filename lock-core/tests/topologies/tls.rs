//! B19: TLS against real `redis-server` processes with certificates made at test time.
//!
//! Every test starts its own server on free loopback ports (a TLS port for the locker, a
//! plaintext one for the fixture's assertions) and its own certificate authority.

use crate::common;

use std::time::{Duration, Instant};

use lock_core::{ConfigError, LockError, Locker, TlsConfig};
use lock_testkit::{
    CertAndKey, RedisCluster, RedisSentinel, RedisServer, TestCa, TlsServerConfig, Validity,
};

/// Connect limit of the failing connects.
const CONNECT: Duration = Duration::from_secs(1);

/// What a refused handshake may take: the connect limit plus scheduling slack (it takes about
/// 0.7 s: the connection manager makes 3 attempts with a short backoff). A hang would run into
/// the test's own 30 s guard instead.
const FAIL_WITHIN: Duration = Duration::from_secs(2);

/// What a connect to a server that never answers may take: 3 attempts of `CONNECT` each,
/// plus the backoff between them and slack.
const SILENT_WITHIN: Duration = Duration::from_millis(3 * 1000 + 1500);

/// A CA and a server presenting a certificate for `127.0.0.1` only (IP SAN, no DNS name).
fn tls_server(auth_clients: bool) -> (TestCa, RedisServer) {
    let ca = TestCa::new("lock-kit test CA");
    let cert = ca.server_cert(&["127.0.0.1"], Validity::Current);
    let server = start(&ca, cert, auth_clients);
    (ca, server)
}

fn start(ca: &TestCa, cert: CertAndKey, auth_clients: bool) -> RedisServer {
    common::install_crypto_provider();
    let mut config = TlsServerConfig::new(cert, ca);
    if auth_clients {
        config = config.require_client_certs();
    }
    RedisServer::start_tls(&config).expect("start redis-server with TLS")
}

fn trusting(ca: &TestCa) -> TlsConfig {
    common::install_crypto_provider();
    TlsConfig::new().root_certificate_pem(ca.cert_pem())
}

/// Builds a locker for `url` and returns the error and how long the attempt took; the whole
/// attempt is guarded so that a hang fails the test instead of blocking it.
async fn failed_connect(url: String, tls: Option<TlsConfig>) -> (LockError, Duration) {
    let mut builder = Locker::builder().url(url).connect_timeout(CONNECT);
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(30), builder.build())
        .await
        .expect("connect hung for 30 s");
    let err = result.expect_err("connect must fail");
    let elapsed = started.elapsed();
    eprintln!("failed after {elapsed:?}: {err}");
    (err, elapsed)
}

/// The error's full text, its chain of sources included.
fn chain(err: &LockError) -> String {
    let mut text = err.to_string();
    let mut next = std::error::Error::source(err);
    while let Some(e) = next {
        text.push_str(" <- ");
        text.push_str(&e.to_string());
        next = e.source();
    }
    text
}

fn assert_tls_error(err: &LockError, elapsed: Duration, expect: &str) {
    let text = chain(err);
    assert!(
        err.is_tls(),
        "expected LockError::Tls, got {err:?} ({text})"
    );
    assert!(!err.is_busy(), "{err:?}");
    assert!(
        text.contains(expect),
        "error does not say {expect:?}: {text}"
    );
    assert!(elapsed < FAIL_WITHIN, "took {elapsed:?}: {text}");
}

/// Happy path: `rediss://` with the private CA; acquire, contend, release; the waiter is
/// woken by the release message (pub/sub over TLS), not by polling; the watchdog renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_happy_path_locks_wakes_waiters_and_renews() {
    let (ca, server) = tls_server(false);
    // A 30 s lease and a 30 s fallback retry: neither the holder's TTL nor polling can wake
    // the waiter within the test, only the release message can.
    let connect = |lease: Duration| {
        Locker::builder()
            .url(server.tls_url())
            .tls(trusting(&ca))
            .watchdog_lease(lease)
            .fallback_retry(Duration::from_secs(30))
            .build()
    };
    let holder = connect(Duration::from_secs(30)).await.unwrap();
    let waiter = connect(Duration::from_secs(30)).await.unwrap();

    let guard = holder.lock("tls-key").await.unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let g = waiter
                .lock("tls-key")
                .wait(Duration::from_secs(20))
                .await
                .unwrap();
            let at = Instant::now();
            g.release().await.unwrap();
            at
        }
    });
    // The waiter's subscription is in place on the server (it went over the TLS port: the
    // locker knows no other address).
    let subscribed = Instant::now();
    while server.pubsub_channels().is_empty() {
        assert!(
            subscribed.elapsed() < Duration::from_secs(5),
            "no subscription"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Meanwhile the watchdog renews a short lease over TLS: held for 3 leases of 300 ms.
    let lease = Duration::from_millis(300);
    let renewer = connect(lease).await.unwrap();
    let short = renewer.lock("renewed").await.unwrap();
    tokio::time::sleep(lease * 3).await;
    assert!(short.is_held());
    assert!(
        renewer.stats().renewal_calls >= 3,
        "{}",
        renewer.stats().renewal_calls
    );
    let pttl: i64 = server.cmd(&["PTTL", &server.keys("lock:*:lock:renewed")[0]]);
    assert!(pttl > 0, "{pttl}");
    short.release().await.unwrap();
    assert!(!waiting.is_finished(), "the waiter got a held lock");

    let released = Instant::now();
    guard.release().await.unwrap();
    let woken = waiting.await.unwrap() - released;
    assert!(woken < Duration::from_secs(2), "woken after {woken:?}");
    assert!(!holder.is_locked("tls-key").await.unwrap());
    // The command and pub/sub connections of both lockers sit on the TLS port.
    let clients: String = server.cmd(&["CLIENT", "LIST"]);
    let tls_port = format!(" laddr=127.0.0.1:{} ", server.tls_port().unwrap());
    let on_tls = clients.lines().filter(|l| l.contains(&tls_port));
    assert!(on_tls.clone().count() >= 4, "{clients}");
    // A pub/sub connection is flagged P while subscribed; the waiter's has unsubscribed since
    // it won (a winner leaves the channel at once), so its last command tells it.
    let pubsub = |l: &&str| {
        l.contains(" flags=P ") || l.contains(" cmd=subscribe ") || l.contains(" cmd=unsubscribe ")
    };
    assert!(on_tls.filter(pubsub).count() >= 1, "{clients}");
    for line in clients.lines().filter(pubsub) {
        assert!(
            line.contains(&tls_port),
            "a pub/sub connection off the TLS port: {line}"
        );
    }
    common::assert_nothing_left(&server, &[&holder, &waiter, &renewer]).await;
}

/// Mutual TLS (`--tls-auth-clients yes`): a client certificate from the CA is accepted; without
/// one the connect fails with a TLS error, promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let (ca, server) = tls_server(true);
    let client = ca.client_cert("lock-kit client");
    let locker = Locker::builder()
        .url(server.tls_url())
        .tls(trusting(&ca).client_identity_pem(client.cert_pem.clone(), client.key_pem.clone()))
        .build()
        .await
        .unwrap();
    locker.lock("k").await.unwrap().release().await.unwrap();

    let (err, elapsed) = failed_connect(server.tls_url(), Some(trusting(&ca))).await;
    assert_tls_error(&err, elapsed, "CertificateRequired");

    // A client certificate from another CA is refused as well.
    let stranger = TestCa::new("another CA").client_cert("intruder");
    let (err, elapsed) = failed_connect(
        server.tls_url(),
        Some(trusting(&ca).client_identity_pem(stranger.cert_pem, stranger.key_pem)),
    )
    .await;
    assert_tls_error(&err, elapsed, "UnknownCA");
    common::assert_nothing_left(&server, &[&locker]).await;
}

/// A server certificate from a CA the client does not trust: `Tls`, "UnknownIssuer", fast.
#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let (_ca, server) = tls_server(false);
    let other = TestCa::new("some other CA");
    let (err, elapsed) = failed_connect(server.tls_url(), Some(trusting(&other))).await;
    assert_tls_error(&err, elapsed, "UnknownIssuer");
    // Without a TlsConfig the system trust store is used, which knows no test CA either.
    let (err, elapsed) = failed_connect(server.tls_url(), None).await;
    assert_tls_error(&err, elapsed, "UnknownIssuer");
    common::assert_nothing_left(&server, &[]).await;
}

/// `#insecure` (accept any certificate) is refused by the kit itself, for every topology's
/// URLs, before any connection: a `ConfigError::Tls`. Before, it was refused only because a
/// redis feature was off (a backend error at connect), so enabling that feature anywhere in
/// the dependency tree would have turned verification off.
#[tokio::test]
async fn insecure_tls_urls_are_refused_in_code_before_any_connection() {
    let (_ca, server) = tls_server(false);
    let insecure = format!("{}#insecure", server.tls_url());
    let builders = [
        ("url", Locker::builder().url(insecure.clone())),
        (
            "cluster",
            Locker::builder().cluster([server.tls_url(), insecure.clone()]),
        ),
        (
            "redlock",
            Locker::builder().redlock([server.tls_url(), server.tls_url(), insecure.clone()]),
        ),
        (
            "sentinel",
            Locker::builder().sentinel("locks", [insecure.clone()]),
        ),
    ];
    for (topology, builder) in builders {
        let before = server.connections_received();
        let err = builder.connect_timeout(CONNECT).build().await.unwrap_err();
        assert!(
            matches!(err, LockError::Config(ConfigError::Tls { .. })),
            "{topology}: {err:?}"
        );
        assert!(err.to_string().contains("#insecure"), "{topology}: {err}");
        // One connection: the fixture's own `connections_received` call.
        assert_eq!(
            server.connections_received(),
            before + 1,
            "{topology}: a connection reached the server"
        );
    }
    common::assert_nothing_left(&server, &[]).await;
}

/// Plaintext `redis://` to the TLS port: the server drops the connection; a connection error
/// (not `Busy`, not a hang) within the connect limit.
#[tokio::test]
async fn plaintext_to_the_tls_port_is_a_prompt_connection_error() {
    let (_ca, server) = tls_server(false);
    let url = format!("redis://127.0.0.1:{}/", server.tls_port().unwrap());
    let (err, elapsed) = failed_connect(url, None).await;
    assert!(err.is_backend() && !err.is_busy(), "{err:?}");
    assert!(elapsed < FAIL_WITHIN, "took {elapsed:?}: {err}");
    common::assert_nothing_left(&server, &[]).await;
}

/// And the other way round: `rediss://` to the plaintext port. The server reads the
/// ClientHello as an unfinished inline command and answers nothing, so the handshake times
/// out: a timeout `Backend` error within 3 connect limits (the connection manager's
/// attempts), not a hang.
#[tokio::test]
async fn tls_to_a_plaintext_port_times_out_without_hanging() {
    let (ca, server) = tls_server(false);
    let url = format!("rediss://127.0.0.1:{}/", server.port());
    let (err, elapsed) = failed_connect(url, Some(trusting(&ca))).await;
    assert!(err.is_backend() && err.is_timeout(), "{err:?}");
    assert!(elapsed < SILENT_WITHIN, "took {elapsed:?}: {err}");
    common::assert_nothing_left(&server, &[]).await;
}

/// An expired server certificate: `Tls`, "certificate expired".
#[tokio::test]
async fn an_expired_server_certificate_is_refused() {
    let ca = TestCa::new("lock-kit test CA");
    let expired = ca.server_cert(&["127.0.0.1"], Validity::Expired);
    let server = start(&ca, expired, false);
    let (err, elapsed) = failed_connect(server.tls_url(), Some(trusting(&ca))).await;
    assert_tls_error(&err, elapsed, "certificate expired");
    common::assert_nothing_left(&server, &[]).await;
}

/// Host name verification, checked explicitly (redis-cli accepted `-h localhost` against an
/// IP-only SAN): `rediss://localhost` against a certificate for IP 127.0.0.1 only fails, and
/// so does `rediss://127.0.0.1` against a certificate for a DNS name only.
#[tokio::test]
async fn a_certificate_for_another_host_name_is_refused() {
    let (ca, server) = tls_server(false);
    let url = format!("rediss://localhost:{}/", server.tls_port().unwrap());
    let (err, elapsed) = failed_connect(url, Some(trusting(&ca))).await;
    assert_tls_error(&err, elapsed, "not valid for name");

    let dns_only = ca.server_cert(&["redis.lock-kit.test"], Validity::Current);
    let second = start(&ca, dns_only, false);
    let (err, elapsed) = failed_connect(second.tls_url(), Some(trusting(&ca))).await;
    assert_tls_error(&err, elapsed, "not valid for name");
    common::assert_nothing_left(&server, &[]).await;
    common::assert_nothing_left(&second, &[]).await;
}

/// Bad PEM in the TLS settings: `Config(Tls)` from `build()`, and not one connection reached
/// the server.
#[tokio::test]
async fn bad_pem_is_a_config_error_before_any_connection() {
    let (ca, server) = tls_server(false);
    let client = ca.client_cert("lock-kit client");
    let other_key = ca.client_cert("someone else").key_pem;
    let before = server.connections_received();
    let cases: Vec<(&str, TlsConfig, &str)> = vec![
        (
            "not PEM at all",
            TlsConfig::new().root_certificate_pem("hello"),
            "root certificate PEM",
        ),
        (
            "a truncated certificate",
            TlsConfig::new().root_certificate_pem(ca.cert_pem()[..200].to_owned()),
            "root certificate PEM",
        ),
        (
            "a certificate that is not X.509",
            TlsConfig::new().root_certificate_pem(
                "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
            ),
            "root certificate PEM",
        ),
        (
            "a key that is not PEM",
            trusting(&ca).client_identity_pem(client.cert_pem.clone(), "secret-key-bytes"),
            "client key PEM",
        ),
        (
            "a key of another certificate",
            trusting(&ca).client_identity_pem(client.cert_pem.clone(), other_key),
            "client identity",
        ),
        (
            "a client certificate that is not PEM",
            trusting(&ca).client_identity_pem("nope", client.key_pem.clone()),
            "client certificate PEM",
        ),
    ];
    for (case, tls, what) in cases {
        let started = Instant::now();
        let err = Locker::builder()
            .url(server.tls_url())
            .tls(tls)
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, LockError::Config(ConfigError::Tls { what: w, .. }) if *w == what),
            "{case}: {err:?}"
        );
        assert!(
            !err.to_string().contains("secret-key-bytes"),
            "{case}: {err}"
        );
        assert!(started.elapsed() < Duration::from_millis(500), "{case}");
    }
    // TLS settings with a plaintext URL are refused too, rather than silently unused.
    let err = Locker::builder()
        .url(server.url())
        .tls(trusting(&ca))
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            LockError::Config(ConfigError::Tls { what: "url", .. })
        ),
        "{err:?}"
    );
    // Only this call's own INFO connection reached the server.
    assert_eq!(server.connections_received(), before + 1);
    common::assert_nothing_left(&server, &[]).await;
}

/// RedLock over TLS: every node is a `rediss://` URL with the same private CA; a lock is
/// granted on all of them, contended, and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_tls() {
    let ca = TestCa::new("lock-kit test CA");
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| {
            start(
                &ca,
                ca.server_cert(&["127.0.0.1"], Validity::Current),
                false,
            )
        })
        .collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::tls_url).collect();
    let connect = || {
        Locker::builder()
            .redlock(urls.clone())
            .tls(trusting(&ca))
            .build()
    };
    let a = connect().await.unwrap();
    let b = connect().await.unwrap();
    let guard = a.lock("k").await.unwrap();
    // The grant is decided by the first majority; the last node's answer may still be on its
    // way, so wait for it rather than read it at once.
    let on_every_node = common::eventually(Duration::from_secs(2), || {
        servers
            .iter()
            .all(|server| server.keys("lock:*:lock:k").len() == 1)
    })
    .await;
    assert!(on_every_node, "the lock key is on every TLS node");
    assert!(b
        .lock("k")
        .wait(Duration::ZERO)
        .await
        .unwrap_err()
        .is_busy());
    guard.release().await.unwrap();
    b.lock("k")
        .wait(Duration::ZERO)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // A RedLock release answers once a majority released; the last node may still be on its
    // way, so no lock key is checked for by polling (assert_nothing_left), not at once.
    for server in &servers {
        common::assert_nothing_left(server, &[&a, &b]).await;
    }
}

/// A TLS Sentinel deployment (replication and monitoring over TLS, see
/// `RedisSentinel::start_tls`) with a private CA.
fn tls_sentinel() -> (TestCa, RedisSentinel) {
    let ca = TestCa::new("lock-kit test CA");
    let cert = ca.server_cert(&["127.0.0.1"], Validity::Current);
    let sentinel = RedisSentinel::start_tls("locks", &TlsServerConfig::new(cert, &ca))
        .expect("start a TLS sentinel deployment");
    (ca, sentinel)
}

/// A locker that asks the sentinels over TLS (`rediss://`), with a 30 s fallback retry so that
/// only a release message can wake a waiter within the test.
async fn tls_sentinel_locker(ca: &TestCa, sentinel: &RedisSentinel) -> Locker {
    Locker::builder()
        .sentinel(sentinel.master_name(), sentinel.sentinel_tls_urls())
        .tls(trusting(ca))
        .fallback_retry(Duration::from_secs(30))
        .build()
        .await
        .expect("connect through the TLS sentinels")
}

/// `server` has at least `at_least` connections on its TLS port, and every pub/sub
/// connection (flag `P`) is one of them.
fn assert_on_tls(server: &RedisServer, at_least: usize) {
    let clients: String = server.cmd(&["CLIENT", "LIST"]);
    let tls_port = format!(" laddr=127.0.0.1:{} ", server.tls_port().unwrap());
    let on_tls = clients.lines().filter(|l| l.contains(&tls_port)).count();
    assert!(on_tls >= at_least, "{on_tls} on the TLS port: {clients}");
    for line in clients.lines().filter(|l| l.contains(" flags=P ")) {
        assert!(
            line.contains(&tls_port),
            "a pub/sub connection off the TLS port: {line}"
        );
    }
}

/// Sentinel over TLS: the lockers ask the sentinels on their TLS ports and connect to the
/// primary's TLS port (command and pub/sub connections); acquire, contention and release work,
/// and a waiter is woken by the release message (30 s fallback retry and lease: only the
/// message can wake it within 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_locks_and_wakes_waiters() {
    let (ca, sentinel) = tls_sentinel();
    let master = sentinel.master();
    let holder = tls_sentinel_locker(&ca, &sentinel).await;
    let waiter = tls_sentinel_locker(&ca, &sentinel).await;

    let guard = holder.lock("stls-key").await.unwrap();
    assert_eq!(master.keys("lock:*:lock:stls-key").len(), 1);
    assert!(holder.is_locked("stls-key").await.unwrap());
    assert!(waiter
        .lock("stls-key")
        .wait(Duration::ZERO)
        .await
        .unwrap_err()
        .is_busy());

    let first_token = guard.fencing_token().await.unwrap();
    let (woken, token) =
        common::wake_up_after_release(guard, &waiter, || !master.pubsub_channels().is_empty())
            .await;
    lock_testkit::figure(&format!(
        "TLS Sentinel: waiter woken by the release message after {woken:?} (fallback 30 s)"
    ));
    assert!(woken < Duration::from_secs(2), "woken after {woken:?}");
    assert!(token > first_token, "{token} after {first_token}");
    assert!(!holder.is_locked("stls-key").await.unwrap());

    // The lockers' connections go to the TLS port (the sentinels name no other): two command
    // connections and the waiter's pub/sub connection at least (the sentinels' and the
    // replica's links are TLS too, but not counted).
    assert_on_tls(master, 3);
    common::assert_nothing_left(master, &[&holder, &waiter]).await;
}

/// Sentinel over TLS across a failover: after the primary is killed and the replica promoted,
/// the existing locker follows the new primary (asking the sentinels over TLS again) and a new
/// lock is granted there, a new locker connects to it over TLS, contention holds, and a waiter
/// on the new primary is woken by the release message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_follows_a_failover() {
    let (ca, mut sentinel) = tls_sentinel();
    let holder = tls_sentinel_locker(&ca, &sentinel).await;
    holder
        .lock("before")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let old = sentinel.kill_primary();
    let new = sentinel.wait_for_failover(Duration::from_secs(15)).unwrap();
    assert_ne!(old, new);
    assert_eq!(new, sentinel.replica().tls_port().unwrap());
    let master = sentinel.master();

    // The holder's connection to the old primary is dead; it asks the sentinels again (after
    // the error, or by its 1 s poll) and locks on the new primary.
    let started = Instant::now();
    let guard = loop {
        match holder.lock("after").wait(Duration::ZERO).await {
            Ok(guard) => break guard,
            Err(e) => {
                assert!(!e.is_busy(), "{e:?}");
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "no lock on the new primary after 10 s: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    eprintln!(
        "first lock on the new primary after {:?}",
        started.elapsed()
    );
    assert_eq!(master.keys("lock:*:lock:after").len(), 1);

    let other = tls_sentinel_locker(&ca, &sentinel).await;
    assert!(other
        .lock("after")
        .wait(Duration::ZERO)
        .await
        .unwrap_err()
        .is_busy());
    let (woken, _) =
        common::wake_up_after_release(guard, &other, || !master.pubsub_channels().is_empty()).await;
    lock_testkit::figure(&format!(
        "TLS Sentinel after failover: waiter woken by the release message after {woken:?}"
    ));
    assert!(woken < Duration::from_secs(2), "woken after {woken:?}");

    // The new locker's command and pub/sub connections at least (the holder's pub/sub
    // connection may still be reconnecting).
    assert_on_tls(master, 2);
    common::assert_nothing_left(master, &[&holder, &other]).await;
}

/// TLS sentinels are verified too: a locker that trusts another CA cannot ask them for the
/// primary, and fails promptly with [`LockError::Tls`] (`UnknownIssuer`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sentinels_with_an_untrusted_certificate_are_refused() {
    let (_ca, sentinel) = tls_sentinel();
    let other = TestCa::new("another CA");
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        Locker::builder()
            .sentinel(sentinel.master_name(), sentinel.sentinel_tls_urls())
            .tls(trusting(&other))
            .connect_timeout(CONNECT)
            .build(),
    )
    .await
    .expect("connect hung for 30 s");
    let err = result.expect_err("an untrusted sentinel must be refused");
    let elapsed = started.elapsed();
    eprintln!("refused after {elapsed:?}: {}", chain(&err));
    assert_tls_error(&err, elapsed, "UnknownIssuer");
    // Nothing reached the primary.
    common::assert_nothing_left(sentinel.master(), &[]).await;
}

/// The ports in `CLUSTER NODES` as seen over a connection to `url` (TLS when `rediss://`,
/// verified with `ca`), and the redirect a node on `url` gives for a key of another shard.
async fn cluster_view(url: &str, ca: &TestCa, foreign_key: &str) -> (Vec<u16>, String) {
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(ca.cert_pem().into_bytes()),
    };
    let client = redis::Client::build_with_tls(url, certs).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut ports: Vec<u16> = nodes
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .filter_map(|addr| addr.split('@').next()?.rsplit(':').next()?.parse().ok())
        .collect();
    ports.sort_unstable();
    let err = redis::cmd("GET")
        .arg(foreign_key)
        .query_async::<Option<String>>(&mut conn)
        .await
        .unwrap_err();
    let (to, _slot) = err.redirect_node().expect("a MOVED redirect");
    (ports, to.to_owned())
}

/// Cluster over TLS (3 primaries, TLS ports, `tls-cluster yes`): the nodes describe the cluster
/// with their TLS ports to TLS clients (`CLUSTER NODES`, `MOVED`); the lockers, seeded with
/// `rediss://` URLs only, take locks on every shard, contention holds on each, and a waiter is
/// woken by the release message (30 s fallback retry) over a TLS pub/sub connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_locks_every_shard_and_wakes_waiters() {
    let ca = TestCa::new("lock-kit test CA");
    let config = TlsServerConfig::new(ca.server_cert(&["127.0.0.1"], Validity::Current), &ca)
        .with_client_identity(ca.client_cert("cluster node"));
    let cluster = RedisCluster::start_tls(3, 0, &config).expect("start a TLS cluster");
    let connect = || {
        Locker::builder()
            .cluster(cluster.tls_urls())
            .tls(trusting(&ca))
            .fallback_retry(Duration::from_secs(30))
            .build()
    };
    let a = connect().await.unwrap();
    let b = connect().await.unwrap();

    // Over TLS, every node is known by its TLS port, redirects included.
    let primaries = cluster.current_primaries().unwrap();
    let mut tls_ports: Vec<u16> = primaries.iter().map(|p| p.tls_port().unwrap()).collect();
    tls_ports.sort_unstable();
    let first = primaries[0];
    let foreign = (0..)
        .map(|i| format!("probe-{i}"))
        .find(|k| cluster.primary_for_key(k).unwrap().port() != first.port())
        .unwrap();
    let owner_tls = cluster
        .primary_for_key(&foreign)
        .unwrap()
        .tls_port()
        .unwrap();
    let (ports, moved_to) = cluster_view(&first.tls_url(), &ca, &foreign).await;
    assert_eq!(ports, tls_ports);
    assert_eq!(moved_to, format!("127.0.0.1:{owner_tls}"));

    // Locks on every shard, each contended.
    let keys: Vec<String> = (0..12).map(|i| format!("shard-{i}")).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(a.lock(key.as_str()).await.unwrap());
    }
    let mut shards: Vec<u16> = cluster
        .keys("lock:*:lock:shard-*")
        .unwrap()
        .iter()
        .map(|name| cluster.primary_for_key(name).unwrap().port())
        .collect();
    assert_eq!(shards.len(), keys.len());
    shards.sort_unstable();
    shards.dedup();
    assert_eq!(shards.len(), 3, "locks on every primary");
    for key in &keys {
        assert!(b
            .lock(key.as_str())
            .wait(Duration::ZERO)
            .await
            .unwrap_err()
            .is_busy());
    }

    // A waiter is woken by the release message.
    let held = guards.pop().unwrap();
    let subscribed = || primaries.iter().any(|p| !p.pubsub_channels().is_empty());
    let (woken, _) = common::wake_up_after_release(held, &b, subscribed).await;
    lock_testkit::figure(&format!(
        "TLS Cluster: waiter woken by the release message after {woken:?} (fallback 30 s)"
    ));
    assert!(woken < Duration::from_secs(2), "woken after {woken:?}");
    for g in guards {
        g.release().await.unwrap();
    }
    // Both lockers' command connections reach every primary on its TLS port, and every
    // pub/sub connection is a TLS one.
    for primary in &primaries {
        assert_on_tls(primary, 2);
    }
    common::assert_cluster_clean(&cluster, &[&a, &b]).await;
}

/// What Sentinel with TLS cannot do is a configuration error before any connection: sentinel
/// URLs that mix `redis://` and `rediss://` (is the primary TLS or not?), TLS settings with a
/// `redis://` sentinel, and `rediss://` sentinels with different credentials (redis-rs takes
/// one set for all sentinels when their connections carry certificates).
#[tokio::test]
async fn sentinel_tls_misconfigurations_are_refused() {
    let ca = TestCa::new("lock-kit test CA");
    let cases = [
        (
            Locker::builder().sentinel(
                "mymaster",
                ["rediss://127.0.0.1:26379", "redis://127.0.0.1:26380"],
            ),
            "topology",
        ),
        (
            Locker::builder()
                .sentinel("mymaster", ["redis://127.0.0.1:26379"])
                .tls(trusting(&ca)),
            "url",
        ),
        (
            Locker::builder()
                .sentinel(
                    "mymaster",
                    [
                        "rediss://:one@127.0.0.1:26379",
                        "rediss://:two@127.0.0.1:26380",
                    ],
                )
                .tls(trusting(&ca)),
            "topology",
        ),
    ];
    for (builder, expect) in cases {
        let err = builder.build().await.unwrap_err();
        assert!(
            matches!(
                &err,
                LockError::Config(ConfigError::Tls { what, .. }) if *what == expect
            ),
            "{err:?}"
        );
        assert!(!err.to_string().contains("one@") && !err.to_string().contains("two@"));
    }
    // No leak check: no server and no locker (every build is refused).
}
