//! TLS on the data plane's TCP listener and the admin API's listener (`[tls]`, off by default;
//! docs/decisions.md D30), for hosts whose guests reach the daemon over a network: without it a VM's
//! data token, its pages and the host's admin token cross that network in clear.
//!
//! What it is: rustls (TLS 1.3 and 1.2, the ring provider) with the certificate chain and key of two
//! PEM files; no client certificates (a guest proves who it is with its VM token, inside the
//! encrypted session, exactly as on the Unix socket). The Unix socket and the peer listener are never
//! wrapped: the first never leaves the host, the second has its own Noise channel bound to the
//! nodes' keys (D28).
//!
//! How a TLS connection moves: the TLS handshake runs where the data plane's HELLO runs, on the
//! handshake thread (`handshake`), inside the same handshake slot and `limits.handshake_timeout_ms`,
//! so a client that opens TLS connections and never finishes them costs what a plain one costs. An
//! authenticated TLS session then moves to the session runtime like a plain one: [`Homed`] lets the
//! socket under rustls change reactors while rustls's state stays where it is.
//!
//! Invariant: a `ServerConfig` from [`server_config`] holds a certificate chain and its matching key
//! (rustls checks the pair when it is built); every failure names the file.

use crate::handshake::Rehome;
use crate::ServerError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::runtime::Handle;

/// The rustls server configuration of a certificate chain (`cert_file`, leaf first) and its private
/// key (`key_file`: PKCS#8, PKCS#1 or SEC1 PEM).
pub fn server_config(cert_file: &Path, key_file: &Path) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let bad = |field: &str, p: &Path, e: String| ServerError::Config {
        field: field.into(),
        reason: format!("{}: {e}", p.display()),
    };
    let certs = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| bad("tls.cert_file", cert_file, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("tls.cert_file", cert_file, e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("tls.cert_file", cert_file, "no certificate in it".into()));
    }
    let key =
        PrivateKeyDer::from_pem_file(key_file).map_err(|e| bad("tls.key_file", key_file, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("tls", cert_file, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad("tls.key_file", key_file, format!("does not fit the certificate: {e}")))?;
    Ok(Arc::new(cfg))
}

/// A TCP stream that can be registered with another runtime's reactor in place, so that the socket
/// under a TLS session moves from the handshake thread to the session runtime (tokio-rustls has no
/// way to rebuild a session around a new stream). Invariant: `Some` except during [`Homed::rehome`],
/// which puts a stream back before it returns, or fails and leaves the connection unusable.
#[derive(Debug)]
pub struct Homed(Option<TcpStream>);

impl Homed {
    pub fn new(s: TcpStream) -> Homed {
        Homed(Some(s))
    }

    fn get(&self) -> io::Result<&TcpStream> {
        self.0.as_ref().ok_or_else(lost)
    }

    fn rehome(&mut self, to: &Handle) -> io::Result<()> {
        let s = self.0.take().ok_or_else(|| io::Error::other("connection already lost"))?;
        self.0 = Some(s.rehome(to)?);
        Ok(())
    }

    fn pin_inner(self: Pin<&mut Self>) -> io::Result<Pin<&mut TcpStream>> {
        self.get_mut().0.as_mut().map(Pin::new).ok_or_else(lost)
    }
}

/// A `Homed` whose socket failed to move between runtimes: the connection is gone.
fn lost() -> io::Error {
    io::Error::other("connection lost while moving between runtimes")
}

impl AsRawFd for Homed {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_ref().map_or(-1, |s| s.as_raw_fd())
    }
}

impl AsyncRead for Homed {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.pin_inner() {
            Ok(s) => s.poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Homed {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.pin_inner() {
            Ok(s) => s.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.pin_inner() {
            Ok(s) => s.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.pin_inner() {
            Ok(s) => s.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// A data-plane connection under TLS.
pub type TlsConn = tokio_rustls::server::TlsStream<Homed>;

impl Rehome for TlsConn {
    fn rehome(mut self, to: &Handle) -> io::Result<Self> {
        self.get_mut().0.rehome(to)?;
        Ok(self)
    }

    /// Reads the socket under TLS: only used to discard what a connection that will not be read again
    /// sent (`Rehome::stop_receiving`), where ciphertext is as good as plaintext.
    fn try_read_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.get_ref().0.get()?.try_read(buf)
    }
}

/// The TLS handshake of an accepted connection, bounded by `limit`; `None` when it fails or takes
/// longer (the connection is dropped: a TLS client is told nothing in plain text).
pub async fn accept(
    acceptor: &tokio_rustls::TlsAcceptor,
    s: TcpStream,
    limit: std::time::Duration,
) -> Option<TlsConn> {
    match tokio::time::timeout(limit, acceptor.accept(Homed::new(s))).await {
        Ok(Ok(conn)) => Some(conn),
        Ok(Err(e)) => {
            tracing::debug!("TLS handshake failed: {e}");
            None
        }
        Err(_) => None,
    }
}
