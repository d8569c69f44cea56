//! The simulator's own test CA, made fresh at every start: a CA, a server certificate for
//! loopback (`127.0.0.1`, `::1`, `localhost`) and one client certificate. The gateway
//! requires a client certificate signed by this CA on every connection (mutual TLS), as
//! OpenShell's does with the PKI it generates.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// Where each file of the PKI was written.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PkiFiles {
    /// The CA certificate: a client trusts the gateway with it.
    pub ca_file: PathBuf,
    /// The client certificate and key (OpenShell's mtls/ directory calls them tls.crt and
    /// tls.key).
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The gateway's own certificate and key.
    pub server_cert_file: PathBuf,
    pub server_key_file: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("making the test certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The PEM texts, kept in memory for the TLS server.
pub struct Pki {
    pub files: PkiFiles,
    pub ca_pem: String,
    pub server_cert_pem: String,
    pub server_key_pem: String,
}

/// Makes a fresh CA, server and client certificate and writes them under `dir`.
pub fn generate(dir: &Path) -> Result<Pki, PkiError> {
    let write = |name: &str, text: &str| -> Result<PathBuf, PkiError> {
        let path = dir.join(name);
        fs::write(&path, text).map_err(|source| PkiError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    };
    fs::create_dir_all(dir).map_err(|source| PkiError::Write {
        path: dir.to_path_buf(),
        source,
    })?;

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.distinguished_name
        .push(DnType::CommonName, "openshell-simulator test CA");
    let ca_cert = ca.self_signed(&ca_key)?;

    let server_key = KeyPair::generate()?;
    let mut server = CertificateParams::new(vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ])?;
    server
        .distinguished_name
        .push(DnType::CommonName, "openshell-server");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = server.signed_by(&server_key, &ca_cert, &ca_key)?;

    let client_key = KeyPair::generate()?;
    let mut client = CertificateParams::new(Vec::<String>::new())?;
    client
        .distinguished_name
        .push(DnType::CommonName, "openshell-client");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_cert = client.signed_by(&client_key, &ca_cert, &ca_key)?;

    let files = PkiFiles {
        ca_file: write("ca.crt", &ca_cert.pem())?,
        cert_file: write("tls.crt", &client_cert.pem())?,
        key_file: write("tls.key", &client_key.serialize_pem())?,
        server_cert_file: write("server.crt", &server_cert.pem())?,
        server_key_file: write("server.key", &server_key.serialize_pem())?,
    };
    Ok(Pki {
        files,
        ca_pem: ca_cert.pem(),
        server_cert_pem: server_cert.pem(),
        server_key_pem: server_key.serialize_pem(),
    })
}
