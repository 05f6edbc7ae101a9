//! TLS for connections that cross a network: the data plane over TCP and the admin API over HTTPS
//! (optional, off by default; docs/decisions.md D30).
//!
//! The daemon presents a certificate chain; the client trusts exactly the certificate authorities of
//! one PEM file ([`TlsClient::ca_file`]), never the system's or the web's roots: a guest's daemon is
//! its host's, named by the operator, and a public CA vouching for some other server of the same name
//! must not be enough. The server name checked against the certificate is [`TlsClient::server_name`],
//! or the host part of the address when unset.
//!
//! Invariant: a [`TlsClient`] that loads is a usable configuration (at least one trust anchor); every
//! failure to read or parse the file is [`TlsError`] naming the file.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Errors of loading a TLS client configuration or naming a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The CA file cannot be read or holds no PEM certificate.
    #[error("TLS CA file {path}: {reason}")]
    CaFile { path: PathBuf, reason: String },
    /// The server name is neither a DNS name nor an IP address.
    #[error("TLS server name {name:?}: {reason}")]
    ServerName { name: String, reason: String },
}

/// How a client reaches a daemon over TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsClient {
    /// PEM file of the certificate authorities trusted for the daemon's certificate.
    pub ca_file: PathBuf,
    /// The name the daemon's certificate must carry; `None`: the host part of the address.
    pub server_name: Option<String>,
}

impl TlsClient {
    /// The rustls configuration: the CAs of `ca_file` as the only roots, no client certificate.
    pub fn config(&self) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        client_config(&self.ca_file)
    }

    /// The name to check for a connection to `addr` (`host:port`, `[v6]:port`, or a bare host).
    pub fn name_for(&self, addr: &str) -> Result<ServerName<'static>, TlsError> {
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => host_of(addr).to_string(),
        };
        ServerName::try_from(name.clone()).map_err(|e| TlsError::ServerName { name, reason: e.to_string() })
    }
}

/// A client configuration trusting exactly the certificates of the PEM file `ca_file`.
pub fn client_config(ca_file: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let bad = |reason: String| TlsError::CaFile { path: ca_file.into(), reason };
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file).map_err(|e| bad(e.to_string()))?;
    for cert in certs {
        let cert = cert.map_err(|e| bad(e.to_string()))?;
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no certificate in it".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// The host part of `host:port`, `[v6]:port` or a bare host (brackets removed).
fn host_of(addr: &str) -> &str {
    let addr = addr.rsplit("://").next().unwrap_or(addr);
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_takes_the_host_part() {
        assert_eq!(host_of("daemon.example:7411"), "daemon.example");
        assert_eq!(host_of("127.0.0.1:7411"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7411"), "::1");
        assert_eq!(host_of("https://h:1"), "h");
        assert_eq!(host_of("::1"), "::1");
        assert_eq!(host_of("h"), "h");
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ca.pem");
        std::fs::write(&p, "not a certificate\n").unwrap();
        let e = client_config(&p).unwrap_err().to_string();
        assert!(e.contains("ca.pem") && e.contains("no certificate"), "{e}");
        let e = client_config(&dir.path().join("missing.pem")).unwrap_err().to_string();
        assert!(e.contains("missing.pem"), "{e}");
    }
}
