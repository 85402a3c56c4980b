//! TLS on the gRPC port (`GRPC_SERVER_USE_TLS`), with rustls as the library's Redis store uses it:
//! the server's certificate and key, and, with `GRPC_CLIENT_TLS_CACERT`, client certificates
//! required and checked against that CA (mutual TLS), and against `GRPC_CLIENT_TLS_SAN` when it is
//! set, as the reference checks them.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tokio_rustls::TlsAcceptor;

use crate::settings::TlsFiles;

/// The acceptor `files` describe; an error names the file and what is wrong with it.
pub(crate) fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(Iterator::collect)
        .map_err(|error| format!("GRPC_SERVER_TLS_CERT {}: {error}", files.cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "GRPC_SERVER_TLS_CERT {}: no certificate in the file",
            files.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|error| format!("GRPC_SERVER_TLS_KEY {}: {error}", files.key.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS: {error}"))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)
                .map_err(|error| format!("GRPC_CLIENT_TLS_CACERT {}: {error}", ca.display()))?
            {
                let cert = cert
                    .map_err(|error| format!("GRPC_CLIENT_TLS_CACERT {}: {error}", ca.display()))?;
                roots
                    .add(cert)
                    .map_err(|error| format!("GRPC_CLIENT_TLS_CACERT {}: {error}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|error| format!("GRPC_CLIENT_TLS_CACERT {}: {error}", ca.display()))?;
            let verifier: Arc<dyn ClientCertVerifier> = match &files.client_san {
                None => verifier,
                Some(san) => {
                    let name = ServerName::try_from(san.clone())
                        .map_err(|error| format!("GRPC_CLIENT_TLS_SAN={san:?}: {error}"))?;
                    Arc::new(NamedClient {
                        chain: verifier,
                        name,
                    })
                }
            };
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|error| format!("GRPC_SERVER_TLS_KEY {}: {error}", files.key.display()))?;
    // gRPC is HTTP/2: a client that offers ALPN is told so.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Client certificates that chain to the CA (`chain`) and also name `name` among their subject
/// alternative names: the reference's `GRPC_CLIENT_TLS_SAN`.
#[derive(Debug)]
struct NamedClient {
    chain: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for NamedClient {
    fn offer_client_auth(&self) -> bool {
        self.chain.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.chain.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .chain
            .verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        cert.verify_is_valid_for_subject_name(&self.name)
            .map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            })?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}
