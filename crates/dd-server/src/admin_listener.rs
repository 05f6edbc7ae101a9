//! The admin API's TCP listener: every accepted connection's bytes pass a framing check before hyper
//! reads them (issue 30, item 6).
//!
//! A request head with both `Content-Length` and `Transfer-Encoding` is answered 400
//! `conflicting_framing` and the connection closed, without the request reaching a handler: the two
//! framings may disagree on where the body ends, and a proxy in front that honours the other one
//! would pass a second, smuggled request (RFC 9112, section 6.3). It must be done here, on the bytes:
//! hyper drops the `Content-Length` of such a request before any handler or middleware could see it.
//!
//! The check follows lines, not HTTP: a head ends at an empty line, and a line counts when it starts
//! with either header's name (any case). It keeps a few bytes per line across reads, so a head split
//! anywhere is judged the same. Body bytes are scanned too: a body that itself holds both header lines
//! and then an empty line closes its own connection, which only its sender can arrange. Invariant:
//! bytes of a head found conflicting never reach hyper (they are held back, the answer is written
//! with one non-blocking write, and hyper reads the end of the stream).
//!
//! Under TLS (`[tls]` with `admin = true`, `crate::tls`) the check reads the decrypted bytes, and the
//! TLS handshakes run in tasks of their own (at most [`MAX_TLS_HANDSHAKES`] at once, the oldest
//! displaced by a newer connection, each within `limits.handshake_timeout_ms`): axum's accept loop
//! takes connections one at a time, and a client that stalls its handshake must not keep every other
//! operator out.

use std::collections::VecDeque;
use std::io;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// TLS handshakes of the admin listener in progress at once; a connection beyond them displaces the
/// oldest.
pub const MAX_TLS_HANDSHAKES: usize = 64;

/// The answer to a conflicting head.
const REFUSAL: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 102\r\n\
connection: close\r\n\r\n{\"code\":\"conflicting_framing\",\"message\":\"both Content-Length and Transfer-Encoding: send one framing\"}";

/// A TCP listener whose connections refuse conflicting framing headers (give it to `axum::serve`),
/// plain or under TLS.
#[derive(Debug)]
pub struct AdminListener {
    local: SocketAddr,
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Plain(TcpListener),
    /// Connections whose TLS handshake completed, from the accepting task (aborted with the listener).
    Tls {
        done: mpsc::Receiver<(AdminIo, SocketAddr)>,
        task: tokio::task::JoinHandle<()>,
    },
}

impl Drop for AdminListener {
    fn drop(&mut self) {
        if let Inner::Tls { task, .. } = &self.inner {
            task.abort();
        }
    }
}

impl AdminListener {
    pub fn plain(l: TcpListener) -> io::Result<AdminListener> {
        Ok(AdminListener { local: l.local_addr()?, inner: Inner::Plain(l) })
    }

    /// Accepts on `l` in a task of its own, each connection's TLS handshake in its own task within
    /// `limit`; `accept` returns connections whose handshake completed.
    pub fn tls(
        l: TcpListener,
        acceptor: tokio_rustls::TlsAcceptor,
        limit: Duration,
    ) -> io::Result<AdminListener> {
        let local = l.local_addr()?;
        let (tx, done) = mpsc::channel(MAX_TLS_HANDSHAKES);
        let task = tokio::spawn(async move {
            // Handshakes in progress, oldest first: when all are taken, a new connection displaces the
            // oldest (as the data plane's handshake slots do), so stalled connections cannot keep an
            // operator out; a completed handshake is fast, a displaced one is only ever a stalled one
            // or one of a flood.
            let mut running: VecDeque<tokio::task::JoinHandle<()>> = VecDeque::new();
            loop {
                let (s, addr) = match l.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!("admin accept: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                running.retain(|h| !h.is_finished());
                if running.len() >= MAX_TLS_HANDSHAKES {
                    if let Some(oldest) = running.pop_front() {
                        oldest.abort();
                    }
                }
                let (tx, acceptor) = (tx.clone(), acceptor.clone());
                running.push_back(tokio::spawn(async move {
                    if let Ok(Ok(s)) = tokio::time::timeout(limit, acceptor.accept(s)).await {
                        let _ = tx.send((AdminIo::Tls(Box::new(s)), addr)).await;
                    }
                }));
            }
        });
        Ok(AdminListener { local, inner: Inner::Tls { done, task } })
    }
}

impl axum::serve::Listener for AdminListener {
    type Io = Checked;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Checked, SocketAddr) {
        let (io, a) = match &mut self.inner {
            Inner::Plain(l) => {
                let (s, a) = axum::serve::Listener::accept(l).await;
                (AdminIo::Plain(s), a)
            }
            Inner::Tls { done, .. } => match done.recv().await {
                Some(c) => c,
                // The accepting task is gone only when the listener is being dropped.
                None => std::future::pending().await,
            },
        };
        (Checked { inner: io, scan: Scan::default(), refused: false }, a)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// An admin connection's stream: plain TCP or TLS over it.
#[derive(Debug)]
pub enum AdminIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AdminIo {
    /// Sends `bytes` without waiting, as far as the socket takes them (the refusal).
    fn send_now(&mut self, bytes: &[u8]) {
        match self {
            AdminIo::Plain(s) => {
                let _ = s.try_write(bytes);
            }
            // Encrypted into rustls's buffer now; written out by the flush that `Checked::poll_read`
            // completes before it reports the end of the stream.
            AdminIo::Tls(s) => {
                let _ = s.get_mut().1.writer().write_all(bytes);
            }
        }
    }
}

impl AsyncRead for AdminIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AdminIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            AdminIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for AdminIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            AdminIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            AdminIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AdminIo::Plain(s) => Pin::new(s).poll_flush(cx),
            AdminIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            AdminIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            AdminIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What the framing check remembers between reads.
#[derive(Debug, Default)]
struct Scan {
    /// The current line's first bytes, lower-cased (enough to tell both header names).
    line: Vec<u8>,
    /// Whether the current line has any byte other than `\r`.
    nonempty: bool,
    content_length: bool,
    transfer_encoding: bool,
}

const PREFIX: usize = 18;

impl Scan {
    /// Feeds bytes; true as soon as a head with both headers ends in them.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            if b == b'\n' {
                if !self.nonempty {
                    let conflict = self.content_length && self.transfer_encoding;
                    (self.content_length, self.transfer_encoding) = (false, false);
                    if conflict {
                        return true;
                    }
                } else if self.line.starts_with(b"content-length:") {
                    self.content_length = true;
                } else if self.line.starts_with(b"transfer-encoding:") {
                    self.transfer_encoding = true;
                }
                self.line.clear();
                self.nonempty = false;
                continue;
            }
            if b != b'\r' {
                self.nonempty = true;
            }
            if self.line.len() < PREFIX {
                self.line.push(b.to_ascii_lowercase());
            }
        }
        false
    }
}

/// An admin connection behind the framing check.
#[derive(Debug)]
pub struct Checked {
    inner: AdminIo,
    scan: Scan,
    /// A conflicting head was answered: hyper reads the end of the stream from now on.
    refused: bool,
}

impl AsyncRead for Checked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.refused {
            // The end of the stream, once the refusal is out (under TLS it waits in rustls's buffer).
            return Pin::new(&mut this.inner).poll_flush(cx);
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.scan.feed(&buf.filled()[before..]) {
                    // Held back: hyper never sees this head complete.
                    buf.set_filled(before);
                    this.refused = true;
                    // The socket's send buffer is empty between requests (hyper wrote every answer
                    // before reading on), so one non-blocking write takes the whole refusal.
                    this.inner.send_now(REFUSAL);
                    return Pin::new(&mut this.inner).poll_flush(cx);
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Checked {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_well_formed() {
        let text = std::str::from_utf8(REFUSAL).unwrap();
        let (_, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(text.contains(&format!("content-length: {}\r\n", body.len())), "{}", body.len());
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }

    #[test]
    fn a_head_split_anywhere_is_judged_the_same() {
        let bad = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTRANSFER-ENCODING: chunked\r\n\r\n";
        let good = b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        for cut in 0..bad.len() {
            let mut s = Scan::default();
            assert!(s.feed(&bad[..cut]) || s.feed(&bad[cut..]), "cut at {cut}");
        }
        for cut in 0..good.len() {
            let mut s = Scan::default();
            assert!(!s.feed(&good[..cut]) && !s.feed(&good[cut..]), "cut at {cut}");
        }
    }
}
