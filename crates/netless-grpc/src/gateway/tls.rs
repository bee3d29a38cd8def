//! The gateway's TLS: a rustls acceptor (HTTP/2 by ALPN) from PEM files, optionally
//! requiring every client to present a certificate signed by a given CA (mutual TLS). It
//! reads the files once, when the acceptor is made; it never sees a call.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS acceptor (HTTP/2 by ALPN) from a PEM certificate chain and a PEM private key. Any
/// client may connect; see [`tls_acceptor_verifying_clients`] to require a certificate.
pub fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    server_config(cert, key, None)
}

/// A TLS acceptor like [`tls_acceptor`] that also requires every client to present a
/// certificate issued by a CA in the PEM file `client_ca` (mutual TLS): a client without
/// one fails the handshake, before any call.
///
/// ```no_run
/// use std::path::Path;
/// let tls = netless_grpc::tls_acceptor_verifying_clients(
///     Path::new("server.pem"),
///     Path::new("server.key"),
///     Path::new("clients-ca.pem"),
/// )?;
/// # Ok::<(), String>(())
/// ```
pub fn tls_acceptor_verifying_clients(
    cert: &Path,
    key: &Path,
    client_ca: &Path,
) -> Result<TlsAcceptor, String> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in read_certs(client_ca, "client CA")? {
        roots
            .add(ca)
            .map_err(|e| format!("the client CA in {}: {e}", client_ca.display()))?;
    }
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| format!("the client CA in {}: {e}", client_ca.display()))?;
    server_config(cert, key, Some(verifier))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("reading the {what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", path.display()));
    }
    Ok(certs)
}

fn server_config(
    cert: &Path,
    key: &Path,
    clients: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Result<TlsAcceptor, String> {
    let certs = read_certs(cert, "certificate chain")?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("reading the private key {}: {e}", key.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
