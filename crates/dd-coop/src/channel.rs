//! The encrypted channel every peer session runs in (issue 30, item 2; `docs/protocol.md`, "Peer
//! protocol"). No I/O: the daemon's listener and client move the bytes.
//!
//! **Construction** (none of our own): the Noise protocol `Noise_NN_25519_ChaChaPoly_BLAKE2s` through
//! the `snow` crate, the primitives WireGuard uses. The two messages of NN agree fresh ephemeral
//! X25519 keys; every later byte travels in ChaCha20-Poly1305 records keyed by that agreement, each
//! with Noise's implicit 64-bit counter as its nonce. NN alone authenticates nobody: the peer
//! handshake that follows inside the channel (`identity`) has each node sign a transcript holding the
//! channel's **handshake hash** ([`Channel::binding`]), the channel binding of Noise's section 11.2.
//! A relay that runs its own NN with each side gets two different hashes, so neither node's signature
//! verifies on the other leg; a relay that only passes bytes holds no key, so it can neither read nor
//! add, change, drop, reorder or replay a record without the receiver's decryption failing (the
//! counter must match), and a failed record ends the session.
//!
//! **Records**: `u16` little-endian length, then that many bytes of one Noise message (at most
//! 65535: [`MAX_PLAIN`] bytes of plaintext and the 16-byte tag). The two handshake messages are framed
//! the same way. Plaintext is a stream: a peer frame may span records and a record may end inside one.
//!
//! Invariants: a [`Channel`] exists only after a completed handshake; a record that fails to decrypt
//! is an error, never plaintext; keys and plaintext never appear in `Debug` output.

use thiserror::Error;

/// The Noise protocol name (pattern, DH, cipher, hash).
pub const NOISE_PARAMS: &str = "Noise_NN_25519_ChaChaPoly_BLAKE2s";
/// Bytes of a record's length field.
pub const RECORD_HEADER: usize = 2;
/// The longest record (one Noise message: plaintext and tag).
pub const MAX_RECORD: usize = 65535;
/// Bytes of the authentication tag of each record.
pub const TAG_LEN: usize = 16;
/// The most plaintext one record carries.
pub const MAX_PLAIN: usize = MAX_RECORD - TAG_LEN;
/// The longest handshake message either side accepts (NN's are 32 and 48 bytes): read before anything
/// is authenticated, so it is small.
pub const MAX_HANDSHAKE_MESSAGE: usize = 64;
/// Bytes of the handshake hash (BLAKE2s).
pub const BINDING_LEN: usize = 32;

/// Why the channel failed: the session ends.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// A handshake message or record that does not decrypt or verify (tampered, replayed, reordered,
    /// from another session, or not a Noise message at all).
    #[error("a record failed authentication")]
    Decrypt,
    #[error("a record of {0} bytes is outside the limit")]
    Length(usize),
    #[error("noise: {0}")]
    Noise(String),
}

fn noise(e: snow::Error) -> ChannelError {
    ChannelError::Noise(e.to_string())
}

fn builder() -> snow::Builder<'static> {
    snow::Builder::new(NOISE_PARAMS.parse().expect("a valid protocol name"))
}

/// The side that connected, after its first message.
pub struct Initiator(snow::HandshakeState);

/// Starts a handshake as the connecting side: the first message, framed, to send.
pub fn initiate() -> Result<(Initiator, Vec<u8>), ChannelError> {
    let mut hs = builder().build_initiator().map_err(noise)?;
    let mut msg = [0u8; MAX_HANDSHAKE_MESSAGE];
    let n = hs.write_message(&[], &mut msg).map_err(noise)?;
    Ok((Initiator(hs), framed(&msg[..n])))
}

impl Initiator {
    /// Completes the handshake with the accepting side's message (its record body).
    pub fn finish(mut self, msg: &[u8]) -> Result<Channel, ChannelError> {
        let mut scratch = [0u8; MAX_HANDSHAKE_MESSAGE];
        self.0.read_message(msg, &mut scratch).map_err(|_| ChannelError::Decrypt)?;
        Channel::from_handshake(self.0)
    }
}

/// Answers a connecting side's first message (its record body): the channel and the answer, framed.
pub fn respond(msg: &[u8]) -> Result<(Channel, Vec<u8>), ChannelError> {
    let mut hs = builder().build_responder().map_err(noise)?;
    let mut scratch = [0u8; MAX_HANDSHAKE_MESSAGE];
    hs.read_message(msg, &mut scratch).map_err(|_| ChannelError::Decrypt)?;
    let mut out = [0u8; MAX_HANDSHAKE_MESSAGE];
    let n = hs.write_message(&[], &mut out).map_err(noise)?;
    Ok((Channel::from_handshake(hs)?, framed(&out[..n])))
}

fn framed(msg: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(RECORD_HEADER + msg.len());
    v.extend_from_slice(&(msg.len() as u16).to_le_bytes());
    v.extend_from_slice(msg);
    v
}

/// The length of the record whose header is `head`; an error when it cannot be a record (empty, or
/// shorter than a tag).
pub fn record_len(head: [u8; RECORD_HEADER]) -> Result<usize, ChannelError> {
    let n = u16::from_le_bytes(head) as usize;
    if n < TAG_LEN {
        return Err(ChannelError::Length(n));
    }
    Ok(n)
}

/// One session's keys after the handshake: seals what this side sends, opens what it receives.
pub struct Channel {
    transport: snow::TransportState,
    binding: [u8; BINDING_LEN],
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Channel")
    }
}

impl Channel {
    fn from_handshake(hs: snow::HandshakeState) -> Result<Channel, ChannelError> {
        let binding: [u8; BINDING_LEN] =
            hs.get_handshake_hash().try_into().map_err(|_| ChannelError::Noise("hash length".into()))?;
        Ok(Channel { transport: hs.into_transport_mode().map_err(noise)?, binding })
    }

    /// The handshake hash both sides share (and nobody else): what the identity signatures cover.
    pub fn binding(&self) -> &[u8; BINDING_LEN] {
        &self.binding
    }

    /// Appends `plain` to `out` as records (as many as its length needs; none for nothing).
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) -> Result<(), ChannelError> {
        for chunk in plain.chunks(MAX_PLAIN) {
            let at = out.len();
            out.resize(at + RECORD_HEADER + chunk.len() + TAG_LEN, 0);
            let n = self.transport.write_message(chunk, &mut out[at + RECORD_HEADER..]).map_err(noise)?;
            out[at..at + RECORD_HEADER].copy_from_slice(&(n as u16).to_le_bytes());
            out.truncate(at + RECORD_HEADER + n);
        }
        Ok(())
    }

    /// Decrypts one record's body (after its length field) and appends its plaintext to `out`.
    pub fn open(&mut self, record: &[u8], out: &mut Vec<u8>) -> Result<(), ChannelError> {
        if record.len() < TAG_LEN || record.len() > MAX_RECORD {
            return Err(ChannelError::Length(record.len()));
        }
        let at = out.len();
        out.resize(at + record.len() - TAG_LEN, 0);
        match self.transport.read_message(record, &mut out[at..]) {
            Ok(n) => {
                out.truncate(at + n);
                Ok(())
            }
            Err(_) => {
                out.truncate(at);
                Err(ChannelError::Decrypt)
            }
        }
    }
}

/// Test helpers: a connected pair without sockets.
#[cfg(any(test, feature = "testing"))]
pub fn pair() -> (Channel, Channel) {
    let (i, m1) = initiate().expect("initiate");
    let (r, m2) = respond(&m1[RECORD_HEADER..]).expect("respond");
    (i.finish(&m2[RECORD_HEADER..]).expect("finish"), r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits records out of `bytes` and opens each with `ch`.
    fn open_all(ch: &mut Channel, mut bytes: &[u8]) -> Result<Vec<u8>, ChannelError> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let n = record_len([bytes[0], bytes[1]])?;
            ch.open(&bytes[RECORD_HEADER..RECORD_HEADER + n], &mut out)?;
            bytes = &bytes[RECORD_HEADER + n..];
        }
        Ok(out)
    }

    #[test]
    fn both_sides_share_a_binding_and_exchange_any_length() {
        let (mut a, mut b) = pair();
        assert_eq!(a.binding(), b.binding());
        let (c, _) = pair();
        assert_ne!(a.binding(), c.binding(), "every handshake has its own hash");
        for len in [0, 1, 4096, MAX_PLAIN, MAX_PLAIN + 1, 3 * MAX_PLAIN + 7] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let mut wire = Vec::new();
            a.seal(&plain, &mut wire).unwrap();
            assert!(!wire.windows(64.min(len.max(1))).any(|w| len >= 64 && w == &plain[..64]), "in clear");
            assert_eq!(open_all(&mut b, &wire).unwrap(), plain, "{len}");
            let mut back = Vec::new();
            b.seal(&plain, &mut back).unwrap();
            assert_eq!(open_all(&mut a, &back).unwrap(), plain, "{len} back");
        }
    }

    #[test]
    fn tampered_replayed_reordered_or_foreign_records_are_refused() {
        let (mut a, mut b) = pair();
        let (mut r1, mut r2) = (Vec::new(), Vec::new());
        a.seal(b"first", &mut r1).unwrap();
        a.seal(b"second", &mut r2).unwrap();
        // Reordered: the second before the first.
        assert_eq!(open_all(&mut b, &r2), Err(ChannelError::Decrypt));
        let (mut a, mut b) = pair();
        let (mut r1, mut r2) = (Vec::new(), Vec::new());
        a.seal(b"first", &mut r1).unwrap();
        a.seal(b"second", &mut r2).unwrap();
        assert_eq!(open_all(&mut b, &r1).unwrap(), b"first");
        // Replayed.
        assert_eq!(open_all(&mut b, &r1), Err(ChannelError::Decrypt));
        // Tampered.
        let (mut a, mut b) = pair();
        let mut r = Vec::new();
        a.seal(b"a fetch of pin 7", &mut r).unwrap();
        r[5] ^= 1;
        assert_eq!(open_all(&mut b, &r), Err(ChannelError::Decrypt));
        // Sealed in another session (what a relay that holds its own channel could send).
        let (mut m, _) = pair();
        let (_, mut b) = pair();
        let mut r = Vec::new();
        m.seal(b"injected", &mut r).unwrap();
        assert_eq!(open_all(&mut b, &r), Err(ChannelError::Decrypt));
        // Not even a record.
        assert!(record_len([3, 0]).is_err());
    }
}
