//! The simulator's own CA, as E2B's egress proxy has E2B's: every VM trusts it in its system
//! bundle (`/etc/ssl/certs/ca-certificates.crt` is mounted from [`Ca::pem`]), and the proxy
//! presents a certificate it signs for whatever name the guest asked for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// A CA could not be made or could not sign.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("TLS config: {0}")]
    Rustls(#[from] rustls::Error),
}

pub struct Ca {
    key: KeyPair,
    cert: rcgen::Certificate,
    pem: String,
    configs: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl Ca {
    pub fn new() -> Result<Ca, CaError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "E2B simulator egress CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let pem = cert.pem();
        Ok(Ca {
            key,
            cert,
            pem,
            configs: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A server config presenting a certificate for `host` (made once per name).
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, CaError> {
        let mut configs = self
            .configs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(config) = configs.get(host) {
            return Ok(Arc::clone(config));
        }
        let leaf_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![host.to_owned()])?;
        params.distinguished_name.push(DnType::CommonName, host);
        let leaf = params.signed_by(&leaf_key, &self.cert, &self.key)?;
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        configs.insert(host.to_owned(), Arc::clone(&config));
        Ok(config)
    }
}
