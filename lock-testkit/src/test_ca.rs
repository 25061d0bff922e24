//! Test certificates made at run time with `rcgen` (the `test-ca` feature, on by default):
//! [`TestCa`] issues server and client certificates for [`TlsServerConfig`](crate::TlsServerConfig).
//! Without the feature the kit builds without `rcgen` and `ring`, as the macro crate's UI tests
//! do (their trybuild project compiles every dependency again).

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::tls::CertAndKey;

/// Whether a certificate is valid now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Valid from 2020 to 2100.
    Current,
    /// Valid only during the year 2000: expired.
    Expired,
}

/// A private certificate authority for tests (ECDSA P-256).
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

fn validity(params: &mut CertificateParams, validity: Validity) {
    let (from, to) = match validity {
        Validity::Current => (2020, 2100),
        Validity::Expired => (2000, 2001),
    };
    params.not_before = rcgen::date_time_ymd(from, 1, 1);
    params.not_after = rcgen::date_time_ymd(to, 1, 1);
}

impl TestCa {
    /// A new self-signed CA named `common_name`, with a fresh key.
    ///
    /// # Panics
    ///
    /// If `rcgen` cannot generate the key or the certificate.
    pub fn new(common_name: &str) -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, Validity::Current);
        let key = KeyPair::generate().expect("generate CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("self-sign CA certificate");
        Self { issuer }
    }

    /// The CA certificate (PEM), what a client or server trusts.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for exactly these subject alternative names: an entry that parses
    /// as an IP address becomes an IP SAN, anything else a DNS SAN (`["127.0.0.1"]` gives a
    /// certificate that is valid for `127.0.0.1` and not for `localhost`).
    ///
    /// # Panics
    ///
    /// If a name is not a valid DNS name or `rcgen` fails.
    pub fn server_cert(&self, sans: &[&str], valid: Validity) -> CertAndKey {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("valid subject alternative names");
        params.distinguished_name = name("redis test server");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, valid);
        self.issue(params)
    }

    /// A client certificate (for mutual TLS) with common name `common_name`.
    ///
    /// # Panics
    ///
    /// If `rcgen` fails.
    pub fn client_cert(&self, common_name: &str) -> CertAndKey {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, Validity::Current);
        self.issue(params)
    }

    fn issue(&self, params: CertificateParams) -> CertAndKey {
        let key = KeyPair::generate().expect("generate key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign certificate");
        CertAndKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}
