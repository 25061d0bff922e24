//! What a TLS [`RedisServer`](crate::RedisServer) presents and requires: [`TlsServerConfig`],
//! built from the certificates of a [`TestCa`](crate::TestCa) (the `test-ca` feature).
//!
//! Nothing is read from or written to a fixed place: the PEM text lives in memory until a
//! fixture writes it into its own temporary directory.

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertAndKey {
    /// The certificate (PEM).
    pub cert_pem: String,
    /// The private key (PKCS#8 PEM).
    pub key_pem: String,
}

impl std::fmt::Debug for CertAndKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAndKey")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What a TLS test server presents and whom it accepts.
#[derive(Debug, Clone)]
pub struct TlsServerConfig {
    /// The server's certificate and key.
    pub server: CertAndKey,
    /// The CA the server trusts for client certificates (`--tls-ca-cert-file`).
    pub client_ca_pem: String,
    /// `--tls-auth-clients yes`: a client without a certificate from `client_ca_pem` is refused.
    pub auth_clients: bool,
    /// The certificate the server presents when it connects to other servers itself
    /// (`--tls-client-cert-file`, `--tls-client-key-file`); without one it presents `server`.
    /// A TLS cluster bus (`tls-cluster yes`) always requires a client certificate, and
    /// `server` (issued for server authentication only) is refused there.
    pub client: Option<CertAndKey>,
}

impl TlsServerConfig {
    /// A server presenting `server`, trusting `ca` for client certificates, not requiring them.
    #[cfg(feature = "test-ca")]
    pub fn new(server: CertAndKey, ca: &crate::TestCa) -> Self {
        Self {
            server,
            client_ca_pem: ca.cert_pem(),
            auth_clients: false,
            client: None,
        }
    }

    /// Presents `client` (e.g. [`TestCa::client_cert`](crate::TestCa::client_cert)) when the server connects to other
    /// servers: replication, the cluster bus.
    pub fn with_client_identity(mut self, client: CertAndKey) -> Self {
        self.client = Some(client);
        self
    }

    /// Requires client certificates issued by the CA (mutual TLS).
    pub fn require_client_certs(mut self) -> Self {
        self.auth_clients = true;
        self
    }
}
