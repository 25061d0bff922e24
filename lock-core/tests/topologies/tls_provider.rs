//! The kit never installs a process-wide rustls `CryptoProvider`. Without one, a TLS locker is
//! refused with `ConfigError::NoCryptoProvider` before any connection, and the process still
//! has none; with the one the application installed, TLS works through that provider, which
//! stays the default.
//!
//! One test in a process of its own (`run_alone`): a process's default provider can be set
//! only once, so the steps (none installed, then the application's) must run in this order,
//! with no other test installing one.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use lock_core::{ConfigError, LockError, Locker, TlsConfig};
use lock_testkit::{RedisServer, TestCa, TlsServerConfig, Validity};
use rustls::crypto::{CryptoProvider, GetRandomFailed, SecureRandom};

/// Calls of the application's provider's random source: a handshake made with that provider
/// draws from it (the client hello's random), one made with any other does not.
static DRAWS: AtomicUsize = AtomicUsize::new(0);

/// `ring`'s random source, counted.
#[derive(Debug)]
struct CountingRandom;

impl SecureRandom for CountingRandom {
    fn fill(&self, buf: &mut [u8]) -> Result<(), GetRandomFailed> {
        DRAWS.fetch_add(1, Ordering::SeqCst);
        rustls::crypto::ring::default_provider()
            .secure_random
            .fill(buf)
    }
}

fn refused(result: Result<Locker, LockError>) -> bool {
    matches!(
        result,
        Err(LockError::Config(ConfigError::NoCryptoProvider))
    )
}

#[test]
fn the_application_chooses_the_crypto_provider_and_the_kit_installs_none() {
    common::child::run_alone(module_path!(), "provider_chosen_by_the_application");
}

#[tokio::test]
#[ignore = "run in a process of its own by the_application_chooses_the_crypto_provider_and_the_kit_installs_none"]
async fn provider_chosen_by_the_application() {
    if !common::child::alone() {
        return;
    }
    assert!(CryptoProvider::get_default().is_none(), "a fresh process");
    let ca = TestCa::new("lock-kit test CA");
    let cert = ca.server_cert(&["127.0.0.1"], Validity::Current);
    let server = RedisServer::start_tls(&TlsServerConfig::new(cert, &ca)).expect("TLS server");
    let tls = || TlsConfig::new().root_certificate_pem(ca.cert_pem());

    // No provider: every way of asking for TLS is refused before any connection, with a
    // message naming the call that fixes it, and the process still has no provider.
    let err = Locker::builder()
        .url(server.tls_url())
        .tls(tls())
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Config(ConfigError::NoCryptoProvider)),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("rustls::crypto::ring::default_provider().install_default()"),
        "{err}"
    );
    assert!(refused(
        Locker::builder().url(server.tls_url()).build().await
    ));
    assert!(refused(
        Locker::builder().url(server.tls_url()).build_lazy()
    ));
    let urls = [server.tls_url(), server.tls_url(), server.tls_url()];
    assert!(refused(
        Locker::builder().redlock(urls).tls(tls()).build_lazy()
    ));
    assert!(refused(
        Locker::builder().cluster([server.tls_url()]).build().await
    ));
    assert!(refused(
        Locker::builder()
            .sentinel("locks", [server.tls_url()])
            .build()
            .await
    ));
    let clients: String = server.cmd(&["CLIENT", "LIST"]);
    let tls_port = format!(" laddr=127.0.0.1:{} ", server.tls_port().unwrap());
    assert!(!clients.contains(&tls_port), "nothing dialled: {clients}");
    // A plaintext locker needs no provider, and installs none either.
    let plain = Locker::builder().url(server.url()).build().await.unwrap();
    plain.lock("plain").await.unwrap().release().await.unwrap();
    assert!(CryptoProvider::get_default().is_none());

    // The application installs its own provider (`ring`, with a random source it counts).
    CryptoProvider {
        secure_random: &CountingRandom,
        ..rustls::crypto::ring::default_provider()
    }
    .install_default()
    .expect("no provider installed yet");
    let installed = Arc::clone(CryptoProvider::get_default().expect("installed"));
    let locker = Locker::builder()
        .url(server.tls_url())
        .tls(tls())
        .build()
        .await
        .expect("TLS locker with the application's provider");
    let guard = locker.lock("tls-provider").await.unwrap();
    assert!(locker.is_locked("tls-provider").await.unwrap());
    guard.release().await.unwrap();
    // The handshakes drew from the application's provider, which is still the default.
    assert!(DRAWS.load(Ordering::SeqCst) > 0);
    assert!(Arc::ptr_eq(
        CryptoProvider::get_default().expect("still installed"),
        &installed
    ));
    common::assert_nothing_left(&server, &[&plain, &locker]).await;
}
