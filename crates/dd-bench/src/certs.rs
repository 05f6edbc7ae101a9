//! Throwaway TLS certificates for benchmarks and tests of the daemon's `[tls]` (a CA and a server
//! certificate it signed for `localhost` and `127.0.0.1`, written as PEM files): made fresh each run,
//! never committed, so no private key lives in the repository.

use std::path::{Path, PathBuf};

/// The PEM files of one CA and the server certificate it signed.
#[derive(Debug, Clone)]
pub struct Certs {
    /// The CA's certificate (what clients trust).
    pub ca: PathBuf,
    /// The server's certificate (`tls.cert_file`).
    pub cert: PathBuf,
    /// The server's private key (`tls.key_file`).
    pub key: PathBuf,
}

impl Certs {
    /// The daemon's `[tls]` table for these files.
    pub fn tls_toml(&self) -> String {
        format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\n",
            self.cert.display().to_string(),
            self.key.display().to_string()
        )
    }
}

/// Errors of making certificates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    #[error("making a certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

fn write(path: PathBuf, text: &str) -> Result<PathBuf, CertError> {
    std::fs::write(&path, text).map_err(|source| CertError::Write { path: path.clone(), source })?;
    Ok(path)
}

/// A self-signed CA named `name`, its certificate written to `dir/NAME.pem`.
pub fn make_ca(dir: &Path, name: &str) -> Result<(rcgen::Certificate, rcgen::KeyPair, PathBuf), CertError> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let ca = params.self_signed(&key)?;
    let path = write(dir.join(format!("{name}.pem")), &ca.pem())?;
    Ok((ca, key, path))
}

/// A CA (`dir/test-ca.pem`) and a server certificate it signed for `localhost` and `127.0.0.1`
/// (`dir/server.pem`, key `dir/server.key`).
pub fn make_certs(dir: &Path) -> Result<Certs, CertError> {
    let (ca, ca_key, ca_path) = make_ca(dir, "test-ca")?;
    let key = rcgen::KeyPair::generate()?;
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    Ok(Certs {
        ca: ca_path,
        cert: write(dir.join("server.pem"), &cert.pem())?,
        key: write(dir.join("server.key"), &key.serialize_pem())?,
    })
}
