//! Per-node identity of co-operative de-duplication peers (issue 12, defect 8; decision D18).
//!
//! Every daemon has its own ed25519 key pair. The membership lists each node's name with its public
//! key; a connection is a node only once it has signed a fresh challenge with that node's private key.
//! No secret is shared, so holding one node's key lets nobody speak as another node.
//!
//! The handshake (`docs/protocol.md`, "Peer protocol"): the client sends HELLO with its name, epoch
//! and a random nonce; the server answers with its own name, epoch, nonce and a signature over the
//! [`transcript`] of both; the client checks it against the key it expects for the node it dialled and
//! answers AUTH with its own signature over the same transcript (a different role byte, so neither
//! signature can be replayed as the other). Both nonces are fresh, so a recorded handshake proves
//! nothing on a later connection. The handshake runs inside the session's encrypted channel
//! (`channel`), and the transcript holds that channel's handshake hash: a signature proves the name
//! for this channel only, so the keys that protect every later frame belong to the node that signed
//! (issue 30, item 2).
//!
//! Invariants: key material is only ever parsed from its documented text form ([`parse_secret`],
//! [`parse_public`]) and never logged; verification uses `verify_strict` (no malleable signatures).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};

pub use ed25519_dalek::{Signature, SIGNATURE_LENGTH};

/// Length of a handshake nonce.
pub const NONCE_LEN: usize = 32;

/// Which side of the handshake signs (part of the signed transcript).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The node that accepted the connection (signs in its HELLO answer).
    Server,
    /// The node that connected (signs in AUTH).
    Client,
}

/// Why a key does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    #[error("not base64")]
    NotBase64,
    #[error("a key is 32 bytes (44 base64 characters), this is {0} bytes")]
    Length(usize),
    #[error("not a valid ed25519 public key")]
    Invalid,
}

/// A node's private key.
pub struct NodeKey(SigningKey);

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeKey(public {})", self.public_text())
    }
}

fn decode32(text: &str) -> Result<[u8; 32], KeyError> {
    let b = B64.decode(text.trim()).map_err(|_| KeyError::NotBase64)?;
    b.as_slice().try_into().map_err(|_| KeyError::Length(b.len()))
}

/// Parses a private key file's text: the base64 of the 32-byte ed25519 seed.
pub fn parse_secret(text: &str) -> Result<NodeKey, KeyError> {
    Ok(NodeKey(SigningKey::from_bytes(&decode32(text)?)))
}

/// Parses a public key: the base64 of its 32 bytes.
pub fn parse_public(text: &str) -> Result<VerifyingKey, KeyError> {
    VerifyingKey::from_bytes(&decode32(text)?).map_err(|_| KeyError::Invalid)
}

/// The text form of a public key.
pub fn public_text(k: &VerifyingKey) -> String {
    B64.encode(k.as_bytes())
}

pub use ed25519_dalek::VerifyingKey as PublicKey;

impl NodeKey {
    /// A key from 32 random bytes (the caller draws them from the OS generator; tests may seed them).
    pub fn from_seed(seed: [u8; 32]) -> NodeKey {
        NodeKey(SigningKey::from_bytes(&seed))
    }
    /// The private key file's text (base64 seed and a newline).
    pub fn secret_text(&self) -> String {
        format!("{}\n", B64.encode(self.0.to_bytes()))
    }
    pub fn public(&self) -> VerifyingKey {
        self.0.verifying_key()
    }
    pub fn public_text(&self) -> String {
        public_text(&self.public())
    }
    /// Signs the handshake transcript as `role`.
    pub fn sign(&self, role: Role, t: &Transcript<'_>) -> [u8; SIGNATURE_LENGTH] {
        self.0.sign(&t.bytes(role)).to_bytes()
    }
}

/// What both signatures of one handshake cover.
#[derive(Debug, Clone, Copy)]
pub struct Transcript<'a> {
    pub client: &'a str,
    pub server: &'a str,
    pub client_epoch: u64,
    pub server_epoch: u64,
    pub client_nonce: &'a [u8; NONCE_LEN],
    pub server_nonce: &'a [u8; NONCE_LEN],
    /// The encrypted channel's handshake hash (`channel::Channel::binding`).
    pub binding: &'a [u8; crate::channel::BINDING_LEN],
}

impl Transcript<'_> {
    fn bytes(&self, role: Role) -> Vec<u8> {
        let mut v = Vec::with_capacity(192 + self.client.len() + self.server.len());
        v.extend_from_slice(b"doubledecker peer handshake v3\0");
        v.push(match role {
            Role::Server => b'S',
            Role::Client => b'C',
        });
        for name in [self.client, self.server] {
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(name.as_bytes());
        }
        v.extend_from_slice(&self.client_epoch.to_le_bytes());
        v.extend_from_slice(&self.server_epoch.to_le_bytes());
        v.extend_from_slice(self.client_nonce);
        v.extend_from_slice(self.server_nonce);
        v.extend_from_slice(self.binding);
        v
    }

    /// Whether `sig` is `key`'s signature of this transcript as `role`.
    pub fn verify(&self, role: Role, key: &VerifyingKey, sig: &[u8; SIGNATURE_LENGTH]) -> bool {
        key.verify_strict(&self.bytes(role), &Signature::from_bytes(sig)).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<'a>(c: &'a str, n1: &'a [u8; 32], n2: &'a [u8; 32]) -> Transcript<'a> {
        Transcript {
            binding: &[6; 32],
            client: c,
            server: "b",
            client_epoch: 1,
            server_epoch: 2,
            client_nonce: n1,
            server_nonce: n2,
        }
    }

    #[test]
    fn only_the_right_key_role_and_transcript_verify() {
        let (a, m) = (NodeKey::from_seed([1; 32]), NodeKey::from_seed([2; 32]));
        let (n1, n2) = ([3u8; 32], [4u8; 32]);
        let sig = a.sign(Role::Client, &t("a", &n1, &n2));
        assert!(t("a", &n1, &n2).verify(Role::Client, &a.public(), &sig));
        assert!(!t("a", &n1, &n2).verify(Role::Client, &m.public(), &sig), "another node's key");
        assert!(!t("a", &n1, &n2).verify(Role::Server, &a.public(), &sig), "the other role");
        assert!(!t("m", &n1, &n2).verify(Role::Client, &a.public(), &sig), "another name");
        assert!(!t("a", &n2, &n1).verify(Role::Client, &a.public(), &sig), "other nonces");
        let other_channel = Transcript { binding: &[7; 32], ..t("a", &n1, &n2) };
        assert!(!other_channel.verify(Role::Client, &a.public(), &sig), "another channel");
        let mut bad = sig;
        bad[0] ^= 1;
        assert!(!t("a", &n1, &n2).verify(Role::Client, &a.public(), &bad));
    }

    #[test]
    fn key_text_round_trips_and_bad_text_is_an_error() {
        let k = NodeKey::from_seed([9; 32]);
        let again = parse_secret(&k.secret_text()).unwrap();
        assert_eq!(again.public(), k.public());
        assert_eq!(parse_public(&k.public_text()).unwrap(), k.public());
        assert_eq!(parse_public("not base64!").unwrap_err(), KeyError::NotBase64);
        assert_eq!(parse_public(&B64.encode([1u8; 16])).unwrap_err(), KeyError::Length(16));
        assert!(
            format!("{k:?}").contains(&k.public_text()) && !format!("{k:?}").contains(k.secret_text().trim())
        );
    }
}
