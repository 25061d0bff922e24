//! TLS for `rediss://` connections: [`TlsConfig`] (a private CA, a client identity), its
//! validation before any connection, and the recognition of TLS failures in Redis errors.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::ConfigError;

/// Certificates for `rediss://` connections: a private CA to trust and, for mutual TLS, a
/// client certificate with its key.
///
/// Without a `TlsConfig`, a `rediss://` URL is verified against the system's trust store
/// (the platform certificates, or `SSL_CERT_FILE` / `SSL_CERT_DIR`). With
/// [`root_certificate_pem`](Self::root_certificate_pem), only the given CA certificates are
/// trusted. The server's certificate must be valid now, chain to a trusted CA and name the
/// host of the URL: `rediss://127.0.0.1:6380` needs an IP address SAN `127.0.0.1`,
/// `rediss://redis.internal:6380` a DNS SAN `redis.internal` (the subject's common name is not
/// consulted).
///
/// The same certificates are used for every connection of a locker: with Sentinel, for the
/// sentinels and for the primary they name, so one CA (or a bundle of CAs) must vouch for both.
///
/// All PEM text is parsed by [`LockerBuilder::build`](crate::LockerBuilder::build) before any
/// connection is made; a malformed certificate or key is a [`ConfigError::Tls`]. `Debug`
/// prints neither certificates nor the key.
///
/// There is deliberately no option to skip verification. redis-rs reads a `#insecure`
/// fragment (`rediss://host:6380/#insecure`) as "accept any certificate" (with its
/// `tls-rustls-insecure` feature): the kit refuses such a URL itself, whatever features are on,
/// with [`ConfigError::Tls`](crate::ConfigError::Tls) from
/// [`build`](crate::LockerBuilder::build), before any connection. Accepting any certificate
/// turns TLS into encryption towards whoever answers.
///
/// The handshakes use the process's default rustls `CryptoProvider`, which the application
/// installs (the kit installs none; see the crate docs, "TLS").
///
/// # Examples
///
/// ```no_run
/// use lock_core::{Locker, TlsConfig};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// // Once, at start-up: the process's rustls provider (the kit installs none).
/// let _ = rustls::crypto::ring::default_provider().install_default();
/// let tls = TlsConfig::new()
///     .root_certificate_pem(std::fs::read("/etc/redis/tls/ca.crt")?)
///     // Only when the server runs with `tls-auth-clients yes`:
///     .client_identity_pem(
///         std::fs::read("/etc/redis/tls/client.crt")?,
///         std::fs::read("/etc/redis/tls/client.key")?,
///     );
/// let locker = Locker::builder()
///     .url("rediss://redis.internal:6380")
///     .tls(tls)
///     .build()
///     .await?;
/// # let _ = locker;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct TlsConfig {
    root_pem: Option<Vec<u8>>,
    client: Option<ClientIdentity>,
}

#[derive(Clone)]
struct ClientIdentity {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field(
                "root_certificates",
                &self.root_pem.as_ref().map(|_| "<set>"),
            )
            .field(
                "client_identity",
                &self.client.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl TlsConfig {
    /// No private CA, no client identity: the system trust store verifies the server.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the CA certificates in `pem` (one or more `BEGIN CERTIFICATE` blocks) instead of
    /// the system trust store.
    pub fn root_certificate_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_pem = Some(pem.into());
        self
    }

    /// Presents this client certificate (`cert_chain_pem`: the certificate, then any
    /// intermediates) with its private key (`key_pem`: PKCS#8, PKCS#1 or SEC1 PEM), for servers
    /// that require client certificates (`tls-auth-clients yes`).
    pub fn client_identity_pem(
        mut self,
        cert_chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client = Some(ClientIdentity {
            cert_pem: cert_chain_pem.into(),
            key_pem: key_pem.into(),
        });
        self
    }

    /// Parses every PEM and checks that rustls accepts them together (a key that does not
    /// belong to its certificate is refused here), without any network traffic.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("protocol versions", e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        if let Some(pem) = &self.root_pem {
            for cert in certificates(pem, "root certificate PEM")? {
                roots
                    .add(cert)
                    .map_err(|e| invalid("root certificate PEM", e.to_string()))?;
            }
        }
        let builder = builder.with_root_certificates(roots);
        if let Some(client) = &self.client {
            // The key's own parse error could quote key material; only its kind is reported.
            let key = PrivateKeyDer::from_pem_slice(&client.key_pem).map_err(|e| {
                invalid(
                    "client key PEM",
                    format!("no usable private key ({})", kind(&e)),
                )
            })?;
            let chain = certificates(&client.cert_pem, "client certificate PEM")?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| invalid("client identity", e.to_string()))?;
        }
        Ok(())
    }

    pub(crate) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client.as_ref().map(|c| redis::ClientTlsConfig {
                client_cert: c.cert_pem.clone(),
                client_key: c.key_pem.clone(),
            }),
            root_cert: self.root_pem.clone(),
        }
    }
}

fn invalid(what: &'static str, reason: String) -> ConfigError {
    ConfigError::Tls { what, reason }
}

fn kind(error: &rustls::pki_types::pem::Error) -> &'static str {
    use rustls::pki_types::pem::Error;
    match error {
        Error::NoItemsFound => "no PEM section found",
        Error::MissingSectionEnd { .. } => "a PEM section has no end line",
        Error::IllegalSectionStart { .. } => "a malformed PEM section start",
        Error::Base64Decode(_) => "invalid base64",
        _ => "unreadable PEM",
    }
}

/// All `CERTIFICATE` sections of `pem`; at least one, each a parseable X.509 certificate.
fn certificates(
    pem: &[u8],
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, e.to_string()))?;
    if certs.is_empty() {
        return Err(invalid(what, "no `BEGIN CERTIFICATE` section".to_owned()));
    }
    for cert in &certs {
        webpki_parse(cert).map_err(|reason| invalid(what, reason))?;
    }
    Ok(certs)
}

/// Checks that `cert` is DER that rustls can use as an end-entity or trust anchor.
fn webpki_parse(cert: &CertificateDer<'_>) -> Result<(), String> {
    // A trust anchor is extracted from any well-formed certificate; this catches base64 that
    // decodes to something that is not a certificate.
    let mut store = rustls::RootCertStore::empty();
    let (added, ignored) = store.add_parsable_certificates([cert.clone()]);
    if added == 1 && ignored == 0 {
        Ok(())
    } else {
        Err("a `CERTIFICATE` section is not a valid X.509 certificate".to_owned())
    }
}

/// Refuses TLS unless the process has a default rustls `CryptoProvider`.
///
/// redis-rs builds its TLS client configuration with `rustls::ClientConfig::builder()`, which
/// takes the process-wide default provider, and offers no way to hand it a configuration with
/// an explicit one. Without a default, rustls would either install the provider its crate
/// features name (a process-wide change the application did not ask for) or, when the build
/// enables both `ring` and `aws-lc-rs`, panic; it offers no way to tell the two apart without
/// doing either. So the kit asks the application to choose: it never installs a provider.
pub(crate) fn check_crypto_provider() -> Result<(), ConfigError> {
    match rustls::crypto::CryptoProvider::get_default() {
        Some(_) => Ok(()),
        None => Err(ConfigError::NoCryptoProvider),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_prints_no_certificate_or_key() {
        let tls = TlsConfig::new()
            .root_certificate_pem("-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n")
            .client_identity_pem("CERT-BYTES", "-----BEGIN PRIVATE KEY-----\nSECRETKEY\n");
        let debug = format!("{tls:?}");
        assert!(
            !debug.contains("QUJD") && !debug.contains("SECRETKEY"),
            "{debug}"
        );
        assert!(!debug.contains("CERT-BYTES"), "{debug}");
    }

    #[test]
    fn garbage_is_refused_with_context() {
        let err = TlsConfig::new()
            .root_certificate_pem("not a pem")
            .validate()
            .unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Tls {
                    what: "root certificate PEM",
                    ..
                }
            ),
            "{err}"
        );
        let err = TlsConfig::new()
            .root_certificate_pem("-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n")
            .validate()
            .unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Tls {
                    what: "root certificate PEM",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn key_text_never_reaches_the_error() {
        let err = TlsConfig::new()
            .client_identity_pem(
                "-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n",
                "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n",
            )
            .validate()
            .unwrap_err();
        assert!(!err.to_string().contains("c2VjcmV0"), "{err}");
    }
}
