//! TLS for the guard listener (grants.md §5.3) and for plimsolld's listeners: the daemon's
//! certificate and key, rustls, TLS 1.2 minimum, ALPN `h2` then `http/1.1`, no client
//! certificates.

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// Why the TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("invalid TLS configuration: cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("invalid TLS configuration: {0} holds no PEM certificate")]
    NoCertificate(String),
    /// The key file holds no PEM private key.
    #[error("invalid TLS configuration: {0} holds no PEM private key")]
    NoKey(String),
    /// rustls refused the pair.
    #[error("invalid TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Loads the certificate chain and key into an acceptor.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.display().to_string(),
            source,
        })
    };
    let (cert_pem, key_pem) = (read(cert)?, read(key)?);
    let chain = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Read {
            path: cert.display().to_string(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert.display().to_string()));
    }
    let private = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|source| TlsError::Read {
            path: key.display().to_string(),
            source,
        })?
        .ok_or_else(|| TlsError::NoKey(key.display().to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(chain, private)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
