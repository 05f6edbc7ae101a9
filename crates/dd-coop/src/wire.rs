//! The peer-to-peer wire format of co-operative de-duplication (no I/O): daemons exchange summaries,
//! remote compares, fetches of pinned pages and unpins on a listener of their own (`coop.listen`),
//! separate from the guests' data plane. Documented in `docs/protocol.md` ("Peer protocol").
//!
//! Framing copies the data plane's: a 20-byte header (`magic "DP"`, version, op, flags, status,
//! request id, payload length; little-endian) and a payload. A response echoes the op and request id and
//! sets flag bit 0. Every frame's payload is bounded by the caller's `max_payload` before it is read.
//!
//! **Why not dd-proto's codec** (issue 15, item 3; `docs/decisions.md` D23): the header layout, the
//! byte reader and the status type look like the data plane's (`dd_proto::frame`, `msg`, `status`),
//! but they are kept apart on purpose. dd-proto depends on the engine (its messages carry engine types
//! and its statuses are `CacheError::code()`), and this crate is the part of co-operation that has no
//! engine; the magic differs (`DP` against `DD`) so that a peer dialling a data-plane port, or a guest a
//! peer port, fails on the first two bytes; the version is fixed and checked in the header here (a
//! version-1 peer, with a shared secret, must get `bad_frame` before anything else), where the data
//! plane negotiates it in HELLO and lets any version through its header; and the status codes are two
//! separate stable lists (here 1-7; there 10-99 the engine's, 100 and up the protocol's) that must never
//! be merged or renumbered. What is shared would be about sixty lines of byte shuffling, each side
//! pinned by its own tests and fuzz target; sharing them would tie two stable formats' evolution.
//!
//! Invariants: decoding never panics on any input and never allocates more than the payload it is
//! given; every decoded message re-encodes to a frame that decodes to the same message (the fuzz target
//! `peer_decoder` checks both); status codes are stable and never reused.

use crate::identity::{NONCE_LEN, SIGNATURE_LENGTH};
use thiserror::Error;

pub const MAGIC: [u8; 2] = *b"DP";
/// Version 3: every frame inside the encrypted channel (`channel`), whose handshake hash the identity
/// signatures cover. Version 2 had per-node keys in the clear; version 1 a shared secret.
pub const VERSION: u8 = 3;
pub const HEADER_LEN: usize = 20;
pub const FLAG_RESPONSE: u16 = 1;
/// The largest payload any peer accepts: a summary of 2^29 bits (64 MiB) plus its header fields.
pub const ABSOLUTE_MAX_PAYLOAD: u32 = (64 << 20) + 64;
/// Longest node name.
pub const MAX_NAME: usize = 255;

/// The largest answer payload a client reads for pages of `page_size` bytes: a fetched page and its
/// header fields, or an error message, whichever is longer. The daemon's client refuses anything
/// longer; the peer_handler fuzz target checks the listener never answers past it.
pub const fn max_answer_payload(page_size: usize) -> usize {
    if page_size + 64 > 4096 {
        page_size + 64
    } else {
        4096
    }
}
/// Most pins in one UNPIN.
pub const MAX_UNPIN: usize = 65536;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PeerOp {
    Hello = 1,
    Summary = 2,
    Compare = 3,
    Fetch = 4,
    Unpin = 5,
    Auth = 6,
}

impl PeerOp {
    pub fn from_u8(v: u8) -> Option<PeerOp> {
        Some(match v {
            1 => PeerOp::Hello,
            2 => PeerOp::Summary,
            3 => PeerOp::Compare,
            4 => PeerOp::Fetch,
            5 => PeerOp::Unpin,
            6 => PeerOp::Auth,
            _ => return None,
        })
    }
}

/// Stable status codes of the peer protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerStatus(pub u16);

impl PeerStatus {
    pub const OK: PeerStatus = PeerStatus(0);
    /// A name outside the membership, or a signature that does not verify: the connection is closed.
    pub const AUTH_FAILED: PeerStatus = PeerStatus(1);
    /// The first frame was not HELLO (or the second not AUTH): closed.
    pub const NOT_AUTHENTICATED: PeerStatus = PeerStatus(2);
    pub const MALFORMED: PeerStatus = PeerStatus(3);
    pub const UNKNOWN_OP: PeerStatus = PeerStatus(4);
    /// The payload is above the receiver's limit: closed without reading it.
    pub const TOO_LARGE: PeerStatus = PeerStatus(5);
    /// Bad magic or version: closed.
    pub const BAD_FRAME: PeerStatus = PeerStatus(6);
    /// The receiver does not do co-operative de-duplication with this sender (summary of the wrong
    /// size, de-duplication off).
    pub const REFUSED: PeerStatus = PeerStatus(7);
    /// The node already holds its `coop.max_sessions_per_peer` sessions on this listener: refused at
    /// AUTH, closed (issue 30, item 1).
    pub const BUSY: PeerStatus = PeerStatus(8);

    /// Whether the listener closes the connection after this answer (a failed handshake, a frame it
    /// cannot read): the session is over, unlike an answer about one request, after which the
    /// connection stays in step. `peers::starts_backoff` backs off after these.
    pub fn ends_session(self) -> bool {
        matches!(
            self,
            PeerStatus::AUTH_FAILED
                | PeerStatus::NOT_AUTHENTICATED
                | PeerStatus::TOO_LARGE
                | PeerStatus::BAD_FRAME
                | PeerStatus::BUSY
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum WireError {
    #[error("bad magic or version")]
    BadFrame,
    #[error("payload of {0} bytes is above the limit")]
    TooLarge(u32),
    #[error("unknown op {0}")]
    UnknownOp(u8),
    #[error("malformed {0} payload")]
    Malformed(&'static str),
}

impl WireError {
    pub fn status(&self) -> PeerStatus {
        match self {
            WireError::BadFrame => PeerStatus::BAD_FRAME,
            WireError::TooLarge(_) => PeerStatus::TOO_LARGE,
            WireError::UnknownOp(_) => PeerStatus::UNKNOWN_OP,
            WireError::Malformed(_) => PeerStatus::MALFORMED,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerHeader {
    pub op: u8,
    pub flags: u16,
    pub status: u16,
    pub request_id: u64,
    pub payload_len: u32,
}

/// Parses a header. `Ok(None)` when fewer than 20 bytes are there.
pub fn parse_header(buf: &[u8], max_payload: u32) -> Result<Option<PeerHeader>, WireError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    if buf[0..2] != MAGIC || buf[2] != VERSION {
        return Err(WireError::BadFrame);
    }
    let h = PeerHeader {
        op: buf[3],
        flags: u16::from_le_bytes([buf[4], buf[5]]),
        status: u16::from_le_bytes([buf[6], buf[7]]),
        request_id: u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes")),
        payload_len: u32::from_le_bytes(buf[16..20].try_into().expect("4 bytes")),
    };
    if h.payload_len > max_payload.min(ABSOLUTE_MAX_PAYLOAD) {
        return Err(WireError::TooLarge(h.payload_len));
    }
    Ok(Some(h))
}

fn begin(out: &mut Vec<u8>, op: u8, flags: u16, status: PeerStatus, id: u64) -> usize {
    let at = out.len();
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.push(op);
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&status.0.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    at
}

fn finish(out: &mut [u8], at: usize) {
    let len = (out.len() - at - HEADER_LEN) as u32;
    out[at + 16..at + 20].copy_from_slice(&len.to_le_bytes());
}

/// A request between daemons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerRequest<'a> {
    /// First frame: who the sender claims to be, its restart epoch and a fresh random nonce.
    Hello { name: &'a str, epoch: u64, nonce: [u8; NONCE_LEN] },
    /// Second frame: the sender's signature of the handshake transcript (`identity::Transcript`).
    Auth { signature: [u8; SIGNATURE_LENGTH] },
    /// The sender's content summary (a Bloom filter's bits; `bits.len() * 8 == m_bits`).
    Summary { m_bits: u64, k_hashes: u32, bits: &'a [u8] },
    /// Remote compare (Algorithm 4): pin a frame equal to `page` for the sender.
    Compare { hash: u128, page: &'a [u8] },
    /// Remotified get: the bytes of a pin the sender holds.
    Fetch { pin: u64 },
    /// Releases pins the sender holds.
    Unpin { pins: Vec<u64> },
}

/// A successful response (errors carry a status and a UTF-8 message instead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerResponse<'a> {
    /// The receiver's name and epoch, its nonce and its signature of the transcript.
    Hello {
        name: &'a str,
        epoch: u64,
        nonce: [u8; NONCE_LEN],
        signature: [u8; SIGNATURE_LENGTH],
    },
    Done,
    /// `Some(pin)` when an equal frame was found and pinned.
    Compared(Option<u64>),
    Fetched(Option<&'a [u8]>),
    Unpinned(u32),
}

struct Reader<'a> {
    b: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.b.len() < n {
            return Err(WireError::Malformed(self.what));
        }
        let (a, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn u128(&mut self) -> Result<u128, WireError> {
        Ok(u128::from_le_bytes(self.take(16)?.try_into().expect("16")))
    }
    fn end(self) -> Result<(), WireError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(WireError::Malformed(self.what))
        }
    }
}

impl<'a> PeerRequest<'a> {
    pub fn op(&self) -> PeerOp {
        match self {
            PeerRequest::Hello { .. } => PeerOp::Hello,
            PeerRequest::Summary { .. } => PeerOp::Summary,
            PeerRequest::Compare { .. } => PeerOp::Compare,
            PeerRequest::Fetch { .. } => PeerOp::Fetch,
            PeerRequest::Unpin { .. } => PeerOp::Unpin,
            PeerRequest::Auth { .. } => PeerOp::Auth,
        }
    }

    /// Appends the request as one frame.
    pub fn encode(&self, id: u64, out: &mut Vec<u8>) {
        let at = begin(out, self.op() as u8, 0, PeerStatus::OK, id);
        match self {
            PeerRequest::Hello { name, epoch, nonce } => {
                out.extend_from_slice(&(name.len() as u16).to_le_bytes());
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(&epoch.to_le_bytes());
                out.extend_from_slice(nonce);
            }
            PeerRequest::Auth { signature } => out.extend_from_slice(signature),
            PeerRequest::Summary { m_bits, k_hashes, bits } => {
                out.extend_from_slice(&m_bits.to_le_bytes());
                out.extend_from_slice(&k_hashes.to_le_bytes());
                out.extend_from_slice(bits);
            }
            PeerRequest::Compare { hash, page } => {
                out.extend_from_slice(&hash.to_le_bytes());
                out.extend_from_slice(page);
            }
            PeerRequest::Fetch { pin } => out.extend_from_slice(&pin.to_le_bytes()),
            PeerRequest::Unpin { pins } => {
                out.extend_from_slice(&(pins.len() as u32).to_le_bytes());
                for p in pins {
                    out.extend_from_slice(&p.to_le_bytes());
                }
            }
        }
        finish(out, at);
    }

    /// Decodes a request payload. `page_size` is the only page length accepted.
    pub fn decode(op: u8, payload: &'a [u8], page_size: usize) -> Result<PeerRequest<'a>, WireError> {
        let op = PeerOp::from_u8(op).ok_or(WireError::UnknownOp(op))?;
        let what = match op {
            PeerOp::Hello => "hello",
            PeerOp::Summary => "summary",
            PeerOp::Compare => "compare",
            PeerOp::Fetch => "fetch",
            PeerOp::Unpin => "unpin",
            PeerOp::Auth => "auth",
        };
        let mut r = Reader { b: payload, what };
        let req = match op {
            PeerOp::Hello => {
                let n = r.u16()? as usize;
                if n > MAX_NAME {
                    return Err(WireError::Malformed(what));
                }
                let name = std::str::from_utf8(r.take(n)?).map_err(|_| WireError::Malformed(what))?;
                let epoch = r.u64()?;
                let nonce = r.take(NONCE_LEN)?.try_into().expect("NONCE_LEN bytes");
                PeerRequest::Hello { name, epoch, nonce }
            }
            PeerOp::Auth => {
                PeerRequest::Auth { signature: r.take(SIGNATURE_LENGTH)?.try_into().expect("64 bytes") }
            }
            PeerOp::Summary => {
                let m_bits = r.u64()?;
                let k_hashes = r.u32()?;
                let bits = r.b;
                if bits.len() as u64 * 8 != m_bits {
                    return Err(WireError::Malformed(what));
                }
                r.b = &[];
                PeerRequest::Summary { m_bits, k_hashes, bits }
            }
            PeerOp::Compare => {
                let hash = r.u128()?;
                let page = r.take(page_size)?;
                PeerRequest::Compare { hash, page }
            }
            PeerOp::Fetch => PeerRequest::Fetch { pin: r.u64()? },
            PeerOp::Unpin => {
                let n = r.u32()? as usize;
                if n > MAX_UNPIN || r.b.len() != n * 8 {
                    return Err(WireError::Malformed(what));
                }
                let pins = (0..n).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
                PeerRequest::Unpin { pins }
            }
        };
        r.end()?;
        Ok(req)
    }
}

impl<'a> PeerResponse<'a> {
    /// Appends the response to a request of `op` as one frame.
    pub fn encode(&self, op: u8, id: u64, out: &mut Vec<u8>) {
        let at = begin(out, op, FLAG_RESPONSE, PeerStatus::OK, id);
        match self {
            PeerResponse::Hello { name, epoch, nonce, signature } => {
                out.extend_from_slice(&epoch.to_le_bytes());
                out.extend_from_slice(&(name.len() as u16).to_le_bytes());
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(nonce);
                out.extend_from_slice(signature);
            }
            PeerResponse::Done => {}
            PeerResponse::Compared(pin) => {
                out.push(pin.is_some() as u8);
                out.extend_from_slice(&pin.unwrap_or(0).to_le_bytes());
            }
            PeerResponse::Fetched(page) => {
                out.push(page.is_some() as u8);
                if let Some(p) = page {
                    out.extend_from_slice(p);
                }
            }
            PeerResponse::Unpinned(n) => out.extend_from_slice(&n.to_le_bytes()),
        }
        finish(out, at);
    }

    /// Decodes the payload of a successful (status 0) response to a request of `op`.
    pub fn decode(op: u8, payload: &'a [u8], page_size: usize) -> Result<PeerResponse<'a>, WireError> {
        let op = PeerOp::from_u8(op).ok_or(WireError::UnknownOp(op))?;
        let mut r = Reader { b: payload, what: "response" };
        let resp = match op {
            PeerOp::Hello => {
                let epoch = r.u64()?;
                let n = r.u16()? as usize;
                if n > MAX_NAME {
                    return Err(WireError::Malformed("response"));
                }
                let name = std::str::from_utf8(r.take(n)?).map_err(|_| WireError::Malformed("response"))?;
                let nonce = r.take(NONCE_LEN)?.try_into().expect("NONCE_LEN bytes");
                let signature = r.take(SIGNATURE_LENGTH)?.try_into().expect("64 bytes");
                PeerResponse::Hello { name, epoch, nonce, signature }
            }
            PeerOp::Summary | PeerOp::Auth => PeerResponse::Done,
            PeerOp::Compare => {
                let found = r.u8()?;
                let pin = r.u64()?;
                match found {
                    0 => PeerResponse::Compared(None),
                    1 => PeerResponse::Compared(Some(pin)),
                    _ => return Err(WireError::Malformed("response")),
                }
            }
            PeerOp::Fetch => match r.u8()? {
                0 => PeerResponse::Fetched(None),
                1 => PeerResponse::Fetched(Some(r.take(page_size)?)),
                _ => return Err(WireError::Malformed("response")),
            },
            PeerOp::Unpin => PeerResponse::Unpinned(r.u32()?),
        };
        r.end()?;
        Ok(resp)
    }
}

/// Appends an error response (status and a message of at most 1024 bytes).
pub fn encode_error(op: u8, id: u64, status: PeerStatus, msg: &str, out: &mut Vec<u8>) {
    let at = begin(out, op, FLAG_RESPONSE, status, id);
    let mut end = msg.len().min(1024);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&msg.as_bytes()[..end]);
    finish(out, at);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip_req(req: PeerRequest<'_>) {
        let mut out = Vec::new();
        req.encode(77, &mut out);
        let h = parse_header(&out, u32::MAX).unwrap().unwrap();
        assert_eq!((h.op, h.request_id, h.flags), (req.op() as u8, 77, 0));
        assert_eq!(h.payload_len as usize, out.len() - HEADER_LEN);
        assert_eq!(PeerRequest::decode(h.op, &out[HEADER_LEN..], 8).unwrap(), req);
    }

    #[test]
    fn requests_roundtrip() {
        roundtrip_req(PeerRequest::Hello { name: "node-b", epoch: 42, nonce: [7; NONCE_LEN] });
        roundtrip_req(PeerRequest::Auth { signature: [5; SIGNATURE_LENGTH] });
        roundtrip_req(PeerRequest::Summary { m_bits: 128, k_hashes: 3, bits: &[0xa5; 16] });
        roundtrip_req(PeerRequest::Compare { hash: u128::MAX - 5, page: &[9; 8] });
        roundtrip_req(PeerRequest::Fetch { pin: 1 << 40 });
        roundtrip_req(PeerRequest::Unpin { pins: vec![1, 2, 3] });
    }

    #[test]
    fn responses_roundtrip() {
        let page = [3u8; 8];
        for (op, resp) in [
            (PeerOp::Hello, PeerResponse::Hello { name: "a", epoch: 9, nonce: [1; 32], signature: [2; 64] }),
            (PeerOp::Auth, PeerResponse::Done),
            (PeerOp::Summary, PeerResponse::Done),
            (PeerOp::Compare, PeerResponse::Compared(Some(5))),
            (PeerOp::Compare, PeerResponse::Compared(None)),
            (PeerOp::Fetch, PeerResponse::Fetched(Some(&page))),
            (PeerOp::Fetch, PeerResponse::Fetched(None)),
            (PeerOp::Unpin, PeerResponse::Unpinned(3)),
        ] {
            let mut out = Vec::new();
            resp.encode(op as u8, 5, &mut out);
            let h = parse_header(&out, u32::MAX).unwrap().unwrap();
            assert_eq!(h.flags, FLAG_RESPONSE);
            assert_eq!(PeerResponse::decode(h.op, &out[HEADER_LEN..], 8).unwrap(), resp);
        }
    }

    #[test]
    fn bad_input_is_an_error_never_a_panic() {
        assert_eq!(parse_header(b"DD\x01", 100).unwrap(), None);
        let mut out = Vec::new();
        PeerRequest::Fetch { pin: 1 }.encode(1, &mut out);
        out[0] = b'X';
        assert_eq!(parse_header(&out, 100), Err(WireError::BadFrame));
        out[0] = b'D';
        out[16] = 200;
        assert_eq!(parse_header(&out, 100), Err(WireError::TooLarge(200)));
        assert_eq!(PeerRequest::decode(9, &[], 8), Err(WireError::UnknownOp(9)));
        assert!(PeerRequest::decode(PeerOp::Compare as u8, &[0; 20], 8).is_err(), "short page");
        assert!(PeerRequest::decode(PeerOp::Compare as u8, &[0; 25], 8).is_err(), "long page");
        assert!(PeerRequest::decode(PeerOp::Summary as u8, &[0; 13], 8).is_err(), "bits do not match m");
        assert!(PeerRequest::decode(PeerOp::Unpin as u8, &[2, 0, 0, 0, 1], 8).is_err());
        assert!(PeerResponse::decode(PeerOp::Fetch as u8, &[2], 8).is_err());
        let mut e = Vec::new();
        encode_error(3, 4, PeerStatus::MALFORMED, &"é".repeat(600), &mut e);
        let h = parse_header(&e, u32::MAX).unwrap().unwrap();
        assert!(h.payload_len <= 1024 && std::str::from_utf8(&e[HEADER_LEN..]).is_ok());
    }
}
