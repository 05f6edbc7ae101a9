//! Frames: a fixed 20-byte little-endian header followed by `payload_len` bytes of payload.
//!
//! ```text
//! offset size field
//!      0    2 magic        b"DD" (0x44 0x44)
//!      2    1 version      protocol version (HELLO may carry any; afterwards the negotiated one)
//!      3    1 op           operation (the response echoes the request's op)
//!      4    2 flags        bit 0: response; all other bits reserved, must be 0
//!      6    2 status       0 in requests; the response's status code
//!      8    8 request_id   chosen by the client, echoed in the response (pipelining)
//!     16    4 payload_len  bytes of payload after the header
//! ```
//!
//! Invariant: [`split_frame`] never looks past the bytes it is given, and rejects a payload length above
//! the receiver's limit before anything is buffered for it, which bounds per-connection memory.

use crate::status::Status;
use crate::ProtoError;

pub const HEADER_LEN: usize = 20;
pub const MAGIC: [u8; 2] = *b"DD";
/// Flag bit of a response frame.
pub const FLAG_RESPONSE: u16 = 1;

/// Operations. The numbers are stable; new operations get new numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    Hello = 1,
    Ping = 2,
    CreatePool = 3,
    DestroyPool = 4,
    SetSpec = 5,
    Put = 6,
    Get = 7,
    FlushPage = 8,
    FlushObject = 9,
    MigrateObject = 10,
    PutBatch = 11,
    GetBatch = 12,
    PoolStats = 13,
    VmStats = 14,
    ListPools = 15,
    SetLabel = 16,
}

impl Op {
    pub const ALL: [Op; 16] = [
        Op::Hello,
        Op::Ping,
        Op::CreatePool,
        Op::DestroyPool,
        Op::SetSpec,
        Op::Put,
        Op::Get,
        Op::FlushPage,
        Op::FlushObject,
        Op::MigrateObject,
        Op::PutBatch,
        Op::GetBatch,
        Op::PoolStats,
        Op::VmStats,
        Op::ListPools,
        Op::SetLabel,
    ];

    pub fn from_u8(v: u8) -> Option<Op> {
        Op::ALL.get((v as usize).wrapping_sub(1)).copied()
    }

    /// Stable lowercase name (metrics labels, logs).
    pub fn name(self) -> &'static str {
        match self {
            Op::Hello => "hello",
            Op::Ping => "ping",
            Op::CreatePool => "create_pool",
            Op::DestroyPool => "destroy_pool",
            Op::SetSpec => "set_spec",
            Op::Put => "put",
            Op::Get => "get",
            Op::FlushPage => "flush_page",
            Op::FlushObject => "flush_object",
            Op::MigrateObject => "migrate_object",
            Op::PutBatch => "put_batch",
            Op::GetBatch => "get_batch",
            Op::PoolStats => "pool_stats",
            Op::VmStats => "vm_stats",
            Op::ListPools => "list_pools",
            Op::SetLabel => "set_label",
        }
    }
}

/// A decoded frame header. `op` is the raw byte: an unknown op is still a well-formed frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub op: u8,
    pub flags: u16,
    pub status: u16,
    pub request_id: u64,
    pub payload_len: u32,
}

impl Header {
    pub fn is_response(&self) -> bool {
        self.flags & FLAG_RESPONSE != 0
    }

    pub fn status(&self) -> Status {
        Status(self.status)
    }

    /// Decodes a header. Fails only on bad magic; the caller checks the length against its limit.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, ProtoError> {
        if b[0..2] != MAGIC {
            return Err(ProtoError::BadMagic(u16::from_le_bytes([b[0], b[1]])));
        }
        Ok(Header {
            version: b[2],
            op: b[3],
            flags: u16::from_le_bytes([b[4], b[5]]),
            status: u16::from_le_bytes([b[6], b[7]]),
            request_id: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            payload_len: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.push(self.version);
        out.push(self.op);
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&self.request_id.to_le_bytes());
        out.extend_from_slice(&self.payload_len.to_le_bytes());
    }
}

/// Finds the first complete frame at the start of `buf`. Returns `Ok(None)` when more bytes are
/// needed, `Ok(Some((header, total_len)))` when `buf[..total_len]` is one frame (header + payload).
/// A payload longer than `max_payload` is refused as soon as the header is readable.
pub fn split_frame(buf: &[u8], max_payload: u32) -> Result<Option<(Header, usize)>, ProtoError> {
    let Some(hb) = buf.get(..HEADER_LEN) else { return Ok(None) };
    let h = Header::decode(hb.try_into().expect("header length"))?;
    if h.payload_len > max_payload {
        return Err(ProtoError::FrameTooLarge { len: h.payload_len, limit: max_payload });
    }
    let total = HEADER_LEN + h.payload_len as usize;
    Ok(if buf.len() >= total { Some((h, total)) } else { None })
}

/// Starts a response frame in `out`; returns the offset to pass to [`finish_response`]. The caller
/// appends the payload in between.
pub fn begin_response(out: &mut Vec<u8>, version: u8, op: u8, request_id: u64) -> usize {
    let start = out.len();
    Header { version, op, flags: FLAG_RESPONSE, status: 0, request_id, payload_len: 0 }.encode(out);
    start
}

/// Completes the frame begun at `start`: patches its status and payload length.
pub fn finish_response(out: &mut [u8], start: usize, status: Status) {
    let len = (out.len() - start - HEADER_LEN) as u32;
    out[start + 6..start + 8].copy_from_slice(&status.0.to_le_bytes());
    out[start + 16..start + 20].copy_from_slice(&len.to_le_bytes());
}

/// Writes a complete error response: status and a UTF-8 message (cut to
/// [`crate::MAX_ERROR_MESSAGE_BYTES`] at a character boundary).
pub fn write_error(out: &mut Vec<u8>, version: u8, op: u8, request_id: u64, status: Status, message: &str) {
    let start = begin_response(out, version, op, request_id);
    let mut end = message.len().min(crate::MAX_ERROR_MESSAGE_BYTES);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&message.as_bytes()[..end]);
    finish_response(out, start, status);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_is_pinned() {
        let h = Header { version: 1, op: 7, flags: 1, status: 11, request_id: 0x0102, payload_len: 5 };
        let mut v = Vec::new();
        h.encode(&mut v);
        assert_eq!(
            v,
            [b'D', b'D', 1, 7, 1, 0, 11, 0, 2, 1, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0],
            "the layout documented in docs/protocol.md"
        );
        assert_eq!(Header::decode(v[..].try_into().unwrap()).unwrap(), h);
    }

    #[test]
    fn split_waits_for_whole_frames_and_refuses_large_ones() {
        let mut v = Vec::new();
        Header { version: 1, op: 2, flags: 0, status: 0, request_id: 9, payload_len: 3 }.encode(&mut v);
        v.extend_from_slice(&[1, 2, 3]);
        for cut in 0..v.len() {
            assert_eq!(split_frame(&v[..cut], 100).unwrap(), None, "cut at {cut}");
        }
        let (h, n) = split_frame(&v, 100).unwrap().unwrap();
        assert_eq!((h.request_id, n), (9, 23));
        assert_eq!(split_frame(&v, 2), Err(ProtoError::FrameTooLarge { len: 3, limit: 2 }));
        v[0] = b'X';
        assert!(matches!(split_frame(&v, 100), Err(ProtoError::BadMagic(_))));
    }

    #[test]
    fn error_messages_are_bounded() {
        let mut out = Vec::new();
        let long = "é".repeat(4000);
        write_error(&mut out, 1, 6, 1, Status::MALFORMED, &long);
        let (h, n) = split_frame(&out, u32::MAX).unwrap().unwrap();
        assert_eq!(n, out.len());
        assert!(h.payload_len as usize <= crate::MAX_ERROR_MESSAGE_BYTES);
        assert!(std::str::from_utf8(&out[HEADER_LEN..]).is_ok());
        assert_eq!(h.status(), Status::MALFORMED);
    }

    #[test]
    fn op_numbers_round_trip() {
        for op in Op::ALL {
            assert_eq!(Op::from_u8(op as u8), Some(op));
        }
        assert_eq!(Op::from_u8(0), None);
        assert_eq!(Op::from_u8(17), None);
        assert_eq!(Op::from_u8(255), None);
    }
}
