//! Certificates made by the tests, in pure Rust (no `openssl` command): a certificate authority
//! and the certificates it signs, for the TLS tests of the Redis store and of tollgate-server.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A certificate authority: its certificate (PEM) and what signs with it.
pub struct Authority {
    /// The authority's own certificate, PEM-encoded (what a client or server is told to trust).
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Default for Authority {
    fn default() -> Self {
        Authority::new()
    }
}

impl Authority {
    /// A new authority with a fresh key, named "tollgate test CA".
    pub fn new() -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Its own name: a certificate whose issuer is named as itself reads as self-signed.
        params
            .distinguished_name
            .push(DnType::CommonName, "tollgate test CA");
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Authority {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names` (PEM) and its key (PEM).
    pub fn sign(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].as_str());
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}
