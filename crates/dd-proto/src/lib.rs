//! # dd-proto: the DoubleDecker data-plane wire format
//!
//! This crate owns the bytes on the wire between a guest (the `dd-client` library) and the host cache
//! manager (`dd-server`), and nothing else: no sockets, no engine calls. `docs/protocol.md` is the
//! human-readable specification of the same format; the two must agree (the unit tests here pin the
//! layout with literal byte strings).
//!
//! * [`frame`]: the 20-byte frame header, splitting a byte stream into frames, response framing.
//! * [`msg`]: requests (borrowing from the received payload, so a put is not copied before it reaches
//!   the engine) and responses (owned, for the client), with encode and decode.
//! * [`status`]: the stable numeric status codes: 0 ok, engine errors use `CacheError::code()`, and the
//!   protocol's own codes from 100 up.
//!
//! Invariants: decoding never panics and never allocates more than the payload it was given implies
//! (batch counts are checked against the payload length before any `Vec` is sized), and every decode
//! error maps to a documented status code.
#![forbid(unsafe_code)] // nothing here needs it: unsafe code lives in dd-engine, dd-fuse, dd-memctl and the few FFI calls of the other crates

pub mod frame;
pub mod msg;
pub mod status;

pub use frame::{Header, Op, FLAG_RESPONSE, HEADER_LEN, MAGIC};
pub use msg::{KeyList, Request, Response};
pub use status::Status;

/// The newest protocol version this crate speaks. HELLO negotiates it (see `docs/protocol.md`,
/// "Versioning"). Version 2 adds the daemon's instance id to the HELLO response; every other layout is
/// that of version 1.
pub const PROTOCOL_VERSION: u8 = 2;
/// The oldest version this crate can speak.
pub const MIN_PROTOCOL_VERSION: u8 = 1;

/// The version byte of an answer sent before a session negotiated one (a failed HELLO, a frame whose
/// header is refused): the client's own version byte when this crate speaks it, so a version-1 client
/// reads every answer in its version (issue 30, item 4); the newest version otherwise.
pub fn answer_version(client: Option<u8>) -> u8 {
    match client {
        Some(v) if (MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&v) => v,
        _ => PROTOCOL_VERSION,
    }
}
/// Default largest payload a peer accepts (2 MiB: a full default batch of 256 4 KiB pages plus keys).
pub const DEFAULT_MAX_PAYLOAD_BYTES: u32 = 2 * 1024 * 1024;
/// No configuration may raise the payload limit above this (64 MiB).
pub const ABSOLUTE_MAX_PAYLOAD_BYTES: u32 = 64 * 1024 * 1024;
/// Default largest number of pages in one batched request.
pub const DEFAULT_MAX_BATCH: u32 = 256;
/// Longest token a HELLO may carry.
pub const MAX_TOKEN_BYTES: usize = 256;
/// Largest HELLO payload (`min_version u16, max_version u16, vm u32, token_len u16`, the longest token):
/// before authentication a receiver refuses any frame that announces more, from its header alone.
pub const MAX_HELLO_PAYLOAD_BYTES: u32 = 2 + 2 + 4 + 2 + MAX_TOKEN_BYTES as u32;
/// Longest error message a server puts in an error response.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 1024;

/// Errors of decoding (and of framing). Each maps to a stable [`Status`] via [`ProtoError::status`].
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    /// The frame does not start with the magic bytes: the stream is not (or no longer) framed.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// The payload length exceeds the receiver's limit.
    #[error("payload of {len} bytes exceeds the limit of {limit}")]
    FrameTooLarge { len: u32, limit: u32 },
    /// The op byte names no operation of this protocol version.
    #[error("unknown op {0}")]
    UnknownOp(u8),
    /// The payload does not have the layout its op requires.
    #[error("malformed {op} payload: {reason}")]
    Malformed { op: &'static str, reason: &'static str },
    /// A batch carries more entries than the limit.
    #[error("batch of {got} exceeds the limit of {limit}")]
    BatchTooLarge { got: u32, limit: u32 },
    /// HELLO asked for versions this side does not speak, or a frame carries another version than the
    /// negotiated one.
    #[error("unsupported protocol version {0}")]
    UnsupportedVersion(u16),
}

impl ProtoError {
    /// The status code that reports this error on the wire.
    pub fn status(&self) -> Status {
        match self {
            ProtoError::BadMagic(_) => Status::BAD_MAGIC,
            ProtoError::FrameTooLarge { .. } => Status::FRAME_TOO_LARGE,
            ProtoError::UnknownOp(_) => Status::UNKNOWN_OP,
            ProtoError::Malformed { .. } => Status::MALFORMED,
            ProtoError::BatchTooLarge { .. } => Status::BATCH_TOO_LARGE,
            ProtoError::UnsupportedVersion(_) => Status::UNSUPPORTED_VERSION,
        }
    }

    /// Whether the byte stream can still be parsed after this error. After a fatal error the receiver
    /// cannot find the next frame boundary (bad magic) or will not read the payload (too large), so it
    /// reports the error and closes the connection; after any other error the frame was well-formed
    /// and the connection stays usable.
    pub fn is_fatal(&self) -> bool {
        matches!(self, ProtoError::BadMagic(_) | ProtoError::FrameTooLarge { .. })
    }
}
