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

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// The answer to a conflicting head.
const REFUSAL: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 102\r\n\
connection: close\r\n\r\n{\"code\":\"conflicting_framing\",\"message\":\"both Content-Length and Transfer-Encoding: send one framing\"}";

/// A TCP listener whose connections refuse conflicting framing headers (give it to `axum::serve`).
#[derive(Debug)]
pub struct AdminListener(pub TcpListener);

impl axum::serve::Listener for AdminListener {
    type Io = Checked;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Checked, std::net::SocketAddr) {
        let (s, a) = axum::serve::Listener::accept(&mut self.0).await;
        (Checked { inner: s, scan: Scan::default(), refused: false }, a)
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.0.local_addr()
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
    inner: TcpStream,
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
        if self.refused {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.scan.feed(&buf.filled()[before..]) {
                    // Held back: hyper never sees this head complete.
                    buf.set_filled(before);
                    this.refused = true;
                    // The socket's send buffer is empty between requests (hyper wrote every answer
                    // before reading on), so one non-blocking write takes the whole refusal.
                    let _ = this.inner.try_write(REFUSAL);
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
